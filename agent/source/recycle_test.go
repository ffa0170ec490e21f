package source

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// Advanced entries are recycled (group.free). A Delivery and a Token of an
// earlier use of an entry must not act on its later use, even when the later
// use has the same subscriber at the same binding index.
func TestRecycledEntryIgnoresStaleDeliveryAndToken(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		d0 := h.next(a)
		tok0 := mustBind(t, d0)
		h.idle(a) // window closed, waiting for tok0
		tok0.Confirm()
		h.expectAdvanced("0:1/0/0")
		h.emit(1)
		h.next(a)
		h.idle(a)
		h.expectAdvanced("1:1/0/0") // this harvest put 0's entry on the free list
		h.emit(2)
		d2 := h.next(a)
		if d2.e != d0.e || d2.i != d0.i {
			t.Fatal("record 2 did not reuse record 0's entry; the scenario checks nothing")
		}
		if _, ok := d0.Bind(); ok {
			t.Fatal("stale delivery of 0 bound a token in 2's window")
		}
		if d0.Reject(errors.New("stale")) {
			t.Fatal("stale delivery of 0 rejected record 2")
		}
		if d0.Fail(errors.New("stale")) {
			t.Fatal("stale delivery of 0 failed record 2")
		}
		tok2 := mustBind(t, d2)
		h.idle(a)      // 2 waits for tok2
		tok0.Confirm() // duplicate and stale
		tok0.Fail(errors.New("stale"))
		h.expectAdvanced()
		tok2.Confirm()
		h.expectAdvanced("2:1/0/0")
	})
}

// A subscriber whose window stays open on a record it no longer resolves
// (here: failed by the ack timeout) must not close a binding of the entry's
// later use: recycling closes that window.
func TestRecycledEntryClosesAWindowLeftOpen(t *testing.T) {
	scenario(t, Config{AckTimeout: 100 * time.Millisecond}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		d0 := h.next(a) // a's window stays open on 0 (binding index 0)
		h.next(b)
		h.idle(b)
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		h.expectAdvanced("0:1/1/0") // a timed out; its window is still set
		h.emit(1)                   // snapshot {b}
		h.next(b)
		h.idle(b)
		h.expectAdvanced("1:1/0/0") // 0's entry recycled
		h.emit(2)
		d2 := h.next(b) // b's binding at index 0 of the reused entry
		if d2.e != d0.e || d2.i != d0.i {
			t.Fatal("record 2 did not reuse record 0's entry at the same index; the scenario checks nothing")
		}
		_, err := h.tryNext(a) // closes a's (stale) window first
		expectErr[*AckTimeoutError](t, err)
		h.expectAdvanced() // b's window on 2 is still open
		tok := mustBind(t, d2)
		h.idle(b)
		h.expectAdvanced()
		tok.Confirm()
		h.expectAdvanced("2:1/0/0")
	})
}
