// Command sarama-peer is the raw Sarama loop of the side-by-side benchmarks
// (bench/sidebyside): a consumer group whose claims hand every record to an
// async producer, the ceiling of what any Sarama-based framework can reach.
// It tracks no deliveries: an offset is marked once its output is handed to
// the producer (acks=all), so a crash may lose records. Configured by the
// BENCH_* environment the harness sets; BENCH_SARAMA_SAFE=1 gives its
// producer Runnel's settings (idempotent, one request in flight, successes
// returned: the harness's sarama-safe system), BENCH_CPUPROFILE writes a
// pprof CPU profile of the run.
//
// Workloads (BENCH_WORKLOAD):
//   - stateless: BENCH_INPUT to BENCH_OUTPUT with the value upper-cased, on
//     the input record's partition;
//   - stateful: a count per key kept in memory only (no store, no restore),
//     written to <BENCH_ID>-counts-changelog as a decimal (the harness
//     creates that topic) through a write cache: one record per dirty key per
//     flush, like Runnel's commit cycles and Kafka Streams' record cache
//     (writeCache has the flush rules). BENCH_SARAMA_WRITE_THROUGH=1 writes
//     every new count instead, one record per input record, as Goka does (the
//     harness's opt-in sarama-wt).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sarama-peer:", err)
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
	commitMS, err := strconv.Atoi(env("BENCH_COMMIT_MS", "2800"))
	if err != nil {
		return fmt.Errorf("BENCH_COMMIT_MS: %w", err)
	}
	workload := env("BENCH_WORKLOAD", "stateless")
	out := env("BENCH_OUTPUT", "output")
	if workload == "stateful" {
		out = env("BENCH_ID", "bench") + "-counts-changelog"
	} else if workload != "stateless" {
		return fmt.Errorf("BENCH_WORKLOAD %q: want stateless or stateful", workload)
	}
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_0_0_0
	cfg.ClientID = "sarama-peer"
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Interval = time.Duration(commitMS) * time.Millisecond
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Return.Successes = false
	cfg.Producer.Flush.Frequency = 2 * time.Millisecond
	cfg.Producer.Flush.Bytes = 256 << 10
	if os.Getenv("BENCH_SARAMA_SAFE") != "" {
		// Runnel's producer settings (internal/kafka.NewConfig): idempotent,
		// one request in flight, every success returned.
		cfg.Producer.Idempotent = true
		cfg.Net.MaxOpenRequests = 1
		cfg.Producer.Return.Successes = true
		cfg.Producer.Retry.Max = 10
	}
	brokers := strings.Split(env("BENCH_BROKERS", "localhost:9092"), ",")

	producer, err := sarama.NewAsyncProducer(brokers, cfg)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	group, err := sarama.NewConsumerGroup(brokers, env("BENCH_ID", "bench"), cfg)
	if err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	if cfg.Producer.Return.Successes {
		go func() {
			for range producer.Successes() {
			}
		}()
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
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	perr := make(chan error, 1)
	go func() {
		for e := range producer.Errors() {
			select {
			case perr <- e:
				stop() // a lost output record: end the run with the error
			default:
			}
		}
	}()
	h := &handler{producer: producer, out: out, stateful: workload == "stateful", counts: map[int32]map[string]int64{},
		writeThrough: os.Getenv("BENCH_SARAMA_WRITE_THROUGH") != "",
		commit:       time.Duration(commitMS) * time.Millisecond}
	var runErr error
	for ctx.Err() == nil {
		if err := group.Consume(ctx, []string{env("BENCH_INPUT", "input")}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
			runErr = fmt.Errorf("consume: %w", err)
			break
		}
		select {
		case err := <-perr:
			runErr = fmt.Errorf("produce: %w", err)
		default:
		}
		if runErr != nil {
			break
		}
	}
	if err := group.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("close group: %w", err)
	}
	if err := producer.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("close producer: %w", err)
	}
	return runErr
}

// handler is the consumer-group handler; counts holds the stateful
// workload's counts per partition (each map is owned by that partition's
// ConsumeClaim goroutine; mu guards the outer map only).
type handler struct {
	producer sarama.AsyncProducer
	out      string
	stateful bool
	// writeThrough: stateful writes every new count at once (no write
	// cache).
	writeThrough bool
	commit       time.Duration // the commit interval: the write cache flushes at least this often
	mu           sync.Mutex
	counts       map[int32]map[string]int64
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	h.mu.Lock()
	counts := h.counts[claim.Partition()]
	if counts == nil {
		counts = map[string]int64{}
		h.counts[claim.Partition()] = counts
	}
	h.mu.Unlock()
	if h.stateful && !h.writeThrough {
		return h.consumeCached(sess, claim, counts)
	}
	for m := range claim.Messages() {
		var v []byte
		if h.stateful {
			k := string(m.Key)
			counts[k]++
			v = strconv.AppendInt(nil, counts[k], 10)
		} else {
			v = []byte(strings.ToUpper(string(m.Value)))
		}
		h.producer.Input() <- &sarama.ProducerMessage{Topic: h.out, Partition: m.Partition,
			Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(v)}
		sess.MarkMessage(m, "")
	}
	return nil
}

// Write-cache flush rules of the stateful loop, Runnel's commit-cycle
// triggers (internal/group/clock.go) with its defaults, so that both write the
// same number of changelog records for the same input:
//   - firstFlush after a claim's first record (Runnel's first-record check,
//     every 10 ms until a task's first cycle);
//   - every commit interval;
//   - idle: at a check every commit interval / 10 (20–200 ms), when records
//     came since the last flush and none since the previous check (the
//     partition is caught up);
//   - full: when the cache holds cacheBytes (Runnel's tablestate.DefaultCacheBytes,
//     4 MiB per table partition, each entry counted as its key, its value
//     and 64 bytes as Runnel counts it);
//   - the end of the claim (a rebalance or the stop).
const (
	firstFlush = 10 * time.Millisecond
	cacheBytes = 4 << 20
)

// consumeCached is the stateful loop with a write cache: counts change in
// memory, and each flush writes one record per key changed since the last
// flush (its latest count), then marks the offset of the last record it
// covers. counts and the cache are owned by this claim's goroutine.
func (h *handler) consumeCached(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim, counts map[string]int64) error {
	idleEvery := min(max(h.commit/10, 20*time.Millisecond), 200*time.Millisecond)
	tick, idle := time.NewTicker(h.commit), time.NewTicker(idleEvery)
	defer tick.Stop()
	defer idle.Stop()
	dirty := map[string]struct{}{}
	bytes := 0
	var last *sarama.ConsumerMessage // the last record counted, not yet marked
	flush := func() {
		for k := range dirty {
			h.producer.Input() <- &sarama.ProducerMessage{Topic: h.out, Partition: claim.Partition(),
				Key: sarama.StringEncoder(k), Value: sarama.ByteEncoder(strconv.AppendInt(nil, counts[k], 10))}
		}
		clear(dirty)
		bytes = 0
		if last != nil {
			sess.MarkMessage(last, "")
			last = nil
		}
	}
	defer flush()
	var first <-chan time.Time // armed by the claim's first record
	started, recent := false, false
	for {
		select {
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			k := string(m.Key)
			counts[k]++
			if _, ok := dirty[k]; !ok {
				dirty[k] = struct{}{}
				bytes += len(k) + 8 + 64
			}
			last, recent = m, true
			if !started {
				started = true
				first = time.After(firstFlush)
			}
			if bytes >= cacheBytes {
				flush()
			}
		case <-first:
			first = nil
			flush()
		case <-tick.C:
			flush()
		case <-idle.C:
			if !recent && len(dirty) > 0 {
				flush()
			}
			recent = false
		case <-sess.Context().Done():
			return nil
		}
	}
}
