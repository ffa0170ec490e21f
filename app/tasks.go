package app

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// taskKey names a task: the partition count of its co-partitioned topics and
// tables, and the partition.
type taskKey struct{ parts, p int32 }

// Task states, as /api/assignment shows them and the "task state" log lines
// name them (keys task, partition, from, to).
const (
	// TaskRunning: the task's sources process records; cycles run.
	TaskRunning = "running"
	// TaskRestarting: a failed record's partition waits out its redelivery
	// backoff, caches dropped, before it reads again from the last commit
	// point.
	TaskRestarting = "restarting"
	// TaskSuspending: the partition is being given up: drain, final cycle.
	TaskSuspending = "suspending"
	// TaskAbandoned: a cycle could not flush, or the partition stopped
	// without a final cycle; its claims end and the session restarts.
	TaskAbandoned = "abandoned"
	// TaskClosed: the last claim left; the task is gone.
	TaskClosed = "closed"
)

// TaskStatus is one task as /api/assignment shows it.
type TaskStatus struct {
	// Partition and Partitions name the task: partition Partition of the
	// co-partitioned topics and tables with Partitions partitions.
	Partition  int32  `json:"partition"`
	Partitions int32  `json:"partitions"`
	State      string `json:"state"`
	// Sources is how many claimed topic partitions feed the task.
	Sources int `json:"sources"`
	// Tables are the names of the tables the task writes.
	Tables []string `json:"tables"`
	// Cycles counts the cycles that wrote records; Records the changelog
	// records they wrote; LastCycleMS the duration of the last one.
	Cycles      int64   `json:"cycles"`
	Records     int64   `json:"records"`
	LastCycleMS float64 `json:"last_cycle_ms"`
}

// taskRun is a running task: its commit-cycle loop and the claims using it.
type taskRun struct {
	t      *task.Task
	key    taskKey
	refs   int           // claims using the task; guarded by taskSet.mu
	state  string        // guarded by taskSet.mu
	cycles int64         // guarded by taskSet.mu
	recs   int64         // guarded by taskSet.mu
	last   time.Duration // guarded by taskSet.mu
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	failed chan struct{} // closed when the task was abandoned
	fail   sync.Once
}

// failedNow reports whether the task was abandoned by its cycles (or a
// claim's failed final cycle): its claims must end and the session restart.
func (tr *taskRun) failedNow() bool {
	select {
	case <-tr.failed:
		return true
	default:
		return false
	}
}

// abandon abandons the task (task.Task.Abandon) and fails every claim of it:
// the partition restarts from its committed offsets.
func (tr *taskRun) abandon(ts *taskSet, err error) {
	tr.t.Abandon(err)
	ts.set(tr, TaskAbandoned)
	tr.fail.Do(func() { close(tr.failed) })
}

// taskSet holds the worker's running tasks.
type taskSet struct {
	w  *Worker
	mu sync.Mutex
	m  map[taskKey]*taskRun // guarded by mu
}

// activator is a table runtime with per-partition activation of its own
// (table.GlobalState: every worker holds every partition, and writes the
// ones its tasks own).
type activator interface {
	Activate(p int32) error
	Deactivate(p int32)
}

// join returns the task of k for a claim of sess, starting it (and its cycle
// loop) for the first claim; leave ends the claim's use. Errors: activating
// a global table's partition (reading its store's marks).
func (ts *taskSet) join(k taskKey, sess sarama.ConsumerGroupSession, states []table.Cutter) (*taskRun, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[taskKey]*taskRun{}
	}
	if tr := ts.m[k]; tr != nil {
		tr.refs++
		return tr, nil
	}
	for i, st := range states {
		if a, ok := st.(activator); ok {
			if err := a.Activate(k.p); err != nil {
				for _, prev := range states[:i] {
					if a, ok := prev.(activator); ok {
						a.Deactivate(k.p)
					}
				}
				return nil, err
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	commit := func(ctx context.Context, offs []task.Offset) error {
		ts.w.commitMu.Lock()
		defer ts.w.commitMu.Unlock()
		if err := ts.w.commitSync(ctx, sess, offs); err != nil {
			return err
		}
		for _, o := range offs {
			sess.MarkOffset(o.Topic, o.Partition, o.Offset, "")
		}
		return nil
	}
	tr := &taskRun{t: &task.Task{Partition: k.p, Tables: states, Commit: commit}, key: k, refs: 1, state: TaskRunning,
		wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}), failed: make(chan struct{})}
	ts.m[k] = tr
	ts.w.log.Info("task state", "task", fmt.Sprintf("%d/%d", k.p, k.parts), "partition", k.p, "from", "created", "to", TaskRunning)
	ts.w.metrics.taskTransitions.WithLabelValues(TaskRunning).Inc()
	if ts.w.txn != nil {
		// ExactlyOnce: the worker's transaction cycles every task at once
		// (txn.go).
		cancel()
		close(tr.done)
		return tr, nil
	}
	go ts.loop(ctx, k, tr)
	return tr, nil
}

// set moves tr to state, logging and counting the transition.
func (ts *taskSet) set(tr *taskRun, state string) {
	ts.mu.Lock()
	from := tr.state
	tr.state = state
	ts.mu.Unlock()
	if from == state {
		return
	}
	ts.w.log.Info("task state", "task", fmt.Sprintf("%d/%d", tr.key.p, tr.key.parts), "partition", tr.key.p, "from", from, "to", state)
	ts.w.metrics.taskTransitions.WithLabelValues(state).Inc()
}

// status returns every task's status, by partition.
func (ts *taskSet) status() []TaskStatus {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make([]TaskStatus, 0, len(ts.m))
	for k, tr := range ts.m {
		st := TaskStatus{Partition: k.p, Partitions: k.parts, State: tr.state, Sources: tr.t.Sources(),
			Cycles: tr.cycles, Records: tr.recs, LastCycleMS: float64(tr.last.Microseconds()) / 1000}
		for _, s := range tr.t.Tables {
			st.Tables = append(st.Tables, s.Name())
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Partitions != out[j].Partitions {
			return out[i].Partitions < out[j].Partitions
		}
		return out[i].Partition < out[j].Partition
	})
	return out
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
		for _, st := range tr.t.Tables {
			if a, ok := st.(activator); ok {
				a.Deactivate(k.p)
			}
		}
		ts.set(tr, TaskClosed)
		if ts.w.txn != nil {
			ts.w.txn.closed(tr)
		}
	}
}

// wake asks the task of k for a cycle now (a table cache is full).
func (ts *taskSet) wake(k taskKey) {
	if x := ts.w.txn; x != nil {
		select {
		case x.wake <- struct{}{}:
		default:
		}
		return
	}
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

// firstCheck is how often a new task looks whether its sources handed out a
// record yet, for its first cycle (taskSet.loop).
const firstCheck = 10 * time.Millisecond

// loop runs the task's cycles every commit interval and when a cache is
// full, until ctx ends. An abandoned cycle fails the task's claims.
func (ts *taskSet) loop(ctx context.Context, k taskKey, tr *taskRun) {
	defer close(tr.done)
	w := ts.w
	tick := time.NewTicker(w.cfg.CommitInterval)
	defer tick.Stop()
	// An idle task cycles at once: when its sources handed out records since
	// the last cycle and none in the last idle interval (the partition is
	// caught up, or the input paused), nothing would join the batch by
	// waiting, and the state and the commit would only come later.
	var idleC <-chan time.Time
	if d := w.idleCommit(); d > 0 {
		idle := time.NewTicker(d)
		defer idle.Stop()
		idleC = idle.C
	}
	// The first cycle of a task comes as soon as its sources handed out a
	// record (checked every firstCheck), idle or not: after a hand-over or a
	// restart the partition's new state, and its owner's position, reach
	// the changelog and the group at once (standbys, global replicas and
	// readers of the changelog see the partition live again). Waiting for
	// the idle check instead cost up to 200 ms of every hand-over (measured
	// in bench/sidebyside's handover trace; docs/benchmarks.md).
	// Like the idle cycles, it is off when IdleCommit is negative.
	first := time.NewTicker(firstCheck)
	defer first.Stop()
	firstC := first.C
	if idleC == nil {
		first.Stop()
		firstC = nil
	}
	var cycled, seen int64 // records handed out at the last cycle and the last idle check
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-tr.wake:
		case <-firstC:
			if tr.t.Handed() == 0 {
				continue
			}
		case <-idleC:
			n := tr.t.Handed()
			quiet := n == seen && n != cycled
			seen = n
			if !quiet {
				continue
			}
		}
		if firstC != nil {
			first.Stop()
			firstC = nil
		}
		cycled = tr.t.Handed()
		cctx, cancel := context.WithTimeout(ctx, w.flushBudget())
		st, err := tr.t.Cycle(cctx, w.cutBudget())
		cancel()
		switch {
		case err == nil:
			if st.Records > 0 {
				w.metrics.cycle(st.Records, st.Elapsed)
				ts.mu.Lock()
				tr.cycles++
				tr.recs += int64(st.Records)
				tr.last = st.Elapsed
				ts.mu.Unlock()
			}
		case errors.Is(err, task.ErrStopped):
			// Abandoned by a failed partition that restarts in place (or
			// is ending): no cycle until it resets the task.
		case errors.Is(err, task.ErrAbandoned):
			if permanent(err) {
				// No retry can write this changelog record (too large, not
				// allowed, no such topic): restarting would lose the write
				// or loop forever. Stop with the cause.
				w.log.Error("changelog write failed permanently; stopping the worker", "partition", k.p, "err", err)
				w.fatal.stop(err)
			} else if errors.Is(err, stores.ErrFailed) {
				// A store that failed (disk full, I/O error, corruption)
				// stays failed in this process: stop the worker with the
				// cause; a restart recovers from the changelog.
				w.log.Error("table store failed; stopping the worker", "partition", k.p, "err", err)
				w.fatal.stop(err)
			} else if ctx.Err() == nil {
				w.log.Warn("commit cycle abandoned; the partition restarts from its committed offsets", "partition", k.p, "err", err)
			}
			tr.abandon(ts, err)
			<-ctx.Done()
			return
		case ctx.Err() == nil:
			w.log.Debug("commit cycle postponed", "partition", k.p, "err", err)
		}
	}
}

// commitSync commits offs for the group member of sess in one OffsetCommit
// request to the group coordinator and returns the first partition error
// (for example UNKNOWN_MEMBER_ID once the member was evicted). Sarama's
// session commits report errors only asynchronously; a commit cycle must
// know before it applies to the store. A rebalance in progress, or a
// generation the coordinator moved past while this member's session is
// being carried into the next one (cooperative rebalancing), is retried
// every 50 ms with the session's current generation until ctx ends. The
// offsets are also marked in the session (task.Source.Committable), so
// Sarama's own commits never go back.
func (w *Worker) commitSync(ctx context.Context, sess sarama.ConsumerGroupSession, offs []task.Offset) error {
	if len(offs) == 0 {
		return nil
	}
	for {
		err := w.commitOnce(sess, offs)
		if err == nil || !(errors.Is(err, sarama.ErrRebalanceInProgress) || errors.Is(err, sarama.ErrIllegalGeneration) ||
			errors.Is(err, sarama.ErrNotCoordinatorForConsumer) || errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable)) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (w *Worker) commitOnce(sess sarama.ConsumerGroupSession, offs []task.Offset) error {
	coord, err := w.meta.Coordinator(w.app.id)
	if err != nil {
		return fmt.Errorf("commit: coordinator of %s: %w", w.app.id, err)
	}
	v := w.meta.Config().Version
	req := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: w.app.id, ConsumerID: sess.MemberID(),
		ConsumerGroupGeneration: sess.GenerationID()}
	switch {
	case v.IsAtLeast(sarama.V2_4_0_0):
		req.Version = 8
	case v.IsAtLeast(sarama.V2_3_0_0):
		req.Version = 7
	case v.IsAtLeast(sarama.V2_1_0_0):
		req.Version = 6
	case v.IsAtLeast(sarama.V2_0_0_0):
		req.Version = 4
	}
	if req.Version >= 7 && w.cfg.InstanceID != "" {
		id := w.cfg.InstanceID
		req.GroupInstanceId = &id
	}
	for _, o := range offs {
		req.AddBlock(o.Topic, o.Partition, o.Offset, 0, "")
	}
	resp, err := coord.CommitOffset(req)
	if err != nil {
		_ = coord.Close() // sarama reopens it on the next request
		return fmt.Errorf("commit: %w", err)
	}
	for _, o := range offs {
		if kerr, ok := resp.Errors[o.Topic][o.Partition]; ok && kerr != sarama.ErrNoError {
			if kerr == sarama.ErrNotCoordinatorForConsumer || kerr == sarama.ErrConsumerCoordinatorNotAvailable {
				_ = w.meta.RefreshCoordinator(w.app.id)
			}
			return fmt.Errorf("commit %s[%d]@%d (generation %d): %w", o.Topic, o.Partition, o.Offset, sess.GenerationID(), kerr)
		}
	}
	return nil
}

// permanent reports whether a changelog write failed for a reason no retry
// fixes: the record is too large, the worker may not write the topic, or the
// topic does not exist (it was deleted under the worker).
func permanent(err error) bool {
	var cerr sarama.ConfigurationError
	if errors.As(err, &cerr) {
		return true // e.g. a record above Producer.MaxMessageBytes
	}
	for _, kerr := range []sarama.KError{sarama.ErrMessageSizeTooLarge, sarama.ErrTopicAuthorizationFailed,
		sarama.ErrClusterAuthorizationFailed, sarama.ErrUnknownTopicOrPartition, sarama.ErrInvalidTopic,
		sarama.ErrTransactionalIDAuthorizationFailed} {
		if errors.Is(err, kerr) {
			return true
		}
	}
	return false
}

// idleCommit is how long a task's sources must hand out nothing before it
// cycles early (Config.IdleCommit); 0 disables it.
func (w *Worker) idleCommit() time.Duration {
	switch d := w.cfg.IdleCommit; {
	case d < 0:
		return 0
	case d > 0:
		return d
	}
	return min(max(w.cfg.CommitInterval/10, 20*time.Millisecond), 200*time.Millisecond)
}
