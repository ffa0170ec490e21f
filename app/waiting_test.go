package app_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// TestTaskWaitsInFlight holds the first record unresolved (a derived record
// bound to it and answered late) while 3000 more arrive, with a write cache
// far from its limit and no commit cycle due: the only brake left is the
// source's in-flight byte bound (512 KiB; a record of 6 bytes counts 518),
// which every record behind the held one keeps full. The task's status
// names it (WaitInFlight) and the source stands still after about 1,013
// records went out; after the release it drains, every key counted once,
// and nothing waits.
func TestTaskWaitsInFlight(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	const n = 3000
	dir := t.TempDir()
	a := app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(time.Hour), // no cut: the window stays open
		app.WithIdleCommit(-1),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id+"-"),
		app.WithCacheBytes(16<<20))
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(1))
	seen := table.New(a, "seen", codec.String(), codec.DecimalInt64())
	held := make(chan func(error), 1)
	agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if ev.Key == "hold" {
				done, ok := evbind.Of[*tablestate.Env](ev).BindPersist()
				if !ok {
					return errors.New("could not bind to the held record")
				}
				held <- done
			}
			seen.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(seen))
	w, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, in.Name())
	sendHeldAndKeys(t, brokers, in.Name(), n)
	release := once(<-held)
	t.Cleanup(func() { release(errors.New("the test ended with the record held")) })

	task := func() app.TaskStatus {
		t.Helper()
		ts := w.Tasks()
		if len(ts) != 1 {
			t.Fatalf("tasks %+v, want 1", ts)
		}
		return ts[0]
	}
	var ts app.TaskStatus
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ts = task(); ts.Waiting == app.WaitInFlight {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the task does not wait for in-flight bytes after 30 s: %+v", ts)
		}
	}
	// 512 KiB of records counting 512 bytes each beside their 6 bytes of
	// key and value ("k0000", "x"; "hold" is one shorter), the last one
	// over; Handed counts the rest of that record's fetched batch too (up
	// to 256 records: the claim source counts a batch when it hands it to
	// the source group, whose emit then waits inside it).
	const want = (512<<10)/(512+6) + 1
	// Handed and Waiting are read one after the other: the first sample
	// can count a batch before the one whose emit waits. Two later ones
	// agree.
	time.Sleep(500 * time.Millisecond)
	ts = task()
	time.Sleep(300 * time.Millisecond)
	still := task()
	t.Logf("waiting for %q with %d handed out, then %q with %d", ts.Waiting, ts.Handed, still.Waiting, still.Handed)
	if still.Waiting != app.WaitInFlight || still.Handed != ts.Handed || ts.Handed < want-1 || ts.Handed > want+256 {
		t.Fatalf("waiting for %q with %d handed out, then %q with %d: want %q standing at %d to %d", ts.Waiting, ts.Handed, still.Waiting, still.Handed, app.WaitInFlight, want-1, want+256)
	}
	release(nil)
	testbroker.Eventually(t, 30*time.Second, "every record handed out", func() bool { return task().Handed == n+1 })
	if ts := task(); ts.Waiting != "" {
		t.Errorf("after the release the task waits for %q", ts.Waiting)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkSeenOnce(t, dir, n)
}
