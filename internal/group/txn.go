package group

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/stores"
)

// TxnTasks is a worker's running tasks as its TxnCommitter sees and moves
// them; T names one task (app's *taskRun). The methods are called with the
// committer's lock held (All and Task also without it, from Loop), and must
// not call the committer back.
type TxnTasks[T comparable] interface {
	// All returns the running tasks, ordered as task.Together locks them
	// (by key).
	All() []T
	// Task returns the task t runs.
	Task(t T) *task.Task
	// Name names t in errors ("task <name> abandoned alone ...").
	Name(t T) string
	// Abandon abandons t with err: its caches are dropped, its claims end
	// and its partition restarts from its committed offsets.
	Abandon(t T, err error)
	// Unresolved returns the most records any source of ts has handed out
	// and not yet resolved.
	Unresolved(ts []T) int64
	// SkipControl has t's sources skip the transaction markers an idle
	// source may sit before (called while no record is handed out).
	SkipControl(t T)
	// Counted adds a worker-wide cycle's stats to the counters of ts
	// (which it ran over); Postponed counts a cycle of ts whose cut did not
	// finish.
	Counted(ts []T, st task.Stats)
	Postponed(ts []T)
}

// TxnMetrics are the collectors a TxnCommitter counts in (app registers
// them).
type TxnMetrics struct {
	// Commits, Aborts: transactions committed and aborted. TimedOut:
	// transactions aborted at or past their timeout, or whose cut missed
	// its deadline. Resent: offset commits sent again under the member's
	// new generation (Rejoins.Rejoined).
	Commits, Aborts, TimedOut, Resent prometheus.Counter
	// Seconds observes each commit's time (offsets added and committed).
	Seconds prometheus.Observer
	// Renewals counts the producer's renewals by reason: fenced, timeout,
	// failed (see ZombieRule).
	Renewals *prometheus.CounterVec
	// Cycle counts a cycle that wrote records (records, its time).
	Cycle func(records int, elapsed time.Duration)
}

// TxnConfig is what a TxnCommitter needs of its worker. Every field is
// required (IdleCommit may be 0); none changes after NewTxnCommitter.
type TxnConfig[T comparable] struct {
	// Producer is the worker's transactional producer; renewed in place
	// (kafka.Producer.Renew), never replaced.
	Producer *kafka.Producer
	// Tasks are the worker's running tasks.
	Tasks TxnTasks[T]
	// Group is the consumer group ID, InstanceID the member's
	// group.instance.id (empty: a dynamic member): the transactions' offset
	// commits go to them.
	Group, InstanceID string
	// TransactionalID is the producer's, as logs and errors name it.
	TransactionalID string
	// Timeout is the transaction timeout (the producer's
	// transaction.timeout.ms).
	Timeout time.Duration
	// CommitInterval and IdleCommit time the periodic cycles (CycleClock;
	// IdleCommit 0: no early cycle). CutBudget is the least time a cut may
	// wait for the records below its commit point; FlushBudget bounds a
	// periodic cycle as a whole.
	CommitInterval, IdleCommit, CutBudget, FlushBudget time.Duration
	// CommitMu orders the transactions' offset commits with the session's
	// own: held while a transaction commits.
	CommitMu *sync.Mutex
	// Log gets the committer's lines (aborts, renewals, missed deadlines).
	Log *slog.Logger
	// Metrics are counted in.
	Metrics TxnMetrics
	// Fatal is called with the cause when the worker cannot go on (the
	// producer could not be renewed, a transaction could not begin, a
	// changelog write or a store failed for good): the caller stops the
	// worker. The committer goes on as if aborted meanwhile.
	Fatal func(error)
	// Done is closed when the worker stops: a renewal waiting for a broker
	// gives up.
	Done <-chan struct{}
}

// TxnCommitter runs a worker's commit cycles under exactly-once: one Kafka
// transaction per worker (Kafka Streams' eos-v2, KIP-447), committed by one
// cycle over every task of the worker (task.Together): the sink records, the
// dead letters and the changelog records of all its partitions since the
// last cycle, and their source offsets, become visible to read_committed
// readers together or not at all. Only the transactions commit the group's
// offsets under exactly-once.
//
// Invariants:
//   - A transaction is open (open) exactly while records may be handed to the
//     agents: every record a source hands out is handed under gate's read
//     lock (HandOut), and a cycle holds its write lock from the cut to the
//     next Begin, so every record whose effects are in a transaction is below
//     the commit point that transaction commits.
//   - After an abort, every task is abandoned (its caches dropped, its claims
//     ending) and the next transaction begins only once all of them closed
//     (Closed): records an abandoned partition's agents still send fail (no
//     transaction), and are processed again from the committed offsets in
//     the next session.
//   - A producer that cannot go on (fenced, its transaction aborted by the
//     broker after the transaction timeout, an abort that failed) is renewed
//     in place (renewLocked) after the tasks were abandoned and before the
//     next Begin: the old producer is closed and every one of its delivery
//     reports ran before the new one initializes the transactional ID, so no
//     record of an abandoned task reaches a later transaction.
//
// Lock order: mu, then gate; then the tasks' locks (TxnTasks), then
// TxnConfig.CommitMu.
type TxnCommitter[T comparable] struct {
	cfg   TxnConfig[T]
	tasks TxnTasks[T]
	gate  sync.RWMutex // hand-outs read-lock it; a cycle write-locks it
	wake  chan struct{}
	// rejoins says whether the member rejoins the group and the
	// generation of its last assignment: a transaction commits its offsets
	// with the generation the coordinator knows, or fails as a zombie's
	// would (KIP-447).
	rejoins Rejoins

	mu      sync.Mutex
	open    bool                        // a transaction is open; guarded by mu
	isOpen  atomic.Bool                 // open, for HandOut
	pending map[T]struct{}              // abandoned by the last abort, not yet closed; guarded by mu
	sess    sarama.ConsumerGroupSession // current session; guarded by mu
	last    map[task.Offset]bool        // offsets of the last commit; guarded by mu
	opened  chan struct{}               // closed when a transaction opens; guarded by mu
	began   time.Time                   // when the open transaction began; guarded by mu
	// fenced holds the times of the fences by another producer of the
	// transactional ID within the last fenceWindow, oldest first (a
	// renewal after a fence, or a renewal that failed for its whole
	// budget after one): a fence while it holds maxFences stops the worker
	// (ZombieRule). Commits do not clear it. Guarded by mu.
	fenced []time.Time
	// window bounds the records a source of the worker has handed out and
	// not yet resolved (CutWindow), so that a cut, which waits for all of
	// them, fits in the transaction: it shrinks when a cut is slow or
	// misses the transaction's deadline and grows back when cuts are
	// quick. It outlives sessions and renewals.
	window CutWindow
	// handedAt is each running task's Handed count at the last cycle: a
	// task whose sources handed out nothing since is idle, and only then
	// does a cycle look for transaction markers to skip (see Cycle).
	// Guarded by mu.
	handedAt map[T]int64
	// gated is set while a cycle holds the gate (no source hands out a
	// record meanwhile): app's TaskStatus.Waiting shows it as "cycle".
	gated atomic.Bool
}

// NewTxnCommitter returns the committer of a worker; Begin opens its first
// transaction and Loop runs its periodic cycles.
func NewTxnCommitter[T comparable](cfg TxnConfig[T]) *TxnCommitter[T] {
	return &TxnCommitter[T]{cfg: cfg, tasks: cfg.Tasks, wake: make(chan struct{}, 1),
		pending: map[T]struct{}{}, opened: make(chan struct{})}
}

// CutDeadline is the part of the transaction timeout a transaction may
// spend before its cut: what is left is for the flush and the commit. A
// cycle whose cut is not done by then aborts the transaction itself, at an
// epoch the broker still accepts, before the broker times it out and
// fences the producer (issue #24: transactions open 47 s to 15 min against
// an 11.2 s timeout, 0 commits in 40 minutes under CPU starvation).
func (x *TxnCommitter[T]) CutDeadline() time.Duration { return x.cfg.Timeout * 3 / 4 }

// Rejoins returns the member's rejoins the transactions' offset commits
// follow (RejoinStrategy and the worker's assignments feed it).
func (x *TxnCommitter[T]) Rejoins() *Rejoins { return &x.rejoins }

// Window returns the worker's cut window: the records each source may hold
// handed out and unresolved.
func (x *TxnCommitter[T]) Window() *CutWindow { return &x.window }

// IsOpen reports whether a transaction is open (records may be handed out).
func (x *TxnCommitter[T]) IsOpen() bool { return x.isOpen.Load() }

// Gated reports whether a cycle holds the hand-out gate (no source hands
// out a record meanwhile).
func (x *TxnCommitter[T]) Gated() bool { return x.gated.Load() }

// Wake asks for a cycle now (a table cache is full).
func (x *TxnCommitter[T]) Wake() {
	select {
	case x.wake <- struct{}{}:
	default:
	}
}

// HandOut is held by a source while it hands out one record or one fetched
// batch (registers it as handed out; see the invariants): it waits until a
// transaction is open and no cycle runs, and returns the release. It returns
// false, holding nothing, when ctx ends or stop closes first. Nil-safe:
// without a committer (at-least-once) it holds nothing.
func (x *TxnCommitter[T]) HandOut(ctx context.Context, stop <-chan struct{}) (func(), bool) {
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

// SetSession records the group session whose generation and member fence the
// transactions' offset commits.
func (x *TxnCommitter[T]) SetSession(sess sarama.ConsumerGroupSession) {
	x.mu.Lock()
	x.sess = sess
	x.mu.Unlock()
}

// Begin opens the first transaction (see beginLocked). Errors: the
// producer's BeginTxn.
func (x *TxnCommitter[T]) Begin() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.beginLocked()
}

// beginLocked opens a transaction if none is open and no abandoned task is
// left. Guarded by mu (the caller holds it).
func (x *TxnCommitter[T]) beginLocked() error {
	if x.open || len(x.pending) > 0 {
		return nil
	}
	if err := x.cfg.Producer.Begin(); err != nil {
		return err
	}
	x.began = time.Now()
	x.setOpen(true)
	return nil
}

// setOpen sets open (and isOpen); opening closes opened, closing makes a
// new one. Guarded by mu.
func (x *TxnCommitter[T]) setOpen(open bool) {
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

// Closed says task t is gone; the next transaction may begin when it was
// the last task abandoned by an abort.
func (x *TxnCommitter[T]) Closed(t T) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if _, ok := x.pending[t]; !ok {
		return
	}
	delete(x.pending, t)
	x.beginOrStopLocked()
}

// beginOrStopLocked begins the next transaction (beginLocked); a producer
// that cannot begin one because it cannot go on is renewed first
// (renewLocked), any other failure stops the worker (Fatal). Guarded by mu.
func (x *TxnCommitter[T]) beginOrStopLocked() {
	p := x.cfg.Producer
	err := x.beginLocked()
	if err != nil && p.Fatal() {
		if rerr := x.renewLocked(err, 0); rerr != nil {
			x.cfg.Log.Error("transactional producer could not be renewed; stopping the worker", "err", rerr)
			x.cfg.Fatal(rerr)
			return
		}
		err = x.beginLocked()
	}
	if err != nil {
		x.cfg.Log.Error("begin transaction failed; stopping the worker", "err", err)
		x.cfg.Fatal(err)
	}
}

// abortLocked aborts the open transaction and abandons every task with err:
// their partitions restart from the committed offsets. Guarded by mu.
func (x *TxnCommitter[T]) abortLocked(err error) {
	p, m, log := x.cfg.Producer, x.cfg.Metrics, x.cfg.Log
	for _, t := range x.tasks.All() {
		x.pending[t] = struct{}{}
		x.tasks.Abandon(t, err)
	}
	var age time.Duration
	var aerr error
	if x.open {
		age = time.Since(x.began)
		x.setOpen(false)
		m.Aborts.Inc()
		if age >= x.cfg.Timeout {
			// The broker aborted it already (transaction.timeout.ms), and
			// bumped the producer's epoch: the abort below may fail.
			m.TimedOut.Inc()
		}
		aerr = p.Abort()
	}
	if aerr != nil || p.Fatal() {
		// What could be aborted was; the producer cannot go on. The tasks
		// are abandoned above, so a new producer in its place loses
		// nothing: the next transaction begins when they closed.
		cause := err
		if aerr != nil {
			cause = fmt.Errorf("abort transaction: %w (after %w)", aerr, err)
		}
		if rerr := x.renewLocked(cause, age); rerr != nil {
			log.Error("transactional producer could not be renewed; stopping the worker", "err", rerr)
			x.cfg.Fatal(rerr)
			return
		}
	} else {
		log.Warn("transaction aborted; every partition restarts from its committed offsets", "err", err, "transaction_age", age)
	}
	x.beginOrStopLocked()
}

// ErrTransactionalIDInUse is the cause of a worker stopped because another
// live process owns its transactional ID (see ZombieRule).
var ErrTransactionalIDInUse = errors.New("transactional ID in use by another live process")

// ZombieRule, as renewLocked applies it. A producer is renewed whenever it
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
// renewing, and one more fence is still taken for that retry: a fence after maxFences renewals within fenceWindow, whether or not
// a transaction of this worker committed between them, means another live
// process keeps initializing the ID: two workers run with the same data dir (a copied data dir, or one
// shared by two hosts; Pebble's lock refuses a second process on one host's
// stores). Renewing again would make the two fence each other for ever,
// each aborting the other's transactions: the worker stops with
// ErrTransactionalIDInUse instead, and the other process keeps the ID.
// Commits between the fences do not clear the count: a process that
// initializes the ID less often than the worker commits (once a second
// against a 200 ms commit interval) is as live as one that does it more
// often, and with the count cleared at every commit it kept the worker
// renewing for the whole 60 s of TestExactlyOnceStopsWhenTransactionalIDInUse/slow.
const ZombieRule = "a third fence by another producer of the transactional ID within two minutes stops the worker"

// maxFences is the number of renewals after a fence that ZombieRule allows
// within fenceWindow, and fenceSettle how long a fenced worker waits before
// it renews (see ZombieRule).
const (
	maxFences   = 2
	fenceWindow = 2 * time.Minute
	fenceSettle = 300 * time.Millisecond
)

// recentFencesLocked forgets the fences older than fenceWindow and returns
// how many are left. Guarded by mu.
func (x *TxnCommitter[T]) recentFencesLocked() int {
	now := time.Now()
	i := 0
	for i < len(x.fenced) && now.Sub(x.fenced[i]) >= fenceWindow {
		i++
	}
	x.fenced = x.fenced[i:]
	return len(x.fenced)
}

// renewLocked replaces the worker's transactional producer with a new one of
// the same transactional ID (kafka.Producer.Renew: the old one is closed and
// drained first, the new one bumps the epoch), after an abort that failed or
// left the producer unable to go on; cause is why, age the age of the
// transaction it failed in (0: none was open). Every task must already be
// abandoned. Errors: ErrTransactionalIDInUse (ZombieRule), the renewal's
// error once its retries ran out. Guarded by mu.
func (x *TxnCommitter[T]) renewLocked(cause error, age time.Duration) error {
	p, log := x.cfg.Producer, x.cfg.Log
	reason := "failed"
	switch {
	case age >= x.cfg.Timeout:
		reason = "timeout"
	case kafka.Fenced(cause) || kafka.Fenced(p.FatalErr()):
		// The cause may be a task's error whose records failed after the
		// fence (their reports name it only as text): the producer keeps
		// the error that made it fatal.
		reason = "fenced"
	}
	id := x.cfg.TransactionalID
	if reason == "fenced" && x.recentFencesLocked() >= maxFences {
		log.Error("fenced again by another producer of this worker's transactional ID: another live process uses this data dir's process ID; stopping the worker",
			"transactional_id", id, "rule", ZombieRule, "fences", len(x.fenced)+1, "err", cause)
		return fmt.Errorf("%w: %s (%s): %w", ErrTransactionalIDInUse, id, ZombieRule, cause)
	}
	// Renew retries what Kafka calls retriable (the coordinator loading,
	// moving or busy: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
	// CONCURRENT_TRANSACTIONS) with backoff for up to the delivery timeout
	// (app's flushBudget); what is left is a person's to fix.
	if reason == "fenced" {
		time.Sleep(fenceSettle)
	}
	// A broker that is down longer than the renewal's budget (a restart of
	// a loaded broker took 44 s in the chaos suite) is waited out: renew
	// again until it answers, the worker stops, or the error is one a
	// person must fix (kafka.Permanent: authorization, a bad ID).
	for attempt := 1; ; attempt++ {
		err := p.Renew()
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
			x.fenced = append(x.fenced, time.Now())
			if x.recentFencesLocked() >= maxFences {
				log.Error("the transactional producer could not be renewed after a fence: another live process keeps using this data dir's process ID; stopping the worker",
					"transactional_id", id, "rule", ZombieRule, "fences", len(x.fenced), "err", err)
				return fmt.Errorf("%w: %s (%s): %w (after %w)", ErrTransactionalIDInUse, id, ZombieRule, err, cause)
			}
		}
		select {
		case <-x.cfg.Done:
			return fmt.Errorf("renew transactional producer %s: worker stopping: %w (after %w)", id, err, cause)
		case <-time.After(time.Second):
		}
		if attempt == 1 {
			log.Warn("transactional producer could not be renewed yet; retrying until a broker answers",
				"transactional_id", id, "err", err)
		}
	}
	if reason == "fenced" {
		x.fenced = append(x.fenced, time.Now())
	}
	x.cfg.Metrics.Renewals.WithLabelValues(reason).Inc()
	log.Warn("transactional producer renewed (new epoch); every partition restarts from its committed offsets",
		"reason", reason, "transactional_id", id, "transaction_age", age, "transaction_timeout", x.cfg.Timeout, "err", cause)
	return nil
}

// LeftAlone is called when task t leaves the worker, after any cycle in
// progress (it takes mu). A task abandoned on its own (a timer or a join
// backfill failed; not by an abort, which puts it in pending) sent its
// records in the open transaction without its offsets: the transaction is
// aborted, or a later commit would publish them and the partition would
// send them again.
func (x *TxnCommitter[T]) LeftAlone(t T) {
	x.mu.Lock()
	defer x.mu.Unlock()
	err := x.tasks.Task(t).Err()
	if _, pending := x.pending[t]; err == nil || pending || !x.open {
		return
	}
	x.abortLocked(fmt.Errorf("task %v abandoned alone in the worker's transaction: %w", x.tasks.Name(t), err))
}

// Abort aborts the open transaction and abandons every task with err: their
// partitions restart from the committed offsets; the next transaction
// begins once they all closed (Closed).
func (x *TxnCommitter[T]) Abort(err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.abortLocked(err)
}

// Cycle runs one cycle over every task of the worker in the open
// transaction: it commits the transaction with the tasks' offsets and
// begins the next one. A failure to cut is returned and changes nothing; a
// failure to flush or commit aborts (abortLocked) and is returned wrapping
// task.ErrAbandoned (a caller must not abort again).
//
// While the member rejoins the group a periodic cycle (final false) is
// skipped, and a final one waits for the assignment: an offset commit with the
// generation the member is leaving would be refused and abort the
// transaction.
func (x *TxnCommitter[T]) Cycle(ctx context.Context, final bool) error {
	cfg := &x.cfg
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
	trs := x.tasks.All()
	tasks := make([]*task.Task, len(trs))
	handedAt := make(map[T]int64, len(trs))
	idle := true // no source handed out a record since the last cycle
	for i, tr := range trs {
		tasks[i] = x.tasks.Task(tr)
		// A source that handed out nothing for a whole cycle may sit before
		// transaction markers it is never given: skip them (one Fetch per
		// partition, decoding what it returns). A busy source is not
		// stuck, and a Fetch per partition in every cycle, with the gate
		// held, cost 20% of the stateful worker's CPU at a 100 ms interval
		// (pprof, kfake): only idle tasks pay it, one cycle after they
		// went idle.
		n := tasks[i].Handed()
		handedAt[tr] = n
		if last, ok := x.handedAt[tr]; !ok || last != n {
			idle = false
			continue
		}
		x.tasks.SkipControl(tr)
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
		for i, tr := range trs {
			if err := tasks[i].Err(); err != nil {
				return fmt.Errorf("task %v abandoned alone in the worker's transaction: %w", x.tasks.Name(tr), err)
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
			if cfg.InstanceID != "" {
				id := cfg.InstanceID
				inst = &id
			}
			meta = sarama.NewConsumerGroupMetadataFromSession(sess, cfg.Group, inst)
			meta.GenerationID = max(meta.GenerationID, x.rejoins.Generation())
		} else {
			meta = sarama.NewConsumerGroupMetadata(cfg.Group)
		}
		cfg.CommitMu.Lock()
		defer cfg.CommitMu.Unlock()
		if err := cfg.Producer.Commit(m, meta, x.rejoined(meta, x.began.Add(cfg.Timeout*7/8))); err != nil {
			return err // still open: abortLocked aborts it
		}
		x.setOpen(false)
		cfg.Metrics.Commits.Inc()
		cfg.Metrics.Seconds.Observe(time.Since(start).Seconds())
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
	held := x.tasks.Unresolved(trs)
	deadline := x.began.Add(x.CutDeadline())
	cut := max(cfg.CutBudget, time.Until(deadline))
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
		x.window.Adapt(st.Cut, cfg.CutBudget, held)
		if st.Records > 0 {
			cfg.Metrics.Cycle(st.Records, st.Elapsed)
		}
		x.tasks.Counted(trs, st)
		return nil
	case errors.Is(err, task.ErrAbandoned):
		if kafka.Permanent(err) || errors.Is(err, stores.ErrFailed) {
			cfg.Log.Error("transaction failed permanently; stopping the worker", "err", err)
			cfg.Fatal(err)
		}
		x.abortLocked(err)
		return err
	case ctx.Err() == nil && !time.Now().Before(deadline):
		// The cut missed the deadline: the records handed out take longer
		// than the transaction may. Abort it now and hand out fewer.
		left := x.tasks.Unresolved(trs)
		x.window.Missed(held)
		cfg.Metrics.TimedOut.Inc()
		cfg.Log.Warn("transaction could not cut before its deadline; aborting it and handing out fewer records at once",
			"transaction_age", time.Since(x.began), "deadline", x.CutDeadline(), "transaction_timeout", cfg.Timeout,
			"unresolved_at_start", held, "unresolved", left, "window", x.window.Load(), "err", err)
		err = fmt.Errorf("transaction cut deadline (%v of its %v timeout) passed: %w", x.CutDeadline(), cfg.Timeout, err)
		x.abortLocked(err)
		// Aborted already: a caller must not abort again (a final cycle
		// would otherwise abort, and log, a second time).
		return fmt.Errorf("%w: %w", task.ErrAbandoned, err)
	default:
		x.tasks.Postponed(trs)
		return err
	}
}

// unchanged reports whether offs are the offsets the last commit committed.
// Guarded by mu.
func (x *TxnCommitter[T]) unchanged(offs []task.Offset) bool {
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
// commit sent again counted (TxnMetrics.Resent) and logged.
func (x *TxnCommitter[T]) rejoined(meta *sarama.ConsumerGroupMetadata, deadline time.Time) kafka.Rejoined {
	return x.rejoins.Rejoined(meta, deadline, func(refused, g int32, waited time.Duration) {
		x.cfg.Metrics.Resent.Inc()
		x.cfg.Log.Info("group rebalanced during a transaction's offset commit; committing under the new generation",
			"refused_generation", refused, "generation", g, "waited", waited.Round(time.Millisecond))
	})
}

// handed sums the records handed out by every task's sources.
func (x *TxnCommitter[T]) handed() int64 {
	var n int64
	for _, t := range x.tasks.All() {
		n += x.tasks.Task(t).Handed()
	}
	return n
}

// Loop runs cycles every commit interval, when a cache is full (Wake), and
// when the tasks' sources handed out records since the last cycle but none
// in the last idle interval (CycleClock, as app's per-task loop does under
// at-least-once), until ctx ends.
func (x *TxnCommitter[T]) Loop(ctx context.Context) {
	cfg := &x.cfg
	// A transaction must commit well within its timeout.
	clock := NewCycleClock(min(cfg.CommitInterval, cfg.Timeout/2), cfg.IdleCommit, false, x.handed, x.wake)
	defer clock.Stop()
	for clock.Wait(ctx) {
		cctx, cancel := context.WithTimeout(ctx, cfg.FlushBudget)
		err := x.Cycle(cctx, false)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, task.ErrAbandoned) {
			cfg.Log.Debug("commit cycle postponed", "err", err)
		}
	}
}
