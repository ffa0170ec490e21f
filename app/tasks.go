package app

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/table"
)

// taskKey names a task: the partition count of its co-partitioned topics and
// tables, and the partition.
type taskKey struct{ parts, p int32 }

// taskRun is a running task: its commit-cycle loop and the claims using it.
type taskRun struct {
	t      *task.Task
	refs   int // claims using the task; guarded by taskSet.mu
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	failed chan struct{} // closed when the task was abandoned
	fail   sync.Once
}

// abandon abandons the task (task.Task.Abandon) and fails every claim of it:
// the partition restarts from its committed offsets.
func (tr *taskRun) abandon(err error) {
	tr.t.Abandon(err)
	tr.fail.Do(func() { close(tr.failed) })
}

// taskSet holds the worker's running tasks.
type taskSet struct {
	w  *Worker
	mu sync.Mutex
	m  map[taskKey]*taskRun // guarded by mu
}

// join returns the task of k for a claim of sess, starting it (and its cycle
// loop) for the first claim; leave ends the claim's use.
func (ts *taskSet) join(k taskKey, sess sarama.ConsumerGroupSession, states []*table.State) *taskRun {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[taskKey]*taskRun{}
	}
	if tr := ts.m[k]; tr != nil {
		tr.refs++
		return tr
	}
	ctx, cancel := context.WithCancel(context.Background())
	tr := &taskRun{t: &task.Task{Partition: k.p, Tables: states, Commit: sess.Commit}, refs: 1,
		wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}), failed: make(chan struct{})}
	ts.m[k] = tr
	go ts.loop(ctx, k, tr)
	return tr
}

// leave ends one claim's use of the task of k; the last one stops its loop
// (waiting for a cycle in progress).
func (ts *taskSet) leave(k taskKey) {
	ts.mu.Lock()
	tr := ts.m[k]
	if tr == nil {
		ts.mu.Unlock()
		return
	}
	tr.refs--
	last := tr.refs <= 0
	if last {
		delete(ts.m, k)
	}
	ts.mu.Unlock()
	if last {
		tr.cancel()
		<-tr.done
	}
}

// wake asks the task of k for a cycle now (a table cache is full).
func (ts *taskSet) wake(k taskKey) {
	ts.mu.Lock()
	tr := ts.m[k]
	ts.mu.Unlock()
	if tr != nil {
		select {
		case tr.wake <- struct{}{}:
		default:
		}
	}
}

// cutBudget bounds how long a periodic cycle waits for the records below its
// commit point to resolve (agents pulling past them, sinks acknowledged); the
// sources hand out no record meanwhile. A cycle that cannot cut in time is
// tried again at the next interval.
func (w *Worker) cutBudget() time.Duration {
	return min(max(w.cfg.CommitInterval, time.Second), w.drainBudget())
}

// flushBudget bounds how long a periodic cycle waits for its changelog acks
// before the task is abandoned (the producer retries within it).
func (w *Worker) flushBudget() time.Duration {
	r := w.cfg.Rebalance
	if r <= 0 {
		r = 60 * time.Second
	}
	return max(r, 30*time.Second)
}

// loop runs the task's cycles every commit interval and when a cache is
// full, until ctx ends. An abandoned cycle fails the task's claims.
func (ts *taskSet) loop(ctx context.Context, k taskKey, tr *taskRun) {
	defer close(tr.done)
	w := ts.w
	tick := time.NewTicker(w.cfg.CommitInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-tr.wake:
		}
		cctx, cancel := context.WithTimeout(ctx, w.flushBudget())
		st, err := tr.t.Cycle(cctx, w.cutBudget())
		cancel()
		switch {
		case err == nil:
			if st.Records > 0 {
				w.metrics.cycleRecords.Add(float64(st.Records))
				w.metrics.cycleSeconds.Observe(st.Elapsed.Seconds())
			}
		case errors.Is(err, task.ErrAbandoned):
			if ctx.Err() == nil {
				w.log.Warn("commit cycle abandoned; the partition restarts from its committed offsets", "partition", k.p, "err", err)
			}
			tr.abandon(err)
			<-ctx.Done()
			return
		case ctx.Err() == nil:
			w.log.Debug("commit cycle postponed", "partition", k.p, "err", err)
		}
	}
}
