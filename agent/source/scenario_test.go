package source

import (
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// A record is pending on exactly the subscribers present at fan-out and is
// advanced only after all of them moved past it.
func TestFanOutSnapshot(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		if d := h.next(a); d.Record.Offset != 0 {
			t.Fatalf("a got offset %d", d.Record.Offset)
		}
		h.next(b)
		h.idle(a) // a moved past 0; b's window is still open
		h.expectAdvanced()
		h.idle(b)
		h.expectAdvanced("0:2/0/0")
	})
}

// A subscriber that joins after fan-out never sees the record and is not
// counted for it.
func TestLateJoiner(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		b := h.sub("b")
		h.emit(1)
		if d := h.next(b); d.Record.Offset != 1 {
			t.Fatalf("late joiner got offset %d, want 1", d.Record.Offset)
		}
		h.next(a)
		h.next(a) // closes 0: a is its whole snapshot
		h.expectAdvanced("0:1/0/0")
		h.idle(a)
		h.expectAdvanced()
		h.idle(b)
		h.expectAdvanced("1:2/0/0")
	})
}

// A filter that derives nothing is acked when it asks for the next record,
// even when none exists yet.
func TestFilterEmitsNothing(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		h.next(a)
		h.expectAdvanced()
		h.idle(a)
		h.expectAdvanced("0:1/0/0")
	})
}

// Several derived records: every token must confirm (any order) and the
// window must be closed.
func TestSeveralDerivedRecords(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		d := h.next(a)
		t1, t2, t3 := mustBind(t, d), mustBind(t, d), mustBind(t, d)
		t3.Confirm()
		t1.Confirm()
		h.idle(a)
		h.expectAdvanced()
		t2.Confirm()
		h.expectAdvanced("0:1/0/0")
	})
}

// Confirming before the window closes is enough: closing then acks at once.
func TestConfirmBeforeWindowCloses(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		d := h.next(a)
		mustBind(t, d).Confirm()
		h.expectAdvanced()
		h.idle(a)
		h.expectAdvanced("0:1/0/0")
	})
}

// A confirmation after the ack timeout is ignored: the record was already
// failed and advanced.
func TestConfirmAfterTimeout(t *testing.T) {
	scenario(t, Config{AckTimeout: time.Second}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		d := h.next(a)
		tok := mustBind(t, d)
		h.idle(a) // window closed, waiting for the confirmation
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		h.expectAdvanced("0:0/1/0")
		_, err := h.tryNext(a)
		te := expectErr[*AckTimeoutError](t, err)
		if te.ID != "a" || te.EventID != 0 || te.Timeout != time.Second {
			t.Fatalf("timeout error %+v", te)
		}
		tok.Confirm()
		h.expectAdvanced()
	})
}

// Reject before binding resolves REJECTED at once; a later Bind draws no token.
func TestRejectBeforeBind(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		d := h.next(a)
		reason := errors.New("malformed")
		if !d.Reject(reason) {
			t.Fatal("Reject inside the window did not take effect")
		}
		h.expectAdvanced("0:0/0/1")
		if _, ok := d.Bind(); ok {
			t.Fatal("Bind after Reject returned a token")
		}
		h.mu.Lock()
		causes := h.items[0].Causes
		h.mu.Unlock()
		if len(causes) != 1 || !errors.Is(causes[0], reason) {
			t.Fatalf("causes %v, want [%v]", causes, reason)
		}
	})
}

// Reject after binding: REJECTED, and the earlier token's confirmation is
// ignored.
func TestRejectAfterBind(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		d := h.next(a)
		tok := mustBind(t, d)
		d.Reject(errors.New("no"))
		tok.Confirm()
		h.next(b)
		h.idle(a)
		h.idle(b)
		h.expectAdvanced("0:1/0/1")
	})
}

// Reject on a stale delivery (its window closed) warns and does nothing
// (deviation 2: the reference could flip a pending entry from a task that
// copied the context).
func TestDeviationStaleRejectIsNoop(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0, 1)
		d0 := h.next(a)
		tok := mustBind(t, d0)
		h.next(a) // window of 0 closed, waiting for tok
		if d0.Reject(errors.New("late")) {
			t.Fatal("stale Reject took effect")
		}
		if _, ok := d0.Bind(); ok {
			t.Fatal("stale Bind returned a token")
		}
		if !strings.Contains(h.logs(), "called outside an ack-mode binding window; ignored") {
			t.Fatalf("no warning logged:\n%s", h.logs())
		}
		tok.Confirm()
		h.expectAdvanced("0:1/0/0")
	})
}

// Queue overflow under FailSubscriber fails only that subscriber, in every
// outstanding record; siblings and the group go on.
func TestOverflowFailSubscriber(t *testing.T) {
	scenario(t, Config{QueueSize: 2}, func(t *testing.T, h *harness) {
		slow, fast := h.sub("slow"), h.sub("fast")
		h.emit(0)
		h.next(fast)
		h.emit(1, 2) // slow's queue holds 0, 1; 2 overflows it
		h.next(fast)
		h.next(fast)
		h.idle(fast)
		h.expectAdvanced("0:1/1/0", "1:1/1/0", "2:1/1/0")
		_, err := h.tryNext(slow)
		oe := expectErr[*OverflowError](t, err)
		if oe.ID != "slow" || oe.QueueSize != 2 || oe.Key != "k" {
			t.Fatalf("overflow error %+v", oe)
		}
		h.emit(3) // slow is excluded from later snapshots
		h.next(fast)
		h.idle(fast)
		h.expectAdvanced("3:1/0/0")
	})
}

// Unsubscribe with an open window and no cause counts it ACKED; with an
// unconfirmed token it waits for the confirmation.
func TestUnsubscribeOpenWindowNoCause(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0, 1)
		h.next(b)
		h.next(b)
		h.idle(b)
		h.next(a) // window on 0, bind a token
		d := h.next(a)
		tok := mustBind(t, d)
		h.expectAdvanced("0:2/0/0")
		a.Unsubscribe(nil)
		h.expectAdvanced()
		tok.Confirm()
		h.expectAdvanced("1:2/0/0")
	})
}

// Deviation 3: Unsubscribe with a cause counts the open window FAILED (the
// reference counts it ACKED, committing a record the subscriber crashed on).
func TestDeviationUnsubscribeWithCauseFails(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0)
		h.next(a)
		h.next(b)
		h.idle(b)
		crash := errors.New("agent crashed")
		a.Unsubscribe(crash)
		h.expectAdvanced("0:1/1/0")
		h.mu.Lock()
		causes := h.items[0].Causes
		h.mu.Unlock()
		if len(causes) != 1 || !errors.Is(causes[0], crash) {
			t.Fatalf("causes %v", causes)
		}
	})
}

// Deviation 1: a deliberate stop is reported to a waiting subscriber.
func TestDeviationStopReported(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0)
		h.m.Stop("k")
		_, err := h.tryNext(a)
		if !errors.Is(err, ErrGroupStopped) {
			t.Fatalf("Next after Stop: %v", err)
		}
		if c := h.producer(0).closes(); c != 1 {
			t.Fatalf("producer closed %d times", c)
		}
		h.expectAdvanced() // 0 was never resolved: abandoned
	})
}

// Deviation 4: Token.Fail fails the record for that subscriber at once.
func TestDeviationTokenFail(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emit(0, 1)
		d := h.next(a)
		tok := mustBind(t, d)
		tok.Fail(errors.New("NOT_ENOUGH_REPLICAS"))
		h.expectAdvanced("0:0/1/0")
		h.next(a) // the subscriber itself is healthy
		h.idle(a)
		h.expectAdvanced("1:1/0/0")
	})
}

// Deviation 5: the config is validated.
func TestDeviationConfigValidated(t *testing.T) {
	for _, cfg := range []Config{{QueueSize: -1}, {AckTimeout: -time.Second}, {CohortGrace: -1}, {Overflow: 7}} {
		if _, err := NewManager(cfg); err == nil {
			t.Errorf("NewManager(%+v) accepted", cfg)
		}
	}
	m, err := NewManager(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if m.cfg.QueueSize != 1024 || m.cfg.AckTimeout != 300*time.Second || m.cadence != 30*time.Second {
		t.Fatalf("defaults: %+v cadence %s", m.cfg, m.cadence)
	}
}

// Open returning nil while its context is live terminates the group:
// ErrPollEnded to every subscriber, resolved prefix drained, Close once.
func TestProducerReturnsEarly(t *testing.T) {
	scenario(t, Config{}, func(t *testing.T, h *harness) {
		a, b := h.sub("a"), h.sub("b")
		h.emit(0, 1)
		h.next(a)
		h.next(b)
		h.next(a)
		h.next(b) // 0 resolved; both windows on 1
		h.end(nil)
		for _, s := range []*Subscription{a, b} {
			if _, err := h.tryNext(s); !errors.Is(err, ErrPollEnded) {
				t.Fatalf("%s: %v, want ErrPollEnded", s.ID(), err)
			}
		}
		h.expectAdvanced("0:2/0/0")
		if c := h.producer(0).closes(); c != 1 {
			t.Fatalf("closed %d times", c)
		}
		if h.m.groups["k"] != nil {
			t.Fatal("terminated group still registered")
		}
	})
}
