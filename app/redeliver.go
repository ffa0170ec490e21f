package app

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/internal/group"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/table"
)

func (r Redelivery) withDefaults() Redelivery {
	if r.MaxRetries == 0 {
		r.MaxRetries = DefaultMaxRetries
	} else if r.MaxRetries < 0 {
		r.MaxRetries = 0
	}
	if r.Backoff <= 0 {
		r.Backoff = DefaultBackoff
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = DefaultMaxBackoff
	}
	r.MaxBackoff = max(r.MaxBackoff, r.Backoff)
	return r
}

// delay returns Backoff·2^(n-1) capped at MaxBackoff, for the n-th retry (n >= 1).
func (r Redelivery) delay(n int) time.Duration {
	d := r.Backoff
	for i := 1; i < n && d < r.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, r.MaxBackoff)
}

// sleep waits d or until one of done is closed; false when one was.
func sleep(d time.Duration, done ...<-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	var a, b <-chan struct{}
	if len(done) > 0 {
		a = done[0]
	}
	if len(done) > 1 {
		b = done[1]
	}
	select {
	case <-t.C:
		return true
	case <-a:
	case <-b:
	}
	return false
}

// fatalState holds the error that stops the worker (agent.StopWorker).
type fatalState struct {
	mu     sync.Mutex
	err    error
	cancel context.CancelFunc
}

// context derives the worker's run context: it is cancelled by stop.
func (f *fatalState) context(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	f.mu.Lock()
	f.cancel = cancel
	f.mu.Unlock()
	return ctx, cancel
}

// stop records err (the first one wins) and cancels the worker's run context.
func (f *fatalState) stop(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	cancel := f.cancel
	f.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func (f *fatalState) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// partition runs the agents of one claimed source partition for one session:
// one incarnation of its shared source (a source.Manager group with a
// claimProducer) at a time. A failed stream (ack timeout, source terminated)
// restarts the incarnation from the lowest unresolved offset; a revoke drains
// and commits; agent.StopWorker stops the worker.
type partition struct {
	h       *handler
	w       *Worker
	sess    sarama.ConsumerGroupSession
	topic   string
	p       int32
	key     string
	runners []agentrt.Runner
	feed    *group.ClaimFeed
	retry   Redelivery

	// env is the worker's tablestate.Env with this partition's in-flight counter.
	env      *tablestate.Env
	inflight *tablestate.InFlight
	// task runs the commit cycles of the tables this partition writes; nil
	// when it writes none (offsets are then marked as records resolve).
	task *taskRun
	// dead are the records of the claim dead-lettered at-least-once and not
	// yet behind the marked offset (dlq.go).
	dead deadLettered
	// src is the claim's duplicate filter: a repartition topic under
	// at-least-once, nil otherwise (dedup.go).
	src *srcFilter
	// truncated: the partition's log ended below the offset being read
	// (kafka.Sub.Reset); the session restarts (claimProducer.openSub).
	truncated atomic.Bool
}

// deadLetters is the claim's record of dead letters written, nil under
// ExactlyOnce: there a dead letter is part of the cycle's transaction, and a
// record processed again after an abort must be dead-lettered again.
func (pt *partition) deadLetters() *deadLettered {
	if pt.w.txn != nil {
		return nil
	}
	return &pt.dead
}

// markOffset marks next, the offset of the next record to read, for the
// session's commit: at-least-once only. Under ExactlyOnce only the
// transactions commit group offsets (TxnOffsetCommit, group.TxnCommitter.Cycle): a
// session commit beside them was a second writer of the group's offsets,
// one that could move an offset back below what a transaction committed.
// The metadata names where the dead letters of records from next on start
// (deadLettered.metadata), for whoever claims the partition next.
func (pt *partition) markOffset(next int64) {
	if pt.w.txn == nil {
		pt.sess.MarkOffset(pt.topic, pt.p, next, joinMeta(pt.dead.metadata(next), pt.src.metadata(next, true)))
	}
}

type agentResult struct {
	r   agentrt.Runner
	sub *source.Subscription
	err error
}

// run runs the partition until a revoke (nil) or a fatal agent error. A
// failure (a failed record, a stream that failed) restarts the partition in
// place, after the redelivery backoff: the task drops its write caches (the
// effects of the records since its last commit cycle; the store holds only
// cycles), windowed tables rebuild their index from the store, and a new
// incarnation reads from the last cycle's commit point (or, without tables,
// from the failed record). Other partitions of the worker go on. A task fed
// by several co-partitioned claims cannot rewind one of them alone: there the
// failure ends the member's session, as an abandoned task does.
func (pt *partition) run(ctx context.Context) error {
	w := pt.w
	from := int64(-1)    // -1: read the claim
	retryAt := int64(-1) // the failed record the next incarnation holds at (-1: none)
	for {
		prod := newClaimProducer(pt, from)
		prod.retryAt = retryAt
		if pt.task != nil {
			prod.capped = true
			pt.task.t.Add(prod)
		}
		err, again := pt.incarnation(ctx, prod)
		if again && w.txn != nil && !pt.task.failedNow() {
			// ExactlyOnce: the open transaction holds what this partition's
			// records sent since the last cycle, and it is the worker's, so
			// every partition goes back to its committed offsets (txn.go).
			// Aborted before the source leaves the task: a cycle in between
			// would cut the task's caches, which hold writes of this
			// source's records after its commit point, without waiting for
			// them to resolve and without this source's offset.
			w.txn.Abort(fmt.Errorf("%s failed: %w", pt.key, err))
		}
		// A task fed by other claims too, or abandoned by its own cycles
		// (its cycle loop ended), cannot restart in place.
		shared := false
		if pt.task != nil {
			pt.task.t.Remove(prod)
			shared = pt.task.t.Sources() > 0 || pt.task.failedNow()
		}
		if !again {
			return err
		}
		// A log that ended below what was read (records lost on the
		// broker, the topic recreated) is not read again in place: the
		// offsets go back, and this incarnation's commit points and cut
		// tables are of the old log. The session restarts; the claim starts
		// at the committed offset, or at the log start when that is past
		// the log end (Sarama's Consumer.Group.ResetInvalidOffsets).
		shared = shared || w.txn != nil || pt.truncated.Load()
		from = prod.resumeOffset()
		failed := prod.failedOffset()
		n := max(pt.attemptsOf(failed), 1)
		d := pt.retry.delay(n)
		if shared {
			w.log.Warn("partition failed; its task has other sources, was abandoned or is in the worker's transaction, so the session restarts and the partition resumes from its committed offset",
				"topic", pt.topic, "partition", pt.p, "offset", from, "attempt", n, "in", d, "err", err)
			if pt.task != nil {
				pt.task.abandon(&w.tasks, err)
			}
			if !sleep(d, ctx.Done(), pt.feed.Revoked()) {
				return nil
			}
			return fmt.Errorf("%s: %w", pt.key, err)
		}
		// The next incarnation reads from the last commit point (from), cycles
		// the records before the failed one, and hands the failed record out
		// alone (claimProducer.retryAt): a further failure of it then
		// reprocesses that one record, not a commit interval.
		retryAt = failed
		w.log.Warn("partition failed; redelivering from the last commit point",
			"topic", pt.topic, "partition", pt.p, "offset", failed, "from", from, "reprocess", max(failed-from, 0)+1,
			"attempt", n, "in", d, "err", err)
		w.metrics.restarts.WithLabelValues(pt.topic).Inc()
		if pt.task != nil {
			w.tasks.set(pt.task, task.Restarting)
		}
		if !sleep(d, ctx.Done(), pt.feed.Revoked()) {
			return nil
		}
		if pt.task != nil {
			if err := pt.resetTask(); err != nil {
				return fmt.Errorf("%s: %w", pt.key, err)
			}
			w.tasks.set(pt.task, task.Running)
		}
	}
}

// resetTask reverts the partition's task to its last commit cycle for a new
// incarnation: caches dropped, the task runnable again, the runtime state of
// windowed tables rebuilt from the store.
func (pt *partition) resetTask() error {
	pt.task.t.Reset()
	if pt.env.StreamTime != nil {
		pt.env.StreamTime.Reset() // stream-time timers start over (timers.go)
	}
	for _, st := range pt.task.t.Tables {
		if t := pt.w.tableByName(st.Name()); t != nil {
			pt.w.deactivatePartition(t, pt.p)
			if err := pt.w.activatePartition(t, pt.p); err != nil {
				return err
			}
		}
	}
	return nil
}

// retryError ends a partition's incarnation so that a failed record is
// redelivered (Advance).
type retryError struct {
	key     string
	offset  int64
	attempt int
	causes  []error
}

func (e *retryError) Error() string {
	return fmt.Sprintf("%s@%d failed (delivery %d): %v", e.key, e.offset, e.attempt, e.causes)
}

// incarnation runs one shared-source group over the partition until a revoke
// (nil, false), a fatal agent error (err, false) or a failure that restarts the
// partition (err, true).
func (pt *partition) incarnation(ctx context.Context, prod *claimProducer) (error, bool) {
	w := pt.w
	subs := make([]*source.Subscription, 0, len(pt.runners))
	for _, r := range pt.runners {
		sub, err := w.mgr.Subscribe(pt.key, r.Name(), func(context.Context) (source.Producer, error) { return prod, nil })
		if err != nil {
			for _, s := range subs {
				s.Unsubscribe(nil)
			}
			return fmt.Errorf("subscribe %s to %s: %w", r.Name(), pt.key, err), true
		}
		subs = append(subs, sub)
	}
	// Every agent of the topic is subscribed before the first record is fanned
	// out, so each record's snapshot holds all of them.
	close(prod.ready)

	actx, cancelAgents := context.WithCancel(context.Background())
	defer cancelAgents()
	results := make(chan agentResult, len(pt.runners))
	for i, r := range pt.runners {
		go func() { results <- pt.supervise(actx, r, subs[i]) }()
	}
	running := len(pt.runners)
	var first *agentResult
	var taskFailed <-chan struct{}
	if pt.task != nil {
		taskFailed = pt.task.failed
	}
	var taskErr error
	select {
	case <-ctx.Done():
	case <-pt.feed.Revoked():
	case <-taskFailed:
		taskErr = pt.task.t.Err()
	case res := <-results:
		running--
		first = &res
		if res.err == nil {
			first.err = fmt.Errorf("agent %s on %s returned before the partition was revoked", res.r.Name(), pt.key)
		}
	}
	// Revoke: stop fetching, give in-flight records the drain budget to
	// resolve, advance what resolved, commit, abandon the rest to redelivery.
	// Failure: the same without the wait.
	prod.stopFetching()
	switch {
	case taskErr != nil:
		// The caches were dropped: nothing more may be committed.
	case first == nil:
		prod.waitDrained(w.drainBudget())
	default:
		// The failing agent's open window and queued records fail with its
		// error (never acked); the others' unresolved records are abandoned.
		first.sub.Unsubscribe(first.err)
	}
	w.mgr.Stop(pt.key)
	cancelAgents()
	for ; running > 0; running-- {
		<-results
	}
	// Wait for the broker's answer to every record the agents sent, so that
	// the partition's changelog is complete before it is given up: the next
	// owner restores up to the highwater it sees when it starts, and a write
	// acknowledged after that would land on top of the new owner's writes.
	// Only this partition's records count: the producer as a whole is never
	// idle under load on other partitions.
	fctx, cancelFlush := context.WithTimeout(context.Background(), w.drainBudget())
	if err := pt.inflight.Wait(fctx); err != nil {
		w.log.Warn("records still in flight when the partition stopped", "topic", pt.topic, "partition", pt.p, "err", err)
	}
	finalCommitted := false // the final cycle committed the partition's offsets
	if pt.task != nil {
		if first == nil && taskErr == nil {
			w.tasks.set(pt.task, task.Suspending)
		}
		// The final cycle: flush what the drained records wrote, commit
		// their offsets and apply them, before the partition is given up.
		// It cuts only if every fetched record resolved; otherwise (and
		// after a failure) the task is abandoned: the writes since the last
		// cycle are dropped and the records are processed again from its
		// commit point (by the next owner, or here after the restart).
		switch {
		case taskErr != nil:
		case first != nil && w.txn != nil:
			// The failed record's partition restarts, and with it every
			// partition of the worker's transaction (run aborts it).
		case first != nil:
			// The failed record's partition restarts (run): drop the caches
			// now, so that no cycle flushes effects of records after it.
			pt.task.t.Abandon(fmt.Errorf("%s failed: %w", pt.key, first.err))
		case w.txn != nil:
			// The final cycle commits the worker's transaction, this
			// partition's drained records with it; if it cannot, the
			// transaction is aborted and every partition restarts.
			if err := w.txn.Cycle(fctx, true); err != nil {
				w.log.Warn("final commit cycle did not complete; the partition's uncommitted records will be processed again", "topic", pt.topic, "partition", pt.p, "err", err)
				if !errors.Is(err, task.ErrAbandoned) {
					w.txn.Abort(fmt.Errorf("%s stopped: %w", pt.key, err))
				}
			}
		default:
			st, err := pt.task.t.Cycle(fctx, w.drainBudget())
			if err != nil {
				w.log.Warn("final commit cycle did not complete; the partition's uncommitted records will be processed again", "topic", pt.topic, "partition", pt.p, "err", err)
				pt.task.abandon(&w.tasks, fmt.Errorf("%s stopped: %w", pt.key, err))
			}
			// A cycle that wrote records committed its sources' offsets
			// (task.Task.Cycle); one without writes only marked them.
			finalCommitted = err == nil && st.Records > 0
		}
	}
	cancelFlush()
	if !finalCommitted {
		// Offsets marked as records resolved go to the group now. After a
		// final cycle that committed, there is nothing left to send: a
		// task's source marks an offset only up to a cycle's commit point
		// (claimProducer.Advance, capped), and this cycle committed the
		// last one; a session commit would repeat its OffsetCommit, one
		// more round trip per revoked partition, serialized with the other
		// partitions' final cycles under commitMu.
		w.sessionCommit(pt.sess)
	}
	if taskErr != nil {
		if ctx.Err() != nil {
			return nil, false
		}
		return taskErr, true
	}
	if first == nil {
		return nil, false
	}
	if first.r.Settings().OnError == agentrt.StopWorker {
		var ae *agent.Error
		if errors.As(first.err, &ae) && !ae.Stream {
			w.log.Error("agent failed; stopping the worker (agent.StopWorker)", "agent", first.r.Name(), "topic", pt.topic, "partition", pt.p, "err", first.err)
			w.fatal.stop(first.err)
			return first.err, false
		}
	}
	if ctx.Err() != nil {
		return nil, false
	}
	return first.err, true
}

// supervise runs one agent over its subscription, restarting it on the same
// subscription after an error on a record (agent.Restart with backoff,
// agent.DeadLetter at once). It returns when the stream ended (nil), the
// stream failed, or the policy is StopWorker.
func (pt *partition) supervise(actx context.Context, r agentrt.Runner, sub *source.Subscription) agentResult {
	w := pt.w
	policy := r.Settings().OnError
	failures := 0
	env := w.agentEnv(pt.env, r)
	for {
		began := time.Now()
		err := r.Run(actx, pt.p, sub, env)
		if err == nil || actx.Err() != nil {
			return agentResult{r: r, sub: sub}
		}
		w.metrics.agentFailed(pt.topic, r.Name(), err)
		// Before the agent runs again: it goes on past a record it did not
		// finish, and its stamped sends after this point leave a gap
		// (dedup.go).
		pt.inflight.Fail()
		var ae *agent.Error
		if errors.Is(err, tablestate.ErrNotOwned) {
			// A table write that no running task's cycles would cut: a
			// broken invariant (docs/tables.md, rule 8), never bad input.
			// Retrying or dead-lettering would let the offset commit
			// without the write; the record is not committed, so stopping
			// loses nothing.
			w.log.Error("table write outside the task that owns the partition; stopping the worker", "agent", r.Name(), "topic", pt.topic, "partition", pt.p, "err", err)
			w.fatal.stop(err)
			return agentResult{r: r, sub: sub, err: err}
		}
		var undeclared *table.UndeclaredError
		if errors.As(err, &undeclared) {
			// A write or send the agent did not declare (agent.WritesTo,
			// agent.SendsTo): every delivery would fail the same way until
			// the code declares it. The record was failed, not committed.
			w.log.Error("agent writes or sends where it did not declare; stopping the worker", "agent", r.Name(), "topic", pt.topic, "partition", pt.p, "err", err)
			w.fatal.stop(err)
			return agentResult{r: r, sub: sub, err: err}
		}
		if !errors.As(err, &ae) || ae.Stream || policy == agentrt.StopWorker {
			return agentResult{r: r, sub: sub, err: err}
		}
		if errors.Is(err, table.ErrNotCoPartitioned) && ae.Offset >= 0 {
			// Dead-lettered at once by the agent (agent.Run): every delivery
			// would fail the same way.
			w.log.Warn("table key outside the event's partition; the record is dead-lettered (is the input topic keyed by the table's key? dev: --key-field)",
				"agent", r.Name(), "topic", pt.topic, "partition", pt.p, "offset", ae.Offset, "err", err)
			continue
		}
		if time.Since(began) > pt.retry.MaxBackoff {
			failures = 0
		}
		failures++
		if policy == agentrt.DeadLetter && ae.Offset >= 0 {
			w.log.Warn("agent failed on a record; dead-lettered, continuing", "agent", r.Name(), "topic", pt.topic, "partition", pt.p, "offset", ae.Offset, "err", err)
			continue
		}
		d := pt.retry.delay(failures)
		w.log.Warn("agent failed; restarting", "agent", r.Name(), "topic", pt.topic, "partition", pt.p, "offset", ae.Offset, "in", d, "err", err)
		if !sleep(d, actx.Done()) {
			return agentResult{r: r, sub: sub}
		}
	}
}

// attempt counts one more failed delivery of offset and returns the count.
func (pt *partition) attempt(offset int64) int { return pt.w.attempts.Add(pt.key, offset) }

func (pt *partition) attemptsOf(offset int64) int { return pt.w.attempts.Get(pt.key, offset) }

func (pt *partition) forget(offset int64) { pt.w.attempts.Forget(pt.key, offset) }

// claimProducer is the shared-source producer of one incarnation of a claimed
// partition. Its poll loop reads the claim (or, after a seek back or in a
// later incarnation, its own PartitionConsumer); its Advance marks offsets,
// dead-letters rejected records and seeks back on a failed one.
//
// Invariant (the commit rule): the offset marked for commit is wm.Next(), the
// lowest fetched offset not yet resolved in the current epoch, or one past
// the last resolved one; a failed record resets wm to its own offset, so
// nothing at or after an unresolved record is ever committed. Offsets between
// fetched records (compaction, transaction markers) are known absent.
type claimProducer struct {
	pt    *partition
	from  int64         // first offset to read; -1: the claim
	ready chan struct{} // closed once every agent subscribed

	stopOnce sync.Once
	stop     chan struct{} // closed to stop fetching (revoke or failure)
	rewindCh chan struct{} // capacity 1: Advance asks the poll loop to seek back

	// pc is the own PartitionConsumer, owned by the poll goroutine until
	// Open returns; Close closes it.
	pc sarama.PartitionConsumer
	// sub reads the partition through the worker's Fetcher (instead of the
	// claim's channel and pc), nil without one. Set by the poll goroutine
	// under mu; Close closes it.
	sub *kafka.Sub
	// usedClm says the poll loop took the claim's channel. Written by the
	// poll goroutine with mu held (a cycle's skipControl reads it under mu
	// while the poll loop may be starting); the poll goroutine and Close
	// (after Open returned) read it without.
	usedClm bool

	mu     sync.Mutex
	cond   *sync.Cond
	wm     *source.Watermark // guarded by mu
	epoch  *epoch            // the current epoch; guarded by mu
	rewind int64             // offset to seek back to, -1 none; guarded by mu
	marked int64             // last offset marked, -1 none; guarded by mu
	halted bool              // draining is pointless (failure on stop, budget over); guarded by mu
	closed bool              // guarded by mu

	// Commit cycles (internal/task): with tables (capped), the marked offset
	// never passes flushed, the commit point of the last cycle whose
	// changelog records the broker acknowledged. nextFetch is the offset after
	// the last record handed to the agents; paused holds the poll loop while
	// a cycle is cut.
	capped    bool  // set before Open
	handed    int64 // records handed to the agents; guarded by mu
	flushed   int64 // guarded by mu
	nextFetch int64 // guarded by mu
	paused    bool  // guarded by mu
	// pausedAt is handed when the current cycle paused the source: a cut
	// is refused if a record was handed out since (AwaitResolved). parked
	// says the poll loop holds a record and waits for the cycle to resume
	// it (tests wait for it).
	pausedAt int64 // guarded by mu
	parked   bool  // guarded by mu
	// resumed counts the Resumes (every cycle resumes its sources after
	// its cut, whether it cut or not): awaitCacheRoom looks at the task's
	// caches again after each. Guarded by mu.
	resumed int64
	// cacheWaiting says the poll loop waits for a cycle to cut a write
	// cache at its hard limit (awaitCacheRoom); windowWaiting that it
	// waits for handed-out records to resolve (awaitWindow). Shown as
	// TaskStatus.Waiting; tests wait for them. Guarded by mu.
	cacheWaiting  bool
	windowWaiting bool
	txnWaiting    bool // ExactlyOnce: waits for a transaction to open (HandOut)
	// roomWait is what the source group's emit waits for (a
	// source.RoomWait, set by WaitingForRoom without c.mu: the group calls
	// it under its own lock while the poll loop is inside emit).
	roomWait atomic.Int32

	// retryAt is the offset of the record whose failure ended the previous
	// incarnation, -1 none: the poll loop cycles the records before it,
	// hands it out alone and the records after it once it resolved
	// (emitBatch). Set before Open; then owned by the poll goroutine.
	retryAt int64
}

var (
	_ source.BatchProducer = (*claimProducer)(nil)
	_ source.RoomObserver  = (*claimProducer)(nil)
)

func newClaimProducer(pt *partition, from int64) *claimProducer {
	start := from
	if from < 0 {
		start = pt.feed.Claim().InitialOffset()
	}
	c := &claimProducer{pt: pt, from: from, ready: make(chan struct{}), stop: make(chan struct{}),
		rewindCh: make(chan struct{}, 1), wm: source.NewWatermark(start), epoch: newEpoch(0, start, pt.inflight), rewind: -1, marked: -1,
		flushed: start, nextFetch: start, retryAt: -1}
	if from >= 0 {
		pt.src.rewind(from) // a later incarnation reads again from from
	}
	c.cond = sync.NewCond(&c.mu)
	return c
}

// filter is the claim's duplicate filter (nil: none; dedup.go).
func (c *claimProducer) filter() *srcFilter {
	if c.pt == nil {
		return nil
	}
	return c.pt.src
}

func (c *claimProducer) stopFetching() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.mu.Lock()
	c.cond.Broadcast()
	c.mu.Unlock()
}

// resumeOffset is where a next incarnation starts: the lowest unresolved
// offset of this one (valid once the group stopped).
func (c *claimProducer) resumeOffset() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := c.wm.Next()
	if c.rewind >= 0 {
		next = c.rewind
	}
	if c.capped {
		// The task's caches, holding the effects of the records since the
		// last cycle, were dropped: those records are processed again.
		next = min(next, c.flushed)
	}
	return next
}

// failedOffset is the offset of the record that ended the incarnation (the
// lowest unresolved one).
func (c *claimProducer) failedOffset() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rewind >= 0 {
		return c.rewind
	}
	return c.wm.Next()
}

// waitDrained waits until every record fetched in the current epoch has been
// advanced, a record failed, or budget passed.
func (c *claimProducer) waitDrained(budget time.Duration) {
	t := time.AfterFunc(budget, func() {
		c.mu.Lock()
		c.halted = true
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer t.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for !c.halted && !c.closed && c.rewind < 0 && c.wm.Pending() > 0 {
		c.cond.Wait()
	}
}

// Open implements source.Producer; the manager calls OpenBatch instead.
func (c *claimProducer) Open(ctx context.Context, emit func(*source.Record, any) error) error {
	return c.OpenBatch(ctx, func(batch []source.Emit) error {
		for _, it := range batch {
			if err := emit(it.Record, it.Payload); err != nil {
				return err
			}
		}
		return nil
	})
}

// maxEmitBatch bounds the records the poll loop hands over in one batch:
// those already waiting in the claim's channel (Sarama's ChannelBufferSize,
// 256 by default) after the first.
const maxEmitBatch = 256

// OpenBatch implements source.BatchProducer: it hands the agents every
// record already waiting in the channel at once (at most maxEmitBatch).
func (c *claimProducer) OpenBatch(ctx context.Context, emit func([]source.Emit) error) error {
	pt := c.pt
	msgBatch := make([]*sarama.ConsumerMessage, 0, maxEmitBatch)
	batch := make([]source.Emit, 0, maxEmitBatch)
	select {
	case <-c.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if pt.w != nil && pt.w.fetcher != nil {
		return c.openSub(ctx, msgBatch, batch, emit)
	}
	var msgs <-chan *sarama.ConsumerMessage
	if c.from < 0 {
		msgs = pt.feed.Take()
		c.mu.Lock()
		c.usedClm = msgs != nil
		c.mu.Unlock()
	}
	if msgs == nil {
		start := c.from
		if start < 0 {
			start = pt.feed.Claim().InitialOffset()
		}
		var err error
		if msgs, err = c.seek(start); err != nil {
			return err
		}
	}
	for {
		rw, err := c.awaitRewind(ctx)
		if err != nil {
			return err
		}
		if rw >= 0 {
			if msgs, err = c.seek(rw); err != nil {
				return err
			}
			c.rewound()
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.stop:
			<-ctx.Done()
			return ctx.Err()
		case <-c.rewindCh:
		case m, ok := <-msgs:
			if !ok {
				if c.usedClm && c.pc == nil {
					pt.feed.Ended()
					<-ctx.Done()
					return ctx.Err()
				}
				return fmt.Errorf("partition consumer of %s closed", pt.key)
			}
			// Take what else is waiting, without blocking: the batch ends
			// at the first empty receive (or a closed channel, seen on
			// the next loop).
			msgBatch = append(msgBatch[:0], m)
		drain:
			for len(msgBatch) < maxEmitBatch {
				select {
				case m, ok := <-msgs:
					if !ok {
						break drain
					}
					msgBatch = append(msgBatch, m)
				default:
					break drain
				}
			}
			err := c.emitBatch(ctx, msgBatch, batch, emit)
			clear(msgBatch)
			if err != nil {
				return err
			}
		}
	}
}

// awaitRewind returns the offset a seek back asked the poll loop to read
// again from (-1: none), after the redelivery delay of its record's
// attempts; ctx's error when fetching stopped or ctx ended meanwhile (it
// waits for ctx then). The poll loop seeks and calls rewound.
func (c *claimProducer) awaitRewind(ctx context.Context) (int64, error) {
	pt := c.pt
	c.mu.Lock()
	rw := c.rewind
	c.mu.Unlock()
	if rw < 0 {
		return -1, nil
	}
	n := pt.attemptsOf(rw)
	d := pt.retry.delay(n)
	pt.w.log.Info("seeking back to a failed record", "topic", pt.topic, "partition", pt.p, "offset", rw, "attempt", n+1, "in", d)
	if !sleep(d, ctx.Done(), c.stop) {
		<-ctx.Done()
		return -1, ctx.Err()
	}
	return rw, nil
}

// rewound says the poll loop sought back to the rewind offset.
func (c *claimProducer) rewound() {
	c.mu.Lock()
	c.rewind = -1
	c.mu.Unlock()
}

// errLogTruncated: a source partition's log ended below the offset read.
var errLogTruncated = errors.New("the partition's log ends below the offset read (records lost on the broker, or the topic recreated)")

// openSub is OpenBatch's poll loop reading the partition through the
// worker's Fetcher: the claim's own channel is released to the feed (which
// only waits for its end, the revoke) and its fetching paused, and a seek
// back is a Seek of the Sub.
func (c *claimProducer) openSub(ctx context.Context, msgBatch []*sarama.ConsumerMessage, batch []source.Emit, emit func([]source.Emit) error) error {
	pt := c.pt
	pt.feed.Release()
	start := c.from
	if start < 0 {
		// Without a committed offset Consumer.Offsets.Initial
		// (sarama.OffsetOldest, or OffsetNewest), which the Fetcher looks up.
		start = pt.feed.Claim().InitialOffset()
	}
	sub := pt.w.fetcher.Subscribe(pt.topic, pt.p, start)
	pt.w.metrics.claimSub(pt.topic, pt.p, sub)
	c.mu.Lock()
	c.sub = sub
	c.mu.Unlock()
	for {
		rw, err := c.awaitRewind(ctx)
		if err != nil {
			return err
		}
		if rw >= 0 {
			sub.SeekTo(rw)
			c.rewound()
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.stop:
			<-ctx.Done()
			return ctx.Err()
		case <-pt.feed.Revoked():
			<-ctx.Done()
			return ctx.Err()
		case <-c.rewindCh:
		case <-sub.Ready():
			if _, ok := sub.Reset(); ok {
				// The partition's log ends below what was read (records
				// lost on the broker, or the topic recreated): the session
				// restarts (partition.run).
				pt.truncated.Store(true)
				return fmt.Errorf("%s: %w", pt.key, errLogTruncated)
			}
			msgBatch = sub.Take(msgBatch[:0], maxEmitBatch)
			if len(msgBatch) == 0 {
				continue
			}
			err := c.emitBatch(ctx, msgBatch, batch, emit)
			clear(msgBatch)
			if err != nil {
				return err
			}
		}
	}
}

// emitBatch hands fetched messages out (batch is scratch space). Without a
// failed record to hold at (retryAt < 0) that is one emitFetched. With one,
// the messages before it go out as usual; at the failed record the task
// first runs a commit cycle whose commit point is the failed record
// (cycleBefore), then the failed record goes out alone, and the messages
// after it only once it resolved (awaitHeld): succeeded, or dead-lettered
// after its last retry. So the caches hold nothing but the failed record's
// effects when it fails again, and the next incarnation reverts to the cycle
// at it and reads that one record again. When fetching stops (or a seek back
// starts) meanwhile, the rest of msgs is left to the next reader, as
// emitFetched leaves a batch.
func (c *claimProducer) emitBatch(ctx context.Context, msgs []*sarama.ConsumerMessage, batch []source.Emit, emit func([]source.Emit) error) error {
	for len(msgs) > 0 {
		seg, hold := msgs, false
		if c.retryAt >= 0 {
			i := 0
			for i < len(msgs) && msgs[i].Offset < c.retryAt {
				i++
			}
			if i == 0 {
				// The failed record (or, if it is gone, the first record
				// after its offset).
				if !c.cycleBefore(ctx) {
					return nil
				}
				seg, hold = msgs[:1], true
			} else {
				seg = msgs[:i]
			}
		}
		// No record goes out while a write cache of the task is at its
		// hard limit (backpressure while a cut is blocked).
		if !c.awaitCacheRoom(ctx) {
			return nil
		}
		// No more than the cycle's window of records is unresolved at once
		// (group.CutWindow), so that a cut can wait for them within its budget
		// (under ExactlyOnce, within the transaction's time).
		if !hold {
			n, ok := c.awaitWindow(ctx, len(seg))
			if !ok {
				return nil
			}
			seg = seg[:n]
		}
		// ExactlyOnce: a batch is handed out only inside an open
		// transaction and never while a cycle runs (group.TxnCommitter); one hold
		// of the gate covers the registration of the whole batch.
		closed := c.pt.w.txn != nil && !c.pt.w.txn.IsOpen()
		if closed {
			c.setTxnWaiting(true) // no transaction open: an abort's partitions are closing, or a begin failed
		}
		release, ok := c.pt.w.txn.HandOut(ctx, c.stop)
		if closed {
			c.setTxnWaiting(false)
		}
		if !ok {
			return nil // stopping: the batch is left to the next reader
		}
		if err := c.emitFetched(seg, batch, release, emit); errors.Is(err, errCacheFull) {
			continue // awaitCacheRoom waits for a cycle to cut the caches
		} else if err != nil {
			return err
		}
		msgs = msgs[len(seg):]
		if hold {
			if !c.awaitHeld(ctx, seg[0].Offset) {
				return nil
			}
			c.retryAt = -1
		}
	}
	return nil
}

// awaitCacheRoom waits while a write cache of the partition's task is at or
// over its hard limit (task.Task.OverLimit, Config.WriteCacheLimit), and
// returns true once none is; false when fetching stopped, a seek back
// started or ctx ended meanwhile.
//
// This is where the limit is enforced, and the only place it may be: a cut
// waits until every record below its commit point resolved, so a table
// write that blocked for room would keep the record it belongs to from
// resolving, and with it the cut that makes the room (a deadlock). Holding
// back the next records instead lets those handed out complete; the cycle
// that cuts (whichever woke it: the wake sent here, the cache's own OnFull,
// the commit interval) resumes the source, and the caches are looked at
// again after every Resume. A cache therefore holds at most the limit plus
// the writes of the records handed out before the look: per source
// partition, the agents' queues (1024 records each) and one fetched batch
// (maxEmitBatch). The cycle being flushed, if any, holds at most as much
// again. Each wait is counted (runnel_write_cache_waits_total) and
// timed (runnel_write_cache_wait_seconds_total) under the table that was
// over.
//
// Writes that come from no record of a source (timers, join backfills) are
// not held back.
func (c *claimProducer) awaitCacheRoom(ctx context.Context) bool {
	pt := c.pt
	if !c.capped || pt.task == nil {
		return true
	}
	c.mu.Lock()
	seen := c.resumed
	c.mu.Unlock()
	name := pt.task.t.OverLimit()
	if name == "" {
		return true
	}
	began := time.Now()
	pt.w.metrics.cacheWaits.WithLabelValues(name).Inc()
	defer func() { pt.w.metrics.cacheWaitSeconds.WithLabelValues(name).Add(time.Since(began).Seconds()) }()
	pt.w.log.Debug("write cache at its limit; holding records back until a cycle cuts it", "topic", pt.topic, "partition", pt.p, "table", name)
	defer c.wakeOnDone(ctx)()
	// Ask for a cycle: the one the cache asked for when it filled may have
	// found its cut blocked and been postponed. Later tries come with the
	// commit interval (each cut waits up to the cut budget).
	pt.w.tasks.wake(pt.task.key)
	for {
		c.mu.Lock()
		c.cacheWaiting = true
		c.cond.Broadcast()
		for c.resumed == seen {
			if ctx.Err() != nil || c.rewind >= 0 || c.halted || c.closed || c.stopped() {
				c.cacheWaiting = false
				c.mu.Unlock()
				return false
			}
			c.cond.Wait()
		}
		seen = c.resumed
		c.mu.Unlock()
		// OverLimit takes the tables' locks: looked at without c.mu (the
		// Resume counter read before it catches a cut in between).
		if pt.task.t.OverLimit() == "" {
			c.mu.Lock()
			c.cacheWaiting = false
			c.mu.Unlock()
			return true
		}
	}
}

// errCacheFull is emitFetched's answer when a write cache of the task was at
// its hard limit: nothing was handed out.
var errCacheFull = errors.New("write cache at its hard limit")

// setTxnWaiting records whether the poll loop waits for a transaction to
// open (TaskStatus.Waiting).
func (c *claimProducer) setTxnWaiting(on bool) {
	c.mu.Lock()
	c.txnWaiting = on
	c.mu.Unlock()
}

// waitingFor names what holds the poll loop back from handing out records,
// "" when nothing does (TaskStatus.Waiting): a write cache at its hard
// limit, the cut window's unresolved records, no open transaction, the
// source group's room (its in-flight bytes or an agent's queue), or a
// cycle's cut (the source is paused, ExactlyOnce: or a cycle holds the
// transaction's gate).
func (c *claimProducer) waitingFor() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.cacheWaiting:
		return WaitWriteCache
	case c.windowWaiting:
		return WaitWindow
	case c.txnWaiting:
		return WaitTransaction
	}
	switch source.RoomWait(c.roomWait.Load()) {
	case source.RoomBytes:
		return WaitInFlight
	case source.RoomQueue:
		return WaitAgents
	}
	if c.paused || (c.pt.w.txn != nil && c.pt.w.txn.Gated()) {
		return WaitCycle
	}
	return ""
}

// WaitingForRoom implements source.RoomObserver: the source group's emit
// waits for room (TaskStatus.Waiting WaitInFlight or WaitAgents) or stopped
// waiting.
func (c *claimProducer) WaitingForRoom(w source.RoomWait) { c.roomWait.Store(int32(w)) }

// awaitWindow waits until fewer records than the cycle's window are
// unresolved (handed out and not yet resolved) and returns how many of the
// n next records may go out now (at least 1); ok is false when fetching
// stopped, a seek back started or ctx ended meanwhile. The window is the
// worker's transaction's under ExactlyOnce, the task's under at-least-once
// (group.CutWindow); a partition without a task (no cycles) returns n at once.
func (c *claimProducer) awaitWindow(ctx context.Context, n int) (int, bool) {
	var win *group.CutWindow
	switch {
	case c.pt.w.txn != nil:
		win = c.pt.w.txn.Window()
	case c.pt.task != nil:
		win = &c.pt.task.window
	default:
		return n, true
	}
	defer c.wakeOnDone(ctx)()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case ctx.Err() != nil, c.rewind >= 0, c.halted, c.closed, c.stopped():
			c.windowWaiting = false
			return 0, false
		}
		if room := win.Load() - c.unresolvedLocked(); room > 0 {
			c.windowWaiting = false
			return int(min(int64(n), room)), true
		}
		c.windowWaiting = true
		c.cond.Wait() // Advance broadcasts as records resolve
	}
}

// unresolvedLocked is the number of offsets handed out and not yet
// resolved. Guarded by mu.
func (c *claimProducer) unresolvedLocked() int64 {
	return max(c.nextFetch-c.wm.Next(), 0)
}

// unresolved is unresolvedLocked for other goroutines.
func (c *claimProducer) unresolved() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unresolvedLocked()
}

// cycleBefore runs a commit cycle of the task up to the failed record, the
// next message to hand out: every record before it was handed out, so the
// cycle's commit point (Pause: the offset after the last record handed out)
// is the failed record's offset, and the task's last cycle after it holds
// the effects of exactly the records before the failed one. The task's cycle
// loop runs the cycle (taskSet.wake); it is asked up to three times, each
// waited for up to the cut budget (a cycle that cannot cut is postponed).
// If none completes, the failed record is handed out anyway: correct, only a
// further failure reprocesses from the older commit point. False: fetching
// stopped (or a seek back started) while it waited.
//
// Without tables there is no cycle to wait for (offsets are marked as
// records resolve); under ExactlyOnce a failure restarts the worker's
// session and this path is never taken (run).
func (c *claimProducer) cycleBefore(ctx context.Context) bool {
	pt := c.pt
	if !c.capped || pt.task == nil || pt.w.txn != nil {
		return true
	}
	c.mu.Lock()
	target := c.nextFetch
	c.mu.Unlock()
	budget := pt.w.cutBudget()
	for range 3 {
		pt.w.tasks.wake(pt.task.key)
		switch c.awaitFlushed(ctx, target, budget) {
		case waitDone:
			return true
		case waitStopped:
			return false
		}
	}
	pt.w.log.Warn("no commit cycle up to the failed record; handing it out anyway (a further failure reprocesses from the last commit point)",
		"topic", pt.topic, "partition", pt.p, "offset", target)
	return true
}

// Outcomes of awaitFlushed.
const (
	waitDone    = iota // the condition holds
	waitTimeout        // the budget passed
	waitStopped        // fetching stopped, a seek back started, or ctx ended
)

// awaitFlushed waits until a cycle with a commit point at or after target
// was acknowledged (Committable), up to budget.
func (c *claimProducer) awaitFlushed(ctx context.Context, target int64, budget time.Duration) int {
	timedOut := false // guarded by mu
	t := time.AfterFunc(budget, func() {
		c.mu.Lock()
		timedOut = true
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer t.Stop()
	defer c.wakeOnDone(ctx)()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case c.flushed >= target:
			return waitDone
		case ctx.Err() != nil, c.rewind >= 0, c.halted, c.closed, c.stopped():
			return waitStopped
		case timedOut:
			return waitTimeout
		}
		c.cond.Wait()
	}
}

// wakeOnDone makes ctx's end wake every waiter on c.cond (they check
// ctx.Err() after each Wait); the returned func unregisters it. Called
// without c.mu held.
func (c *claimProducer) wakeOnDone(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
}

// awaitHeld waits until the held record at off resolved (true), or fetching
// stopped, a seek back started, or ctx ended (false). Advance wakes it.
func (c *claimProducer) awaitHeld(ctx context.Context, off int64) bool {
	defer c.wakeOnDone(ctx)()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case c.wm.Next() > off:
			return true
		case ctx.Err() != nil, c.rewind >= 0, c.halted, c.closed, c.stopped():
			return false
		}
		c.cond.Wait()
	}
}

// emitFetched registers fetched messages as handed out and fans them out in
// one batch (batch is scratch space). The caller holds the transaction's
// hand-out gate (group.TxnCommitter.HandOut); emitFetched calls release once the
// batch is registered, or discarded, before fanning it out. While a cycle is
// being cut the whole batch waits; a seek back, or fetching stopped in the
// meantime, discards it.
func (c *claimProducer) emitFetched(msgs []*sarama.ConsumerMessage, batch []source.Emit, release func(), emit func([]source.Emit) error) error {
	c.mu.Lock()
	for c.paused && c.rewind < 0 && !c.closed && !c.stopped() {
		c.parked = true
		c.cond.Broadcast()
		c.cond.Wait() // a cycle is being cut
	}
	c.parked = false
	if c.rewind >= 0 {
		c.mu.Unlock()
		release()
		return nil // fetched before the seek back: discarded
	}
	if c.stopped() {
		// Fetching stopped (revoke, failure) while the batch waited: it
		// is left to the next reader. Handed out now, after the drain, it
		// could reach a group that no longer delivers it and stay
		// unresolved below the final cycle's commit point. Nor may it be
		// handed out while a cycle is paused (a regular cycle can still be
		// waiting for its cut when a revoke stops fetching): it lies at or
		// after the cycle's commit point, the agents would apply it to the
		// table caches before the cut, and the cycle would commit its
		// effects with an offset below it, so that the next owner
		// processes it again (counted twice).
		c.mu.Unlock()
		release()
		return nil
	}
	if c.closed {
		// Not reached (Close comes after Open returned); neither handed
		// out (a cycle may be paused) nor skipped (a gap would be
		// committed past): the stream ends.
		c.mu.Unlock()
		release()
		return fmt.Errorf("%s: producer closed while reading", c.pt.key)
	}
	if c.capped && c.pt.task != nil && c.retryAt < 0 && c.pt.task.t.OverLimit() != "" {
		// The caches reached their hard limit since awaitCacheRoom looked
		// (the batch waited for a cycle's cut, or for the transaction's
		// gate, while the agents wrote what was handed out before): not
		// handed out; emitBatch waits for room and comes back. Without
		// this look, under a blocked cut one batch looked at before a
		// failed cut went out after it (TestWriteCacheBoundedWhileCutBlocked
		// under two busy loops: 512-556 records handed out after 4-5
		// failed cuts, where 257-259 are one batch and the held record).
		// Lock order: c.mu, then the tables' locks.
		c.mu.Unlock()
		release()
		return errCacheFull
	}
	last := msgs[len(msgs)-1]
	// Records an earlier run of their source partition delivered are not
	// handed out: fetched and resolved at once (dedup.go).
	all := msgs
	msgs, skipped := c.filter().offer(all)
	for _, m := range all {
		c.wm.Fetched(m.Offset)
		if len(skipped) > 0 && skipped[0] == m.Offset {
			c.wm.Resolved(m.Offset)
			skipped = skipped[1:]
		}
	}
	c.nextFetch = last.Offset + 1
	// Skipped records count as handed out: they move the commit point as
	// handed ones do, and a task's idle check cycles on the count.
	c.handed += int64(len(all))
	pl := c.epoch
	c.mu.Unlock()
	release()
	if len(msgs) < len(all) {
		c.markResolved() // the skipped records resolved
	}
	if len(msgs) == 0 {
		return nil
	}
	batch = batch[:0]
	// One allocation for the batch's records: a record already keeps its
	// fetch's buffer alive through its key and value.
	recs := make([]source.Record, len(msgs))
	for i, m := range msgs {
		rec := &recs[i]
		*rec = source.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
		for _, h := range m.Headers {
			if h != nil {
				rec.Headers = append(rec.Headers, source.Header{Key: h.Key, Value: h.Value})
			}
		}
		batch = append(batch, source.Emit{Record: rec, Payload: pl})
	}
	err := emit(batch)
	clear(batch)
	return err
}

// seek (re)starts reading the partition at offset with the producer's own
// PartitionConsumer. Sarama claims cannot seek: the claim is released to the
// feed, which discards its remaining records.
func (c *claimProducer) seek(offset int64) (<-chan *sarama.ConsumerMessage, error) {
	pt := c.pt
	if c.usedClm {
		pt.feed.Release()
	}
	c.closePC()
	consumer := pt.w.restorer.Consumer
	pc, err := consumer.ConsumePartition(pt.topic, pt.p, offset)
	if errors.Is(err, sarama.ErrOffsetOutOfRange) {
		// The record is gone (retention, DeleteRecords): nothing to redeliver
		// below the log start.
		pt.w.log.Warn("seek target below the log start; reading from the oldest offset", "topic", pt.topic, "partition", pt.p, "offset", offset)
		pc, err = consumer.ConsumePartition(pt.topic, pt.p, sarama.OffsetOldest)
	}
	if err != nil {
		return nil, fmt.Errorf("seek %s to %d: %w", pt.key, offset, err)
	}
	c.mu.Lock()
	c.pc = pc
	c.mu.Unlock()
	go func() {
		for e := range pc.Errors() {
			pt.w.log.Warn("partition consumer error", "topic", pt.topic, "partition", pt.p, "err", e)
		}
	}()
	return pc.Messages(), nil
}

func (c *claimProducer) closePC() {
	c.mu.Lock()
	pc := c.pc
	c.pc = nil
	c.mu.Unlock()
	if pc == nil {
		return
	}
	go func() {
		for range pc.Messages() {
		}
	}()
	if err := pc.Close(); err != nil {
		c.pt.w.log.Warn("close partition consumer", "topic", c.pt.topic, "partition", c.pt.p, "err", err)
	}
}

func (c *claimProducer) Lane(any) (any, error) { return c.pt.p, nil }

// Advance implements source.Producer (docs/design.md §3.7): clean records are
// resolved; a rejected record is dead-lettered to the rejecting agents' topics,
// then resolved; a failed record makes the poll loop seek back to it after a
// backoff (the records after it are fetched again) until it failed
// Redelivery.MaxRetries+1 times, when it is dead-lettered and resolved. The
// marked offset is the watermark's next offset. Records of an older epoch
// (fetched before a seek back) are ignored.
func (c *claimProducer) Advance(ctx context.Context, batch []source.AdvanceItem) error {
	pt := c.pt
	resolved := 0
	defer func() {
		c.markResolved()
		if resolved > 0 {
			pt.w.processed.Add(int64(resolved))
			pt.w.metrics.advanced(pt.topic, pt.agentNames(), resolved)
		}
	}()
	for i := 0; i < len(batch); i++ {
		// Clean records of the current epoch, the common case, resolve in
		// runs under one lock; the first other one leaves the run.
		c.mu.Lock()
		for ; i < len(batch); i++ {
			it := &batch[i]
			if it.Payload != any(c.epoch) {
				continue // fetched before a seek back: stale
			}
			if !it.Outcome.Clean() {
				break
			}
			pt.forget(it.Record.Offset)
			c.wm.Resolved(it.Record.Offset)
			resolved++
		}
		c.mu.Unlock()
		if i == len(batch) {
			break
		}
		it := &batch[i]
		off := it.Record.Offset
		failed := !it.Outcome.Clean() && (it.Outcome.Failed > 0 || it.Outcome.Rejected == 0)
		if !failed && it.Outcome.Rejected > 0 {
			if err := pt.w.deadLetter(ctx, it.Record, it.Causes, it.CauseIDs, pt.attemptsOf(off)+1, pt.deadLetters()); err != nil {
				pt.w.log.Warn("dead-letter failed; the record is redelivered", "topic", pt.topic, "partition", pt.p, "offset", off, "err", err)
				it.Causes = append(it.Causes, err)
				failed = true
			}
		}
		if failed {
			n := pt.attempt(off)
			if n <= pt.retry.MaxRetries {
				pt.w.metrics.retry(pt.topic, it.CauseIDs)
				// Redeliver from off by restarting the member's session (run):
				// the agents may already have applied table updates of records
				// after off, and only a restore (which rebuilds a table partition
				// holding effects of uncommitted records) puts the tables back
				// to the committed offset before the records are processed again.
				return &retryError{key: pt.key, offset: off, attempt: n, causes: it.Causes}
			}
			select {
			case <-c.stop:
				// Stopping: leave the record to the next owner.
				c.seekBack(off)
				return nil
			default:
			}
			if len(it.CauseIDs) == 0 {
				return fmt.Errorf("%s@%d failed %d times with no subscriber to dead-letter it to (outcome %+v)", pt.key, off, n, it.Outcome)
			}
			if err := pt.w.deadLetter(ctx, it.Record, it.Causes, it.CauseIDs, n, pt.deadLetters()); err != nil {
				return err
			}
		}
		pt.forget(off)
		c.mu.Lock()
		c.wm.Resolved(off)
		c.mu.Unlock()
		resolved++
	}
	return nil
}

// markResolved marks for commit the offset after the records resolved so
// far (capped: not past the last cycle's commit point).
func (c *claimProducer) markResolved() {
	pt := c.pt
	c.mu.Lock()
	next := c.wm.Next()
	if c.capped {
		next = min(next, c.flushed)
	}
	mark := next > c.marked && next >= 0
	if mark {
		c.marked = next
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	if mark {
		// Kafka commits the offset of the next record to read.
		pt.markOffset(next)
		pt.w.metrics.position(pt.topic, pt.p, next)
		pt.dead.prune(next)
	}
}

func (c *claimProducer) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

// Topic implements task.Source.
func (c *claimProducer) Topic() string { return c.pt.topic }

// Partition implements task.Source.
func (c *claimProducer) Partition() int32 { return c.pt.p }

// Handed implements task.Source; a record skipped as sent again (dedup.go)
// counts as handed out.
func (c *claimProducer) Handed() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.handed
}

// Pause implements task.Source: the poll loop hands out no record until
// Resume, and the cycle's commit point is the offset after the last record
// handed out.
func (c *claimProducer) Pause() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.paused = true
	c.pausedAt = c.handed
	return c.nextFetch
}

// Resume implements task.Source.
func (c *claimProducer) Resume() {
	c.mu.Lock()
	c.paused = false
	c.resumed++
	c.cond.Broadcast()
	c.mu.Unlock()
}

// AwaitResolved implements task.Source: it waits until every record below
// boundary is resolved (every agent pulled past it and its sink records were
// acknowledged), or fails when the source failed a record, stopped without
// draining, or ctx ended. It also fails when a record was handed out since
// Pause: the caches could then hold effects of records at or after the
// commit point, and a cut now would commit them with an offset below them
// (the writes stay in the caches for a later cycle, whose commit point
// covers them).
func (c *claimProducer) AwaitResolved(ctx context.Context, boundary int64) error {
	defer c.wakeOnDone(ctx)()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.paused && c.handed != c.pausedAt {
			return fmt.Errorf("%s: %d records handed out after the cycle paused the source at %d", c.pt.key, c.handed-c.pausedAt, boundary)
		}
		if c.wm.Next() >= boundary {
			return nil
		}
		switch {
		case ctx.Err() != nil:
			return fmt.Errorf("%s: records below %d unresolved: %w", c.pt.key, boundary, ctx.Err())
		case c.rewind >= 0:
			return fmt.Errorf("%s: a record below %d failed", c.pt.key, boundary)
		case c.halted || c.closed:
			return fmt.Errorf("%s: source stopped (halted %v, closed %v) with records below %d unresolved (next %d, pending %d)", c.pt.key, c.halted, c.closed, boundary, c.wm.Next(), c.wm.Pending())
		}
		c.cond.Wait()
	}
}

// Committable implements task.Source: the cycle ending at boundary is
// acknowledged, so offsets up to boundary may be committed; it marks what
// resolved up to there.
func (c *claimProducer) Committable(boundary int64) {
	c.mu.Lock()
	c.flushed = max(c.flushed, boundary)
	next := min(c.wm.Next(), c.flushed)
	mark := next > c.marked && next >= 0
	if mark {
		c.marked = next
	}
	c.cond.Broadcast() // cycleBefore waits for flushed
	c.mu.Unlock()
	if mark {
		c.pt.markOffset(next)
		c.pt.w.metrics.position(c.pt.topic, c.pt.p, next)
		c.pt.dead.prune(next)
	}
}

// skipControl moves an idle source's commit point past the transaction
// markers (and aborted records) at the end of what it read: a read_committed
// reader is never given them, so after the last data record of a
// transactional topic the committed offset would otherwise stay one marker
// short of the highwater, and the lag at 1, for ever (Kafka's consumer
// commits its fetch position for the same reason). Called by a cycle while
// no record is handed out (group.TxnCommitter holds the gate).
func (c *claimProducer) skipControl() {
	c.mu.Lock()
	idle := c.wm.Pending() == 0 && c.rewind < 0 && !c.closed
	next := c.nextFetch
	hwm := int64(-1)
	switch {
	case c.sub != nil:
		hwm = c.sub.HighWatermark()
	case c.pc != nil:
		hwm = c.pc.HighWaterMarkOffset()
	case c.usedClm:
		hwm = c.pt.feed.Claim().HighWaterMarkOffset()
	}
	c.mu.Unlock()
	if !idle || hwm <= next {
		return
	}
	to, err := c.pt.w.restorer.SkipControl(c.pt.topic, c.pt.p, next)
	if err != nil || to <= next {
		return
	}
	c.mu.Lock()
	if c.nextFetch == next && c.wm.Pending() == 0 && c.rewind < 0 {
		c.nextFetch = to
		c.wm.Reset(to)
	}
	c.mu.Unlock()
}

// seekBack starts a new epoch at offset: later items of the current batch and
// every record fetched before are ignored, and the poll loop reads again from
// offset (unless fetching stopped).
func (c *claimProducer) seekBack(offset int64) {
	c.mu.Lock()
	var fails *tablestate.InFlight
	if c.pt != nil {
		fails = c.pt.inflight
	}
	c.epoch = newEpoch(c.epoch.n+1, offset, fails)
	c.filter().rewind(offset)
	c.rewind = offset
	c.wm.Reset(offset)
	c.nextFetch = offset
	c.cond.Broadcast()
	c.mu.Unlock()
	select {
	case c.rewindCh <- struct{}{}:
	default:
	}
}

func (c *claimProducer) Close() error {
	c.mu.Lock()
	sub := c.sub
	c.sub = nil
	c.mu.Unlock()
	if sub != nil {
		sub.Close()
	}
	c.closePC()
	if c.usedClm {
		c.pt.feed.Release()
	}
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	return nil
}
