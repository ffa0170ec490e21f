package app

import (
	"context"
	"errors"
	"fmt"
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

// txnCycles runs the worker's commit cycles under ExactlyOnce: one Kafka
// transaction per worker (Kafka Streams' eos-v2, KIP-447), committed by one
// cycle over every task of the worker (task.Together): the sink records, the
// dead letters and the changelog records of all its partitions since the
// last cycle, and their source offsets, become visible to read_committed
// readers together or not at all.
//
// Invariants:
//   - A transaction is open (open) exactly while records may be handed to the
//     agents: every record a source hands out is handed under gate's read
//     lock, and a cycle holds its write lock from the cut to the next Begin,
//     so every record whose effects are in a transaction is below the commit
//     point that transaction commits.
//   - After an abort, every task is abandoned (its caches dropped, its claims
//     ending) and the next transaction begins only once all of them closed:
//     records an abandoned partition's agents still send fail (no
//     transaction), and are processed again from the committed offsets in the
//     next session.
//   - A producer that cannot go on (fenced, its transaction aborted by the
//     broker after the transaction timeout, an abort that failed) is renewed
//     in place (renewLocked) after the tasks were abandoned and before the
//     next Begin: the old producer is closed and every one of its delivery
//     reports ran before the new one initializes the transactional ID, so no
//     record of an abandoned task reaches a later transaction.
type txnCycles struct {
	w    *Worker
	gate sync.RWMutex // hand-outs read-lock it; a cycle write-locks it
	wake chan struct{}
	// rejoins says whether the member rejoins the group and the
	// generation of its last assignment: a transaction commits its offsets
	// with the generation the coordinator knows, or fails as a zombie's
	// would (KIP-447).
	rejoins group.Rejoins

	mu      sync.Mutex
	open    bool                        // a transaction is open; guarded by mu
	isOpen  atomic.Bool                 // open, for handOut
	pending map[*taskRun]struct{}       // abandoned by the last abort, not yet closed; guarded by mu
	sess    sarama.ConsumerGroupSession // current session; guarded by mu
	last    map[task.Offset]bool        // offsets of the last commit; guarded by mu
	opened  chan struct{}               // closed when a transaction opens; guarded by mu
	began   time.Time                   // when the open transaction began; guarded by mu
	// fences counts the renewals after a fence by another producer of the
	// transactional ID since the last commit (which resets it): a fence
	// while it is maxFences stops the worker (zombieRule). Guarded by mu.
	fences int
	// window bounds the records a source of the worker has handed out and
	// not yet resolved (group.CutWindow), so that a cut, which waits for all of
	// them, fits in the transaction: it shrinks when a cut is slow or
	// misses the transaction's deadline and grows back when cuts are
	// quick. It outlives sessions and renewals.
	window group.CutWindow
	// handedAt is each running task's Handed count at the last cycle: a
	// task whose sources handed out nothing since is idle, and only then
	// does a cycle look for transaction markers to skip (see cycle).
	// Guarded by mu.
	handedAt map[*taskRun]int64
	// gated is set while a cycle holds the gate (no source hands out a
	// record meanwhile): TaskStatus.Waiting shows it as "cycle".
	gated atomic.Bool
}

func newTxnCycles(w *Worker) *txnCycles {
	x := &txnCycles{w: w, wake: make(chan struct{}, 1), pending: map[*taskRun]struct{}{}, opened: make(chan struct{})}
	return x
}

// cutDeadline is the part of the transaction timeout a transaction may
// spend before its cut: what is left is for the flush and the commit. A
// cycle whose cut is not done by then aborts the transaction itself, at an
// epoch the broker still accepts, before the broker times it out and
// fences the producer (issue #24: transactions open 47 s to 15 min against
// an 11.2 s timeout, 0 commits in 40 minutes under CPU starvation).
func (w *Worker) cutDeadline() time.Duration { return w.txnTimeout() * 3 / 4 }

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

// handOut is held by a source while it hands out one record or one fetched
// batch (registers it as handed out; see the invariants): it waits until a
// transaction is open and no cycle runs, and returns the release. It returns
// false, holding nothing, when ctx ends or stop closes first. Nil-safe:
// without ExactlyOnce it holds nothing.
func (x *txnCycles) handOut(ctx context.Context, stop <-chan struct{}) (func(), bool) {
	if x == nil {
		return func() {}, true
	}
	for {
		x.gate.RLock()
		if x.isOpen.Load() {
			return x.gate.RUnlock, true
		}
		x.gate.RUnlock()
		x.mu.Lock()
		ch := x.opened
		x.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false
		case <-stop:
			return nil, false
		}
	}
}

// setSession records the group session whose generation and member fence the
// transactions' offset commits.
func (x *txnCycles) setSession(sess sarama.ConsumerGroupSession) {
	x.mu.Lock()
	x.sess = sess
	x.mu.Unlock()
}

// begin opens a transaction if none is open and no abandoned task is left.
// Guarded by mu (the caller holds it).
func (x *txnCycles) beginLocked() error {
	if x.open || len(x.pending) > 0 {
		return nil
	}
	if err := x.w.producer.Begin(); err != nil {
		return err
	}
	x.began = time.Now()
	x.setOpen(true)
	return nil
}

// setOpen sets open (and isOpen); opening closes opened, closing makes a
// new one. Guarded by mu.
func (x *txnCycles) setOpen(open bool) {
	if open == x.open {
		return
	}
	x.open = open
	x.isOpen.Store(open)
	if open {
		close(x.opened)
	} else {
		x.opened = make(chan struct{})
	}
}

// closed says an abandoned task is gone; the next transaction may begin when
// it was the last.
func (x *txnCycles) closed(tr *taskRun) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.pending[tr]; !ok {
		return
	}
	delete(x.pending, tr)
	x.beginOrStopLocked()
}

// beginOrStopLocked begins the next transaction (beginLocked); a producer
// that cannot begin one because it cannot go on is renewed first
// (renewLocked), any other failure stops the worker. Guarded by mu.
func (x *txnCycles) beginOrStopLocked() {
	w := x.w
	err := x.beginLocked()
	if err != nil && w.producer.Fatal() {
		if rerr := x.renewLocked(err, 0); rerr != nil {
			w.log.Error("transactional producer could not be renewed; stopping the worker", "err", rerr)
			w.fatal.stop(rerr)
			return
		}
		err = x.beginLocked()
	}
	if err != nil {
		w.log.Error("begin transaction failed; stopping the worker", "err", err)
		w.fatal.stop(err)
	}
}

// abortLocked aborts the open transaction and abandons every task with err:
// their partitions restart from the committed offsets. Guarded by mu.
func (x *txnCycles) abortLocked(err error) {
	w := x.w
	for _, tr := range w.tasks.all() {
		x.pending[tr] = struct{}{}
		tr.abandon(&w.tasks, err)
	}
	var age time.Duration
	var aerr error
	if x.open {
		age = time.Since(x.began)
		x.setOpen(false)
		w.metrics.txn.aborts.Inc()
		if age >= w.txnTimeout() {
			// The broker aborted it already (transaction.timeout.ms), and
			// bumped the producer's epoch: the abort below may fail.
			w.metrics.txn.timedOut.Inc()
		}
		aerr = w.producer.Abort()
	}
	if aerr != nil || w.producer.Fatal() {
		// What could be aborted was; the producer cannot go on. The tasks
		// are abandoned above, so a new producer in its place loses
		// nothing: the next transaction begins when they closed.
		cause := err
		if aerr != nil {
			cause = fmt.Errorf("abort transaction: %w (after %w)", aerr, err)
		}
		if rerr := x.renewLocked(cause, age); rerr != nil {
			w.log.Error("transactional producer could not be renewed; stopping the worker", "err", rerr)
			w.fatal.stop(rerr)
			return
		}
	} else {
		w.log.Warn("transaction aborted; every partition restarts from its committed offsets", "err", err, "transaction_age", age)
	}
	x.beginOrStopLocked()
}

// ErrTransactionalIDInUse is the cause of a worker stopped because another
// live process owns its transactional ID (see zombieRule).
var ErrTransactionalIDInUse = errors.New("transactional ID in use by another live process")

// zombieRule, as renewLocked applies it. A producer is renewed whenever it
// cannot go on; why is told apart by the failed transaction's age and the
// error:
//   - "timeout": the transaction was open at least the transaction timeout
//     (a cycle could not cut: an agent stalled on a record). The broker
//     aborted it and bumped the epoch. Renewing is always right: nobody else
//     holds the ID.
//   - "fenced": PRODUCER_FENCED or INVALID_PRODUCER_EPOCH on a younger
//     transaction: another producer initialized the transactional ID, which
//     is runnel-<app>-<process ID>, the process ID read from the data dir. A
//     restarted incarnation of this worker does that once; so does an
//     operator's tool. The worker renews (fencing the other producer in turn)
//     and goes on.
//   - "failed": any other error (the abort failed, the coordinator could
//     not be reached): renewed like a fence, not counted as one.
//
// A producer that initializes the ID fences this one at once, but its own
// InitProducerId is answered CONCURRENT_TRANSACTIONS until the broker has
// aborted this worker's open transaction, and it retries: a renewal made
// meanwhile is fenced again by that retry (seen on Kafka 4.4 within 0.1 s
// of the renewal, and 1 run in 2 of TestExactlyOnceSurvivesFencedProducer
// with a renewal at once). So a fenced worker waits fenceSettle before
// renewing, and one more fence before a commit is still taken for that
// retry: a fence after maxFences renewals with no transaction of this
// worker committed since means another live process keeps initializing the
// ID: two workers run with the same data dir (a copied data dir, or one
// shared by two hosts; Pebble's lock refuses a second process on one host's
// stores). Renewing again would make the two fence each other for ever,
// each aborting the other's transactions: the worker stops with
// ErrTransactionalIDInUse instead, and the other process keeps the ID.
const zombieRule = "a third fence by another producer of the transactional ID before a commit stops the worker"

// maxFences is the number of renewals after a fence that zombieRule allows
// before a commit, and fenceSettle how long a fenced worker waits before it
// renews (see zombieRule).
const (
	maxFences   = 2
	fenceSettle = 300 * time.Millisecond
)

// renewLocked replaces the worker's transactional producer with a new one of
// the same transactional ID (kafka.Producer.Renew: the old one is closed and
// drained first, the new one bumps the epoch), after an abort that failed or
// left the producer unable to go on; cause is why, age the age of the
// transaction it failed in (0: none was open). Every task must already be
// abandoned. Errors: ErrTransactionalIDInUse (zombieRule), the renewal's
// error once its retries ran out. Guarded by mu.
func (x *txnCycles) renewLocked(cause error, age time.Duration) error {
	w := x.w
	reason := "failed"
	switch {
	case age >= w.txnTimeout():
		reason = "timeout"
	case kafka.Fenced(cause) || kafka.Fenced(w.producer.FatalErr()):
		// The cause may be a task's error whose records failed after the
		// fence (their reports name it only as text): the producer keeps
		// the error that made it fatal.
		reason = "fenced"
	}
	id := w.txnID()
	if reason == "fenced" && x.fences >= maxFences {
		w.log.Error("fenced again by another producer of this worker's transactional ID before any commit: another live process uses this data dir's process ID; stopping the worker",
			"transactional_id", id, "rule", zombieRule, "fences", x.fences+1, "err", cause)
		return fmt.Errorf("%w: %s (%s): %w", ErrTransactionalIDInUse, id, zombieRule, cause)
	}
	// Renew retries what Kafka calls retriable (the coordinator loading,
	// moving or busy: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
	// CONCURRENT_TRANSACTIONS) with backoff for up to the delivery timeout
	// (flushBudget); what is left is a person's to fix.
	if reason == "fenced" {
		time.Sleep(fenceSettle)
	}
	// A broker that is down longer than the renewal's budget (a restart of
	// a loaded broker took 44 s in the chaos suite) is waited out: renew
	// again until it answers, the worker stops, or the error is one a
	// person must fix (kafka.Permanent: authorization, a bad ID).
	for attempt := 1; ; attempt++ {
		err := w.producer.Renew()
		if err == nil {
			break
		}
		if kafka.Permanent(err) || errors.Is(err, kafka.ErrRenewClosed) || kafka.Fenced(err) {
			return fmt.Errorf("renew transactional producer %s: %w (after %w)", id, err, cause)
		}
		if reason == "fenced" {
			// After a fence, a renewal that failed for its whole budget
			// (CONCURRENT_TRANSACTIONS again and again: another producer
			// keeps initializing the ID) counts as one more fence, so that
			// a live zombie cannot hold the worker in this loop for ever
			// (TestExactlyOnceStopsWhenTransactionalIDInUse ran 60 s under
			// load without stopping). A broker that is down after a fence
			// stops the worker only after maxFences whole budgets.
			x.fences++
			if x.fences >= maxFences {
				w.log.Error("the transactional producer could not be renewed after a fence: another live process keeps using this data dir's process ID; stopping the worker",
					"transactional_id", id, "rule", zombieRule, "fences", x.fences+1, "err", err)
				return fmt.Errorf("%w: %s (%s): %w (after %w)", ErrTransactionalIDInUse, id, zombieRule, err, cause)
			}
		}
		select {
		case <-w.runDone:
			return fmt.Errorf("renew transactional producer %s: worker stopping: %w (after %w)", id, err, cause)
		case <-time.After(time.Second):
		}
		if attempt == 1 {
			w.log.Warn("transactional producer could not be renewed yet; retrying until a broker answers",
				"transactional_id", id, "err", err)
		}
	}
	if reason == "fenced" {
		x.fences++
	}
	w.metrics.txn.renewals.WithLabelValues(reason).Inc()
	w.log.Warn("transactional producer renewed (new epoch); every partition restarts from its committed offsets",
		"reason", reason, "transactional_id", id, "transaction_age", age, "transaction_timeout", w.txnTimeout(), "err", cause)
	return nil
}

// leftAlone is called when task tr leaves the worker, after any cycle in
// progress (it takes mu). A task abandoned on its own (a timer or a join
// backfill failed; not by an abort, which puts it in pending) sent its
// records in the open transaction without its offsets: the transaction is
// aborted, or a later commit would publish them and the partition would
// send them again.
func (x *txnCycles) leftAlone(tr *taskRun) {
	x.mu.Lock()
	defer x.mu.Unlock()
	err := tr.t.Err()
	if _, pending := x.pending[tr]; err == nil || pending || !x.open {
		return
	}
	x.abortLocked(fmt.Errorf("task %v abandoned alone in the worker's transaction: %w", tr.key, err))
}

// abort aborts the open transaction (see abortLocked).
func (x *txnCycles) abort(err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.abortLocked(err)
}

// cycle runs one cycle over every task of the worker in the open
// transaction: it commits the transaction with the tasks' offsets and
// begins the next one. A failure to cut is returned and changes nothing; a
// failure to flush or commit aborts (abortLocked).
//
// While the member rejoins the group a periodic cycle (final false) is
// skipped, and a final one waits for the assignment: an offset commit with the
// generation the member is leaving would be refused and abort the
// transaction.
func (x *txnCycles) cycle(ctx context.Context, final bool) error {
	w := x.w
	for x.rejoins.Joining() {
		if !final {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.open {
		return nil // an abort's partitions are still stopping
	}
	x.gate.Lock()
	x.gated.Store(true)
	defer func() {
		x.gated.Store(false)
		x.gate.Unlock()
	}()
	trs := w.tasks.all()
	tasks := make([]*task.Task, len(trs))
	handedAt := make(map[*taskRun]int64, len(trs))
	idle := true // no source handed out a record since the last cycle
	for i, tr := range trs {
		tasks[i] = tr.t
		// A source that handed out nothing for a whole cycle may sit before
		// transaction markers it is never given: skip them (one Fetch per
		// partition, decoding what it returns). A busy source is not
		// stuck, and a Fetch per partition in every cycle, with the gate
		// held, cost 20% of the stateful worker's CPU at a 100 ms interval
		// (pprof, kfake): only idle tasks pay it, one cycle after they
		// went idle.
		n := tr.t.Handed()
		handedAt[tr] = n
		if last, ok := x.handedAt[tr]; !ok || last != n {
			idle = false
			continue
		}
		for _, s := range tr.t.SourceList() {
			if c, ok := s.(*claimProducer); ok {
				c.skipControl()
			}
		}
	}
	x.handedAt = handedAt
	sess := x.sess
	var beginErr error // the next transaction's BeginTxn failed after a commit
	commit := func(ctx context.Context, offs []task.Offset, flushed bool) error {
		// Every task's cycle token is held here. A task abandoned on its own
		// (a timer or a join backfill failed: they run under the token, not
		// the hand-out gate) left what it sent in this transaction, and
		// Together skipped it: committing would publish its records without
		// its offsets, and its partition would send them again. Abort.
		for _, tr := range trs {
			if err := tr.t.Err(); err != nil {
				return fmt.Errorf("task %v abandoned alone in the worker's transaction: %w", tr.key, err)
			}
		}
		if !flushed && (len(offs) == 0 || x.unchanged(offs)) {
			if idle {
				// Nothing handed out since the last cycle: the open
				// transaction holds no source record's effects, and its
				// deadline counts from now (an idle worker's would be
				// long past).
				x.began = time.Now()
			}
			return nil // no record since the last commit: nothing to commit
		}
		start := time.Now()
		m := map[string]map[int32]int64{}
		for _, o := range offs {
			if m[o.Topic] == nil {
				m[o.Topic] = map[int32]int64{}
			}
			m[o.Topic][o.Partition] = o.Offset
		}
		var meta *sarama.ConsumerGroupMetadata
		if sess != nil {
			var inst *string
			if w.cfg.InstanceID != "" {
				id := w.cfg.InstanceID
				inst = &id
			}
			meta = sarama.NewConsumerGroupMetadataFromSession(sess, w.app.id, inst)
			meta.GenerationID = max(meta.GenerationID, x.rejoins.Generation())
		} else {
			meta = sarama.NewConsumerGroupMetadata(w.app.id)
		}
		w.commitMu.Lock()
		defer w.commitMu.Unlock()
		if err := w.producer.Commit(m, meta, x.rejoined(meta, x.began.Add(w.txnTimeout()*7/8))); err != nil {
			return err // still open: abortLocked aborts it
		}
		x.setOpen(false)
		x.fences = 0
		w.metrics.txn.commits.Inc()
		w.metrics.txn.seconds.Observe(time.Since(start).Seconds())
		x.last = make(map[task.Offset]bool, len(offs))
		for _, o := range offs {
			x.last[o] = true
		}
		// The next transaction begins here, while every task's cycle token
		// is still held (a timer firing between two transactions would
		// find none open). A failure to begin must not read as a failed
		// commit, which would drop the cycles of a committed transaction:
		// it is handled after Together applied them.
		beginErr = x.beginLocked()
		return nil
	}
	// The cut may wait until the transaction's cut deadline (sources are
	// paused meanwhile, so what is unresolved only drains), at least the
	// cut budget.
	held := unresolved(trs)
	deadline := x.began.Add(w.cutDeadline())
	cut := max(w.cutBudget(), time.Until(deadline))
	st, err := task.Together(ctx, tasks, cut, commit)
	if beginErr != nil && !errors.Is(err, task.ErrAbandoned) {
		// Committed and applied, but the next transaction could not begin:
		// handled as an abort is (every task abandoned, the producer
		// renewed if it must be, the next transaction begun once they
		// closed).
		x.abortLocked(fmt.Errorf("begin the next transaction: %w", beginErr))
		return beginErr
	}
	switch {
	case err == nil:
		x.window.Adapt(st.Cut, w.cutBudget(), held)
		if st.Records > 0 {
			w.metrics.cycle(st.Records, st.Elapsed)
		}
		w.tasks.counted(trs, st)
		return nil
	case errors.Is(err, task.ErrAbandoned):
		if permanent(err) || errors.Is(err, stores.ErrFailed) {
			w.log.Error("transaction failed permanently; stopping the worker", "err", err)
			w.fatal.stop(err)
		}
		x.abortLocked(err)
		return err
	case ctx.Err() == nil && !time.Now().Before(deadline):
		// The cut missed the deadline: the records handed out take longer
		// than the transaction may. Abort it now and hand out fewer.
		left := unresolved(trs)
		x.window.Missed(held)
		w.metrics.txn.timedOut.Inc()
		w.log.Warn("transaction could not cut before its deadline; aborting it and handing out fewer records at once",
			"transaction_age", time.Since(x.began), "deadline", w.cutDeadline(), "transaction_timeout", w.txnTimeout(),
			"unresolved_at_start", held, "unresolved", left, "window", x.window.Load(), "err", err)
		err = fmt.Errorf("transaction cut deadline (%v of its %v timeout) passed: %w", w.cutDeadline(), w.txnTimeout(), err)
		x.abortLocked(err)
		// Aborted already: a caller must not abort again (a final cycle
		// would otherwise abort, and log, a second time).
		return fmt.Errorf("%w: %w", task.ErrAbandoned, err)
	default:
		w.tasks.postponed(trs...)
		return err
	}
}

// unchanged reports whether offs are the offsets the last commit committed.
// Guarded by mu.
func (x *txnCycles) unchanged(offs []task.Offset) bool {
	if len(offs) != len(x.last) {
		return false
	}
	for _, o := range offs {
		if !x.last[o] {
			return false
		}
	}
	return true
}

// rejoined is x.rejoins.Rejoined for a commit of meta by deadline, each
// commit sent again counted (runnel_transaction_offset_commits_resent_total)
// and logged.
func (x *txnCycles) rejoined(meta *sarama.ConsumerGroupMetadata, deadline time.Time) kafka.Rejoined {
	return x.rejoins.Rejoined(meta, deadline, func(refused, g int32, waited time.Duration) {
		x.w.metrics.txn.resent.Inc()
		x.w.log.Info("group rebalanced during a transaction's offset commit; committing under the new generation",
			"refused_generation", refused, "generation", g, "waited", waited.Round(time.Millisecond))
	})
}

// txnTimeout is the transaction timeout under ExactlyOnce: four commit
// intervals, at least 10 s (minTxnTimeout) (Kafka Streams' exactly-once default) and at most
// 15 min (Kafka's default transaction.max.timeout.ms, above which the broker
// refuses the producer).
func (w *Worker) txnTimeout() time.Duration {
	return min(max(minTxnTimeout, 4*w.cfg.CommitInterval), 15*time.Minute)
}

// minTxnTimeout is the least transaction timeout; tests lower it
// (SetMinTxnTimeout in export_test.go) to time a transaction out quickly.
var minTxnTimeout = 10 * time.Second

// loop runs cycles every commit interval, when a cache is full (wake), and
// when the tasks' sources handed out records since the last cycle but none
// in the last idle interval (group.CycleClock, as taskSet.loop does per task).
func (x *txnCycles) loop(ctx context.Context) {
	w := x.w
	// A transaction must commit well within its timeout.
	clock := group.NewCycleClock(min(w.cfg.CommitInterval, w.txnTimeout()/2), w.idleCommit(), false, w.tasks.handed, x.wake)
	defer clock.Stop()
	for clock.Wait(ctx) {
		cctx, cancel := context.WithTimeout(ctx, w.flushBudget())
		err := x.cycle(cctx, false)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, task.ErrAbandoned) {
			w.log.Debug("commit cycle postponed", "err", err)
		}
	}
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

// handed sums the records handed out by every task's sources.
func (ts *taskSet) handed() int64 {
	var n int64
	for _, tr := range ts.all() {
		n += tr.t.Handed()
	}
	return n
}

// counted adds a worker-wide cycle to the tasks' counters.
func (ts *taskSet) counted(trs []*taskRun, st task.Stats) {
	if st.Records == 0 {
		return
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, tr := range trs {
		tr.cycles++
		tr.last = st.Elapsed
	}
}
