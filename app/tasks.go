package app

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/group"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/stores"
)

// taskKey names a task: the partition count of its co-partitioned topics and
// tables, and the partition.
type taskKey struct{ parts, p int32 }

// Task states, as /api/assignment and /api/status show them and the "task
// state" log lines name them (keys task, partition, from, to): the names of
// internal/task's State, whose table of transitions every change of a task's
// state goes through (taskSet.settleLocked, task.Lifecycles.Move).
const (
	// TaskCreated: the task exists and has not started its work.
	TaskCreated = "created"
	// TaskRestoring: a claim brings the task's table partitions up to their
	// changelogs' highwater (a restore or a standby's promotion).
	TaskRestoring = "restoring"
	// TaskRunning: the task's sources process records; cycles run.
	TaskRunning = "running"
	// TaskRestarting: a failed record's partition waits out its redelivery
	// backoff, caches dropped, before it reads again from the last commit
	// point.
	TaskRestarting = "restarting"
	// TaskSuspending: the partition is being given up: drain, final cycle.
	TaskSuspending = "suspending"
	// TaskStandby: the task's table partitions are followed (standby or
	// warm-up replicas); no records are processed.
	TaskStandby = "standby"
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
	Partition  int32 `json:"partition"`
	Partitions int32 `json:"partitions"`
	// State is one of the Task* constants; SinceMS how long ago the task
	// entered it, in milliseconds.
	State   string  `json:"state"`
	SinceMS float64 `json:"since_ms"`
	// Sources is how many claimed topic partitions feed the task.
	Sources int `json:"sources"`
	// Tables are the names of the tables the task writes (running) or
	// restores and follows (restoring, standby).
	Tables []string `json:"tables"`
	// Changelogs are the positions of the task's table partitions against
	// their changelogs while it restores or follows them: the restored
	// offset, the end offset, the lag and, during a restore, its rate and
	// ETA. Only /api/status and /api/assignment fill them (they ask the
	// brokers for each highwater).
	Changelogs []TablePartitionStatus `json:"changelogs,omitempty"`
	// Cycles counts the cycles that wrote records; Records the changelog
	// records they wrote; LastCycleMS the duration of the last one.
	Cycles      int64   `json:"cycles"`
	Records     int64   `json:"records"`
	LastCycleMS float64 `json:"last_cycle_ms"`
	// Postponed counts the cycles whose cut did not finish within the cut
	// budget (a record below the commit point stayed unresolved): a count
	// that keeps growing is a blocked task.
	Postponed int64 `json:"postponed"`
	// Handed is how many records the task's sources handed out to its
	// agents since the task started, counting the records of a repartition
	// topic skipped as sent again (agent.Deterministic).
	Handed int64 `json:"handed"`
	// HandedPerSecond is the rate of Handed over the last ~10 s, from the
	// worker's samples of its counters taken once a second.
	HandedPerSecond float64 `json:"handed_per_second"`
	// CacheEntries and CacheBytes are the size of the task's write caches
	// (the current cycle's writes, summed over its tables; bytes as
	// Config.CacheBytes counts them: keys, values and 64 per entry).
	CacheEntries int `json:"cache_entries"`
	CacheBytes   int `json:"cache_bytes"`
	// Waiting names what holds the task's sources back from handing out
	// records, empty when nothing does: WaitWriteCache ("write_cache", a
	// write cache at its hard limit, Config.WriteCacheLimit), WaitWindow
	// ("window", the records a cut waits for are capped and a slow one is
	// unresolved), WaitCycle ("cycle", a commit cycle's cut pauses them) or
	// WaitTransaction ("transaction", exactly-once without an open
	// transaction), WaitInFlight ("in_flight", the records in flight reach
	// the source's byte bound) or WaitAgents ("agents", an agent's queue is
	// full).
	// A task that stays waiting is blocked: look at Postponed and the logs.
	Waiting string `json:"waiting,omitempty"`
}

// What holds a task's sources back from handing out records
// (TaskStatus.Waiting).
const (
	// WaitWriteCache: a write cache is at its hard limit
	// (Config.WriteCacheLimit) until a cycle cuts it.
	WaitWriteCache = "write_cache"
	// WaitWindow: as many records as the cut window allows are handed out
	// and not yet resolved (a slow or stuck record holds it).
	WaitWindow = "window"
	// WaitCycle: a commit cycle's cut pauses the sources (under
	// ExactlyOnce, for the whole cycle).
	WaitCycle = "cycle"
	// WaitTransaction: under ExactlyOnce no transaction is open (an
	// abort's partitions are still closing, or the next one could not
	// begin: the producer is being renewed).
	WaitTransaction = "transaction"
	// WaitInFlight: the records handed out and not yet advanced past reach
	// the source's in-flight byte bound (512 KiB a partition); a record
	// that stays unresolved (a derived record not yet confirmed) keeps
	// every record behind it in flight, so the task stands still until it
	// resolves.
	WaitInFlight = "in_flight"
	// WaitAgents: an agent's queue is full; the agents are behind the
	// source (ordinary backpressure, it passes as they catch up).
	WaitAgents = "agents"
)

// taskRun is a running task: its commit-cycle loop and the claims using it.
type taskRun struct {
	t      *task.Task
	key    taskKey
	refs   int           // claims using the task; guarded by taskSet.mu
	state  task.State    // running, restarting, suspending or abandoned; guarded by taskSet.mu
	cycles int64         // guarded by taskSet.mu
	recs   int64         // guarded by taskSet.mu
	last   time.Duration // guarded by taskSet.mu
	stall  int64         // cycles whose cut failed (TaskStatus.Postponed); guarded by taskSet.mu
	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	failed chan struct{} // closed when the task was abandoned
	fail   sync.Once
	// window bounds the records the task's sources hand out unresolved
	// (at-least-once; under ExactlyOnce the transaction's window does).
	window group.CutWindow
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
	ts.set(tr, task.Abandoned)
	tr.fail.Do(func() { close(tr.failed) })
}

// abandonKey abandons the running task k, if any (see taskRun.abandon).
func (ts *taskSet) abandonKey(k taskKey, err error) {
	ts.mu.Lock()
	tr := ts.m[k]
	ts.mu.Unlock()
	if tr != nil {
		tr.abandon(ts, err)
	}
}

// taskSet holds the worker's running tasks.
type taskSet struct {
	w  *Worker
	mu sync.Mutex
	m  map[taskKey]*taskRun // guarded by mu
	// closing holds, per key, a channel closed when the task whose last
	// claim left has released its tables; a new task of the key waits for
	// it (join). Guarded by mu.
	closing map[taskKey]chan struct{}
	// commits coalesces the cycles' OffsetCommits.
	commits group.OffsetCommitter[*taskRun]
	// life holds every task's state and performs its transitions
	// (settleLocked is its one caller). A task's state follows from what
	// holds it, in this order: its running task (m, with the state the
	// claims set); claims restoring its tables (prep); followed table
	// partitions (follows); nothing (closed).
	life     task.Lifecycles
	lifeOnce sync.Once
	prep     map[taskKey]int                 // claims restoring the key's tables, not yet joined; guarded by mu
	follows  map[taskKey]map[string]struct{} // tables whose partition of the key is followed; guarded by mu
}

// invalidTransitions counts the task state transitions refused as outside
// task's table, in every worker of the process (tests fail on any).
var invalidTransitions atomic.Int64

// settleLocked moves the task of k to the state its holders give it (see
// taskSet.life); mu must be held. A restoring or running task whose
// partitions become standbys closes first and comes back as a standby (a
// new task, as Kafka Streams recycles an active into a standby).
func (ts *taskSet) settleLocked(k taskKey) {
	ts.lifeOnce.Do(func() {
		ts.life.Log = ts.w.log
		ts.life.Moved = func(_, to task.State) { ts.w.metrics.taskTransitions.WithLabelValues(to.String()).Inc() }
		ts.life.Refused = func(task.ID, task.State, task.State) {
			invalidTransitions.Add(1)
			ts.w.metrics.taskInvalid.Inc()
		}
	})
	tr := ts.m[k]
	if tr == nil && ts.closing[k] != nil {
		return // the key's last task is releasing its tables; leave settles it
	}
	want := task.Closed
	switch {
	case tr != nil:
		want = tr.state
	case ts.prep[k] > 0:
		want = task.Restoring
	case len(ts.follows[k]) > 0:
		want = task.Standby
	}
	id := task.ID{Partitions: k.parts, Partition: k.p}
	if cur := ts.life.State(id); tr == nil && cur != want && !task.CanMove(cur, want) {
		// No running task: the one that ran (or restored) is over, and
		// what holds the key now is a new task.
		_, _ = ts.life.Move(id, task.Closed)
	}
	_, _ = ts.life.Move(id, want) // a refused move is logged and counted (life.Refused)
}

// prepare registers a claim that restores the tables of k before it joins
// the task (restoring); done, called at the join or when the claim ends
// before it, undoes it (once).
func (ts *taskSet) prepare(k taskKey) (done func()) {
	ts.mu.Lock()
	if ts.prep == nil {
		ts.prep = map[taskKey]int{}
	}
	ts.prep[k]++
	ts.settleLocked(k)
	ts.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			ts.mu.Lock()
			if ts.prep[k]--; ts.prep[k] <= 0 {
				delete(ts.prep, k)
			}
			ts.settleLocked(k)
			ts.mu.Unlock()
		})
	}
}

// following records whether the partition of k of table is followed (a
// standby or warm-up replica).
func (ts *taskSet) following(k taskKey, table string, on bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if on {
		if ts.follows == nil {
			ts.follows = map[taskKey]map[string]struct{}{}
		}
		if ts.follows[k] == nil {
			ts.follows[k] = map[string]struct{}{}
		}
		ts.follows[k][table] = struct{}{}
	} else {
		delete(ts.follows[k], table)
		if len(ts.follows[k]) == 0 {
			delete(ts.follows, k)
		}
	}
	ts.settleLocked(k)
}

// activator is a table runtime with per-partition activation of its own
// (tablestate.GlobalState: every worker holds every partition, and writes the
// ones its tasks own).
type activator interface {
	Activate(p int32) error
	Deactivate(p int32)
}

// errOtherTables: a claim brought other tables than its task cuts (join).
var errOtherTables = errors.New("claim and task disagree on the tables")

// owner is a table runtime whose partitions accept writes only while a task
// owns them (tablestate.State with OwnedWrites).
type owner interface {
	Own(p int32) error
	Disown(p int32)
}

// takeTable makes a new task the writer of partition p of st: a global
// table's partition is activated, a table's owned. Invariant (with
// tablestate.State.OwnedWrites): a table partition accepts writes only while
// exactly one running task cuts it, so no write waits in a cache that no
// cycle flushes while its record's offset commits. Errors: the activation's,
// tablestate.ErrOwned.
func takeTable(st tablestate.Cutter, p int32) error {
	switch t := st.(type) {
	case activator:
		return t.Activate(p)
	case owner:
		return t.Own(p)
	}
	return nil
}

// releaseTable undoes takeTable when the task closes.
func releaseTable(st tablestate.Cutter, p int32) {
	switch t := st.(type) {
	case activator:
		t.Deactivate(p)
	case owner:
		t.Disown(p)
	}
}

// join returns the task of k for a claim of sess, starting it (and its cycle
// loop) for the first claim; leave ends the claim's use. Errors: activating
// a global table's partition (reading its store's marks).
func (ts *taskSet) join(k taskKey, sess sarama.ConsumerGroupSession, states []tablestate.Cutter) (*taskRun, error) {
	ts.mu.Lock()
	for ts.closing[k] != nil {
		// The key's previous task is closing: it gives its table
		// partitions back (releaseTable) before a new task takes them.
		ch := ts.closing[k]
		ts.mu.Unlock()
		<-ch
		ts.mu.Lock()
	}
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[taskKey]*taskRun{}
	}
	if tr := ts.m[k]; tr != nil {
		// Every claim of a task brings the same tables (all those
		// co-partitioned with the task, active in one assignment): a claim
		// whose tables the task does not cut would commit offsets whose
		// table writes no cycle flushes.
		if !sameTables(tr.t.Tables, states) {
			return nil, fmt.Errorf("task %d/%d: a claim brings tables %v, the task runs %v: %w", k.p, k.parts, tableNames(states), tableNames(tr.t.Tables), errOtherTables)
		}
		tr.refs++
		return tr, nil
	}
	for i, st := range states {
		if err := takeTable(st, k.p); err != nil {
			for _, prev := range states[:i] {
				releaseTable(prev, k.p)
			}
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var tr *taskRun
	commit := func(ctx context.Context, offs []task.Offset) error {
		return ts.w.commitSync(ctx, tr, sess, offs)
	}
	tr = &taskRun{t: &task.Task{Partition: k.p, Tables: states, Commit: commit, CacheLimit: ts.w.cfg.writeCacheLimit()}, key: k, refs: 1, state: task.Running,
		wake: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{}), failed: make(chan struct{})}
	ts.m[k] = tr
	ts.settleLocked(k)
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

// set moves tr, a running task, to state (running, restarting, suspending
// or abandoned) through the state table (settleLocked). A task that already
// closed (its key may have a new task) is left alone.
func (ts *taskSet) set(tr *taskRun, state task.State) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	from := tr.state
	if ts.m[tr.key] != tr || from == state {
		return
	}
	if from == task.Abandoned {
		// Abandoned is final for a running task: only its close follows
		// (a claim that restarts meanwhile must not revive it).
		ts.w.log.Debug("abandoned task keeps its state", "task", fmt.Sprintf("%d/%d", tr.key.p, tr.key.parts), "to", state.String())
		return
	}
	tr.state = state
	// A suspending task's final cycle is about to commit: the commit queue
	// waits a little for it, so that the final cycles of the tasks closing
	// together share one OffsetCommit (group.OffsetCommitter).
	switch {
	case state == task.Suspending:
		ts.commits.Expect(tr)
	case from == task.Suspending:
		ts.commits.Unexpect(tr)
	}
	ts.settleLocked(tr.key)
}

// status returns every task's status (no changelog positions), by
// partition count and partition.
func (ts *taskSet) status() []TaskStatus {
	ts.mu.Lock()
	now := time.Now()
	infos := ts.life.Snapshot()
	out := make([]TaskStatus, 0, len(infos))
	trs := make([]*taskRun, 0, len(infos))
	for _, in := range infos {
		k := taskKey{in.ID.Partitions, in.ID.Partition}
		st := TaskStatus{Partition: k.p, Partitions: k.parts, State: in.State.String(),
			SinceMS: float64(now.Sub(in.Since).Microseconds()) / 1000, Tables: []string{}}
		tr := ts.m[k]
		if tr != nil {
			st.Sources, st.Cycles, st.Records = tr.t.Sources(), tr.cycles, tr.recs
			st.LastCycleMS = float64(tr.last.Microseconds()) / 1000
			st.Postponed = tr.stall
		} else {
			st.Tables = ts.w.tableNamesOf(k)
		}
		out = append(out, st)
		trs = append(trs, tr)
	}
	ts.mu.Unlock()
	// Read without taskSet.mu: they take the sources' and the tables' locks.
	for i, tr := range trs {
		if tr == nil {
			continue
		}
		st := &out[i]
		st.Handed = tr.t.Handed()
		for _, s := range tr.t.Tables {
			st.Tables = append(st.Tables, s.Name())
			e, b := s.CacheSize(tr.key.p)
			st.CacheEntries += e
			st.CacheBytes += b
		}
		for _, s := range tr.t.SourceList() {
			if c, ok := s.(*claimProducer); ok && st.Waiting == "" {
				st.Waiting = c.waitingFor()
			}
		}
	}
	return out
}

// handedByTask returns the records each running task's sources handed out
// (the rate sampler's per-task counts; status_rates.go).
func (ts *taskSet) handedByTask() map[taskKey]int64 {
	trs := ts.all()
	out := make(map[taskKey]int64, len(trs))
	for _, tr := range trs { // Handed takes the sources' locks, not taskSet.mu
		out[tr.key] = tr.t.Handed()
	}
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
	var released chan struct{}
	if last {
		delete(ts.m, k)
		if ts.closing == nil {
			ts.closing = map[taskKey]chan struct{}{}
		}
		released = make(chan struct{})
		ts.closing[k] = released
	}
	ts.mu.Unlock()
	if last {
		tr.cancel()
		<-tr.done
		if x := ts.w.txn; x != nil {
			// Under ExactlyOnce the worker's transaction cycles the task
			// (it has no loop of its own): wait for a cycle in progress,
			// which may still cut the task's tables, before they go to the
			// key's next task. A task abandoned on its own (not by an
			// abort) leaves what it sent in the open transaction: abort it
			// (group.TxnCommitter.LeftAlone).
			x.LeftAlone(tr)
		}
		for _, st := range tr.t.Tables {
			releaseTable(st, k.p)
		}
		ts.mu.Lock()
		delete(ts.closing, k)
		ts.mu.Unlock()
		close(released)
		ts.mu.Lock()
		ts.settleLocked(k) // closed, or standby when its partitions are followed
		ts.mu.Unlock()
		if ts.w.txn != nil {
			ts.w.txn.Closed(tr)
		}
	}
}

// postponed counts a cycle of trs whose cut failed (TaskStatus.Postponed).
func (ts *taskSet) postponed(trs ...*taskRun) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, tr := range trs {
		tr.stall++
	}
}

// wake asks the task of k for a cycle now (a table cache is full).
func (ts *taskSet) wake(k taskKey) {
	if x := ts.w.txn; x != nil {
		x.Wake()
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

// loop runs the task's cycles every commit interval, when a cache is full,
// when its sources went idle and for its first record (group.CycleClock), until
// ctx ends. An abandoned cycle fails the task's claims.
func (ts *taskSet) loop(ctx context.Context, k taskKey, tr *taskRun) {
	defer close(tr.done)
	w := ts.w
	clock := group.NewCycleClock(w.cfg.CommitInterval, w.idleCommit(), true, tr.t.Handed, tr.wake)
	defer clock.Stop()
	for clock.Wait(ctx) {
		cctx, cancel := context.WithTimeout(ctx, w.flushBudget())
		held := unresolved([]*taskRun{tr})
		st, err := tr.t.Cycle(cctx, w.cutBudget())
		cancel()
		switch {
		case err == nil:
			tr.window.Adapt(st.Cut, w.cutBudget(), held)
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
			// The cut did not finish in its budget: hand out fewer records
			// at once, so that the next one does (group.CutWindow).
			tr.window.Missed(held)
			ts.postponed(tr)
			w.log.Debug("commit cycle postponed", "partition", k.p, "unresolved_at_start", held, "window", tr.window.Load(), "err", err)
		}
	}
}

// commitSync commits offs, the commit offsets of tr's sources, through the
// worker's offset committer (group.OffsetCommitter.CommitSync: coalesced with
// other tasks' commits, marked in the session, a rebalance in progress
// retried until ctx ends), each offset with the commit metadata of its
// partition (commitMetadata).
func (w *Worker) commitSync(ctx context.Context, tr *taskRun, sess sarama.ConsumerGroupSession, offs []task.Offset) error {
	return w.tasks.commits.CommitSync(ctx, w.member(), tr, sess, offs, func() []string { return commitMetadata(tr, offs) })
}

// member is the group member the commit cycles' OffsetCommits are sent as:
// the worker's offset client, its group and instance ID, ordered with the
// session's own commits by commitMu.
func (w *Worker) member() group.Member {
	return group.Member{Client: w.meta, Group: w.app.id, InstanceID: w.cfg.InstanceID, Mu: &w.commitMu, Log: w.log}
}

// commitMetadata returns the commit metadata of each of offs, offsets of
// tr's sources: what the source's partition marks with it (partition.markOffset,
// deadLettered.metadata), so that a cycle's commit carries where the dead
// letters of later records start as a session commit does (a commit with
// empty metadata would erase it, and a session commit of the same offset
// does not follow).
func commitMetadata(tr *taskRun, offs []task.Offset) []string {
	if tr == nil || tr.t == nil {
		return nil
	}
	srcs := tr.t.SourceList()
	out := make([]string, len(offs))
	for i, o := range offs {
		for _, s := range srcs {
			if c, ok := s.(*claimProducer); ok && c.pt.topic == o.Topic && c.pt.p == o.Partition {
				// The commit may fail: forget nothing yet.
				out[i] = joinMeta(c.pt.dead.metadataFrom(o.Offset), c.pt.src.metadata(o.Offset, false))
				break
			}
		}
	}
	return out
}

// permanent reports whether a changelog write failed for a reason no retry
// fixes: the record is too large, the worker may not write the topic, or the
// topic does not exist (it was deleted under the worker, or stayed unknown
// for the whole delivery timeout): kafka.Permanent.
func permanent(err error) bool { return kafka.Permanent(err) }

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

// sameTables reports whether a and b hold the same tables (by name, in any
// order).
func sameTables(a, b []tablestate.Cutter) bool {
	x, y := tableNames(a), tableNames(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

func tableNames(ts []tablestate.Cutter) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Name()
	}
	return out
}

// unresolved returns the most records any source of trs has handed out and
// not yet resolved.
func unresolved(trs []*taskRun) int64 {
	var most int64
	for _, tr := range trs {
		for _, s := range tr.t.SourceList() {
			if c, ok := s.(*claimProducer); ok {
				most = max(most, c.unresolved())
			}
		}
	}
	return most
}

// all returns the running tasks, ordered by key (the order task.Together
// locks them in).
func (ts *taskSet) all() []*taskRun {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	out := make([]*taskRun, 0, len(ts.m))
	for _, tr := range ts.m {
		out = append(out, tr)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].key.parts != out[j].key.parts {
			return out[i].key.parts < out[j].key.parts
		}
		return out[i].key.p < out[j].key.p
	})
	return out
}
