package source

import (
	"errors"
	"strings"
	"testing"
)

// batchScenario is scenario with BatchProducers.
func batchScenario(t *testing.T, cfg Config, f func(t *testing.T, h *harness)) {
	t.Helper()
	scenario(t, cfg, func(t *testing.T, h *harness) {
		h.batch = true
		f(t, h)
	})
}

// advancedItems returns the items of the Advance batches since the last call,
// in order, whatever the batches' boundaries.
func (h *harness) advancedItems() string {
	return strings.Join(h.advanced(), " ")
}

// A batch longer than the subscriber queue is fanned out record by record as
// room appears (Backpressure), in order, and every record resolves once.
func TestBatchLongerThanQueue(t *testing.T) {
	batchScenario(t, Config{QueueSize: 2, Overflow: Backpressure}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitBatch(0, 1, 2, 3, 4)
		if n := h.emitted.Get(); n != 0 {
			t.Fatalf("emit returned with the queue full: %d emitted", n)
		}
		for want := int64(0); want < 5; want++ {
			if d := h.next(a); d.Record.Offset != want {
				t.Fatalf("delivered %d, want %d", d.Record.Offset, want)
			}
		}
		h.idle(a)
		if got, want := h.advancedItems(), "0:1/0/0 1:1/0/0 2:1/0/0 3:1/0/0 4:1/0/0"; got != want {
			t.Fatalf("advanced %q, want %q", got, want)
		}
		if n := h.emitted.Get(); n != 5 {
			t.Fatalf("emitted %d, want 5", n)
		}
	})
}

// A record failing in the middle of a batch fails alone: the records before
// and after it in the batch resolve as usual, and Advance keeps their order.
func TestBatchFailureMidBatch(t *testing.T) {
	batchScenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitBatch(0, 1, 2, 3)
		h.next(a)
		d1 := h.next(a)
		tok := mustBind(t, d1)
		if !d1.Fail(errors.New("boom")) {
			t.Fatal("Fail on 1 did not take effect")
		}
		tok.Confirm() // after the failure: a no-op
		d2 := h.next(a)
		tok2 := mustBind(t, d2)
		h.next(a)
		h.idle(a)
		if got, want := h.advancedItems(), "0:1/0/0 1:0/1/0"; got != want {
			t.Fatalf("advanced %q before 2's token confirmed, want %q", got, want)
		}
		tok2.Confirm()
		if got, want := h.advancedItems(), "2:1/0/0 3:1/0/0"; got != want {
			t.Fatalf("advanced %q, want %q", got, want)
		}
	})
}

// A stop while a batch waits for room ends the emit with an error: the
// records fanned out before it are resolved or abandoned as usual, the rest
// of the batch is never delivered, and nothing past the resolved prefix is
// advanced.
func TestBatchStopMidBatch(t *testing.T) {
	batchScenario(t, Config{QueueSize: 2, Overflow: Backpressure}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitBatch(0, 1, 2, 3, 4) // 0 and 1 fanned out, 2.. wait
		h.next(a)                  // 0's window open; 2 fanned out
		h.next(a)                  // 0 acked; 1's window open; 3 fanned out
		h.m.Stop("k")
		if got, want := h.advancedItems(), "0:1/0/0"; got != want {
			t.Fatalf("advanced %q, want %q", got, want)
		}
		p := h.producer(0)
		p.mu.Lock()
		errs := p.emitErrs
		p.mu.Unlock()
		if len(errs) != 1 {
			t.Fatalf("emit errors %v, want one (the stop)", errs)
		}
		if n := h.emitted.Get(); n != 0 {
			t.Fatalf("emitted %d: the interrupted batch counts as not delivered", n)
		}
		_, err := h.tryNext(a)
		if !errors.Is(err, ErrGroupStopped) {
			t.Fatalf("Next after stop: %v, want ErrGroupStopped", err)
		}
	})
}

// A lane error anywhere in a batch terminates the group before any record of
// the batch is fanned out.
func TestBatchLaneErrorFansOutNothing(t *testing.T) {
	batchScenario(t, Config{}, func(t *testing.T, h *harness) {
		boom := errors.New("no lane")
		h.laneFn = func(r *Record) (any, error) {
			if r.Offset == 2 {
				return nil, boom
			}
			return r.Partition, nil
		}
		a := h.sub("a")
		h.emitBatch(0, 1, 2, 3)
		_, err := h.tryNext(a)
		if !errors.Is(err, boom) {
			t.Fatalf("Next: %v, want the lane error", err)
		}
		if got := h.advancedItems(); got != "" {
			t.Fatalf("advanced %q, want nothing", got)
		}
	})
}
