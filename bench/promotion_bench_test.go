package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// promotionRecords is how many distinct keys the table of BenchmarkPromotion
// holds (one changelog record each) before worker A stops.
var promotionRecords = flag.Int("promotion-records", 200_000, "table records built before the promotion in BenchmarkPromotion")

// promotionParts is the partition count of BenchmarkPromotion's source topic
// (and so of its table).
const promotionParts = 8

// BenchmarkPromotion measures how long the surviving worker takes to promote
// the partitions of a worker that stopped cleanly, without a standby
// (replicas=0: it restores them from the changelog) and with one
// (replicas=1: it followed them as a standby and replays only what its
// standby had not applied). Setup, outside the timer: two workers A and B
// (Pebble stores, commit interval 200 ms) run one agent that does one
// Table.Update per record of an 8-partition topic; -promotion-records
// records (default 200 000) with as many distinct keys are produced and
// processed (group lag 0), so A's active partitions hold about half of the
// table; with replicas=1 the benchmark also waits until B's store has applied
// A's changelog partitions up to their highwaters. Timed: A's Run context is
// cancelled; once Run returned, one probe record is produced to each of A's
// partitions; the op ends when the changelog highwater of each of those
// partitions moved past its value at A's stop (B processed the probe and the
// broker acknowledged its table write). Metrics, averaged over the ops:
//
//   - promotion-ms: from A's cancel to the last probe's changelog write;
//   - stop-ms: from A's cancel to the return of A's Run (part of the above);
//   - replayed-records: changelog records B's active restores applied during
//     the promotion (Worker.Restored);
//   - replayed-span: the changelog offsets those restores covered
//     (Worker.RestoredSpan), uncommitted tails skipped included;
//   - a-changelog-records: the changelog records of A's partitions at the stop.
//
// After the op the table is read back from its changelog and checked: every
// key counted once, probes included. Run with -benchtime 1x.
func BenchmarkPromotion(b *testing.B) {
	for _, replicas := range []int{0, 1} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			var sum promotionResult
			for range b.N {
				r := runPromotion(b, replicas, *promotionRecords)
				sum.promotion += r.promotion
				sum.stop += r.stop
				sum.replayed += r.replayed
				sum.span += r.span
				sum.aRecords += r.aRecords
			}
			n := float64(b.N)
			b.ReportMetric(float64(sum.promotion.Milliseconds())/n, "promotion-ms")
			b.ReportMetric(float64(sum.stop.Milliseconds())/n, "stop-ms")
			b.ReportMetric(float64(sum.replayed)/n, "replayed-records")
			b.ReportMetric(float64(sum.span)/n, "replayed-span")
			b.ReportMetric(float64(sum.aRecords)/n, "a-changelog-records")
		})
	}
}

type promotionResult struct {
	promotion, stop          time.Duration
	replayed, span, aRecords int64
}

// runningWorker is a worker whose Run goroutine reports on done.
type runningWorker struct {
	w      *app.Worker
	cancel context.CancelFunc
	done   chan error
}

func startWorker(b *testing.B, a *app.App, brokers []string, dir, name string) *runningWorker {
	b.Helper()
	w, err := a.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: filepath.Join(dir, name), Name: name})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningWorker{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	b.Cleanup(func() {
		r.cancel()
		<-r.done
	})
	return r
}

// waitFor polls cond every 10 ms until it holds, or fails b after timeout.
func waitFor(b *testing.B, timeout time.Duration, what string, cond func() bool) {
	b.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}

func runPromotion(b *testing.B, replicas, n int) promotionResult {
	b.StopTimer()
	brokers := testbroker.Brokers(b)
	dir := b.TempDir()
	id := testbroker.Topic(b, "promo")
	a := app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200*time.Millisecond),
		app.WithReplicas(replicas),
		app.WithLogger(benchLogger()),
		app.WithTopicPrefix(id+"-"),
	)
	events := app.Topic(a, "events", codec.String(), codec.String(), app.Partitions(promotionParts))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	agent.New(a, "count", events, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(counts))
	g, err := a.Topology()
	if err != nil {
		b.Fatal(err)
	}
	changelogTopic := g.Tables[0].Changelog

	wa := startWorker(b, a, brokers, dir, "a")
	wb := startWorker(b, a, brokers, dir, "b")
	cfg := testbroker.SaramaConfig(b)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner // SendLines picks the partitions
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	balanced := func() bool {
		return len(wa.w.Assignment().Actives[events.Name()]) == promotionParts/2 &&
			len(wb.w.Assignment().Actives[events.Name()]) == promotionParts/2 &&
			wa.w.Ready() && wb.w.Ready()
	}
	waitFor(b, time.Minute, "two workers with 4 active partitions each, restored", balanced)

	// Build the table: n records with n distinct keys.
	var input bytes.Buffer
	for i := range n {
		fmt.Fprintf(&input, "{\"k\":\"key-%d\"}\n", i)
	}
	tools, err := app.Dial(context.Background(), brokers)
	if err != nil {
		b.Fatal(err)
	}
	defer tools.Close()
	if _, err := app.SendLines(context.Background(), tools, events.Name(), promotionParts, "k", &input, nil); err != nil {
		b.Fatal(err)
	}
	if err := app.WaitForLag0(context.Background(), tools, id, []string{events.Name()}, 2*time.Minute); err != nil {
		b.Fatal(err)
	}
	// A rebalance during the load (a member evicted on the shared cores) can
	// leave the group unbalanced for a while: wait until it settles again.
	waitFor(b, time.Minute, "two workers with 4 active partitions each after the load", balanced)
	if err := app.WaitForLag0(context.Background(), tools, id, []string{events.Name()}, 2*time.Minute); err != nil {
		b.Fatal(err)
	}
	aParts := slices.Clone(wa.w.Assignment().Actives[events.Name()])
	highwaters := func() map[int32]int64 {
		m := map[int32]int64{}
		for _, p := range aParts {
			off, err := client.GetOffset(changelogTopic, p, sarama.OffsetNewest)
			if err != nil {
				b.Fatalf("highwater of %s[%d]: %v", changelogTopic, p, err)
			}
			m[p] = off
		}
		return m
	}
	if replicas > 0 {
		hw := highwaters()
		waitFor(b, time.Minute, "b's standby to apply a's changelog partitions", func() bool {
			for _, p := range aParts {
				off, err := wb.w.StoreOffset("counts", p)
				if err != nil {
					b.Fatal(err)
				}
				if off < hw[p]-1 {
					return false
				}
			}
			return true
		})
	}
	restored0, span0 := wb.w.Restored(), wb.w.RestoredSpan()
	prod := probeProducer(b, brokers)

	// Promotion.
	b.StartTimer()
	t0 := time.Now()
	wa.cancel()
	if err := <-wa.done; err != nil {
		b.Fatalf("worker a: %v", err)
	}
	wa.done <- nil // for the cleanup
	stopped := time.Since(t0)
	hw := highwaters()
	var aRecords int64
	for _, off := range hw {
		aRecords += off
	}
	probes := sendProbes(b, prod, events.Name(), aParts)
	pending := slices.Clone(aParts)
	var last time.Time
	waitFor(b, 2*time.Minute, "b to write the probes' table updates", func() bool {
		pending = slices.DeleteFunc(pending, func(p int32) bool {
			off, err := client.GetOffset(changelogTopic, p, sarama.OffsetNewest)
			return err == nil && off > hw[p]
		})
		last = time.Now()
		return len(pending) == 0
	})
	b.StopTimer()
	r := promotionResult{
		promotion: last.Sub(t0),
		stop:      stopped,
		replayed:  wb.w.Restored() - restored0,
		span:      wb.w.RestoredSpan() - span0,
		aRecords:  aRecords,
	}

	// Check: b owns every partition and the table counts every key once.
	if got := len(wb.w.Assignment().Actives[events.Name()]); got != promotionParts {
		b.Fatalf("worker b holds %d active partitions after the promotion, want %d", got, promotionParts)
	}
	wb.cancel()
	if err := <-wb.done; err != nil {
		b.Fatalf("worker b: %v", err)
	}
	wb.done <- nil
	m, err := app.ReadTable(context.Background(), tools, counts)
	if err != nil {
		b.Fatal(err)
	}
	if len(m) != n+len(probes) {
		b.Fatalf("table has %d keys, want %d", len(m), n+len(probes))
	}
	for _, k := range append(probes, "key-0", fmt.Sprintf("key-%d", n-1)) {
		if m[k] != int64(1) {
			b.Fatalf("count of %q = %v, want 1", k, m[k])
		}
	}
	return r
}

// probeProducer returns a connected sync producer with manual partitioning,
// closed when b ends.
func probeProducer(b *testing.B, brokers []string) sarama.SyncProducer {
	b.Helper()
	cfg := testbroker.SaramaConfig(b)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Return.Successes = true
	prod, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { prod.Close() })
	return prod
}

// sendProbes produces one record to each partition of parts, keyed so that
// murmur2 maps the key to that partition, and returns the keys.
func sendProbes(b *testing.B, prod sarama.SyncProducer, topic string, parts []int32) []string {
	b.Helper()
	var keys []string
	for _, p := range parts {
		var k string
		for j := 0; ; j++ {
			if k = fmt.Sprintf("probe-%d", j); kafka.PartitionFor([]byte(k), promotionParts) == p {
				break
			}
		}
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: p, Key: sarama.StringEncoder(k), Value: sarama.StringEncoder("probe")}); err != nil {
			b.Fatal(err)
		}
		keys = append(keys, k)
	}
	return keys
}

// benchLogger discards logs unless RUNNEL_BENCH_LOG is set.
func benchLogger() *slog.Logger {
	if os.Getenv("RUNNEL_BENCH_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
