package app_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// deliveries counts the deliveries of each offset of one partition to an
// agent.
type deliveries struct {
	mu sync.Mutex
	m  map[int64]int
}

func (d *deliveries) add(off int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[int64]int{}
	}
	d.m[off]++
}

func (d *deliveries) get(off int64) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[off]
}

// A record of partition 0 fails its first deliveries. Two agents read the
// input: "count" fails on the record (after its table update, so each failed
// delivery leaves a write in the cache that must be dropped) and "tally"
// never fails (it runs ahead: at the first failure it has applied records
// after the failed one). The commit interval is longer than the test and
// there are no idle cycles, so the first failure reverts the task to the
// start of the partition: the next incarnation reads the records before the
// failed one again, cycles them (commit point: the failed record) and hands
// the failed record out alone. Every later failure then reverts to that
// cycle and reprocesses the one record.
//
// The assertions would fail with a wrong revert point: a record before the
// failed one delivered more than twice (each failure reverting to the old
// commit point: the cost of a commit interval per failure), or a count above
// exact (the cycle at the failed record holding effects of records at or
// after it, applied again after the revert) or below (a cycle that missed
// records before it).
func TestFailedRecordRevertsToACycleAtIt(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxRetries int
		failures   int  // deliveries of the record that fail
		dead       bool // the record is dead-lettered (count never applies it)
	}{
		{name: "succeeds", maxRetries: 1000, failures: 4},
		{name: "dead-lettered", maxRetries: 3, failures: 1000, dead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			brokers := testbroker.Brokers(t)
			id := testbroker.Topic(t, "app")
			a := app.New(id,
				app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
				app.WithCommitInterval(time.Hour), app.WithIdleCommit(-1),
				app.WithLogger(testLogger()),
				app.WithTopicPrefix(id+"-"),
				app.WithRedelivery(app.Redelivery{MaxRetries: tc.maxRetries, Backoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}),
			)
			in := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(parts))
			counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
			tally := table.New(a, "tally", codec.String(), codec.DecimalInt64())
			var failedAttempts atomic.Int64
			var seen deliveries // partition 0, as the tally agent saw it
			agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
				for ev := range s.Events() {
					fail := ev.Value == "fail" && failedAttempts.Load() < int64(tc.failures)
					if fail && tc.dead {
						failedAttempts.Add(1)
						return errors.New("poison")
					}
					counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
					if fail {
						failedAttempts.Add(1)
						return errors.New("not yet")
					}
				}
				return s.Err()
			}, agent.WritesTo(counts))
			agent.New(a, "tally", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
				for ev := range s.Events() {
					if ev.Partition() == 0 {
						seen.add(ev.Offset())
					}
					tally.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
				}
				return s.Err()
			}, agent.WritesTo(tally))
			dir := t.TempDir()
			_, stop := goWorker(t, a, brokers, dir)
			client := testbroker.Client(t, brokers)
			testbroker.WaitTopic(t, client, in.Name())

			// Three keys of partition 0, one of each other partition.
			p0 := []string{wordPerPartition("a")[0], wordPerPartition("b")[0], wordPerPartition("c")[0]}
			others := wordPerPartition("d")[1:]
			want := map[string]int{}
			var recs []kv
			add := func(k, v string, n int) {
				for range n {
					recs = append(recs, kv{k, v})
					want[k]++
				}
			}
			for i := range 90 {
				add(p0[i%3], "x", 1)
			}
			failAt := len(recs)
			add(p0[0], "fail", 1)
			for i := range 90 {
				add(p0[i%3], "x", 1)
			}
			for _, k := range others {
				add(k, "x", 30)
			}
			offs := send(t, brokers, in.Name(), recs...)
			failOff := offs[failAt][1]
			last := offs[len(offs)-1-30*len(others)][1] // partition 0's last offset

			deliveriesOfFailed := tc.failures + 1
			if tc.dead {
				deliveriesOfFailed = tc.maxRetries + 1
			}
			waitUntil(t, 60*time.Second, "the failed record resolved and partition 0 read to its end", func() bool {
				return seen.get(failOff) >= deliveriesOfFailed && seen.get(last) >= 1
			})
			// Let the other partitions and the last records resolve; the
			// final cycle of the clean stop commits them.
			time.Sleep(200 * time.Millisecond)
			if err := stop(); err != nil {
				t.Fatal(err)
			}

			if n := seen.get(failOff); n != deliveriesOfFailed {
				t.Errorf("the failed record was delivered %d times, want %d", n, deliveriesOfFailed)
			}
			for off := offs[0][1]; off <= last; off++ {
				if off == failOff {
					continue
				}
				// Once, and once more for the records the first failure
				// reverted (before the failed record: since the task's
				// first cycle; after it: handed out before the failure).
				if n := seen.get(off); n < 1 || n > 2 {
					t.Errorf("offset %d of partition 0 delivered %d times, want 1 or 2 (failed record at %d)", off, n, failOff)
				}
			}
			wantCounts(t, storeTable(t, dir, "tally"), want)
			if tc.dead {
				want[p0[0]]-- // count never applied the dead-lettered record
			}
			wantCounts(t, storeTable(t, dir, "counts"), want)
		})
	}
}
