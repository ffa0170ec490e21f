package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/changelog"
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
	var follow []changelog.Option
	for _, t := range w.tables {
		for p := int32(0); p < t.parts; p++ {
			t.state.SetActive(p, false)
		}
		for _, p := range a.Standbys[t.state.Topic()] {
			if follow == nil {
				follow = w.followOptions(ctx, &h.bg)
			}
			h.bg.Add(1)
			go func() {
				defer h.bg.Done()
				if err := w.restorer.Follow(ctx, t.state.Topic(), p, t.store, follow...); err != nil {
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
			opts, err := w.restoreOptions()
			if err != nil {
				g.err = err
				return
			}
			res, err := w.restorer.Restore(ctx, t.state.Topic(), p, t.store, opts...)
			if err != nil {
				g.err = err
				return
			}
			w.restored.Add(res.Records)
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
	prod := newClaimProducer(w, sess, claim)
	key := fmt.Sprintf("%s[%d]", topic, p)
	subs := make([]*source.Subscription, 0, len(runners))
	for _, r := range runners {
		sub, err := w.mgr.Subscribe(key, r.Name(), func(context.Context) (source.Producer, error) { return prod, nil })
		if err != nil {
			for _, s := range subs {
				s.Unsubscribe(nil)
			}
			return fmt.Errorf("subscribe %s to %s: %w", r.Name(), key, err)
		}
		subs = append(subs, sub)
	}
	// Every agent of the topic is subscribed before the first record is fanned
	// out, so each record's snapshot holds all of them.
	close(prod.ready)

	actx, cancelAgents := context.WithCancel(context.Background())
	defer cancelAgents()
	errs := make(chan error, len(runners))
	for i, r := range runners {
		go func() {
			err := r.Run(actx, p, subs[i], w.env)
			subs[i].Unsubscribe(err)
			errs <- err
		}()
	}
	running := len(runners)
	var failure error
	select {
	case <-ctx.Done():
	case err := <-errs:
		running--
		failure = err
		if err == nil {
			failure = fmt.Errorf("agent on %s ended before the partition was revoked", key)
		}
	}
	// Revoke or failure: stop fetching, give in-flight records the drain
	// budget to resolve, advance what resolved, abandon the rest to redelivery.
	prod.stopFetching()
	if failure == nil {
		prod.waitDrained(w.drainBudget())
	}
	w.mgr.Stop(key)
	cancelAgents()
	for ; running > 0; running-- {
		if err := <-errs; err != nil && failure == nil && ctx.Err() == nil {
			failure = err
		}
	}
	sess.Commit()
	if failure != nil {
		w.log.Error("partition stopped on an error; it restarts from its last committed offset", "topic", topic, "partition", p, "err", failure)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		return failure
	}
	return nil
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

// claimProducer is the shared-source producer of one claimed topic partition:
// its poll loop reads the claim, its Advance marks offsets (and dead-letters
// rejected records), and a failed record stops the partition so that it is
// redelivered from the last committed offset.
type claimProducer struct {
	w     *Worker
	sess  sarama.ConsumerGroupSession
	claim sarama.ConsumerGroupClaim
	ready chan struct{} // closed once every agent subscribed

	stopOnce sync.Once
	stop     chan struct{} // closed to stop fetching

	mu          sync.Mutex
	cond        *sync.Cond
	lastEmitted int64 // offset of the last record fanned out, -1 none; guarded by mu
	next        int64 // offset after the last advanced record, -1 none; guarded by mu
	halted      bool  // a record failed; guarded by mu
}

func newClaimProducer(w *Worker, sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) *claimProducer {
	c := &claimProducer{w: w, sess: sess, claim: claim, ready: make(chan struct{}), stop: make(chan struct{}), lastEmitted: -1, next: -1}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *claimProducer) stopFetching() { c.stopOnce.Do(func() { close(c.stop) }) }

// waitDrained waits until every record fanned out has been advanced, a record
// failed, or budget passed.
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
	for !c.halted && c.lastEmitted >= 0 && c.next <= c.lastEmitted {
		c.cond.Wait()
	}
}

func (c *claimProducer) Open(ctx context.Context, emit func(*source.Record, any) error) error {
	select {
	case <-c.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.stop:
			<-ctx.Done()
			return ctx.Err()
		case m, ok := <-c.claim.Messages():
			if !ok {
				<-ctx.Done()
				return ctx.Err()
			}
			rec := &source.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Timestamp: m.Timestamp}
			for _, h := range m.Headers {
				if h != nil {
					rec.Headers = append(rec.Headers, source.Header{Key: h.Key, Value: h.Value})
				}
			}
			c.mu.Lock()
			c.lastEmitted = m.Offset
			c.mu.Unlock()
			if err := emit(rec, m.Offset); err != nil {
				return err
			}
		}
	}
}

func (c *claimProducer) Lane(any) (any, error) { return c.claim.Partition(), nil }

// errRecordFailed stops the partition: the failed record and everything after
// it are redelivered from the last committed offset.
var errRecordFailed = errors.New("record failed")

func (c *claimProducer) Advance(ctx context.Context, batch []source.AdvanceItem) error {
	next := int64(-1)
	var failed *source.AdvanceItem
	for i := range batch {
		it := &batch[i]
		switch {
		case it.Outcome.Clean():
		case it.Outcome.Failed == 0 && it.Outcome.Rejected > 0:
			if err := c.deadLetter(ctx, it); err != nil {
				failed = it
			}
		default:
			failed = it
		}
		if failed != nil {
			break
		}
		next = it.Record.Offset + 1
	}
	if next >= 0 {
		// Offsets of one lane advance in fan-out order, so next only grows; Kafka
		// commits the offset of the next record to read (last processed + 1).
		c.sess.MarkOffset(c.claim.Topic(), c.claim.Partition(), next, "")
		c.w.metrics.committed.WithLabelValues(c.claim.Topic()).Add(float64(len(batch)))
	}
	c.mu.Lock()
	if next >= 0 {
		c.next = next
	}
	if failed != nil {
		c.halted = true
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	if failed != nil {
		return fmt.Errorf("%s[%d]@%d: %w (outcome %+v, causes %v)", c.claim.Topic(), c.claim.Partition(), failed.Record.Offset, errRecordFailed, failed.Outcome, failed.Causes)
	}
	return nil
}

func (c *claimProducer) deadLetter(ctx context.Context, it *source.AdvanceItem) error {
	r := it.Record
	reason := fmt.Sprint(it.Causes)
	msg := &sarama.ProducerMessage{Topic: dlqTopic(c.w.app.id), Partition: 0, Key: bytesOrNil(r.Key), Value: bytesOrNil(r.Value),
		Headers: []sarama.RecordHeader{
			{Key: []byte("runnel-reason"), Value: []byte(reason)},
			{Key: []byte("runnel-topic"), Value: []byte(r.Topic)},
			{Key: []byte("runnel-partition"), Value: fmt.Appendf(nil, "%d", r.Partition)},
			{Key: []byte("runnel-offset"), Value: fmt.Appendf(nil, "%d", r.Offset)},
		}}
	done := make(chan error, 1)
	if err := c.w.producer.Send(msg, func(_ int32, _ int64, err error) { done <- err }); err != nil {
		return err
	}
	select {
	case err := <-done:
		if err == nil {
			c.w.log.Warn("record dead-lettered", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "reason", reason)
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *claimProducer) Close() error { return nil }
