package source

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// The ack timeout fires when elapsed >= T, measured from fan-out, at the
// first scan at or after T: the effective timeout lies in [T, T+cadence).
func TestAckTimeoutBoundary(t *testing.T) {
	scenario(t, Config{AckTimeout: time.Second}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		start := time.Now()
		h.emit(0)
		h.next(a) // window open forever
		time.Sleep(time.Second - time.Millisecond)
		synctest.Wait()
		h.expectAdvanced()
		time.Sleep(100 * time.Millisecond) // cadence = 100 ms
		synctest.Wait()
		h.expectAdvanced("0:0/1/0")
		_, err := h.tryNext(a)
		te := expectErr[*AckTimeoutError](t, err)
		if el := time.Since(start); el < time.Second || el > 1100*time.Millisecond+2*time.Millisecond {
			t.Fatalf("failed after %s", el)
		}
		if !strings.Contains(te.Error(), "did not finish processing event 0") {
			t.Fatalf("message %q", te.Error())
		}
	})
}

// A record still queued (never pulled) can time out: created_at is the
// fan-out time. The subscriber is failed in every outstanding record.
func TestAckTimeoutOfQueuedRecord(t *testing.T) {
	scenario(t, Config{AckTimeout: time.Second}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		time.Sleep(500 * time.Millisecond)
		h.emit(1)
		h.next(b)
		h.next(b)
		h.idle(b)
		h.expectAdvanced()
		time.Sleep(600 * time.Millisecond) // 0 is due; a fails in 0 and 1
		synctest.Wait()
		h.expectAdvanced("0:1/1/0 1:1/1/0")
		if _, err := h.tryNext(a); err == nil {
			t.Fatal("a got a record after failing")
		}
	})
}

// A subscriber that unsubscribed with an unconfirmed token is still failed by
// the timeout (it is not registered, so no sentinel), unblocking the lane.
func TestAckTimeoutOfDepartedSubscriber(t *testing.T) {
	scenario(t, Config{AckTimeout: time.Second}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		mustBind(t, h.next(a))
		a.Unsubscribe(nil)
		h.next(b)
		h.idle(b)
		h.expectAdvanced()
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		h.expectAdvanced("0:1/1/0")
		h.emit(1) // b is healthy
		h.next(b)
		h.idle(b)
		h.expectAdvanced("1:1/0/0")
	})
}

// Resolutions during an in-flight Advance coalesce into the next batch.
func TestCoalescingDuringAdvance(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		gate := make(chan struct{})
		h.advanceGate = gate
		a := h.sub("a")
		h.emit(0, 1, 2, 3)
		h.next(a)
		h.next(a) // 0 -> Advance blocks
		h.next(a)
		h.next(a)
		h.idle(a) // 1, 2, 3 resolve while 0 is in flight
		h.mu.Lock()
		h.advanceGate = nil
		h.mu.Unlock()
		close(gate)
		h.expectAdvanced("0:1/0/0", "1:1/0/0 2:1/0/0 3:1/0/0")
	})
}

// A single action that resolves several records ships them in one batch: a
// force-fail of one subscriber across every outstanding record.
func TestForceFailShipsOneBatch(t *testing.T) {
	scenario(t, Config{QueueSize: 3}, func(t *testing.T, h *harness) {
		slow, fast := h.sub("slow"), h.sub("fast")
		h.emit(0, 1, 2)
		for range 3 {
			h.next(fast)
		}
		h.idle(fast)
		h.expectAdvanced()
		h.emit(3) // slow overflows: 0..3 resolve in one critical section
		h.next(fast)
		h.idle(fast)
		h.expectAdvanced("0:1/1/0 1:1/1/0 2:1/1/0", "3:1/1/0")
		_ = slow
	})
}

// Rejecting twice, or after a force-fail, is a no-op.
func TestRejectTwiceAndAfterFail(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0, 1)
		d := h.next(a)
		if !d.Reject(nil) {
			t.Fatal("first reject ignored")
		}
		if d.Reject(errors.New("again")) {
			t.Fatal("second reject took effect")
		}
		h.expectAdvanced("0:0/0/1")
		d1 := h.next(a)
		mustBind(t, d1).Fail(errors.New("produce failed"))
		if d1.Reject(errors.New("after fail")) {
			t.Fatal("reject after a force-fail took effect")
		}
		if _, ok := d1.Bind(); ok {
			t.Fatal("bind after a force-fail")
		}
		h.expectAdvanced("1:0/1/0")
		h.mu.Lock()
		c0, c1 := h.items[0].Causes, h.items[1].Causes
		h.mu.Unlock()
		if len(c0) != 1 || c0[0].Error() != "rejected" || len(c1) != 1 || !strings.Contains(c1[0].Error(), "produce failed") {
			t.Fatalf("causes %v / %v", c0, c1)
		}
	})
}

// Token.Fail of one subscriber does not affect a sibling's outcome.
func TestTokenFailWithSibling(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		ta := mustBind(t, h.next(a))
		tb := mustBind(t, h.next(b))
		h.idle(a)
		h.idle(b)
		ta.Fail(errors.New("x"))
		h.expectAdvanced()
		tb.Confirm()
		h.expectAdvanced("0:1/1/0")
	})
}

// Once a subscriber failed, every later Next returns the same error.
func TestNextAfterFailureKeepsError(t *testing.T) {
	scenario(t, Config{QueueSize: 1}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		h.next(b)
		h.emit(1) // a overflows
		_, err1 := h.tryNext(a)
		_, err2 := h.tryNext(a)
		if err1 == nil || err1 != err2 {
			t.Fatalf("errors %v / %v", err1, err2)
		}
		h.next(b)
		h.idle(b)
		h.expectAdvanced("0:1/1/0", "1:1/1/0")
	})
}

// A group terminal error replaces an earlier, not yet consumed, overflow error.
func TestTerminalErrorReplacesOverflow(t *testing.T) {
	scenario(t, Config{QueueSize: 1}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		h.next(b)
		h.emit(1) // a overflows
		boom := errors.New("poll failed")
		h.end(boom)
		if _, err := h.tryNext(a); !errors.Is(err, boom) {
			t.Fatalf("Next: %v", err)
		}
	})
}

// StopAll stops every group, each closing its producer once.
func TestStopAllSeveralGroups(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		s1, _ := h.m.Subscribe("k1", "a", h.factory)
		s2, _ := h.m.Subscribe("k2", "a", h.factory)
		synctest.Wait()
		if n := h.nProducers(); n != 2 {
			t.Fatalf("producers %d", n)
		}
		h.m.StopAll()
		for _, s := range []*Subscription{s1, s2} {
			if _, err := h.tryNext(s); !errors.Is(err, ErrGroupStopped) {
				t.Fatalf("%s: %v", s.Key(), err)
			}
		}
		for i := range 2 {
			if c := h.producer(i).closes(); c != 1 {
				t.Fatalf("producer %d closed %d times", i, c)
			}
		}
		if len(h.m.groups) != 0 || len(h.m.all) != 0 {
			t.Fatalf("groups left: %d live, %d tearing down", len(h.m.groups), len(h.m.all))
		}
	})
}

// A subscribe that arrives while the group tears down builds a fresh group.
func TestSubscribeDuringTeardown(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		gate := make(chan struct{})
		h.advanceGate = gate
		a := h.sub("a")
		h.emit(0)
		h.next(a)
		h.idle(a) // Advance([0]) blocks
		stopped := make(chan struct{})
		go func() { h.m.Stop("k"); close(stopped) }()
		synctest.Wait()
		b := h.sub("b") // old group still draining
		if n := h.nProducers(); n != 2 {
			t.Fatalf("producers %d, want a fresh one", n)
		}
		h.mu.Lock()
		h.advanceGate = nil
		h.mu.Unlock()
		close(gate)
		<-stopped
		h.expectAdvanced("0:1/0/0")
		h.emit(5)
		if d := h.next(b); d.Record.Offset != 5 {
			t.Fatalf("b got %d", d.Record.Offset)
		}
	})
}

// Next honours its context; the window it closed stays closed.
func TestNextContextCancel(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		h.next(a)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := a.Next(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Next: %v", err)
		}
		h.expectAdvanced("0:1/0/0")
	})
}

// Unsubscribe twice is a no-op; Unsubscribe during the grace stops the group
// with no factory call.
func TestUnsubscribeIdempotentAndDuringGrace(t *testing.T) {
	scenario(t, Config{CohortGrace: time.Second}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		a.Unsubscribe(nil)
		a.Unsubscribe(errors.New("again"))
		time.Sleep(2 * time.Second)
		if n := h.nProducers(); n != 0 {
			t.Fatalf("factory called %d times", n)
		}
		if len(h.m.all) != 0 {
			t.Fatal("group not torn down")
		}
	})
}

// Lanes are harvested in insertion order; an emptied lane is deleted and
// recreated at the end on its next record.
func TestLaneRecreatedAtEnd(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		gate := make(chan struct{})
		a := h.sub("a")
		h.emitP(0, 0)
		h.next(a)
		h.idle(a)
		h.expectAdvanced("0:1/0/0") // lane 0 deleted
		h.advanceGate = gate
		h.emitP(1, 0)
		h.emitP(0, 1)
		h.emitP(2, 0)
		h.next(a)
		h.next(a) // p1@0 resolved -> Advance blocks
		h.next(a)
		h.idle(a) // p0@1 and p2@0 resolve during the Advance
		h.mu.Lock()
		h.advanceGate = nil
		h.mu.Unlock()
		close(gate)
		h.expectAdvanced("p1@0:1/0/0", "1:1/0/0", "p2@0:1/0/0")
	})
}

// Outcome.Clean: zero subscribers is not clean (v3).
func TestOutcomeClean(t *testing.T) {
	for _, c := range []struct {
		o    Outcome
		want bool
	}{
		{Outcome{}, false},
		{Outcome{Acked: 1}, true},
		{Outcome{Acked: 2, Failed: 1}, false},
		{Outcome{Acked: 2, Rejected: 1}, false},
		{Outcome{Failed: 1}, false},
	} {
		if got := c.o.Clean(); got != c.want {
			t.Errorf("%+v.Clean() = %v", c.o, got)
		}
	}
}

// Bind after the group stopped returns false; a token bound before is a no-op.
func TestBindAfterStop(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		d := h.next(a)
		tok := mustBind(t, d)
		h.m.Stop("k")
		if _, ok := d.Bind(); ok {
			t.Fatal("bind after stop")
		}
		if d.Reject(nil) {
			t.Fatal("reject after stop")
		}
		tok.Confirm()
		h.expectAdvanced()
	})
}
