package tablestate

import (
	"sync/atomic"
	"time"
)

// StreamTime is the stream time of one source partition: the highest record
// timestamp its agents received so far (Kafka Streams' stream time: it only
// moves forward, and only when records arrive). The zero value has seen no
// record. Safe for concurrent use.
type StreamTime struct {
	ms      atomic.Int64 // Unix milliseconds + 1 of the highest timestamp; 0: none yet
	first   atomic.Int64 // Unix milliseconds + 1 of the first timestamp; 0: none yet
	resets  atomic.Int64 // Reset calls
	advance chan struct{}
}

// NewStreamTime returns a stream time that has seen no record.
func NewStreamTime() *StreamTime { return &StreamTime{advance: make(chan struct{}, 1)} }

// Observe moves the stream time to ts if ts is later. A zero ts (a record
// without timestamp) is ignored.
func (s *StreamTime) Observe(ts time.Time) {
	if ts.IsZero() {
		return
	}
	v := ts.UnixMilli() + 1
	s.first.CompareAndSwap(0, v)
	for {
		cur := s.ms.Load()
		if v <= cur {
			return
		}
		if s.ms.CompareAndSwap(cur, v) {
			select {
			case s.advance <- struct{}{}:
			default:
			}
			return
		}
	}
}

// Now returns the stream time; ok is false before the first record.
func (s *StreamTime) Now() (t time.Time, ok bool) {
	v := s.ms.Load()
	if v == 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(v - 1), true
}

// Reset forgets the stream time, as when the partition restarts from its
// committed offsets (its records are processed again, from an earlier
// time); Resets counts the calls, so that a follower can tell.
func (s *StreamTime) Reset() {
	s.resets.Add(1)
	s.ms.Store(0)
	s.first.Store(0)
}

// First returns the timestamp of the first record observed (since the last
// Reset); ok is false before it.
func (s *StreamTime) First() (t time.Time, ok bool) {
	v := s.first.Load()
	if v == 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(v - 1), true
}

// Resets returns how often Reset was called.
func (s *StreamTime) Resets() int64 { return s.resets.Load() }

// Advanced is signalled (capacity one, so signals coalesce) whenever the
// stream time moved forward.
func (s *StreamTime) Advanced() <-chan struct{} { return s.advance }
