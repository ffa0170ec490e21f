package bench

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// kafkaPathRecords is how many records one op of BenchmarkKafkaPath
// processes.
var kafkaPathRecords = flag.Int("kafkapath-records", 200_000, "records per op of BenchmarkKafkaPath")

// BenchmarkKafkaPath measures steady-state table update throughput with a
// changelog through the whole Kafka path of one worker (app.Process on
// testbroker: kfake unless RUNNEL_KAFKA_BROKERS is set, Pebble stores): a
// 1-agent app reads -kafkapath-records records (default 200 000) from a
// 4-partition topic and does one Table.Update per record (a read from the
// write cache or the Pebble store; every commit interval a cycle writes one
// changelog record per changed key with acks=all, commits the offsets and
// applies one Pebble batch). Sub-benchmarks: keys=1k and keys=100k
// distinct keys. One op is one whole Process run; metrics are averaged over
// the ops:
//
//   - agent-records/s: records over the span from the first to the last
//     record the agent saw (steady-state processing, no group join or drain);
//   - changelog-records/s: changelog records over the span from the first to
//     the last one the broker reported (sum of the changelog partitions'
//     highwaters, polled every 20 ms): the write rate the broker acknowledged
//     (with commit cycles it measures the cycles, not the updates);
//   - e2e-records/s: records over the span from the end of the input load to
//     the group's lag 0 (join, processing, the last commits; WaitForLag0
//     polls, so small runs understate it).
//
// ns/op covers the whole Process call, which includes loading the input and
// reading the table back; use the metrics. Run with -benchtime 1x.
func BenchmarkKafkaPath(b *testing.B) {
	for _, keys := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("keys=%dk", keys/1000), func(b *testing.B) {
			var agentRate, clRate, e2eRate float64
			for range b.N {
				r := runKafkaPath(b, *kafkaPathRecords, keys)
				agentRate += r.agent / float64(b.N)
				clRate += r.changelog / float64(b.N)
				e2eRate += r.e2e / float64(b.N)
			}
			b.ReportMetric(agentRate, "agent-records/s")
			b.ReportMetric(clRate, "changelog-records/s")
			b.ReportMetric(e2eRate, "e2e-records/s")
		})
	}
}

// kafkaPathRates are the records/s of one runKafkaPath (0 where the span was
// too short to measure).
type kafkaPathRates struct{ agent, changelog, e2e float64 }

// runKafkaPath runs one app.Process over n records with keys distinct keys
// and checks the table it returns.
func runKafkaPath(b *testing.B, n, keys int) kafkaPathRates {
	b.StopTimer()
	brokers := testbroker.Brokers(b)
	dir := b.TempDir()
	input := filepath.Join(dir, "input.jsonl")
	writeInput(b, input, n, keys)

	id := testbroker.Topic(b, "bench")
	a := app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		app.WithTopicPrefix(id+"-"),
	)
	events := app.Topic(a, "events", codec.String(), codec.String(), app.Partitions(4))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	var seen atomic.Int64
	var first, last atomic.Int64 // unix nanos
	agent.New(a, "count", events, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			now := time.Now().UnixNano()
			first.CompareAndSwap(0, now)
			last.Store(now)
			seen.Add(1)
		}
		return s.Err()
	}, agent.WritesTo(counts))
	g, err := a.Topology()
	if err != nil {
		b.Fatal(err)
	}
	poll := pollHighwaters(b, brokers, g.Tables[0].Changelog, 4, int64(n))

	var loaded time.Time
	var lag0 time.Time
	b.StartTimer()
	res, err := a.Process(context.Background(), brokers, app.DevOptions{
		Workers:    1,
		Input:      input,
		InputTopic: "events",
		KeyField:   "k",
		DataDir:    filepath.Join(dir, "data"),
		Timeout:    5 * time.Minute,
		Out:        io.Discard,
		Progress: func(_ string, n, total int64) {
			if n == total {
				loaded = time.Now()
			}
		},
		Inspect: func([]*app.Worker) { lag0 = time.Now() },
	})
	b.StopTimer()
	cl := poll.stop()
	if err != nil {
		b.Fatal(err)
	}
	if got := seen.Load(); got < int64(n) {
		b.Fatalf("agent saw %d records, want %d", got, n)
	}
	var sum int64
	for _, v := range res.Tables["counts"] {
		sum += v.(int64)
	}
	if sum != int64(n) || len(res.Tables["counts"]) != min(n, keys) {
		b.Fatalf("table has %d keys whose counts sum to %d, want %d keys summing to %d", len(res.Tables["counts"]), sum, min(n, keys), n)
	}
	// A commit cycle writes one changelog record per key it changed.
	if hw := highwaterSum(b, brokers, g.Tables[0].Changelog, 4); hw < int64(min(n, keys)) || hw > int64(n) {
		b.Fatalf("changelog highwaters sum to %d, want between %d keys and %d updates", hw, min(n, keys), n)
	}
	b.ReportMetric(float64(cl.last), "changelog-records")
	var r kafkaPathRates
	if span := time.Duration(last.Load() - first.Load()); span > 0 {
		r.agent = float64(n) / span.Seconds()
	}
	r.changelog = cl.rate()
	if !loaded.IsZero() && lag0.After(loaded) {
		r.e2e = float64(n) / lag0.Sub(loaded).Seconds()
	}
	return r
}

// highwaterSum returns the sum of topic's partition highwaters.
func highwaterSum(b *testing.B, brokers []string, topic string, partitions int32) int64 {
	b.Helper()
	client, err := sarama.NewClient(brokers, testbroker.SaramaConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	var sum int64
	for p := range partitions {
		off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			b.Fatal(err)
		}
		sum += off
	}
	return sum
}

// highwaterPoll samples the sum of a topic's partition highwaters.
type highwaterPoll struct {
	done            chan struct{}
	stopped         chan struct{}
	firstAt, lastAt time.Time
	first, last     int64 // sums seen at firstAt (first nonzero) and lastAt (first reaching want)
}

// pollHighwaters polls the sum of the newest offsets of topic's partitions
// every 20 ms (the topic may not exist yet) until the sum reaches want or
// stop is called.
func pollHighwaters(b *testing.B, brokers []string, topic string, partitions int32, want int64) *highwaterPoll {
	b.Helper()
	client, err := sarama.NewClient(brokers, testbroker.SaramaConfig(b))
	if err != nil {
		b.Fatal(err)
	}
	h := &highwaterPoll{done: make(chan struct{}), stopped: make(chan struct{})}
	go func() {
		defer close(h.stopped)
		defer client.Close()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-h.done:
				return
			case <-tick.C:
			}
			var sum int64
			for p := range partitions {
				off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
				if err != nil {
					sum = -1
					break
				}
				sum += off
			}
			if sum <= 0 {
				continue
			}
			now := time.Now()
			if h.firstAt.IsZero() {
				h.firstAt, h.first = now, sum
			}
			h.lastAt, h.last = now, sum
			if sum >= want {
				return
			}
		}
	}()
	return h
}

// stop ends the polling and returns the samples.
func (h *highwaterPoll) stop() *highwaterPoll {
	close(h.done)
	<-h.stopped
	return h
}

// rate returns the records/s between the first and the last sample (0 when
// they coincide).
func (h *highwaterPoll) rate() float64 {
	if !h.lastAt.After(h.firstAt) {
		return 0
	}
	return float64(h.last-h.first) / h.lastAt.Sub(h.firstAt).Seconds()
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
