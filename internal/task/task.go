// Package task runs the commit cycles of one partition on one worker: the
// claimed source partitions that feed it (one per co-partitioned topic) and
// the partitions of the tables they write.
//
// A cycle (docs/tables.md, "Commit cycles"):
//
//  1. Cut: every source pauses (hands out no further record) and names the
//     cycle's commit point, the offset after the last record it handed out;
//     the task waits until every record below each commit point is resolved
//     (its agents pulled past it, its sink records acknowledged); then each
//     table partition's write cache is cut, and the sources resume. Because
//     the agents had moved past every record below the commit point and no
//     record at or after it was handed out, the cut holds exactly the effects
//     of the records below the commit points: that is what makes a cycle
//     all-or-nothing with the offset commit.
//  2. Flush: one changelog record per dirty key, stamped with the writer
//     epoch, the cycle's sources and the key's before-image
//     (changelog.Stamp); the task waits for the broker's acks.
//  3. Commit: each source may now commit up to its commit point; the group's
//     offsets are committed.
//  4. Apply: each table partition's cycle goes to the store in one batch with
//     the changelog checkpoint and the marks.
//
// At most one cycle of a task runs at a time. The store never holds a cycle
// whose offsets were not committed first, so a crash anywhere leaves a store
// a restore only has to bring forward (docs/tables.md lists every crash
// point).
package task

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"sync"
	"time"
)

// Source is one claimed source partition feeding a task (the worker's claim
// producer implements it).
type Source interface {
	Topic() string
	Partition() int32
	// Pause stops handing out records until Resume and returns the commit
	// point: the offset after the last record handed out.
	Pause() int64
	// Resume undoes Pause.
	Resume()
	// AwaitResolved returns when every record below boundary is resolved, or
	// an error when one failed, the source stopped, ctx ended, or a record
	// was handed out since Pause (the cut would hold its effects).
	AwaitResolved(ctx context.Context, boundary int64) error
	// Committable lets the source commit offsets up to boundary.
	Committable(boundary int64)
	// Handed is how many records the source handed out so far.
	Handed() int64
}

// Offset is a source partition's commit offset.
type Offset struct {
	Topic     string
	Partition int32
	Offset    int64
}

// Stats describes one finished cycle.
type Stats struct {
	// Records is how many changelog records the cycle wrote (one per dirty
	// key and table).
	Records int
	// Cut is how long the sources were paused; Elapsed the whole cycle.
	Cut, Elapsed time.Duration
}

// Task is one partition's commit cycles. Add and Remove the sources as claims
// start and end; Cycle runs one cycle.
type Task struct {
	// Partition is the source and table partition.
	Partition int32
	// Tables are the runtimes of the tables written in this partition
	// (plain, windowed and global tables).
	Tables []tablestate.Cutter
	// Commit commits the sources' offsets (each the offset of the next
	// record to process) synchronously and reports whether the broker took
	// them; it is called between the flush and the apply of a cycle that
	// wrote records. An error abandons the task: the cycle is not applied,
	// so the store never holds a cycle whose offsets were not committed (a
	// later cycle's before-images are read from it). Nil: no commit.
	Commit func(ctx context.Context, offsets []Offset) error
	// CacheLimit is the hard limit of each table partition's write cache,
	// in bytes as tablestate.State.CacheSize counts them (0 or less: none). At
	// or over it, OverLimit names the table and the sources hand out no
	// further record until a cycle cut the cache (backpressure; the
	// worker's claim source waits, see OverLimit).
	CacheLimit int

	// cycle holds the one token of running a cycle (a channel, so that a
	// wait for it can end with a context).
	cycle   chan struct{}
	once    sync.Once
	mu      sync.Mutex
	sources []Source // guarded by mu
	broken  error    // set by Abandon: no cycle runs again; guarded by mu
	// drops counts the times the tables' caches were dropped (Abandon,
	// Reset). It is raised before the caches go, so a reader that sees the
	// same count before and after a read of the caches read no cache that
	// a drop emptied in between (Drops). Guarded by mu.
	drops uint64
}

func (t *Task) init() {
	t.once.Do(func() {
		t.cycle = make(chan struct{}, 1)
	})
}

// lock takes the cycle token, or returns ctx's error.
func (t *Task) lock(ctx context.Context) error {
	t.init()
	select {
	case t.cycle <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (t *Task) unlock() { <-t.cycle }

// Abandon ends the task's cycles: the table caches (the effects of records
// processed since the last cycle) are dropped and every later Cycle fails
// with an error wrapping ErrAbandoned and err. A source that stops without a
// final cycle that covered it must abandon its task: the caches then hold
// effects of its records that no cycle will commit, and flushing them with
// another source's cycle would apply them twice once the records are
// processed again.
func (t *Task) Abandon(err error) {
	t.mu.Lock()
	if t.broken == nil {
		t.broken = fmt.Errorf("%w: %w", ErrAbandoned, err)
	}
	t.mu.Unlock()
	t.drop()
}

// Reset makes an abandoned task runnable again, its caches dropped: the
// partition restarts from the last cycle's commit point (the store holds
// every cycle up to it and nothing after). It waits for a cycle in progress.
func (t *Task) Reset() {
	_ = t.lock(context.Background())
	defer t.unlock()
	t.drop()
	t.mu.Lock()
	t.broken = nil
	t.mu.Unlock()
}

// Err returns the error the task was abandoned with, nil while it runs.
func (t *Task) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.broken
}

// Add adds a source (a claim of a co-partitioned topic started); it waits for
// a cycle in progress. Invariant: a cycle's cut holds effects only of the
// sources it paused, awaited, stamps and commits (the sources when it
// began), so a source must not hand out a record while a cycle that did not
// pause it runs: its effects would be cut with a stamp that does not name it
// and be taken as committed by a restore while its offset is not
// (TestSourceAddedDuringCycleWaitsForIt).
func (t *Task) Add(s Source) {
	_ = t.lock(context.Background())
	defer t.unlock()
	t.mu.Lock()
	t.sources = append(t.sources, s)
	t.mu.Unlock()
}

// Remove removes a source; it waits for a cycle in progress.
func (t *Task) Remove(s Source) {
	_ = t.lock(context.Background())
	defer t.unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, x := range t.sources {
		if x == s {
			t.sources = append(t.sources[:i], t.sources[i+1:]...)
			return
		}
	}
}

// Handed returns how many records the task's sources handed out so far.
func (t *Task) Handed() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for _, s := range t.sources {
		n += s.Handed()
	}
	return n
}

// OverLimit returns the name of a table whose write cache of the task's
// partition holds CacheLimit bytes or more, "" when none does (or there is
// no limit).
//
// A source must not hand out further records while it is over (the worker's
// claim source waits before each fetched batch, and looks again whenever a
// cycle resumes it): a cut waits until every record below the commit point is
// resolved, so the wait must never be inside a table write of a record below
// it (that record would never resolve, and the cut that empties the cache
// would never come). Records already handed out still complete and write, so
// a cache holds at most CacheLimit plus what the records handed out before
// the source looked write.
func (t *Task) OverLimit() string {
	if t.CacheLimit <= 0 {
		return ""
	}
	for _, tb := range t.Tables {
		if _, b := tb.CacheSize(t.Partition); b >= t.CacheLimit {
			return tb.Name()
		}
	}
	return ""
}

// SourceList returns the sources feeding the task.
func (t *Task) SourceList() []Source {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Source(nil), t.sources...)
}

// Sources returns how many sources feed the task.
func (t *Task) Sources() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sources)
}

// ErrStopped is returned (wrapping the cause) by a Cycle of a task that was
// abandoned before the cycle started: nothing was done, and the caller that
// abandoned it decides what happens next (restart the partition, Reset).
var ErrStopped = errors.New("task abandoned; no cycle runs")

// ErrAbandoned wraps the error of a cycle that could not finish: its writes
// were dropped and its offsets not committed, so the records below its
// commit point will be processed again (by this worker after a restart of
// the partition, or by the next owner).
var ErrAbandoned = errors.New("commit cycle abandoned")

// Cycle runs one commit cycle of t alone (see the package doc), committing
// through t.Commit when the cycle wrote changelog records; it is the
// at-least-once cycle, and the same pipeline as Together (one task, its own
// commit). cut bounds the wait for the records below the commit points to
// resolve; ctx bounds the whole cycle, the wait for a cycle in progress
// included.
//
// A failure to cut (a record failed, the source stopped, the cut budget
// passed) changes nothing: the writes stay in the caches for a later cycle.
// A failure to flush (a changelog write failed, or ctx ended while waiting
// for acks) or to commit abandons the task (Abandon): nothing is committed
// or applied, and the error wraps ErrAbandoned. The partition must then stop
// and restart from its committed offsets: the caches no longer hold the
// effects of the records processed since the last cycle. A task abandoned
// before the cycle runs nothing: the error wraps ErrStopped.
func (t *Task) Cycle(ctx context.Context, cut time.Duration) (Stats, error) {
	commit := func(ctx context.Context, offsets []Offset, flushed bool) error {
		// A cycle that wrote nothing commits nothing: its sources only
		// mark their offsets (Committable), which the session commits.
		if !flushed || t.Commit == nil {
			return nil
		}
		return t.Commit(ctx, offsets)
	}
	return cycle(ctx, []*Task{t}, cut, commit, true)
}

// Drops returns how many times the task's table caches were dropped (an
// abandoned cycle, a reset): the effects of the records processed since the
// last cycle left the caches then, until the records are processed again.
// A reader that takes Drops before and after reading the caches, and sees
// the same count, read no cache emptied in between.
func (t *Task) Drops() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.drops
}

// drop discards the tables' caches of the partition (drops is raised first,
// see Drops).
func (t *Task) drop() {
	t.mu.Lock()
	t.drops++
	t.mu.Unlock()
	for _, tb := range t.Tables {
		tb.Drop(t.Partition)
	}
}
