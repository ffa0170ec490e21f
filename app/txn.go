package app

import (
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/internal/group"
	"github.com/runnel-dev/runnel/internal/task"
)

// newTxnCommitter returns the worker's transaction committer under
// ExactlyOnce (group.TxnCommitter: one transaction per worker, committed by
// one cycle over every task), wired to the worker's producer, tasks,
// metrics, logger, commit lock and fatal stop. Called by Run once the
// producer exists and before anything hands out a record.
func newTxnCommitter(w *Worker) *group.TxnCommitter[*taskRun] {
	m := &w.metrics.txn
	return group.NewTxnCommitter(group.TxnConfig[*taskRun]{
		Producer:        w.producer,
		Tasks:           txnTasks{&w.tasks},
		Group:           w.app.id,
		InstanceID:      w.cfg.InstanceID,
		TransactionalID: w.txnID(),
		Timeout:         w.txnTimeout(),
		CommitInterval:  w.cfg.CommitInterval,
		IdleCommit:      w.idleCommit(),
		CutBudget:       w.cutBudget(),
		FlushBudget:     w.flushBudget(),
		CommitMu:        &w.commitMu,
		Log:             w.log,
		Metrics: group.TxnMetrics{Commits: m.commits, Aborts: m.aborts, TimedOut: m.timedOut, Resent: m.resent,
			Seconds: m.seconds, Renewals: m.renewals, Cycle: w.metrics.cycle},
		Fatal: w.fatal.stop,
		Done:  w.runDone,
	})
}

// ErrTransactionalIDInUse is the cause of a worker stopped because another
// live process owns its transactional ID: its producer was fenced a third
// time within two minutes by another producer of the ID, whether or not it
// committed between the fences: two workers run with the same data dir (a
// copied one, or one shared by two hosts).
// Test it with errors.Is.
var ErrTransactionalIDInUse = group.ErrTransactionalIDInUse

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

// txnTasks is the worker's running tasks as its transaction committer sees
// and moves them (group.TxnTasks).
type txnTasks struct{ ts *taskSet }

func (a txnTasks) All() []*taskRun                { return a.ts.all() }
func (txnTasks) Task(tr *taskRun) *task.Task      { return tr.t }
func (txnTasks) Name(tr *taskRun) string          { return fmt.Sprint(tr.key) }
func (a txnTasks) Abandon(tr *taskRun, err error) { tr.abandon(a.ts, err) }
func (txnTasks) Unresolved(trs []*taskRun) int64  { return unresolved(trs) }
func (a txnTasks) Postponed(trs []*taskRun)       { a.ts.postponed(trs...) }

// SkipControl has tr's claims skip the transaction markers an idle claim
// sits before (claimProducer.skipControl).
func (txnTasks) SkipControl(tr *taskRun) {
	for _, s := range tr.t.SourceList() {
		if c, ok := s.(*claimProducer); ok {
			c.skipControl()
		}
	}
}

// Counted adds a worker-wide cycle to the tasks' counters.
func (a txnTasks) Counted(trs []*taskRun, st task.Stats) {
	if st.Records == 0 {
		return
	}
	ts := a.ts
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, tr := range trs {
		tr.cycles++
		tr.last = st.Elapsed
	}
}
