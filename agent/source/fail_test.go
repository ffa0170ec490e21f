package source

import (
	"errors"
	"slices"
	"testing"
)

// Delivery.Fail resolves the open window FAILED with its cause, keeps the
// subscriber in later snapshots (unlike Unsubscribe), and is a no-op on a
// stale delivery; CauseIDs names the subscriber of every cause.
func TestDeliveryFailKeepsSubscriber(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0, 1)
		da := h.next(a)
		boom := errors.New("agent a: boom")
		tok := mustBind(t, da)
		if !da.Fail(boom) {
			t.Fatal("Fail inside the window did not take effect")
		}
		if da.Fail(errors.New("again")) {
			t.Fatal("second Fail took effect")
		}
		tok.Confirm() // stale: no effect
		if _, ok := da.Bind(); ok {
			t.Fatal("Bind after Fail returned a token")
		}
		db := h.next(b)
		if !db.Reject(errors.New("b rejects")) {
			t.Fatal("Reject did not take effect")
		}
		h.expectAdvanced("0:0/1/1")
		h.mu.Lock()
		it := h.items[0]
		h.mu.Unlock()
		if len(it.Causes) != 2 || !errors.Is(it.Causes[0], boom) {
			t.Fatalf("causes %v", it.Causes)
		}
		if !slices.Equal(it.CauseIDs, []string{"a", "b"}) {
			t.Fatalf("cause ids %q, want [a b]", it.CauseIDs)
		}
		// a stays subscribed: it receives record 1 and later records.
		d1 := h.next(a)
		if d1.Record.Offset != 1 {
			t.Fatalf("a got offset %d after Fail, want 1", d1.Record.Offset)
		}
		if da.Fail(boom) { // stale delivery
			t.Fatal("Fail on a stale delivery took effect")
		}
		h.next(b)
		h.emit(2)
		h.next(a)
		h.next(b)
		h.idle(a)
		h.idle(b)
		h.expectAdvanced("1:2/0/0", "2:2/0/0")
	})
}

// A Delivery that Next never filled, the zero value or a nil pointer, has no
// window: every method is a no-op that reports false instead of
// dereferencing a subscriber it does not have (issue #26: Reject panicked).
func TestEmptyDeliveryIsNoop(t *testing.T) {
	for name, d := range map[string]*Delivery{"zero": {}, "nil": nil} {
		t.Run(name, func(t *testing.T) {
			if d.Reject(errors.New("bad")) {
				t.Error("Reject took effect")
			}
			if d.Fail(errors.New("bad")) {
				t.Error("Fail took effect")
			}
			if _, ok := d.Bind(); ok {
				t.Error("Bind returned a token")
			}
			if d.Open() {
				t.Error("Open reported a window")
			}
		})
	}
}
