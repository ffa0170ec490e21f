package tablestate

import (
	"testing"
	"time"
)

// Stream time only moves forward, remembers the first record, signals each
// advance (coalesced) and starts over on Reset.
func TestStreamTime(t *testing.T) {
	s := NewStreamTime()
	if _, ok := s.Now(); ok {
		t.Fatal("stream time before any record")
	}
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	s.Observe(t0.Add(time.Minute))
	s.Observe(t0) // out of order: no step back
	s.Observe(time.Time{})
	if now, _ := s.Now(); !now.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Now = %v", now)
	}
	if first, _ := s.First(); !first.Equal(t0.Add(time.Minute)) {
		t.Fatalf("First = %v", first)
	}
	select {
	case <-s.Advanced():
	default:
		t.Fatal("no advance signalled")
	}
	select {
	case <-s.Advanced():
		t.Fatal("an out-of-order record signalled an advance")
	default:
	}
	s.Reset()
	if _, ok := s.Now(); ok || s.Resets() != 1 {
		t.Fatal("Reset kept the stream time")
	}
	s.Observe(t0)
	if first, _ := s.First(); !first.Equal(t0) {
		t.Fatalf("First after Reset = %v", first)
	}
}
