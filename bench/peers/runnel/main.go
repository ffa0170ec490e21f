// Command runnel-peer is Runnel's app in the side-by-side benchmarks
// (bench/sidebyside): one worker written with the public API only (app, agent,
// table, codec), configured by the BENCH_* environment the harness sets.
//
// Beyond the harness's common settings: BENCH_FAIL=partition:offset:times
// fails that record's first deliveries (the redeliver workload),
// BENCH_REDELIVERY=retries:backoff_ms:max_backoff_ms sets app.WithRedelivery,
// BENCH_HEARTBEAT_MS the group heartbeat, BENCH_SARAMA_LOG=1 turns on
// Sarama's log (joins, syncs, claims) to trace a hand-over.
//
// Workloads (BENCH_WORKLOAD):
//   - stateless: every record of BENCH_INPUT goes to BENCH_OUTPUT with the
//     value upper-cased;
//   - stateful: a count per key in the table "counts" (changelog
//     <BENCH_ID>-counts-changelog, decimal values).
//
// With BENCH_CPUPROFILE and BENCH_MEMPROFILE set it writes a pprof CPU profile
// of the whole run and an allocation profile at exit (SIGTERM), BENCH_TRACE an
// execution trace of the whole run (go tool trace). With
// BENCH_STAGE_LATENCY=1 the stateless agent takes, for each latency record
// (value "lat-<level>-<unix ns>-<seq>", bench/sidebyside/latency.go), the time
// from its stamp to the agent receiving it, and logs p50/p99/p99.9/max at
// exit: the first stage of the end-to-end latency (the input producer, the
// broker, the fetch and the source), to tell it from the rest (the sink's
// producer and the reader).
package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/table"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "runnel-peer:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run() error {
	parts, err := strconv.Atoi(env("BENCH_PARTITIONS", "8"))
	if err != nil {
		return fmt.Errorf("BENCH_PARTITIONS: %w", err)
	}
	commitMS, err := strconv.Atoi(env("BENCH_COMMIT_MS", "2800"))
	if err != nil {
		return fmt.Errorf("BENCH_COMMIT_MS: %w", err)
	}
	lvl := slog.LevelInfo
	if err := lvl.UnmarshalText([]byte(env("BENCH_LOG_LEVEL", "warn"))); err != nil {
		return fmt.Errorf("BENCH_LOG_LEVEL: %w", err)
	}
	if os.Getenv("BENCH_SARAMA_LOG") != "" {
		// Sarama's own log (joins, syncs, heartbeats, claims) with
		// microsecond timestamps, to trace a hand-over.
		sarama.Logger = log.New(os.Stderr, "sarama ", log.LstdFlags|log.Lmicroseconds|log.LUTC)
	}
	fail, err := parseFailure(os.Getenv("BENCH_FAIL"))
	if err != nil {
		return err
	}
	opts := []app.Option{}
	if v := os.Getenv("BENCH_REDELIVERY"); v != "" {
		var retries, backoff, maxBackoff int
		if _, err := fmt.Sscanf(v, "%d:%d:%d", &retries, &backoff, &maxBackoff); err != nil {
			return fmt.Errorf("BENCH_REDELIVERY %q: want retries:backoff_ms:max_backoff_ms: %w", v, err)
		}
		opts = append(opts, app.WithRedelivery(app.Redelivery{MaxRetries: retries,
			Backoff: time.Duration(backoff) * time.Millisecond, MaxBackoff: time.Duration(maxBackoff) * time.Millisecond}))
	}
	if v := os.Getenv("BENCH_HEARTBEAT_MS"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("BENCH_HEARTBEAT_MS: %w", err)
		}
		opts = append(opts, app.WithGroupTimeouts(0, time.Duration(ms)*time.Millisecond, 0, 0))
	}
	// BENCH_COMMIT_MS=0 leaves the commit interval to the app's default for
	// its guarantee (2.8 s under either guarantee).
	if commitMS > 0 {
		opts = append(opts, app.WithCommitInterval(time.Duration(commitMS)*time.Millisecond))
	}
	a := app.New(env("BENCH_ID", "bench"), append([]app.Option{
		app.WithBrokers(strings.Split(env("BENCH_BROKERS", "localhost:9092"), ",")...),
		app.WithDataDir(env("BENCH_DATA_DIR", "./var")),
		app.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))),
	}, opts...)...)

	in := app.Topic(a, env("BENCH_INPUT", "input"), codec.String(), codec.String(), app.Partitions(int32(parts)))
	switch w := env("BENCH_WORKLOAD", "stateless"); w {
	case "stateless":
		out := app.Topic(a, env("BENCH_OUTPUT", "output"), codec.String(), codec.String(), app.Partitions(int32(parts)))
		stage := newStageHist(os.Getenv("BENCH_STAGE_LATENCY") != "")
		defer stage.log()
		agent.New(a, "transform", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				stage.observe(ev.Value)
				out.Send(ev, ev.Key, strings.ToUpper(ev.Value))
			}
			return s.Err()
		}, agent.SendsTo(out))
	case "stateful":
		counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
		agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				if err := fail.check(ev.Partition(), ev.Offset()); err != nil {
					return err
				}
				counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			}
			return s.Err()
		}, agent.WritesTo(counts))
	default:
		return fmt.Errorf("BENCH_WORKLOAD %q: want stateless or stateful", w)
	}

	if path := os.Getenv("BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if path := os.Getenv("BENCH_TRACE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return fmt.Errorf("trace: %w", err)
		}
		defer trace.Stop()
	}
	if path := os.Getenv("BENCH_MEMPROFILE"); path != "" {
		defer func() {
			if err := writeHeap(path); err != nil {
				fmt.Fprintln(os.Stderr, "runnel-peer:", err)
			}
		}()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if path := os.Getenv("BENCH_HEAPPEAK"); path != "" {
		go heapAtPeak(ctx, path)
	}
	w, err := a.NewWorker(app.WorkerOptions{})
	if err != nil {
		return fmt.Errorf("new worker: %w", err)
	}
	if err := w.Run(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// writeHeap writes the allocation profile (alloc_space is its default view
// in `go tool pprof -sample_index=alloc_space`).
func writeHeap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return nil
}

// heapAtPeak writes the in-use heap profile to path each time the live heap
// (runtime/metrics /gc/heap/live:bytes, as of the last GC) passes its
// highest value so far by 5 %, so that the file left at exit shows what
// the heap held at its peak (BENCH_HEAPPEAK; for issue #28's memory work).
func heapAtPeak(ctx context.Context, path string) {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var peak uint64
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(s)
		live := s[0].Value.Uint64()
		if live < peak+peak/20 {
			continue
		}
		peak = live
		f, err := os.Create(path)
		if err != nil {
			return
		}
		_ = pprof.Lookup("heap").WriteTo(f, 0)
		f.Close()
		fmt.Fprintf(os.Stderr, "runnel-peer: heap profile at live heap %d MB\n", live>>20)
	}
}

// failure is BENCH_FAIL=partition:offset:times: the record at that offset of
// that partition fails its first times deliveries (the agent returns an
// error, so the partition redelivers it). The zero failure fails nothing.
type failure struct {
	p        int32
	offset   int64
	times    int
	mu       sync.Mutex
	attempts int
}

func parseFailure(v string) (*failure, error) {
	f := &failure{p: -1}
	if v == "" {
		return f, nil
	}
	if _, err := fmt.Sscanf(v, "%d:%d:%d", &f.p, &f.offset, &f.times); err != nil {
		return nil, fmt.Errorf("BENCH_FAIL %q: want partition:offset:times: %w", v, err)
	}
	return f, nil
}

// check counts a delivery of the record at (p, offset) and returns an error
// for the first times deliveries of the failing record.
func (f *failure) check(p int32, offset int64) error {
	if p != f.p || offset != f.offset {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts++
	if f.attempts > f.times {
		return nil
	}
	return fmt.Errorf("bench: injected failure %d of %d of %d@%d", f.attempts, f.times, p, offset)
}

// stageHist is BENCH_STAGE_LATENCY's histogram: 0.1 ms buckets up to 10 s
// (the last bucket holds everything above).
type stageHist struct {
	on      bool
	mu      sync.Mutex
	buckets []int64
	n       int64
	max     time.Duration
}

func newStageHist(on bool) *stageHist {
	h := &stageHist{on: on}
	if on {
		h.buckets = make([]int64, 100_001)
	}
	return h
}

// observe takes the latency of a record whose value carries a latency stamp.
func (h *stageHist) observe(v string) {
	if !h.on || !strings.HasPrefix(v, "lat-") {
		return
	}
	f := strings.SplitN(v, "-", 4)
	if len(f) != 4 || f[1] == "W" {
		return
	}
	ns, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return
	}
	d := time.Since(time.Unix(0, ns))
	b := min(max(int(d/(100*time.Microsecond)), 0), len(h.buckets)-1)
	h.mu.Lock()
	h.buckets[b]++
	h.n++
	h.max = max(h.max, d)
	h.mu.Unlock()
}

// log writes the percentiles to stderr.
func (h *stageHist) log() {
	if !h.on || h.n == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	q := func(p float64) float64 {
		want := int64(math.Ceil(p * float64(h.n)))
		var seen int64
		for i, c := range h.buckets {
			if seen += c; seen >= want {
				return float64(i) / 10
			}
		}
		return -1
	}
	fmt.Fprintf(os.Stderr, "runnel-peer: stage latency (stamp to agent) n=%d p50=%.1fms p99=%.1fms p99.9=%.1fms max=%.1fms\n",
		h.n, q(0.5), q(0.99), q(0.999), float64(h.max)/float64(time.Millisecond))
}
