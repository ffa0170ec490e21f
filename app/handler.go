package app

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
)

// handler is the sarama.ConsumerGroupHandler of a worker: one generation's
// session at a time.
type handler struct {
	w *Worker

	// Per-session state, reset by Setup.
	mu       sync.Mutex
	restores map[restoreKey]*restoreGate // guarded by mu
	cancel   context.CancelFunc          // stops the commit ticker and standby followers
	bg       sync.WaitGroup              // the commit ticker and standby followers
}

type restoreKey struct {
	table string
	p     int32
}

// restoreGate runs one partition's restore once per session; every claim that
// needs the partition waits for it.
type restoreGate struct {
	once sync.Once
	done chan struct{}
	err  error
}

func (h *handler) Setup(sess sarama.ConsumerGroupSession) error {
	w := h.w
	a := w.strategy.Current()
	w.log.Info("session started", "generation", sess.GenerationID(), "member", sess.MemberID(), "claims", fmtParts(sess.Claims()))
	ctx, cancel := context.WithCancel(sess.Context())
	h.mu.Lock()
	h.restores = map[restoreKey]*restoreGate{}
	h.cancel = cancel
	h.mu.Unlock()

	// A partition stays writable only while it is active; it becomes writable
	// again after its restore in ConsumeClaim.
	for _, t := range w.tables {
		for p := int32(0); p < t.parts; p++ {
			t.state.SetActive(p, false)
		}
		for _, p := range a.Standbys[t.state.Topic()] {
			h.bg.Add(1)
			go func() {
				defer h.bg.Done()
				if err := w.restorer.Follow(ctx, t.state.Topic(), p, t.store); err != nil {
					w.log.Warn("standby stopped", "table", t.def.Name(), "partition", p, "err", err)
				}
			}()
		}
	}
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
				sess.Commit()
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
	sess.Commit()
	h.w.setReady(false)
	h.w.log.Info("session ended", "generation", sess.GenerationID())
	return nil
}

func (w *Worker) setReady(r bool) {
	w.mu.Lock()
	w.ready = r
	w.mu.Unlock()
}

// restore brings every table partition p that is active for this worker and
// co-partitioned with topic up to the end of its changelog, once per session.
func (h *handler) restore(ctx context.Context, topic string, p int32) error {
	w := h.w
	src, _ := w.graph.Topic(topic)
	a := w.strategy.Current()
	for _, t := range w.tables {
		if t.parts != src.Partitions || !slices.Contains(a.Actives[t.state.Topic()], p) {
			continue
		}
		h.mu.Lock()
		k := restoreKey{t.def.Name(), p}
		g := h.restores[k]
		if g == nil {
			g = &restoreGate{done: make(chan struct{})}
			h.restores[k] = g
		}
		h.mu.Unlock()
		g.once.Do(func() {
			defer close(g.done)
			res, err := w.restorer.Restore(ctx, t.state.Topic(), p, t.store)
			if err != nil {
				g.err = err
				return
			}
			w.restored.Add(res.Records)
			w.restoredSpan.Add(res.To - res.Start)
			w.metrics.restored.WithLabelValues(t.def.Name()).Add(float64(res.Records))
			w.log.Info("restored", "table", t.def.Name(), "partition", p, "records", res.Records,
				"from", res.From, "to", res.To, "rebuilt", res.Rebuilt, "elapsed", res.Elapsed)
			t.state.SetActive(p, true)
		})
		select {
		case <-g.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if g.err != nil {
			return g.err
		}
	}
	return nil
}

func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	w := h.w
	topic, p := claim.Topic(), claim.Partition()
	ctx := sess.Context()
	if err := h.restore(ctx, topic, p); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("partition %s[%d]: %w", topic, p, err)
	}
	w.markReadyIfRestored(h)

	var runners []agent.Runner
	for _, r := range w.app.agents {
		if r.Topic() == topic {
			runners = append(runners, r)
		}
	}
	pt := &partition{h: h, w: w, sess: sess, topic: topic, p: p, key: fmt.Sprintf("%s[%d]", topic, p),
		runners: runners, feed: newClaimFeed(claim), retry: w.cfg.redelivery.withDefaults(), attempts: map[int64]int{}}
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
	return min(r/2, 10*time.Second)
}

func (w *Worker) markReadyIfRestored(h *handler) {
	h.mu.Lock()
	defer h.mu.Unlock()
	a := w.strategy.Current()
	need := 0
	for _, t := range w.tables {
		need += len(a.Actives[t.state.Topic()])
	}
	done := 0
	for _, g := range h.restores {
		select {
		case <-g.done:
			if g.err == nil {
				done++
			}
		default:
		}
	}
	if done >= need {
		w.setReady(true)
	}
}
