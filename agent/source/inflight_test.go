package source

import (
	"fmt"
	"testing"
	"testing/synctest"
)

// inFlight returns the in-flight bytes of key "k"'s group, or false when
// there is no live group.
func (h *harness) inFlight() (int64, bool) {
	h.m.mu.Lock()
	g := h.m.groups["k"]
	h.m.mu.Unlock()
	if g == nil {
		return 0, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight, true
}

// emitSized makes the batch poll loop emit one batch of records at offsets
// from..from+n-1 of partition 0, each with a value of size bytes.
func (h *harness) emitSized(from int64, n, size int) {
	recs := make([]*Record, n)
	for i := range recs {
		recs[i] = &Record{Topic: "t", Offset: from + int64(i), Value: make([]byte, size)}
	}
	h.in <- fakeItem{recs: recs}
	synctest.Wait()
}

// Records held unresolved (their derived records unconfirmed) keep the
// group's in-flight bytes at the bound: the poll loop's batch waits in emit,
// the subscriber finds nothing more to pull, and the bytes handed out never
// exceed the bound by more than one record. As the held records resolve the
// rest of the batch goes out, every record is advanced once, in order, and
// the in-flight bytes return to zero.
func TestInFlightBytesBoundHoldsAndResumes(t *testing.T) {
	const size = 1000
	rec := recordSize(&Record{Value: make([]byte, size)})
	bound := 4 * rec
	batchScenario(t, Config{QueueSize: 64, Overflow: Backpressure, MaxInFlightBytes: bound}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitSized(0, 10, size)
		if n := h.emitted.Get(); n != 0 {
			t.Fatalf("the batch's emit returned with %d records in flight over the bound", n)
		}
		// Pull everything there is, binding one derived record to each and
		// confirming none: every record stays unresolved.
		var toks []Token
		var got []int64
		for {
			d, err := h.tryNext(a)
			if err != nil {
				break
			}
			got = append(got, d.Record.Offset)
			toks = append(toks, mustBind(t, d))
			b, _ := h.inFlight()
			if b > bound+rec {
				t.Fatalf("in flight %d bytes after %d records, bound %d (+ one record %d)", b, len(got), bound, rec)
			}
		}
		if fmt.Sprint(got) != "[0 1 2 3]" {
			t.Fatalf("handed out %v while holding them unresolved, want [0 1 2 3] (4 records of %d bytes under a bound of %d)", got, rec, bound)
		}
		if b, _ := h.inFlight(); b != bound {
			t.Fatalf("in flight %d bytes, want %d", b, bound)
		}
		if s := h.advancedItems(); s != "" {
			t.Fatalf("advanced %q before any record resolved", s)
		}
		// Progress resumes as records resolve: confirming the oldest one
		// lets exactly one more record out.
		toks[0].Confirm()
		if s := h.advancedItems(); s != "0:1/0/0" {
			t.Fatalf("advanced %q, want 0 alone", s)
		}
		d := h.next(a)
		if d.Record.Offset != 4 {
			t.Fatalf("after 0 resolved: handed %d, want 4", d.Record.Offset)
		}
		toks = append(toks, mustBind(t, d))
		h.idle(a)
		// Resolving the rest out of order: nothing advances past the
		// unresolved head, and the bytes stay counted until it does.
		toks[3].Confirm()
		toks[2].Confirm()
		if s := h.advancedItems(); s != "" {
			t.Fatalf("advanced %q past the unresolved 1", s)
		}
		if _, err := h.tryNext(a); err == nil {
			t.Fatal("a record went out while 1..4 were in flight")
		}
		toks[1].Confirm()
		if s := h.advancedItems(); s != "1:1/0/0 2:1/0/0 3:1/0/0" {
			t.Fatalf("advanced %q, want 1 2 3", s)
		}
		toks[4].Confirm()
		for want := int64(5); want < 10; want++ {
			d := h.next(a)
			if d.Record.Offset != want {
				t.Fatalf("handed %d, want %d", d.Record.Offset, want)
			}
			if b, _ := h.inFlight(); b > bound+rec {
				t.Fatalf("in flight %d bytes, bound %d", b, bound)
			}
		}
		h.idle(a)
		if s := h.advancedItems(); s != "4:1/0/0 5:1/0/0 6:1/0/0 7:1/0/0 8:1/0/0 9:1/0/0" {
			t.Fatalf("advanced %q, want 4..9", s)
		}
		if n := h.emitted.Get(); n != 10 {
			t.Fatalf("emitted %d, want 10", n)
		}
		if b, _ := h.inFlight(); b != 0 {
			t.Fatalf("in flight %d bytes with every record advanced", b)
		}
	})
}

// A producer that is a RoomObserver is told why its emit waits and when the
// wait ends: bytes while held records keep the group at its in-flight
// bound, queue while a subscriber's queue is full, free once records go out
// again; an emit with room says nothing.
func TestInFlightRoomObserver(t *testing.T) {
	const size = 1000
	rec := recordSize(&Record{Value: make([]byte, size)})
	batchScenario(t, Config{QueueSize: 2, Overflow: Backpressure, MaxInFlightBytes: 2 * rec}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitSized(0, 1, size)
		p := h.producer(0)
		tok := mustBind(t, h.next(a))
		h.idle(a)
		if s := p.rooms(); s != "[]" {
			t.Fatalf("told %s after an emit with room, want nothing", s)
		}
		// 0 is held: 1 goes out and 2 waits for the bytes to drop.
		h.emitSized(1, 2, size)
		if s := p.rooms(); s != "[bytes]" {
			t.Fatalf("told %s with 2 records of %d bytes held under a bound of %d, want [bytes]", s, rec, 2*rec)
		}
		tok.Confirm()
		synctest.Wait()
		if s := p.rooms(); s != "[bytes free]" {
			t.Fatalf("told %s after the held record resolved, want [bytes free]", s)
		}
		h.next(a)
		h.next(a)
		h.idle(a)
	})
	// A subscriber that does not pull: its queue of 2 fills and the third
	// record waits for room in the queue.
	batchScenario(t, Config{QueueSize: 2, Overflow: Backpressure}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitSized(0, 3, 10)
		p := h.producer(0)
		if s := p.rooms(); s != "[queue]" {
			t.Fatalf("told %s with a's queue full, want [queue]", s)
		}
		h.next(a)
		h.next(a)
		h.next(a)
		h.idle(a)
		if s := p.rooms(); s != "[queue free]" {
			t.Fatalf("told %s after a pulled, want [queue free]", s)
		}
	})
}

// A record larger than the bound passes alone: with nothing in flight it goes
// out, and the next record waits until it resolved.
func TestInFlightBytesLargeRecordPasses(t *testing.T) {
	batchScenario(t, Config{Overflow: Backpressure, MaxInFlightBytes: 100}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitSized(0, 2, 1<<20)
		d := h.next(a)
		if d.Record.Offset != 0 {
			t.Fatalf("handed %d, want 0", d.Record.Offset)
		}
		tok := mustBind(t, d)
		h.idle(a) // 0's window closed, its derived record unconfirmed
		if b, _ := h.inFlight(); b != recordSize(d.Record) {
			t.Fatalf("in flight %d bytes, want the one record's %d", b, recordSize(d.Record))
		}
		tok.Confirm()
		if d := h.next(a); d.Record.Offset != 1 {
			t.Fatalf("handed %d, want 1", d.Record.Offset)
		}
		h.idle(a)
		if s := h.advancedItems(); s != "0:1/0/0 1:1/0/0" {
			t.Fatalf("advanced %q", s)
		}
		if n := h.emitted.Get(); n != 2 {
			t.Fatalf("emitted %d, want 2", n)
		}
	})
}

// A stop while the poll loop waits for in-flight bytes ends its emit (the
// rest of the batch is left undelivered) and the resolved prefix is still
// advanced: the wait never outlives the group.
func TestInFlightBytesStopWhileWaiting(t *testing.T) {
	const size = 1000
	rec := recordSize(&Record{Value: make([]byte, size)})
	batchScenario(t, Config{Overflow: Backpressure, MaxInFlightBytes: 2 * rec}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitSized(0, 5, size)
		h.next(a)
		d1 := h.next(a) // 0 acked and advanced; 2 fanned out
		mustBind(t, d1)
		if d := h.next(a); d.Record.Offset != 2 { // 1 held by its unconfirmed token
			t.Fatalf("handed %d, want 2", d.Record.Offset)
		}
		if b, _ := h.inFlight(); b != 2*rec {
			t.Fatalf("in flight %d bytes, want %d", b, 2*rec)
		}
		h.m.Stop("k")
		if s := h.advancedItems(); s != "0:1/0/0" {
			t.Fatalf("advanced %q", s)
		}
		if n := h.emitted.Get(); n != 0 {
			t.Fatalf("emitted %d: the interrupted batch counts as not delivered", n)
		}
		p := h.producer(0)
		p.mu.Lock()
		errs := len(p.emitErrs)
		p.mu.Unlock()
		if errs != 1 {
			t.Fatalf("emit errors %d, want one (the stop)", errs)
		}
	})
}

// Without Backpressure the bound is not applied (FailSubscriber never blocks
// the poll loop), and NewManager refuses a negative bound.
func TestInFlightBytesConfig(t *testing.T) {
	if _, err := NewManager(Config{MaxInFlightBytes: -1}); err == nil {
		t.Fatal("NewManager accepted MaxInFlightBytes -1")
	}
	m, err := NewManager(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if m.cfg.MaxInFlightBytes != DefaultMaxInFlightBytes {
		t.Fatalf("default MaxInFlightBytes %d, want %d", m.cfg.MaxInFlightBytes, DefaultMaxInFlightBytes)
	}
	batchScenario(t, Config{MaxInFlightBytes: 1}, func(t *testing.T, h *harness) {
		a := h.sub("a")
		h.emitSized(0, 3, 10)
		for want := int64(0); want < 3; want++ {
			d := h.next(a)
			if d.Record.Offset != want {
				t.Fatalf("handed %d, want %d", d.Record.Offset, want)
			}
			mustBind(t, d)
		}
		if n := h.emitted.Get(); n != 3 {
			t.Fatalf("emitted %d, want 3", n)
		}
	})
}
