package app

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// Two agents of one topic update the same key of one table partition, each
// once per record: Update's read and write are one step for the partition, so
// none of the 2×n increments is lost (a separate Get and Set would lose some
// when the agents interleave).
func TestConcurrentUpdatesFromTwoAgentsAreNotLost(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t))
	counts := table.New(f.app, "counts", codec.String(), codec.DecimalInt64())
	for _, name := range []string{"a", "b"} {
		agent.New(f.app, name, f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				// The pause inside the read-modify-write lets the other agent's
				// update of the same key interleave, were it not serialized.
				counts.Update(ev, "x", func(n int64) int64 { time.Sleep(100 * time.Microsecond); return n + 1 })
			}
			return s.Err()
		}, agent.WritesTo(counts))
	}
	f.start()
	const n = 1000
	vals := make([]string, n)
	for i := range vals {
		vals[i] = strconv.Itoa(i)
	}
	f.produce(vals...) // one partition: every key, "x" included, is in partition 0
	f.eventually(60*time.Second, "committed offset 1000", func() bool { return f.committed() == n })
	var last string
	for _, m := range f.read(counts.Changelog()) {
		if string(m.Key) == "x" {
			last = string(m.Value)
		}
	}
	if last != strconv.Itoa(2*n) {
		t.Fatalf("count[x] = %s, want %d", last, 2*n)
	}
}

// An agent that fails once on v2 makes v2 and the records after it be
// delivered again; the other agent counts every record in a table, and its
// counts stay exact: the retry restarts the session, and the restore rebuilds
// the table partition that held effects of the records after v2.
func TestRetryDoesNotCountTwice(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t))
	counts := table.New(f.app, "counts", codec.String(), codec.DecimalInt64())
	agent.New(f.app, "count", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(counts))
	var failed atomic.Bool
	agent.New(f.app, "flaky", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if ev.Value == "v2" && failed.CompareAndSwap(false, true) {
				time.Sleep(300 * time.Millisecond) // "count" runs ahead over v3, v4
				return fmt.Errorf("transient failure on %s", ev.Value)
			}
		}
		return s.Err()
	})
	f.start()
	f.produce("v0", "v1", "v2", "v3", "v4")
	f.eventually(30*time.Second, "committed offset 5", func() bool { return f.committed() == 5 })
	got := map[string]string{}
	for _, m := range f.read(counts.Changelog()) {
		got[string(m.Key)] = string(m.Value)
	}
	for _, v := range []string{"v0", "v1", "v2", "v3", "v4"} {
		if got[v] != "1" {
			t.Errorf("count[%s] = %s, want 1", v, got[v])
		}
	}
}
