package app

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/table"
)

// namedCutter is a table runtime that only has a name: join compares the
// tables its claims bring by name and never cuts them here.
type namedCutter string

func (n namedCutter) Name() string          { return string(n) }
func (n namedCutter) Cut(int32) table.Cycle { return nil }
func (n namedCutter) Drop(int32)            {}

// TestTaskJoinRefusesOtherTables: the claims of one task (the co-partitioned
// topics' partitions p) must bring the same tables. A claim that joined with
// fewer (its partition no longer active in the assignment it read) used to be
// let in silently, and the task then never cut the other claim's tables:
// their writes were dropped while the offsets committed (lost updates).
func TestTaskJoinRefusesOtherTables(t *testing.T) {
	w := &Worker{log: slog.New(slog.NewTextHandler(io.Discard, nil)), txn: &txnCycles{}}
	w.metrics = newMetrics(w)
	w.tasks.w = w
	k := taskKey{8, 5}
	a, b := namedCutter("commits-per-actor"), namedCutter("events-per-dir")
	tr, err := w.tasks.join(k, nil, []table.Cutter{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.tasks.join(k, nil, nil); err == nil || !strings.Contains(err.Error(), "a claim brings tables [], the task runs [commits-per-actor events-per-dir]") {
		t.Fatalf("a claim without the task's tables joined: err %v", err)
	}
	if _, err := w.tasks.join(k, nil, []table.Cutter{a}); err == nil {
		t.Fatal("a claim with one of the task's two tables joined")
	}
	tr2, err := w.tasks.join(k, nil, []table.Cutter{b, a})
	if err != nil || tr2 != tr {
		t.Fatalf("the same tables in another order: task %p (want %p), err %v", tr2, tr, err)
	}
	if tr.refs != 2 {
		t.Fatalf("refs %d, want 2 (the refused claims do not count)", tr.refs)
	}
}
