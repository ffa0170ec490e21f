package app

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/group"
	"github.com/runnel-dev/runnel/stores"
)

// handler is the sarama.ConsumerGroupHandler of a worker: one generation's
// session at a time.
type handler struct {
	w *Worker

	// Per-session state, reset by Setup. Table partitions (restores, standby
	// followers) live in Worker.parts: under the cooperative protocol one
	// session spans many assignments.
	mu     sync.Mutex
	cancel context.CancelFunc // stops the commit ticker
	bg     sync.WaitGroup     // the commit ticker
}

type restoreKey struct {
	table string
	p     int32
}

// restoreGate is one partition's restore of an activation: the claim that
// created it runs the restore (tableParts.acquire), every other claim that
// needs the partition waits for done.
type restoreGate struct {
	done chan struct{} // closed when the restore ended
	err  error         // its outcome; written before done closes
	// committed are the group's committed offsets the restore used
	// (changelog.SkipUncommitted): the store holds the effects of exactly
	// the source records below them. Written before done closes.
	committed map[string]map[int32]int64
}

func (h *handler) Setup(sess sarama.ConsumerGroupSession) error {
	w := h.w
	w.log.Info("session started", "generation", sess.GenerationID(), "member", sess.MemberID(), "claims", topicParts(sess.Claims()))
	if w.txn != nil {
		w.txn.SetSession(sess)
	}
	ctx, cancel := context.WithCancel(sess.Context())
	h.mu.Lock()
	h.cancel = cancel
	h.mu.Unlock()
	if len(sess.Claims()) == 0 {
		w.setReady(true)
	}
	h.bg.Add(1)
	go func() {
		defer h.bg.Done()
		t := time.NewTicker(w.cfg.CommitInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				w.sessionCommit(sess)
			}
		}
	}()
	return nil
}

func (h *handler) Cleanup(sess sarama.ConsumerGroupSession) error {
	h.mu.Lock()
	cancel := h.cancel
	h.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	h.bg.Wait()
	h.w.sessionCommit(sess)
	h.w.setReady(false)
	h.w.log.Info("session ended", "generation", sess.GenerationID())
	return nil
}

// sessionCommit commits the session's marked offsets (Sarama), ordered with
// the commit cycles' own commits (Worker.commitMu).
func (w *Worker) sessionCommit(sess sarama.ConsumerGroupSession) {
	if w.txn != nil {
		return // ExactlyOnce: only the transactions commit offsets (partition.markOffset)
	}
	w.commitMu.Lock()
	defer w.commitMu.Unlock()
	sess.Commit()
}

func (w *Worker) setReady(r bool) {
	w.mu.Lock()
	w.ready = r
	w.mu.Unlock()
}

// restore brings every table partition p that is active for this worker and
// co-partitioned with topic up to the end of its changelog, once per
// activation (Worker.parts). It returns the partitions it acquired, which the
// claim releases when it ends, also on error.
func (h *handler) restore(ctx context.Context, topic string, p int32, start int64) ([]restoreKey, error) {
	w := h.w
	src, _ := w.graph.Topic(topic)
	if err := w.globalsCatchUp(ctx, src.Partitions, p); err != nil {
		return nil, err
	}
	a := w.strategy.Current()
	var acquired []restoreKey
	for _, t := range w.tables {
		if t.parts != src.Partitions {
			continue
		}
		if !slices.Contains(a.Actives[t.state.Topic()], p) {
			// A newer assignment than the claim's revoked the partition
			// (the strategy's assignment is updated before the claims are
			// cancelled): processing it without its tables would commit
			// offsets whose table writes no cycle flushes.
			return acquired, fmt.Errorf("%s[%d]: %w", topic, p, errClaimRevoked)
		}
		k := restoreKey{t.def.Name(), p}
		acquired = append(acquired, k)
		if err := w.parts.acquire(ctx, k, topic, start); err != nil {
			return acquired, err
		}
	}
	return acquired, nil
}

// errClaimRevoked: a claim's partition is no longer active in the worker's
// current assignment (a newer generation revoked it before the claim ran).
var errClaimRevoked = errors.New("claim revoked by a newer assignment")

func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	w := h.w
	topic, p := claim.Topic(), claim.Partition()
	w.log.Debug("claim started", "topic", topic, "partition", p, "generation", sess.GenerationID())
	ctx, claimDone := w.claimContext(sess, topic, p) // ends on revoke (cooperative) or session end
	defer claimDone()
	defer w.metrics.trackClaim(claim)()
	if w.fetcher != nil {
		// The worker's Fetcher reads the partition (claimProducer.openSub):
		// the claim's own partition consumer fetches no more than its
		// first response, which the feed discards.
		w.cgroup.Pause(map[string][]int32{topic: {p}})
	}
	src, _ := w.graph.Topic(topic)
	prepared := func() {}
	if len(w.tableNamesOf(taskKey{src.Partitions, p})) > 0 {
		// The task is restoring until the claim joins it (or ends).
		prepared = w.tasks.prepare(taskKey{src.Partitions, p})
	}
	defer prepared()
	acquired, err := h.restore(ctx, topic, p, claim.InitialOffset())
	defer w.parts.release(acquired)
	if errors.Is(err, errClaimRevoked) {
		// Sarama's revoke of the claim (the reconciliation of the newer
		// assignment) or the session's end closes its messages; returning
		// before would end the whole session.
		w.log.Info("claim not active in the current assignment; waiting for its revoke", "topic", topic, "partition", p)
		for range claim.Messages() {
		}
		return nil
	}
	if errors.Is(err, errStartMismatch) {
		// Nothing may commit on top of a store out of step with the
		// claims: the task (under ExactlyOnce, the worker's transaction)
		// is abandoned, the session restarts and the partition is rebuilt.
		if w.txn != nil {
			w.txn.Abort(err)
		} else {
			w.tasks.abandonKey(taskKey{src.Partitions, p}, err)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, stores.ErrFailed) {
			w.log.Error("table store failed; stopping the worker", "topic", topic, "partition", p, "err", err)
			w.fatal.stop(err)
			return nil
		}
		return fmt.Errorf("partition %s[%d]: %w", topic, p, err)
	}
	w.markReadyIfRestored(h)

	var runners []agentrt.Runner
	for _, r := range w.app.agents {
		if r.Topic() == topic {
			runners = append(runners, r)
		}
	}
	pt := &partition{h: h, w: w, sess: sess, topic: topic, p: p, key: fmt.Sprintf("%s[%d]", topic, p),
		runners: runners, feed: group.NewClaimFeed(claim), retry: w.cfg.redelivery.withDefaults(),
		inflight: &tablestate.InFlight{}}
	// At-least-once: the commit metadata of the claim's start offset says
	// where the dead letters of the records it hands out again start
	// (dlq.go) and, on a repartition topic, which of its records earlier
	// runs of their source partitions delivered (dedup.go).
	var committed string
	var metaErr error
	if from := claim.InitialOffset(); w.txn == nil && from >= 0 {
		committed, metaErr = w.committedMetadata(topic, p)
		if metaErr != nil && ctx.Err() == nil {
			w.log.Warn("could not read the commit metadata; a record rejected again may be dead-lettered twice, and repartition records sent again are not recognised",
				"topic", topic, "partition", p, "err", metaErr)
		}
	}
	if w.txn == nil && w.isRepartition(topic) {
		pt.src = newSrcFilter(committed, claim.InitialOffset(), w.metrics.dupsSkipped.WithLabelValues(topic))
	}
	// Dead letters an earlier owner wrote of the records this claim hands
	// out again are not written twice (dlq.go, at-least-once only).
	if metaErr == nil {
		if err := w.loadDeadLetters(ctx, pt, claim.InitialOffset(), committed); err != nil && ctx.Err() == nil {
			w.log.Warn("could not read the dead letters of records to be processed again; a record rejected again may be dead-lettered twice",
				"topic", topic, "partition", p, "err", err)
		}
	}
	var states []tablestate.Cutter
	for _, rk := range acquired {
		states = append(states, w.tableByName(rk.table).state)
	}
	for _, g := range w.glob.tables {
		if g.parts == src.Partitions {
			states = append(states, g.state)
		}
	}
	if len(states) > 0 || w.txn != nil || hasTimers(runners) {
		// The partition may write tables (or its timers send, or, under
		// ExactlyOnce, it sends in the worker's transaction): its offsets
		// are committed by the task's commit cycles (tasks.go, timers.go,
		// txn.go).
		k := taskKey{src.Partitions, p}
		tr, err := w.tasks.join(k, sess, states)
		prepared() // the task runs (or the claim failed): no longer restoring
		if errors.Is(err, errOtherTables) || errors.Is(err, tablestate.ErrOwned) {
			// A broken invariant (docs/tables.md, rule 8), not a passing
			// fault: a session restart would meet it again, in a loop.
			w.log.Error("claim refused by its task; stopping the worker", "topic", topic, "partition", p, "err", err)
			w.fatal.stop(err)
			return nil
		}
		if err != nil {
			return fmt.Errorf("partition %s[%d]: %w", topic, p, err)
		}
		pt.task = tr
		defer w.tasks.leave(k)
	}
	env := *w.env
	env.InFlight = pt.inflight
	env.Partitions = src.Partitions
	pt.env = &env
	pt.backfillJoins(ctx, acquired) // joins.go
	defer pt.startTimers(ctx)()     // timers.go
	// run returns nil on a revoke (after draining and committing), the
	// agent's error under agent.StopWorker (the worker stops); failures that
	// restart the partition are handled inside, within the session.
	return pt.run(ctx)
}

func (w *Worker) drainBudget() time.Duration {
	r := w.cfg.Rebalance
	if r <= 0 {
		r = 60 * time.Second
	}
	// Drain and the in-flight wait each get a third, so that together they stay
	// below the rebalance timeout (sarama gives up on a revoke after it).
	return min(r/3, 10*time.Second)
}

func (w *Worker) markReadyIfRestored(*handler) {
	if w.parts.restoredAll(w.strategy.Current()) {
		w.setReady(true)
	}
}
