package source

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// Under Backpressure a full queue blocks emit instead of failing the
// subscriber; the record is fanned out (and snapshotted) once room appears.
func TestOverflowBackpressure(t *testing.T) {
	scenario(t, Config{QueueSize: 2, Overflow: Backpressure}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0, 1, 2)
		if n := h.emitted.Get(); n != 2 {
			t.Fatalf("emitted %d records, want 2 (third blocked)", n)
		}
		b := h.sub("b") // joins while record 2 waits: it is in 2's snapshot
		h.next(a)
		synctest.Wait()
		if n := h.emitted.Get(); n != 3 {
			t.Fatalf("emitted %d records after room appeared, want 3", n)
		}
		if d := h.next(b); d.Record.Offset != 2 {
			t.Fatalf("b got %d", d.Record.Offset)
		}
		h.next(a)
		h.next(a)
		h.idle(a)
		h.expectAdvanced("0:1/0/0", "1:1/0/0")
		h.idle(b)
		h.expectAdvanced("2:2/0/0")
	})
}

// A stalled subscriber under Backpressure is failed by the ack timeout, which
// unblocks the poll.
func TestBackpressureStallEndsAtAckTimeout(t *testing.T) {
	scenario(t, Config{QueueSize: 1, Overflow: Backpressure, AckTimeout: time.Second}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0, 1)
		if n := h.emitted.Get(); n != 1 {
			t.Fatalf("emitted %d", n)
		}
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if n := h.emitted.Get(); n != 2 {
			t.Fatalf("emitted %d after the timeout, want 2", n)
		}
		h.expectAdvancedItems("0:0/1/0", "1:0/0/0") // 1 fanned out to nobody: born resolved
		if _, err := h.tryNext(a); err == nil {
			t.Fatal("stalled subscriber got no error")
		} else {
			expectErr[*AckTimeoutError](t, err)
		}
	})
}

// Unsubscribe fails every record the subscriber never pulled.
func TestUnsubscribeFailsQueuedRecords(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0, 1)
		h.next(b)
		h.next(b)
		h.idle(b)
		a.Unsubscribe(nil)
		h.expectAdvanced("0:1/1/0 1:1/1/0")
		if _, err := h.tryNext(a); !errors.Is(err, ErrUnsubscribed) {
			t.Fatalf("Next after Unsubscribe: %v", err)
		}
	})
}

// Unsubscribe keeps earlier closed windows waiting for their confirmations.
func TestUnsubscribeKeepsClosedWindowsWaiting(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		tok := mustBind(t, h.next(a))
		h.idle(a)
		h.next(b)
		h.idle(b)
		a.Unsubscribe(errors.New("crash after the window closed"))
		h.expectAdvanced()
		tok.Confirm()
		h.expectAdvanced("0:2/0/0")
	})
}

// A departed subscriber's unconfirmed record still blocks its lane; a record
// fanned out while every registered subscriber is failed is born resolved
// (0,0,0), not clean, and queues behind the pending head.
func TestNoSubscribersAtFanOut(t *testing.T) {
	scenario(t, Config{QueueSize: 1}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		tok := mustBind(t, h.next(a))
		h.emit(1)          // b's queue still holds 0: b overflows (failed in 0 and 1)
		a.Unsubscribe(nil) // 0: waits for tok; 1 (never pulled): failed
		h.emit(2)          // only the failed b is registered: empty snapshot
		h.expectAdvanced()
		tok.Confirm()
		h.expectAdvanced("0:1/1/0 1:0/2/0 2:0/0/0")
		h.mu.Lock()
		clean := h.items[2].Outcome.Clean()
		h.mu.Unlock()
		if clean {
			t.Fatal("a zero-subscriber record is clean")
		}
		_ = b
	})
}

// The last unsubscribe stops the group; an already resolved record is
// advanced in the drain, one still waiting for confirmation is abandoned.
func TestLastUnsubscribeStopsGroup(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0, 1)
		h.next(a)
		tok := mustBind(t, h.next(a)) // 0 acked, window on 1 with a token
		h.advanced()
		a.Unsubscribe(nil)
		h.expectAdvanced()
		tok.Confirm() // group gone: dropped
		h.expectAdvanced()
		if c := h.producer(0).closes(); c != 1 {
			t.Fatalf("closes %d", c)
		}
		if _, ok := h.m.groups["k"]; ok {
			t.Fatal("key still registered")
		}
		// A new subscriber builds a fresh group: factory and Open again.
		h.sub("b")
		if n := h.nProducers(); n != 2 {
			t.Fatalf("producers built: %d, want 2", n)
		}
	})
}

// Open returning an error delivers it (wrapped) to every subscriber.
func TestProducerReturnsError(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		h.next(a)
		h.idle(a)
		boom := errors.New("broker gone")
		h.end(boom)
		if _, err := h.tryNext(a); !errors.Is(err, boom) {
			t.Fatalf("Next: %v", err)
		}
		h.expectAdvanced("0:1/0/0")
		if c := h.producer(0).closes(); c != 1 {
			t.Fatalf("closes %d", c)
		}
	})
}

// An Advance error terminates the group: every subscriber sees it, nothing is
// advanced again, Close once, and the key is free for a fresh group.
func TestAdvanceError(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		boom := errors.New("commit failed")
		h.advanceErr = func([]AdvanceItem) error { return boom }
		a, b := h.sub("a"), h.sub("b")
		h.emit(0, 1)
		h.next(a)
		h.next(b)
		h.next(b)
		h.next(a) // 0 resolved -> Advance fails
		h.expectAdvanced("0:2/0/0")
		for _, s := range []*Subscription{a, b} {
			if _, err := h.tryNext(s); !errors.Is(err, boom) {
				t.Fatalf("%s: %v", s.ID(), err)
			}
		}
		h.expectAdvanced()
		if c := h.producer(0).closes(); c != 1 {
			t.Fatalf("closes %d", c)
		}
		if !strings.Contains(h.logs(), "Producer advance raised; terminating shared-stream group") {
			t.Fatal("advance error not logged")
		}
		h.advanceErr = nil
		h.sub("c")
		if n := h.nProducers(); n != 2 {
			t.Fatalf("producers built %d", n)
		}
	})
}

// A lane error is terminal: that record is not fanned out, the resolved
// prefix is still drained.
func TestLaneError(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		bad := errors.New("no lane")
		h.laneFn = func(r *Record) (any, error) {
			if r.Offset == 1 {
				return nil, bad
			}
			return r.Partition, nil
		}
		a := h.sub("a")
		h.emit(0)
		h.next(a)
		h.idle(a)
		h.emit(1)
		if _, err := h.tryNext(a); !errors.Is(err, bad) {
			t.Fatalf("Next: %v, want the lane error", err)
		}
		h.expectAdvanced("0:1/0/0")
		if c := h.producer(0).closes(); c != 1 {
			t.Fatalf("closes %d", c)
		}
	})
}

// A non-comparable lane terminates the group instead of panicking.
func TestLaneNotComparable(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		h.laneFn = func(r *Record) (any, error) { return []int{1}, nil }
		a := h.sub("a")
		h.emit(0)
		_, err := h.tryNext(a)
		if err == nil || !strings.Contains(err.Error(), "not comparable") {
			t.Fatalf("Next: %v", err)
		}
		h.expectAdvanced()
	})
}

// Lanes are independent: a pending head in p0 does not hold back p1; within
// a lane a resolved record waits behind a pending head and both ship
// together.
func TestInterleavedLanes(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitP(0, 10)
		h.emitP(1, 20)
		h.emitP(0, 11)
		tok := mustBind(t, h.next(a)) // p0@10 waits for tok
		h.next(a)                     // p1@20 window
		h.next(a)                     // p1@20 acked; window on p0@11
		h.expectAdvanced("p1@20:1/0/0")
		h.idle(a) // p0@11 acked, behind the pending head
		h.expectAdvanced()
		tok.Confirm()
		h.expectAdvanced("10:1/0/0 11:1/0/0")
	})
}

// Stop drains the prefixes resolved at the time of the stop and abandons the
// rest; confirmations after the stop are dropped.
func TestStopDrainsResolvedAbandonsRest(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		gate := make(chan struct{})
		h.advanceGate = gate
		a := h.sub("a")
		h.emit(0, 1, 2, 3)
		h.next(a)
		h.next(a) // 0 acked -> Advance([0]) blocks on the gate
		h.next(a) // 1 acked
		tok := mustBind(t, h.next(a))
		h.idle(a) // 2 acked, 3 waits for tok (closed window)
		stopped := make(chan struct{})
		go func() { h.m.Stop("k"); close(stopped) }()
		synctest.Wait()
		tok.Confirm() // after the stop: dropped
		close(gate)
		<-stopped
		h.expectAdvanced("0:1/0/0", "1:1/0/0 2:1/0/0")
		if c := h.producer(0).closes(); c != 1 {
			t.Fatalf("closes %d", c)
		}
	})
}

// Duplicate and stale confirmations are no-ops; the zero Token is a no-op.
func TestDuplicateAndStaleConfirms(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		d := h.next(a)
		t1, t2 := mustBind(t, d), mustBind(t, d)
		t1.Confirm()
		t1.Confirm() // duplicate: must not count for t2
		h.idle(a)
		h.expectAdvanced()
		t2.Confirm()
		h.expectAdvanced("0:1/0/0")
		t2.Confirm()
		t2.Fail(errors.New("stale"))
		Token{}.Confirm()
		Token{}.Fail(nil)
		h.expectAdvanced()
	})
}

// Cohort grace: subscribers arriving within the grace share the first
// snapshot; the factory is called once, after the grace.
func TestCohortGrace(t *testing.T) {
	scenario(t, Config{CohortGrace: 2 * time.Second}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		time.Sleep(time.Second)
		b := h.sub("b")
		if n := h.nProducers(); n != 0 {
			t.Fatalf("factory called during the grace (%d)", n)
		}
		h.in <- fakeItem{rec: &Record{Offset: 0}}
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if n := h.nProducers(); n != 1 {
			t.Fatalf("factory calls %d", n)
		}
		h.next(a)
		h.next(b)
		h.idle(a)
		h.idle(b)
		h.expectAdvanced("0:2/0/0")
	})
}

// Stop during the grace: no factory call, no Open, no Close.
func TestStopDuringGrace(t *testing.T) {
	scenario(t, Config{CohortGrace: time.Minute}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.m.StopAll()
		if n := h.nProducers(); n != 0 {
			t.Fatalf("factory called %d times", n)
		}
		if _, err := h.tryNext(a); !errors.Is(err, ErrGroupStopped) {
			t.Fatalf("Next: %v", err)
		}
	})
}

// A factory error terminates the new group and frees the key.
func TestFactoryError(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		bad := errors.New("no brokers")
		h.factoryErr = bad
		a := h.sub("a")
		if _, err := h.tryNext(a); !errors.Is(err, bad) {
			t.Fatalf("Next: %v", err)
		}
		h.factoryErr = nil
		h.sub("b")
		if n := h.nProducers(); n != 1 {
			t.Fatalf("producers %d", n)
		}
	})
}

// Subscribing the same id twice is an error; an empty key is an error; a new
// group needs a factory.
func TestSubscribeErrors(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		h.sub("a")
		if _, err := h.m.Subscribe("k", "a", h.factory); err == nil || !strings.Contains(err.Error(), "already subscribed") {
			t.Fatalf("duplicate subscribe: %v", err)
		}
		if _, err := h.m.Subscribe("", "a", h.factory); err == nil {
			t.Fatal("empty key accepted")
		}
		if _, err := h.m.Subscribe("other", "a", nil); err == nil {
			t.Fatal("new group without a factory accepted")
		}
		// A sibling may pass nil: the group is built from the first subscriber.
		if _, err := h.m.Subscribe("k", "b", nil); err != nil {
			t.Fatal(err)
		}
	})
}

// The fast path fans out with no bookkeeping: Bind false, Reject warns and
// does nothing, no Advance.
func TestFastPath(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		open := func(ctx context.Context, emit func(*Record) error) error {
			for {
				select {
				case it := <-h.in:
					if err := emit(it.rec); err != nil {
						return err
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		a, err := h.m.SubscribeFast("k", "a", open)
		if err != nil {
			t.Fatal(err)
		}
		b, err := h.m.SubscribeFast("k", "b", nil)
		if err != nil {
			t.Fatal(err)
		}
		h.emit(0)
		d := h.next(a)
		if _, ok := d.Bind(); ok {
			t.Fatal("fast-path Bind returned a token")
		}
		if d.Reject(errors.New("x")) {
			t.Fatal("fast-path Reject took effect")
		}
		if !strings.Contains(h.logs(), "outside an ack-mode binding window") {
			t.Fatal("no warning")
		}
		if d := h.next(b); d.Record.Offset != 0 {
			t.Fatalf("b got %d", d.Record.Offset)
		}
		h.idle(a)
		h.expectAdvanced()
	})
}

// The fast path still fails an overflowing subscriber (FailSubscriber).
func TestFastPathOverflow(t *testing.T) {
	scenario(t, Config{QueueSize: 1}, func(t *testing.T, h *harness) {
		open := func(ctx context.Context, emit func(*Record) error) error {
			for {
				select {
				case it := <-h.in:
					if err := emit(it.rec); err != nil {
						return err
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		a, _ := h.m.SubscribeFast("k", "a", open)
		b, _ := h.m.SubscribeFast("k", "b", nil)
		h.emit(0)
		h.next(b)
		h.emit(1)
		if _, err := h.tryNext(a); err == nil {
			t.Fatal("overflowed subscriber got a record")
		} else {
			expectErr[*OverflowError](t, err)
		}
		if d := h.next(b); d.Record.Offset != 1 {
			t.Fatalf("b got %d", d.Record.Offset)
		}
	})
}
