package table

import (
	"encoding/binary"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"math"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/runnel-dev/runnel/internal/kafka"
)

// Stored layout of a windowed table (see Windowed):
//
//	window row: 0x00 | encoded key | be64(start ms ^ 1<<63)  ->  be64(stream time ms) | encoded value
//	watermark:  0x01 | be32(partition)                       ->  be64(closed-up-to ms)
const (
	tagWindow byte = 0x00
	tagMeta   byte = 0x01
)

const signBit = uint64(1) << 63

func windowKey(kb []byte, start int64) []byte {
	b := make([]byte, 0, 1+len(kb)+8)
	b = append(b, tagWindow)
	b = append(b, kb...)
	return binary.BigEndian.AppendUint64(b, uint64(start)^signBit)
}

func decodeWindowKey(b []byte) (kb []byte, start int64, ok bool) {
	if len(b) < 9 || b[0] != tagWindow {
		return nil, 0, false
	}
	return b[1 : len(b)-8], int64(binary.BigEndian.Uint64(b[len(b)-8:]) ^ signBit), true
}

func metaKey(p int32) []byte {
	return binary.BigEndian.AppendUint32([]byte{tagMeta}, uint32(p))
}

func decodeMetaKey(b []byte) (int32, bool) {
	if len(b) != 5 || b[0] != tagMeta {
		return 0, false
	}
	return int32(binary.BigEndian.Uint32(b[1:])), true
}

func encodeMeta(closedUpTo int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(closedUpTo))
}

func decodeMeta(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("watermark of %d bytes, want 8", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

func encodeRow(stamp int64, vb []byte) []byte {
	b := make([]byte, 8, 8+len(vb))
	binary.BigEndian.PutUint64(b, uint64(stamp))
	return append(b, vb...)
}

func decodeRow(b []byte) (stamp int64, vb []byte, err error) {
	if len(b) < 8 {
		return 0, nil, fmt.Errorf("window row of %d bytes, want >= 8", len(b))
	}
	return int64(binary.BigEndian.Uint64(b[:8])), b[8:], nil
}

// none marks an unknown stream time or watermark.
const none = math.MinInt64

// startIndex holds windows (encoded key per start) ordered by start.
type startIndex struct {
	keys   map[int64]map[string]struct{}
	starts []int64 // ascending, the keys of keys
}

func (x *startIndex) add(start int64, k string) {
	if x.keys == nil {
		x.keys = map[int64]map[string]struct{}{}
	}
	m := x.keys[start]
	if m == nil {
		m = map[string]struct{}{}
		x.keys[start] = m
		i, _ := slices.BinarySearch(x.starts, start)
		x.starts = slices.Insert(x.starts, i, start)
	}
	m[k] = struct{}{}
}

type indexed struct {
	start int64
	keys  []string
}

// popThrough removes and returns the windows with start <= limit, ascending
// by start and key.
func (x *startIndex) popThrough(limit int64) []indexed {
	n := 0
	for n < len(x.starts) && x.starts[n] <= limit {
		n++
	}
	out := make([]indexed, 0, n)
	for _, s := range x.starts[:n] {
		ks := make([]string, 0, len(x.keys[s]))
		for k := range x.keys[s] {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		out = append(out, indexed{s, ks})
		delete(x.keys, s)
	}
	x.starts = slices.Delete(x.starts, 0, n)
	return out
}

// windowPart is a windowed table's runtime of one active partition on one
// worker.
//
// Invariants (kept by update and rebuild, under mu): every window row of the
// partition (store plus the worker's unacknowledged writes) is in exactly one
// of open (end + grace > closedUpTo) or retained (closed, start + retention >
// streamTime); closedUpTo <= streamTime; every window with end + grace <= the
// persisted watermark has been closed (OnClose ran) before.
type windowPart struct {
	dirty atomic.Bool // an update failed midway: rebuild from the store before the next use

	mu         sync.Mutex
	st         int64      // stream time, ms; none before the first write; guarded by mu
	closedUpTo int64      // in-memory watermark, ms; guarded by mu
	open       startIndex // windows not closed yet; guarded by mu
	retained   startIndex // closed windows kept for retention; guarded by mu
}

func (wp *windowPart) streamTime() (int64, bool) {
	wp.mu.Lock()
	defer wp.mu.Unlock()
	return wp.st, wp.st != none
}

// closedWindow is a window closed by an update, for OnClose.
type closedWindow struct {
	key   []byte
	start int64
	value []byte
}

// activatePartition rebuilds partition p's
// stream time and expiry index from the store (Faust never did, rh#44 and
// fs#385: recovered windows never expired).
func (t *Windowed[K, V]) activatePartition(st *tablestate.State, p int32) error {
	if t.err != nil {
		return t.err
	}
	wp := &windowPart{}
	if err := wp.rebuild(t.spec(), st, p); err != nil {
		return err
	}
	t.mu.Lock()
	t.parts[partKey{st, p}] = wp
	t.mu.Unlock()
	return nil
}

// deactivatePartition drops partition p's stream time and expiry index.
func (t *Windowed[K, V]) deactivatePartition(st *tablestate.State, p int32) {
	t.mu.Lock()
	delete(t.parts, partKey{st, p})
	t.mu.Unlock()
}

func (t *Windowed[K, V]) part(s *tablestate.State, p int32) (*windowPart, error) {
	t.mu.Lock()
	wp := t.parts[partKey{s, p}]
	t.mu.Unlock()
	if wp == nil {
		return nil, fmt.Errorf("table %s[%d]: %w", t.name, p, ErrNotActive)
	}
	return wp, nil
}

// rebuild reads partition p (store, then the worker's unacknowledged writes
// over it) into wp; mu must be held or wp unpublished.
func (wp *windowPart) rebuild(w windowParams, s *tablestate.State, p int32) error {
	rows := map[string][]byte{}
	if err := s.Store().Iterate(p, func(k, v []byte) error {
		rows[string(k)] = v
		return nil
	}); err != nil {
		return fmt.Errorf("table %s[%d]: rebuild window index: %w", w.name, p, err)
	}
	s.EachUnapplied(p, func(k string, value []byte, deleted bool) {
		if deleted {
			delete(rows, k)
		} else {
			rows[k] = value
		}
	})
	wp.st, wp.closedUpTo = none, none
	wp.open, wp.retained = startIndex{}, startIndex{}
	if b, ok := rows[string(metaKey(p))]; ok {
		c, err := decodeMeta(b)
		if err != nil {
			return fmt.Errorf("table %s[%d]: %w", w.name, p, err)
		}
		wp.closedUpTo, wp.st = c, c
	}
	size, grace := w.size, w.grace
	for k, v := range rows {
		kb, start, ok := decodeWindowKey([]byte(k))
		if !ok {
			continue
		}
		stamp, _, err := decodeRow(v)
		if err != nil {
			return fmt.Errorf("table %s[%d]: key %q: %w", w.name, p, k, err)
		}
		wp.st = max(wp.st, stamp)
		if wp.closedUpTo != none && start+size+grace <= wp.closedUpTo {
			wp.retained.add(start, string(kb))
		} else {
			wp.open.add(start, string(kb))
		}
	}
	wp.dirty.Store(false)
	return nil
}

// windowParams are the numbers the runtime works with, ms.
type windowParams struct {
	name                   string
	ws                     Windows
	size, grace, retention int64
	late, expiredCount     *atomic.Int64
}

func (t *Windowed[K, V]) spec() windowParams {
	return windowParams{name: t.name, ws: t.ws, size: t.ws.size.Milliseconds(), grace: t.grace, retention: t.retention,
		late: &t.late, expiredCount: &t.expired}
}

// update runs one windowed write of event time at (ms) for encoded key kb: it
// advances stream time, applies fn to every window containing at that is not
// closed, then closes and deletes what stream time passed. It returns the
// windows updated and the windows closed (OnClose runs outside the lock).
func (wp *windowPart) update(w windowParams, s *tablestate.State, ev Event, kb []byte, at int64,
	fn func(old []byte, found bool) ([]byte, error)) (_ int, _ []closedWindow, err error) {
	p := ev.Partition()
	// The watermark and tombstones are routed by kb too: check it here even
	// when every window turns out late and nothing else is written.
	if q := kafka.PartitionFor(kb, s.Partitions()); q != p {
		return 0, nil, fmt.Errorf("table %s: write of key %q from partition %d: the key belongs to partition %d: %w", w.name, kb, p, q, ErrNotCoPartitioned)
	}
	wp.mu.Lock()
	defer wp.mu.Unlock()
	defer func() {
		if err != nil {
			// The index may hold windows whose writes never happened, or
			// have lost windows popped before the error: rebuild it.
			wp.dirty.Store(true)
		}
	}()
	if wp.dirty.Load() {
		if err := wp.rebuild(w, s, p); err != nil {
			return 0, nil, err
		}
	}
	// Writes go to the partition's commit cycle; a cycle that fails drops
	// the caches and the task rebuilds this index from the store
	// (activatePartition), so no write needs watching here.
	wev := ev
	wp.st = max(wp.st, at)
	n := 0
	for _, start := range w.ws.startsContaining(at) {
		if start+w.size+w.grace <= wp.st {
			w.late.Add(1) // closed: the record is late for this window
			continue
		}
		key := windowKey(kb, start)
		old, found, err := s.Get(p, key)
		var vb []byte
		if err == nil && found {
			_, vb, err = decodeRow(old)
		}
		if err != nil {
			return n, nil, fmt.Errorf("table %s[%d]: read window: %w", w.name, p, err)
		}
		nb, ferr := fn(vb, found)
		if ferr != nil {
			return n, nil, ferr
		}
		if err := s.WriteRouted(wev, kb, key, encodeRow(wp.st, nb), false); err != nil {
			return n, nil, err
		}
		wp.open.add(start, string(kb))
		n++
	}
	closes, err := wp.expire(w, s, wev, p, kb)
	if err != nil {
		return n, nil, err
	}
	return n, closes, nil
}

// expire closes the open windows with end + grace <= stream time (reading
// their final values) and deletes the windows with start + retention <=
// stream time; if it did either, it writes the watermark (stream time) bound
// to the event. route is a key of partition p (the co-partitioning check of
// the watermark write).
func (wp *windowPart) expire(w windowParams, s *tablestate.State, wev Event, p int32, route []byte) ([]closedWindow, error) {
	if wp.st == none || wp.st <= wp.closedUpTo {
		return nil, nil
	}
	var closes []closedWindow
	wrote := false
	for _, x := range wp.open.popThrough(wp.st - w.size - w.grace) {
		for _, k := range x.keys {
			b, ok, err := s.Get(p, windowKey([]byte(k), x.start))
			if err != nil {
				return closes, fmt.Errorf("table %s[%d]: read closing window: %w", w.name, p, err)
			}
			if ok {
				_, vb, err := decodeRow(b)
				if err != nil {
					return closes, fmt.Errorf("table %s[%d]: %w", w.name, p, err)
				}
				closes = append(closes, closedWindow{key: []byte(k), start: x.start, value: vb})
			}
			wp.retained.add(x.start, k)
			wrote = true
		}
	}
	for _, x := range wp.retained.popThrough(wp.st - w.retention) {
		for _, k := range x.keys {
			if err := s.WriteRouted(wev, []byte(k), windowKey([]byte(k), x.start), nil, true); err != nil {
				return closes, err
			}
			w.expiredCount.Add(1)
			wrote = true
		}
	}
	wp.closedUpTo = wp.st
	if wrote {
		if err := s.WriteRouted(wev, route, metaKey(p), encodeMeta(wp.st), false); err != nil {
			return closes, err
		}
	}
	return closes, nil
}
