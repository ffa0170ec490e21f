package app

import (
	"errors"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// namedCutter is a table runtime that only has a name: join compares the
// tables its claims bring by name and never cuts them here.
type namedCutter string

func (n namedCutter) Name() string               { return string(n) }
func (n namedCutter) Cut(int32) tablestate.Cycle { return nil }
func (n namedCutter) Drop(int32)                 {}
func (n namedCutter) CacheSize(int32) (int, int) { return 0, 0 }

// TestTaskJoinRefusesOtherTables: the claims of one task (the co-partitioned
// topics' partitions p) must bring the same tables. A claim that joined with
// fewer (its partition no longer active in the assignment it read) used to be
// let in silently, and the task then never cut the other claim's tables:
// their writes were dropped while the offsets committed (lost updates).
func TestTaskJoinRefusesOtherTables(t *testing.T) {
	w := &Worker{app: New("task-join"), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w.metrics = newMetrics(w)
	w.txn = newTxnCommitter(w) // ExactlyOnce: the tasks have no loop of their own
	w.tasks.w = w
	k := taskKey{8, 5}
	a, b := namedCutter("commits-per-actor"), namedCutter("events-per-dir")
	tr, err := w.tasks.join(k, nil, []tablestate.Cutter{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.tasks.join(k, nil, nil); err == nil || !strings.Contains(err.Error(), "a claim brings tables [], the task runs [commits-per-actor events-per-dir]") {
		t.Fatalf("a claim without the task's tables joined: err %v", err)
	}
	if _, err := w.tasks.join(k, nil, []tablestate.Cutter{a}); err == nil {
		t.Fatal("a claim with one of the task's two tables joined")
	}
	tr2, err := w.tasks.join(k, nil, []tablestate.Cutter{b, a})
	if err != nil || tr2 != tr {
		t.Fatalf("the same tables in another order: task %p (want %p), err %v", tr2, tr, err)
	}
	if tr.refs != 2 {
		t.Fatalf("refs %d, want 2 (the refused claims do not count)", tr.refs)
	}
}

// TestTaskOwnsItsTables: a task owns the table partitions it cuts from its
// first claim to its last (takeTable, releaseTable); the worker's tables
// accept writes only meanwhile (tablestate.State.OwnedWrites).
func TestTaskOwnsItsTables(t *testing.T) {
	w := &Worker{app: New("task-join"), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	w.metrics = newMetrics(w)
	w.txn = newTxnCommitter(w) // ExactlyOnce: the tasks have no loop of their own
	w.tasks.w = w
	def := table.New(New("task-join"), "counts", codec.String(), codec.DecimalInt64(), table.Partitions(8))
	st := tablestate.NewState(def, 8, stores.NewMemory(), nil)
	st.OwnedWrites = true
	if err := st.SetActive(5, true); err != nil {
		t.Fatal(err)
	}
	k := taskKey{8, 5}
	if _, err := w.tasks.join(k, nil, []tablestate.Cutter{st}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.tasks.join(k, nil, []tablestate.Cutter{st}); err != nil {
		t.Fatalf("the task's second claim: %v", err)
	}
	if err := st.Own(5); !errors.Is(err, tablestate.ErrOwned) {
		t.Fatalf("partition 5 while the task runs: Own = %v, want ErrOwned", err)
	}
	w.tasks.leave(k)
	if err := st.Own(5); !errors.Is(err, tablestate.ErrOwned) {
		t.Fatalf("partition 5 while the task has a claim left: Own = %v, want ErrOwned", err)
	}
	w.tasks.leave(k)
	if err := st.Own(5); err != nil {
		t.Fatalf("partition 5 after the task closed: Own = %v, want nil (released)", err)
	}
	st.Disown(5)

	// A new task of the key waits while the previous one is closing (its
	// last claim left, its tables not yet given back): taking them first
	// would fail with ErrOwned and leave the partition unprocessed.
	released := make(chan struct{})
	w.tasks.mu.Lock()
	w.tasks.closing = map[taskKey]chan struct{}{k: released}
	w.tasks.mu.Unlock()
	joined := make(chan error, 1)
	go func() {
		_, err := w.tasks.join(k, nil, []tablestate.Cutter{st})
		joined <- err
	}()
	select {
	case err := <-joined:
		t.Fatalf("join returned (%v) while the key's previous task was closing", err)
	case <-time.After(50 * time.Millisecond):
	}
	w.tasks.mu.Lock()
	delete(w.tasks.closing, k)
	w.tasks.mu.Unlock()
	close(released)
	if err := <-joined; err != nil {
		t.Fatalf("join after the previous task closed: %v", err)
	}
	if err := st.Own(5); !errors.Is(err, tablestate.ErrOwned) {
		t.Fatalf("partition 5 after the new task joined: Own = %v, want ErrOwned", err)
	}
}
