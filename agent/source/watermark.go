package source

import "sort"

// Watermark tracks, for one partition, the next offset safe to commit. Kafka
// commits the offset of the next record to consume, i.e. offset+1 of the last
// processed record (OffsetCommit semantics since KIP-211/KIP-392). Offsets may
// have gaps (compaction, transaction markers): a gap is known-absent, never
// in-flight, so the committed offset may jump over it.
//
// A Watermark is not safe for concurrent use; the Kafka producer's poll loop
// and pump share it under their own lock.
type Watermark struct {
	// base is the commit position when nothing fetched is unresolved: the
	// initial committed offset, then last fetched+1 once everything up to it
	// resolved. Invariant: base <= every offset in fetched.
	base int64
	// fetched are the fetched, not yet popped offsets, strictly increasing;
	// resolved[k] says whether fetched[k] resolved. The head is kept
	// unresolved: resolved heads are popped at once (advancing base).
	fetched  []int64
	resolved []bool
	last     int64 // last fetched offset, -1 before the first
}

// NewWatermark returns a Watermark starting at committed, the partition's
// committed offset (the next offset to consume; 0 for an empty partition).
func NewWatermark(committed int64) *Watermark {
	return &Watermark{base: committed, last: committed - 1}
}

// Fetched records that the record at offset was fanned out. Offsets must be
// increasing; an offset not above the last fetched one (or below the current
// commit position) is ignored: after a seek back, call Reset first.
func (w *Watermark) Fetched(offset int64) {
	if offset <= w.last || offset < w.base {
		return
	}
	w.last = offset
	w.fetched = append(w.fetched, offset)
	w.resolved = append(w.resolved, false)
}

// Resolved records that the record at offset resolved (advanced). Unknown or
// already resolved offsets are ignored.
func (w *Watermark) Resolved(offset int64) {
	k := sort.Search(len(w.fetched), func(i int) bool { return w.fetched[i] >= offset })
	if k == len(w.fetched) || w.fetched[k] != offset {
		return
	}
	w.resolved[k] = true
	n := 0
	for n < len(w.fetched) && w.resolved[n] {
		n++
	}
	if n == 0 {
		return
	}
	w.base = w.fetched[n-1] + 1
	// Reslicing from the front is amortized O(1): append reallocates only
	// the live tail once the capacity is used up.
	w.fetched, w.resolved = w.fetched[n:], w.resolved[n:]
}

// Next returns the offset to commit: the lowest unresolved fetched offset
// (every record below it resolved or known absent), or last fetched+1 when
// every fetched record resolved (the committed offset before any fetch).
func (w *Watermark) Next() int64 {
	if len(w.fetched) > 0 {
		return w.fetched[0]
	}
	return w.base
}

// Reset forgets every tracked offset and restarts at next (after a seek back
// to next, or a new assignment committed at next).
func (w *Watermark) Reset(next int64) {
	w.base, w.last = next, next-1
	w.fetched, w.resolved = w.fetched[:0], w.resolved[:0]
}

// Pending returns how many fetched records are unresolved or wait behind one.
func (w *Watermark) Pending() int { return len(w.fetched) }
