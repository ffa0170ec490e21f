package app

import (
	"context"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"time"
)

// backfillJoins fills the partition of every joined table (table.Join)
// among the tables the claim restored, before the claim's agents start:
// each key the joined table lacks, or holds with a stale value, is
// recomputed from the two tables (tablestate.Backfiller), so a join declared
// on tables that already held data is complete from the task's first cycle.
// It runs inside the task between two cycles, as a timer firing does, so its
// writes are committed with the cycle's records. A task with several
// claims (co-partitioned topics) backfills once per claim; the later ones
// find nothing to write. A failure abandons the task (the partition
// restarts from its committed offsets and backfills again).
func (pt *partition) backfillJoins(ctx context.Context, acquired []restoreKey) {
	if pt.task == nil {
		return
	}
	w := pt.w
	for _, rk := range acquired {
		tr := w.tableByName(rk.table)
		if tr == nil {
			continue
		}
		b, ok := tablestate.RuntimeOf(tr.def).(tablestate.Backfiller)
		if !ok {
			continue
		}
		began := time.Now()
		var written int
		fill := func(ctx context.Context, ev tablestate.Event) error {
			var err error
			written, err = b.Backfill(ev)
			return err
		}
		fctx, cancel := context.WithTimeout(context.Background(), w.flushBudget())
		ran := false
		err := pt.punctuate(ctx, &ran, func() error { return agentrt.FireFunc(fctx, pt.p, pt.env, began, fill) }) // timers.go
		cancel()
		switch {
		case !ran:
			return
		case err != nil:
			w.log.Warn("join backfill failed; the partition restarts from its committed offsets",
				"table", rk.table, "topic", pt.topic, "partition", pt.p, "err", err)
			pt.task.abandon(&w.tasks, err)
			return
		case written > 0:
			w.log.Info("join backfilled", "table", rk.table, "topic", pt.topic, "partition", pt.p,
				"keys", written, "elapsed", time.Since(began))
		}
	}
}
