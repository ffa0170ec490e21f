// Package dedup recognises the records of a repartition topic that an
// upstream agent sent again after its source partition was processed a
// second time (a kill -9, an abandoned task, a failed commit: at-least-once
// reprocesses what was processed since the last commit), so that the
// repartition topic's reader applies each of them once.
//
// The sender stamps each record it derives into a repartition topic
// (Stamp: the source record's topic, partition and offset, the agent, the
// record's index among the sends of its event, and the run that sent it: a
// random ID, the offset the run started reading at, and the record's
// sequence number among the run's sends to that repartition partition). The
// reader keeps, per source partition and agent, a Filter entry: a mark, the
// highest (offset, index) it knows every earlier record of was delivered, and
// whether the run it is reading now arrived without a gap. A record at or
// below the mark, from a run that started at or after the mark's run, is one
// the mark's run already delivered: Offer says to skip it.
//
// Why skipping loses nothing. A run reads its source partition in offset
// order from its start offset and sends in that order (the sender numbers a
// run's sends to a partition under one lock, with the Produce call), so a
// run's records reach a repartition partition in (offset, index) order,
// with consecutive sequence numbers unless some failed. The mark only moves
// to a record whose run arrived with no sequence number missing (a failed
// send, then a later one of the same run that succeeded, leaves a gap: the
// mark stays where it was), so every record of the mark's run up to the mark
// is in the partition, before the mark. A run that goes on past a record it
// did not finish (its agent failed on the record and was run again on the
// same subscription, the record was dead-lettered, or the broker refused one
// of its derived records so that the event's later sends were refused before
// being numbered) must not cover that record either: the sender skips a
// sequence number at its next send to each destination after the failure,
// and a send the producer refused uses its number too, so the gap stops the
// mark there as well. A later run starts at an offset the
// group committed, at or after the mark's run's start (committed offsets
// only move forward), so each record it sends at or below the mark is one
// the mark's run processed too and delivered. For an agent whose sends
// depend only on its input that is the same record; for another, the
// reader keeps the first run's version of that record and drops the
// second's (each run's version of a source record is complete where its
// run's mark covers it; where it does not, the later run's records are kept,
// so a record may be counted in two versions, never in none).
//
// A run that starts below the mark's run's start (offsets reset by hand, a
// source topic deleted and created again) is not compared with the mark: its
// records are kept and it sets the mark when it arrives without a gap.
//
// The reader's state moves with its committed offset: Encode at a commit
// point is the commit metadata, Decode at the claim's start restores it, and
// Rewind puts it back to an earlier point when the reader reads again from
// there. A state from before the point it is used at (Rewind and Encode
// fall back to the last sealed batch boundary at or below the point) is
// safe: its marks are lower and its runs' gaps look larger, so it skips
// less, never more.
package dedup

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Header is the name of the record header a Stamp travels in. A record with
// several carries the stamp of the last one (an agent forwarding its
// input's headers adds its own after them).
const Header = "runnel-src"

// Stamp is where a repartition record comes from.
type Stamp struct {
	Topic     string // the source record's topic
	Partition int32  // and partition
	Agent     string // the agent that sent the record
	Offset    int64  // the source record's offset
	Index     uint32 // the record's place among the stamped sends of its event, from 0
	Run       uint64 // the run that sent it: random, one per start of reading
	Base      int64  // the offset the run started reading the source partition at
	Seq       uint32 // the record's place among the run's sends to its repartition partition, from 0
}

const stampVersion = 1

// Append appends the stamp's encoding (a header value) to b.
func (s Stamp) Append(b []byte) []byte {
	b = append(b, stampVersion)
	b = binary.BigEndian.AppendUint64(b, s.Run)
	b = binary.AppendVarint(b, s.Base)
	b = binary.AppendUvarint(b, uint64(s.Seq))
	b = binary.AppendVarint(b, s.Offset)
	b = binary.AppendUvarint(b, uint64(s.Index))
	b = binary.AppendVarint(b, int64(s.Partition))
	b = binary.AppendUvarint(b, uint64(len(s.Topic)))
	b = append(b, s.Topic...)
	b = binary.AppendUvarint(b, uint64(len(s.Agent)))
	b = append(b, s.Agent...)
	return b
}

// errStamp is returned (wrapped) for a header value Append did not write.
var errStamp = errors.New("malformed stamp")

// Parse decodes what Append wrote. Errors: a value of another version or
// malformed (the record is then kept, as one without a stamp).
func Parse(b []byte) (Stamp, error) {
	return parse(b, func(b []byte) string { return string(b) })
}

// parse is Parse with the strings made by intern.
func parse(b []byte, intern func([]byte) string) (Stamp, error) {
	var s Stamp
	if len(b) < 9 || b[0] != stampVersion {
		return s, fmt.Errorf("%w: version or length", errStamp)
	}
	s.Run = binary.BigEndian.Uint64(b[1:9])
	r := reader{b: b[9:]}
	s.Base = r.varint()
	s.Seq = uint32(r.uvarint())
	s.Offset = r.varint()
	s.Index = uint32(r.uvarint())
	s.Partition = int32(r.varint())
	s.Topic = intern(r.bytes())
	s.Agent = intern(r.bytes())
	if r.bad || len(r.b) != 0 {
		return Stamp{}, errStamp
	}
	return s, nil
}

// reader reads varints and strings, remembering the first failure.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.bad, r.b = true, nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.bad, r.b = true, nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) str() string { return string(r.bytes()) }

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.bad || n > uint64(len(r.b)) {
		r.bad, r.b = true, nil
		return nil
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

// Key names a source partition and an agent reading it: the stamps of one
// key are compared with each other.
type Key struct {
	Topic     string
	Partition int32
	Agent     string
}

// Entry is a Filter's state of one key.
type Entry struct {
	// The mark: every record of the mark's run (MarkRun, which started at
	// MarkBase) up to (MarkOffset, MarkIndex) was delivered. HasMark is
	// false before the first one.
	HasMark    bool
	MarkRun    uint64
	MarkBase   int64
	MarkOffset int64
	MarkIndex  uint32
	// The run of the last record read: its ID, the sequence number
	// expected next, and whether every record of it up to there arrived
	// (from sequence number 0, none missing).
	Run   uint64
	Next  uint32
	Whole bool
}

// covers reports whether e's mark covers s: s's run started at or after the
// mark's run and s lies at or below the mark.
func (e *Entry) covers(s Stamp) bool {
	if !e.HasMark || s.Run == e.MarkRun || s.Base < e.MarkBase {
		return false
	}
	return s.Offset < e.MarkOffset || s.Offset == e.MarkOffset && s.Index <= e.MarkIndex
}

// slot is a key's current entry; dirty says it changed since the last Seal.
type slot struct {
	key   Key
	e     Entry
	dirty bool
}

// setCur makes m the current state (no change since the last Seal).
func (f *Filter) setCur(m map[Key]Entry) {
	f.cur = make(map[Key]*slot, len(m))
	for k, e := range m {
		f.cur[k] = &slot{key: k, e: e}
	}
	clear(f.dirty)
	f.dirty = f.dirty[:0]
}

// delta is the entries a sealed batch changed, and the offset after it.
type delta struct {
	end     int64
	changes map[Key]Entry
}

// Filter is the reader's state for one repartition partition. Offer is
// called for each stamped record in offset order and Seal after each batch;
// Commit, Rewind and Encode take offsets of that partition. It is not safe
// for concurrent use.
type Filter struct {
	names map[string]string // interned topic and agent names

	base   map[Key]Entry // the state at baseAt
	baseAt int64
	deltas []delta       // sealed batches after baseAt, in order
	cur    map[Key]*slot // the current state
	dirty  []*slot       // changed since the last Seal

	// Encode's last answer, for the same sealed state (gen counts the
	// changes of the sealed deltas).
	gen     uint64
	encKey  [3]int64
	encLast string
}

// NewFilter returns an empty filter whose state holds at offset at (the
// reader's start; -1: anywhere).
func NewFilter(at int64) *Filter {
	return &Filter{names: map[string]string{}, base: map[Key]Entry{}, baseAt: at, cur: map[Key]*slot{}}
}

// OfferHeader is Offer of a record whose dedup.Header value is h: ok is
// false (and the record is to be kept) when h is not a stamp Append wrote.
// The topic and agent names are interned: no allocation per record.
func (f *Filter) OfferHeader(h []byte) (skip, ok bool) {
	s, err := parse(h, f.intern)
	if err != nil {
		return false, false
	}
	return f.Offer(s), true
}

func (f *Filter) intern(b []byte) string {
	if s, ok := f.names[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(f.names) < 4096 {
		f.names[s] = s
	}
	return s
}

// Offer reads the next record, stamped s, and reports whether it is to be
// skipped (a run that started no later than s's delivered it before).
func (f *Filter) Offer(s Stamp) (skip bool) {
	k := Key{Topic: s.Topic, Partition: s.Partition, Agent: s.Agent}
	sl := f.cur[k]
	if sl == nil {
		sl = &slot{key: k}
		f.cur[k] = sl
	}
	e := sl.e
	whole := s.Seq == 0 // a run read from its first record on
	if e.Run != 0 && s.Run == e.Run {
		whole = e.Whole && s.Seq == e.Next // none of the run's records missing
	}
	e.Run, e.Next, e.Whole = s.Run, s.Seq+1, whole
	skip = e.covers(s)
	if !skip && whole {
		e.HasMark, e.MarkRun, e.MarkBase, e.MarkOffset, e.MarkIndex = true, s.Run, s.Base, s.Offset, s.Index
	}
	sl.e = e
	if !sl.dirty {
		sl.dirty = true
		f.dirty = append(f.dirty, sl)
	}
	return skip
}

// Seal ends a batch: end is the offset after its last record. The state at
// end can then be encoded, committed and rewound to.
func (f *Filter) Seal(end int64) {
	if len(f.dirty) == 0 {
		return
	}
	d := delta{end: end, changes: make(map[Key]Entry, len(f.dirty))}
	for _, sl := range f.dirty {
		d.changes[sl.key] = sl.e
		sl.dirty = false
	}
	clear(f.dirty)
	f.dirty = f.dirty[:0]
	f.gen++
	if n := len(f.deltas); n > 0 && f.deltas[n-1].end >= end {
		// Not after the last seal: fold into it (the state at the
		// earlier end is then lost; a lookup there falls back further).
		for k, e := range d.changes {
			f.deltas[n-1].changes[k] = e
		}
		return
	}
	f.deltas = append(f.deltas, d)
}

// sealedAt returns how many deltas end at or before at.
func (f *Filter) sealedAt(at int64) int {
	n := 0
	for n < len(f.deltas) && f.deltas[n].end <= at {
		n++
	}
	return n
}

// Commit forgets how the state was before at, a committed offset: the
// deltas up to at are folded into the base.
func (f *Filter) Commit(at int64) {
	n := f.sealedAt(at)
	for _, d := range f.deltas[:n] {
		for k, e := range d.changes {
			f.base[k] = e
		}
		f.baseAt = d.end
	}
	f.deltas = slices.Delete(f.deltas, 0, n)
}

// stateAt returns the state at the last seal at or before at (the base if
// there is none).
func (f *Filter) stateAt(at int64) map[Key]Entry {
	m := make(map[Key]Entry, len(f.base))
	if at < f.baseAt {
		return m // before what the filter knows: no marks (keeps everything)
	}
	for k, e := range f.base {
		m[k] = e
	}
	for _, d := range f.deltas[:f.sealedAt(at)] {
		for k, e := range d.changes {
			m[k] = e
		}
	}
	return m
}

// Rewind puts the state back to offset at (the reader reads again from
// there): to the last seal at or before it. Unsealed offers are dropped.
func (f *Filter) Rewind(at int64) {
	if at < f.baseAt {
		// Before what the filter knows: start again at at, with no marks.
		f.base, f.baseAt, f.deltas = map[Key]Entry{}, at, nil
		f.setCur(nil)
		f.gen++
		return
	}
	n := f.sealedAt(at)
	f.setCur(f.stateAt(at))
	f.deltas = f.deltas[:n]
	f.gen++
}

// Entries returns a copy of the current state (tests, status).
func (f *Filter) Entries() map[Key]Entry {
	m := make(map[Key]Entry, len(f.cur))
	for k, sl := range f.cur {
		m[k] = sl.e
	}
	return m
}

// Prefix starts what Encode writes.
const Prefix = "runnel-src:"

// Encode returns the state at offset at (the last seal at or before it) as
// commit metadata: Prefix and base64 (URL alphabet, no padding) of the
// entries, at most max bytes; entries past max are left out (their keys then
// start without a mark: their records are kept). "" when there is nothing.
func (f *Filter) Encode(at int64, max int) string {
	if at < f.baseAt {
		return "" // before what the filter knows: no marks
	}
	eff := f.baseAt
	if n := f.sealedAt(at); n > 0 {
		eff = f.deltas[n-1].end
	}
	key := [3]int64{int64(f.gen), eff, int64(max)}
	if f.gen > 0 && key == f.encKey {
		return f.encLast
	}
	out := f.encode(at, max)
	f.encKey, f.encLast = key, out
	return out
}

func (f *Filter) encode(at int64, max int) string {
	m := f.stateAt(at)
	if len(m) == 0 {
		return ""
	}
	keys := make([]Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		if c := strings.Compare(a.Agent, b.Agent); c != 0 {
			return c
		}
		return int(a.Partition) - int(b.Partition)
	})
	// Names once: (topic, agent) pairs, then entries naming theirs.
	type name struct{ topic, agent string }
	var names []name
	idx := map[name]int{}
	for _, k := range keys {
		nm := name{k.Topic, k.Agent}
		if _, ok := idx[nm]; !ok {
			idx[nm] = len(names)
			names = append(names, nm)
		}
	}
	limit := (max - len(Prefix)) * 3 / 4 // base64 grows 4/3
	var b []byte
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, nm := range names {
		b = binary.AppendUvarint(b, uint64(len(nm.topic)))
		b = append(b, nm.topic...)
		b = binary.AppendUvarint(b, uint64(len(nm.agent)))
		b = append(b, nm.agent...)
	}
	if len(b) > limit {
		return ""
	}
	var ent []byte
	for _, k := range keys {
		e := m[k]
		ent = ent[:0]
		ent = binary.AppendUvarint(ent, uint64(idx[name{k.Topic, k.Agent}]))
		ent = binary.AppendVarint(ent, int64(k.Partition))
		flags := byte(0)
		if e.HasMark {
			flags |= 1
		}
		if e.Whole {
			flags |= 2
		}
		sameRun := e.HasMark && e.MarkRun == e.Run
		if sameRun {
			flags |= 4 // the mark's run is the run read last: written once
		}
		ent = append(ent, flags)
		if e.HasMark {
			if !sameRun {
				ent = binary.BigEndian.AppendUint64(ent, e.MarkRun)
			}
			ent = binary.AppendVarint(ent, e.MarkBase)
			ent = binary.AppendVarint(ent, e.MarkOffset)
			ent = binary.AppendUvarint(ent, uint64(e.MarkIndex))
		}
		ent = binary.BigEndian.AppendUint64(ent, e.Run)
		ent = binary.AppendUvarint(ent, uint64(e.Next))
		if len(b)+len(ent) > limit {
			continue
		}
		b = append(b, ent...)
	}
	return Prefix + base64.RawURLEncoding.EncodeToString(b)
}

// Decode returns a filter holding at offset at the state Encode wrote in s;
// an empty one for "" or anything Encode did not write.
func Decode(s string, at int64) *Filter {
	f := NewFilter(at)
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return f
	}
	raw, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return f
	}
	r := reader{b: raw}
	type name struct{ topic, agent string }
	n := r.uvarint()
	if r.bad || n > uint64(len(raw)) {
		return f
	}
	names := make([]name, 0, n)
	for range n {
		t := r.str()
		a := r.str()
		names = append(names, name{t, a})
	}
	m := map[Key]Entry{}
	for len(r.b) > 0 && !r.bad {
		i := r.uvarint()
		p := r.varint()
		if r.bad || i >= uint64(len(names)) || len(r.b) < 1 {
			return f
		}
		flags := r.b[0]
		r.b = r.b[1:]
		var e Entry
		if flags&1 != 0 {
			e.HasMark = true
			if flags&4 == 0 {
				if len(r.b) < 8 {
					return f
				}
				e.MarkRun = binary.BigEndian.Uint64(r.b)
				r.b = r.b[8:]
			}
			e.MarkBase = r.varint()
			e.MarkOffset = r.varint()
			e.MarkIndex = uint32(r.uvarint())
		}
		if len(r.b) < 8 {
			return f
		}
		e.Run = binary.BigEndian.Uint64(r.b)
		r.b = r.b[8:]
		if flags&4 != 0 {
			e.MarkRun = e.Run
		}
		e.Next = uint32(r.uvarint())
		e.Whole = flags&2 != 0
		m[Key{Topic: names[i].topic, Partition: int32(p), Agent: names[i].agent}] = e
	}
	if r.bad {
		return f
	}
	for k, e := range m {
		f.base[k] = e
	}
	f.setCur(m)
	return f
}
