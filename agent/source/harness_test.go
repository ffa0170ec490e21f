package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeItem is one instruction to the fake poll loop: emit a record, or end
// Open with err.
type fakeItem struct {
	rec  *Record
	recs []*Record // a batch (BatchProducer only)
	end  bool
	err  error
}

// fakeProducer records everything the manager asks of it and checks the
// Producer contract on the way: Advance never concurrent, never empty, never
// after Close, one lane per batch, offsets increasing per lane across calls.
type fakeProducer struct {
	h *harness

	mu       sync.Mutex
	inflight bool
	closed   int
	opened   int
	lastOff  map[any]int64
	emitErrs []error
	room     []RoomWait // what WaitingForRoom was told, in order
}

// WaitingForRoom records the calls (RoomObserver).
func (p *fakeProducer) WaitingForRoom(w RoomWait) {
	p.mu.Lock()
	p.room = append(p.room, w)
	p.mu.Unlock()
}

// rooms returns what WaitingForRoom was told so far, e.g. "[bytes free]".
func (p *fakeProducer) rooms() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprint(p.room)
}

func (p *fakeProducer) Open(ctx context.Context, emit func(*Record, any) error) error {
	p.mu.Lock()
	p.opened++
	p.mu.Unlock()
	for {
		select {
		case it := <-p.h.in:
			if it.end {
				return it.err
			}
			if err := emit(it.rec, it.rec); err != nil {
				p.mu.Lock()
				p.emitErrs = append(p.emitErrs, err)
				p.mu.Unlock()
				return err
			}
			p.h.emitted.Add(1)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// fakeBatchProducer is the fake producer with a batch poll loop: a record is
// a batch of one, a fakeItem's recs one batch.
type fakeBatchProducer struct{ *fakeProducer }

func (p fakeBatchProducer) OpenBatch(ctx context.Context, emit func([]Emit) error) error {
	p.mu.Lock()
	p.opened++
	p.mu.Unlock()
	for {
		select {
		case it := <-p.h.in:
			if it.end {
				return it.err
			}
			recs := it.recs
			if it.rec != nil {
				recs = []*Record{it.rec}
			}
			batch := make([]Emit, len(recs))
			for i, r := range recs {
				batch[i] = Emit{Record: r, Payload: r}
			}
			if err := emit(batch); err != nil {
				p.mu.Lock()
				p.emitErrs = append(p.emitErrs, err)
				p.mu.Unlock()
				return err
			}
			p.h.emitted.Add(len(recs))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *fakeProducer) Lane(payload any) (any, error) {
	rec := payload.(*Record)
	if p.h.laneFn != nil {
		return p.h.laneFn(rec)
	}
	return rec.Partition, nil
}

func (p *fakeProducer) Advance(ctx context.Context, batch []AdvanceItem) error {
	t := p.h.t
	p.mu.Lock()
	if p.inflight {
		t.Errorf("Advance called concurrently")
	}
	if p.closed > 0 {
		t.Errorf("Advance called after Close")
	}
	if len(batch) == 0 {
		t.Errorf("Advance called with an empty batch")
	}
	p.inflight = true
	if p.lastOff == nil {
		p.lastOff = map[any]int64{}
	}
	lane := batch[0].Record.Partition
	for _, it := range batch {
		if it.Record.Partition != lane {
			t.Errorf("batch mixes lanes: %s", fmtBatch(batch))
		}
		if last, ok := p.lastOff[lane]; ok && it.Record.Offset <= last {
			t.Errorf("lane %d advanced out of order: %d after %d", lane, it.Record.Offset, last)
		}
		p.lastOff[lane] = it.Record.Offset
		if it.Payload != any(it.Record) {
			t.Errorf("payload of %d is not the emitted payload", it.Record.Offset)
		}
	}
	p.mu.Unlock()

	p.h.mu.Lock()
	p.h.batches = append(p.h.batches, fmtBatch(batch))
	p.h.items = append(p.h.items, batch...)
	gate, fail := p.h.advanceGate, p.h.advanceErr
	p.h.mu.Unlock()
	if gate != nil {
		<-gate
	}
	p.mu.Lock()
	p.inflight = false
	p.mu.Unlock()
	if fail != nil {
		return fail(batch)
	}
	return nil
}

func (p *fakeProducer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed++
	return nil
}

// fmtBatch renders a batch as "off:acked/failed/rejected" items, prefixed by
// "pN@" for partitions other than 0.
func fmtBatch(batch []AdvanceItem) string {
	var parts []string
	for _, it := range batch {
		o := it.Outcome
		s := fmt.Sprintf("%d:%d/%d/%d", it.Record.Offset, o.Acked, o.Failed, o.Rejected)
		if it.Record.Partition != 0 {
			s = fmt.Sprintf("p%d@%s", it.Record.Partition, s)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// harness drives one Manager inside a synctest bubble with one fake producer
// per group built from key "k".
type harness struct {
	t   *testing.T
	m   *Manager
	in  chan fakeItem
	log *bytes.Buffer

	laneFn  func(*Record) (any, error)
	emitted countBox
	batch   bool // the factory builds BatchProducers

	mu          sync.Mutex
	producers   []*fakeProducer
	factoryErr  error
	batches     []string
	seen        int
	items       []AdvanceItem
	advanceGate chan struct{}
	advanceErr  func([]AdvanceItem) error
}

type countBox struct {
	mu sync.Mutex
	n  int
}

func (c *countBox) Add(d int) { c.mu.Lock(); c.n += d; c.mu.Unlock() }
func (c *countBox) Get() int  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

// scenario runs f in a synctest bubble with a fresh harness and stops the
// manager afterwards. cfg.Logger is replaced by a buffer the test can read.
func scenario(t *testing.T, cfg Config, f func(t *testing.T, h *harness)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		h := &harness{t: t, in: make(chan fakeItem, 1<<12), log: &bytes.Buffer{}}
		cfg.Logger = slog.New(slog.NewTextHandler(lockedWriter{w: h.log, mu: &h.mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
		m, err := NewManager(cfg)
		if err != nil {
			t.Fatal(err)
		}
		h.m = m
		defer m.StopAll()
		f(t, h)
	})
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (h *harness) logs() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.String()
}

func (h *harness) factory(ctx context.Context) (Producer, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.factoryErr != nil {
		return nil, h.factoryErr
	}
	p := &fakeProducer{h: h}
	h.producers = append(h.producers, p)
	if h.batch {
		return fakeBatchProducer{p}, nil
	}
	return p, nil
}

// sub subscribes id to key "k" in ack mode.
func (h *harness) sub(id string) *Subscription {
	h.t.Helper()
	s, err := h.m.Subscribe("k", id, h.factory)
	if err != nil {
		h.t.Fatal(err)
	}
	synctest.Wait()
	return s
}

// emit makes the fake poll loop emit records at the given offsets of
// partition 0 and waits until the bubble is idle.
func (h *harness) emit(offsets ...int64) { h.emitP(0, offsets...) }

func (h *harness) emitP(part int32, offsets ...int64) {
	for _, o := range offsets {
		h.in <- fakeItem{rec: &Record{Topic: "t", Partition: part, Offset: o}}
	}
	synctest.Wait()
}

// emitBatch makes the batch poll loop emit records at the given offsets of
// partition 0 as one batch and waits until the bubble is idle.
func (h *harness) emitBatch(offsets ...int64) {
	recs := make([]*Record, len(offsets))
	for i, o := range offsets {
		recs[i] = &Record{Topic: "t", Offset: o}
	}
	h.in <- fakeItem{recs: recs}
	synctest.Wait()
}

// end makes Open return err.
func (h *harness) end(err error) {
	h.in <- fakeItem{end: true, err: err}
	synctest.Wait()
}

// next returns the next delivery of s; it fails the test when none is queued.
func (h *harness) next(s *Subscription) *Delivery {
	h.t.Helper()
	d, err := h.tryNext(s)
	if err != nil {
		h.t.Fatalf("%s: Next: %v", s.ID(), err)
	}
	return d
}

// tryNext calls Next with a 1 ms deadline (fake time) and waits for the
// bubble to settle.
func (h *harness) tryNext(s *Subscription) (*Delivery, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	d, err := s.Next(ctx)
	synctest.Wait()
	return d, err
}

// idle calls Next on s expecting nothing queued (closes its window).
func (h *harness) idle(s *Subscription) {
	h.t.Helper()
	if d, err := h.tryNext(s); !errors.Is(err, context.DeadlineExceeded) {
		h.t.Fatalf("%s: expected no record, got %v, %v", s.ID(), d, err)
	}
}

// advanced returns the Advance batches since the previous call.
func (h *harness) advanced() []string {
	synctest.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.batches[h.seen:]
	h.seen = len(h.batches)
	return append([]string(nil), out...)
}

func (h *harness) expectAdvanced(want ...string) {
	h.t.Helper()
	got := h.advanced()
	if strings.Join(got, " | ") != strings.Join(want, " | ") {
		h.t.Fatalf("advance batches:\n got  %q\n want %q", got, want)
	}
}

func (h *harness) producer(i int) *fakeProducer {
	h.mu.Lock()
	defer h.mu.Unlock()
	if i >= len(h.producers) {
		h.t.Fatalf("producer %d not built (%d built)", i, len(h.producers))
	}
	return h.producers[i]
}

func (h *harness) nProducers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.producers)
}

func mustBind(t *testing.T, d *Delivery) Token {
	t.Helper()
	tok, ok := d.Bind()
	if !ok {
		t.Fatalf("Bind on offset %d: not bound", d.Record.Offset)
	}
	return tok
}

func expectErr[E error](t *testing.T, err error) E {
	t.Helper()
	var target E
	if !errors.As(err, &target) {
		t.Fatalf("error %v (%T) is not %T", err, err, target)
	}
	return target
}
