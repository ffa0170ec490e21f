package task

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/changelog"
)

// Together runs one commit cycle over many tasks at once, with a single
// commit of every task's offsets: the exactly-once cycle, where the worker's
// transaction holds the sink and changelog records of all its tasks, so no
// task can commit alone (Kafka Streams' eos-v2 commits all the tasks of a
// thread in one transaction for the same reason, KIP-447).
//
// The caller must keep every source of every task from handing out records
// for the whole call (the worker's transaction gate), so the cut, the flush
// and commit see the same records. The steps are those of Task.Cycle, which
// is this pipeline for one task: every source's commit point, the wait for
// the records below them to resolve (bounded by cut), every table
// partition's cut, the flush of every cut (one changelog record per dirty
// key), then commit with every source's offset, and only after it succeeded
// Committable and Apply. The guarantees differ only in the commit (the
// committer): at-least-once commits one task's offsets, and only when its
// cycle wrote records; exactly-once commits the transaction, always.
//
// commit receives the offsets of every source of every task (empty when no
// task has a source) and flushed, whether any changelog record was written;
// it commits the transaction. It is called even when nothing was written, so
// that the sink records of a stateless task are committed with its offsets.
//
// A failure to cut changes nothing and is returned (the caches keep their
// writes, the transaction stays open). A failure to flush or to commit
// abandons every task (Abandon): no cycle is applied, and the error wraps
// ErrAbandoned; the caller must abort the transaction and restart the
// partitions from their committed offsets. Tasks abandoned before the call
// are skipped (their partitions are stopping).
func Together(ctx context.Context, tasks []*Task, cut time.Duration, commit CommitFunc) (Stats, error) {
	return cycle(ctx, tasks, cut, commit, false)
}

// CommitFunc commits a cycle (the committer of the pipeline Cycle and
// Together share): offsets are the commit offsets of every source of the
// cycle's tasks (each the offset of the next record to process, sorted by
// topic and partition), flushed whether the cycle wrote changelog records.
// An error abandons the cycle's tasks (nothing is applied).
type CommitFunc func(ctx context.Context, offsets []Offset, flushed bool) error

// cycle is the one commit-cycle pipeline (Cycle, Together). single: a task
// abandoned before the cycle fails it with ErrStopped (Cycle), where
// Together skips abandoned tasks (their partitions are stopping).
func cycle(ctx context.Context, tasks []*Task, cut time.Duration, commit CommitFunc, single bool) (Stats, error) {
	var st Stats
	start := time.Now()
	var held []*Task
	defer func() {
		for _, t := range held {
			t.unlock()
		}
	}()
	for _, t := range tasks {
		if err := t.lock(ctx); err != nil {
			return st, fmt.Errorf("waiting for the cycle in progress: %w", err)
		}
		held = append(held, t)
	}
	type src struct {
		t     *Task
		s     Source
		bound int64
	}
	var srcs []src
	var live []*Task
	for _, t := range tasks {
		if err := t.Err(); err != nil {
			if single {
				return st, fmt.Errorf("%w: %w", ErrStopped, err)
			}
			continue
		}
		live = append(live, t)
		t.mu.Lock()
		for _, s := range t.sources {
			srcs = append(srcs, src{t: t, s: s})
		}
		t.mu.Unlock()
	}
	for i := range srcs {
		srcs[i].bound = srcs[i].s.Pause()
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			for _, s := range srcs {
				s.s.Resume()
			}
		}
	}
	defer resume()
	cctx, cancel := context.WithTimeout(ctx, cut)
	defer cancel()
	// Twice: the second pass returns at once unless a source awaited early
	// handed out a record while a later one was awaited (it must not while
	// paused; AwaitResolved refuses the cut if it did).
	for range 2 {
		for _, s := range srcs {
			if err := s.s.AwaitResolved(cctx, s.bound); err != nil {
				return st, fmt.Errorf("cut: %w", err)
			}
		}
	}
	type cutTask struct {
		t       *Task
		flushes []tablestate.Cycle
		sources []changelog.Source
	}
	var cuts []cutTask
	for _, t := range live {
		ct := cutTask{t: t}
		for _, tb := range t.Tables {
			if f := tb.Cut(t.Partition); f != nil {
				ct.flushes = append(ct.flushes, f)
			}
		}
		for _, s := range srcs {
			if s.t == t {
				ct.sources = append(ct.sources, changelog.Source{Topic: s.s.Topic(), Partition: s.s.Partition(), Offset: s.bound - 1})
			}
		}
		cuts = append(cuts, ct)
	}
	// The cut holds exactly the effects of the records below the commit
	// points: the sources may hand out records again (under exactly-once the
	// worker's transaction gate still holds them until the commit).
	resume()
	st.Cut = time.Since(start)
	fail := func(stage string, err error) (Stats, error) {
		for _, ct := range cuts {
			for _, f := range ct.flushes {
				f.Drop()
			}
		}
		err = fmt.Errorf("%s: %w", stage, err)
		for _, t := range live {
			t.Abandon(err)
		}
		return st, fmt.Errorf("%w: %w", ErrAbandoned, err)
	}
	var err error
	for _, ct := range cuts {
		for _, f := range ct.flushes {
			st.Records += f.Records()
			if err == nil {
				err = f.Send(ct.sources)
			}
		}
	}
	for _, ct := range cuts {
		for _, f := range ct.flushes {
			if werr := f.Wait(ctx); werr != nil && err == nil {
				err = werr
			}
		}
	}
	if err != nil {
		return fail("flush", err)
	}
	offsets := make([]Offset, 0, len(srcs))
	for _, s := range srcs {
		if s.bound < 0 {
			continue // handed out nothing yet: still at the group's initial offset (a sentinel, not an offset)
		}
		offsets = append(offsets, Offset{Topic: s.s.Topic(), Partition: s.s.Partition(), Offset: s.bound})
	}
	slices.SortFunc(offsets, func(a, b Offset) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	if err := commit(ctx, offsets, st.Records > 0); err != nil {
		return fail("commit", err)
	}
	for _, s := range srcs {
		s.s.Committable(s.bound)
	}
	var errs []error
	for _, ct := range cuts {
		for _, f := range ct.flushes {
			if aerr := f.Apply(); aerr != nil {
				// The transaction is committed but this store lacks the
				// cycle: only a restore from the changelog brings it back.
				ct.t.Abandon(fmt.Errorf("apply: %w", aerr))
				errs = append(errs, aerr)
				break
			}
		}
	}
	st.Elapsed = time.Since(start)
	if len(errs) > 0 {
		return st, fmt.Errorf("%w: apply: %w", ErrAbandoned, errors.Join(errs...))
	}
	return st, nil
}
