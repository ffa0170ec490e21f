package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// BenchmarkKafkaPath measures records/s through the whole Kafka path of one
// worker (app.Process on testbroker: kfake unless RUNNEL_KAFKA_BROKERS is
// set): a 1-agent app reads b.N records from a 4-partition topic and updates
// one table key per record (1000 distinct keys: a read from the overlay or
// the Pebble store, a changelog record produced with acks=all, a persist
// token confirmed on its ack, the source offset committed once every token
// of the record confirmed). Metrics:
//
//   - agent-records/s: b.N over the span from the first to the last record
//     the agent saw (steady-state processing, no group join or drain);
//   - e2e-records/s: b.N over the span from the end of the input load to the
//     group's lag 0 (join, processing, the last commits; WaitForLag0 polls,
//     so small runs understate it).
//
// The timer covers the whole Process call, which includes loading the input
// and reading the table back; use the two metrics, not ns/op. Run with
// -benchtime 100000x or more.
func BenchmarkKafkaPath(b *testing.B) {
	brokers := testbroker.Brokers(b)
	dir := b.TempDir()
	input := filepath.Join(dir, "input.jsonl")
	writeInput(b, input, b.N, 1000)

	id := testbroker.Topic(b, "bench")
	a := app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		app.WithTopicPrefix(id+"-"),
		app.WithDevInput("events", "k"),
	)
	events := app.Topic(a, "events", codec.String(), codec.String(), app.Partitions(4))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	var seen atomic.Int64
	var first, last atomic.Int64 // unix nanos
	agent.New(a, "count", events, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if _, err := counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 }); err != nil {
				return err
			}
			now := time.Now().UnixNano()
			first.CompareAndSwap(0, now)
			last.Store(now)
			seen.Add(1)
		}
		return s.Err()
	})

	var loaded time.Time
	var lag0 time.Time
	b.ResetTimer()
	res, err := a.Process(context.Background(), brokers, app.DevOptions{
		Workers: 1,
		Input:   input,
		DataDir: filepath.Join(dir, "data"),
		Timeout: 5 * time.Minute,
		Out:     io.Discard,
		Progress: func(n, total int64) {
			if n == total {
				loaded = time.Now()
			}
		},
		Inspect: func([]*app.Worker) { lag0 = time.Now() },
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if got := seen.Load(); got < int64(b.N) {
		b.Fatalf("agent saw %d records, want %d", got, b.N)
	}
	var sum int64
	for _, v := range res.Tables["counts"] {
		sum += v.(int64)
	}
	if sum != int64(b.N) {
		b.Fatalf("table counts sum to %d, want %d", sum, b.N)
	}
	if span := time.Duration(last.Load() - first.Load()); span > 0 {
		b.ReportMetric(float64(b.N)/span.Seconds(), "agent-records/s")
	}
	if !loaded.IsZero() && lag0.After(loaded) {
		b.ReportMetric(float64(b.N)/lag0.Sub(loaded).Seconds(), "e2e-records/s")
	}
}

// writeInput writes n JSON lines {"k":"key-<i mod keys>","i":<i>} to path.
func writeInput(b *testing.B, path string, n, keys int) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i := range n {
		fmt.Fprintf(w, "{\"k\":\"key-%d\",\"i\":%d}\n", i%keys, i)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}
