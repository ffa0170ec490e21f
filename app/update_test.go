package app

import (
	"context"
	"strconv"
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
				if _, err := counts.Update(ev, "x", func(n int64) int64 { time.Sleep(100 * time.Microsecond); return n + 1 }); err != nil {
					return err
				}
			}
			return s.Err()
		})
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
