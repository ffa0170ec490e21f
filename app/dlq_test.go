package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// A rejected record is dead-lettered once, also when a later record's
// failure restarts the partition from its last commit cycle, which lies
// before the rejected record: the agent sees it again and rejects it again,
// and the dead letter is not written a second time (issue #26: under
// at-least-once every bad record was dead-lettered twice, and `dlq replay`
// sent it back twice). The agent writes a table (so the partition has a
// task, on Pebble, and restarts revert to its last cycle); no cycle runs
// before the failure (a one-minute interval, no idle commit).
func TestRejectedRecordDeadLetteredOnceAcrossRestart(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t), WithCommitInterval(time.Minute), WithIdleCommit(-1))
	counts := table.New(f.app, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(1))
	var seen counter
	agent.New(f.app, "a", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			n := seen.inc(ev.Value)
			switch {
			case ev.Value == "bad1":
				ev.Reject(errors.New("bad value"))
				continue
			case ev.Value == "fail3" && n == 1:
				return errors.New("transient") // redelivered: the partition restarts
			}
			if _, err := counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 }); err != nil {
				return err
			}
		}
		return s.Err()
	})
	w, err := f.app.NewWorker(WorkerOptions{}) // Pebble stores in the fixture's data dir
	if err != nil {
		t.Fatal(err)
	}
	stop := testbroker.Start(t, w)
	f.produce("v0", "bad1", "v2", "fail3", "v4")
	// The second delivery of fail3 comes after the restart handed out bad1
	// again and resolved it (the cycle before the failed record waits for
	// it), so a second dead letter would be acknowledged by now.
	f.eventually(20*time.Second, "fail3 delivered again", func() bool { return seen.get("fail3") >= 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := seen.get("bad1"); n != 2 {
		t.Fatalf("bad1 handed out %d times, want 2 (the restart must go back before it for this test)", n)
	}
	dlq := f.read(f.app.DeadLetterTopic("a"))
	if len(dlq) != 1 || string(dlq[0].Value) != "bad1" || header(dlq[0], HeaderOffset) != "1" {
		var offs []string
		for _, m := range dlq {
			offs = append(offs, header(m, HeaderOffset))
		}
		t.Fatalf("dead-letter topic holds %d records (source offsets %v), want bad1@1 once", len(dlq), offs)
	}
	if w.DeadLettered() != 1 {
		t.Errorf("worker counted %d dead letters, want 1", w.DeadLettered())
	}
}

// deadLettered keeps an (offset, agent) pair until the marked offset passes
// it; a nil set (ExactlyOnce) records nothing.
func TestDeadLetteredPrunesBelowMarked(t *testing.T) {
	var d deadLettered
	d.add(4, "a")
	d.add(4, "b")
	d.add(9, "a")
	if !d.has(4, "a") || !d.has(4, "b") || d.has(4, "c") || !d.has(9, "a") {
		t.Fatalf("set %v", d.m)
	}
	d.prune(4) // 4 is the next offset to read: not behind the mark yet
	if !d.has(4, "a") {
		t.Fatal("pruned the offset at the mark")
	}
	d.prune(5)
	if d.has(4, "a") || d.has(4, "b") || !d.has(9, "a") {
		t.Fatalf("after prune(5): %v", d.m)
	}
	var none *deadLettered
	none.add(1, "a")
	none.prune(0)
	if none.has(1, "a") {
		t.Fatal("a nil set remembered a dead letter")
	}
}
