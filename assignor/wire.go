package assignor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Wire format (docs/assignment.md §Wire format). Both payloads start with a
// version byte; version 1 is the only one defined. A decoder reads the fields
// of the versions it knows and ignores the bytes after them when the version is
// newer than its own (later versions only append fields). A payload of a known
// version with trailing bytes, a truncated payload, or version 0 is rejected.
//
//	string   = uvarint length, bytes
//	parts    = uvarint count, then partitions ascending as uvarint deltas
//	           (first partition, then each minus the previous minus 1)
//	topicmap = uvarint count, then (string topic, parts) sorted by topic
//
// Subscription v1 (member -> leader, in JoinGroup user data):
//
//	version, uvarint instance, string process, string url, varint generation,
//	topicmap prevActives, topicmap prevStandbys,
//	uvarint topics, then (string topic, uvarint count, then (uvarint partition, varint offset)...)
//
// Assignment v1 (leader -> member, in SyncGroup user data):
//
//	version, varint generation, string memberID, string leaderID, uvarint flags (bit 0: probe),
//	topicmap actives, standbys, warmups, globals,
//	uvarint urlCount, string url..., uvarint topics,
//	then (string topic, uvarint partitions, then per partition uvarint (url index + 1, 0 none))
//
// Assignment v2 appends: topicmap pending (actives withheld until the owner
// revoked them, cooperative protocol).
const (
	subscriptionVersion = 1
	assignmentVersion   = 2
)

// ErrMalformed is wrapped by every decoding error of the Runnel user data.
var ErrMalformed = errors.New("malformed runnel assignor user data")

// subscription is the member -> leader user data.
type subscription struct {
	Instance                  uint64 // random per Strategy: lets the leader find itself
	ProcessID, URL            string
	Generation                int32
	PrevActives, PrevStandbys map[string][]int32
	Offsets                   map[string]map[int32]int64
}

// assignmentData is the leader -> member user data.
type assignmentData struct {
	Generation                          int32
	MemberID, LeaderID                  string
	Probe                               bool
	Actives, Standbys, Warmups, Globals map[string][]int32
	URLs                                map[string]map[int32]string
	Pending                             map[string][]int32 // v2
}

type encoder struct{ b []byte }

func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) varint(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) str(s string)     { e.uvarint(uint64(len(s))); e.b = append(e.b, s...) }

func (e *encoder) topicMap(m map[string][]int32) {
	topics := sortedKeys(m)
	topics = slices.DeleteFunc(topics, func(t string) bool { return len(m[t]) == 0 })
	e.uvarint(uint64(len(topics)))
	for _, t := range topics {
		ps := slices.Clone(m[t])
		ps = slices.DeleteFunc(ps, func(p int32) bool { return p < 0 })
		slices.Sort(ps)
		ps = slices.Compact(ps)
		e.str(t)
		e.uvarint(uint64(len(ps)))
		prev := int64(-1)
		for _, p := range ps {
			e.uvarint(uint64(int64(p) - prev - 1))
			prev = int64(p)
		}
	}
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, what)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint " + what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads an element count and checks it against the bytes left (every
// element takes at least one byte), so garbage cannot make us allocate.
func (d *decoder) count(what string) int {
	n := d.uvarint(what)
	if n > uint64(len(d.b)) {
		d.fail(fmt.Sprintf("%s count %d exceeds the %d bytes left", what, n, len(d.b)))
		return 0
	}
	return int(n)
}

func (d *decoder) str(what string) string {
	n := d.uvarint(what + " length")
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail(fmt.Sprintf("%s length %d exceeds the %d bytes left", what, n, len(d.b)))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) int32v(what string) int32 {
	v := d.varint(what)
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.fail(what + " out of int32 range")
		return 0
	}
	return int32(v)
}

func (d *decoder) topicMap(what string) map[string][]int32 {
	n := d.count(what)
	m := make(map[string][]int32, n)
	for range n {
		t := d.str(what + " topic")
		k := d.count(what + " partitions")
		if d.err != nil {
			return nil
		}
		if _, dup := m[t]; dup {
			d.fail(what + " duplicate topic " + t)
			return nil
		}
		ps := make([]int32, 0, k)
		prev := int64(-1)
		for range k {
			p := prev + 1 + int64(d.uvarint(what+" partition"))
			if d.err != nil {
				return nil
			}
			if p > math.MaxInt32 || p < 0 {
				d.fail(what + " partition out of range")
				return nil
			}
			ps = append(ps, int32(p))
			prev = p
		}
		m[t] = ps
	}
	return m
}

// version reads the version byte; ok is false for an empty payload.
func (d *decoder) version() byte {
	if len(d.b) == 0 {
		d.fail("empty")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	if v == 0 {
		d.fail("version 0")
	}
	return v
}

// end rejects trailing bytes after a payload of version known, the newest
// version this decoder reads.
func (d *decoder) end(v, known byte) {
	if d.err == nil && v == known && len(d.b) != 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
}

func encodeSubscription(s subscription) []byte {
	e := &encoder{b: []byte{subscriptionVersion}}
	e.uvarint(s.Instance)
	e.str(s.ProcessID)
	e.str(s.URL)
	e.varint(int64(s.Generation))
	e.topicMap(s.PrevActives)
	e.topicMap(s.PrevStandbys)
	topics := sortedKeys(s.Offsets)
	e.uvarint(uint64(len(topics)))
	for _, t := range topics {
		ps := make([]int32, 0, len(s.Offsets[t]))
		for p := range s.Offsets[t] {
			ps = append(ps, p)
		}
		slices.Sort(ps)
		e.str(t)
		e.uvarint(uint64(len(ps)))
		for _, p := range ps {
			e.uvarint(uint64(uint32(p)))
			e.varint(s.Offsets[t][p])
		}
	}
	return e.b
}

func decodeSubscription(b []byte) (subscription, error) {
	d := &decoder{b: b}
	v := d.version()
	var s subscription
	s.Instance = d.uvarint("instance")
	s.ProcessID = d.str("process")
	s.URL = d.str("url")
	s.Generation = d.int32v("generation")
	s.PrevActives = d.topicMap("prev actives")
	s.PrevStandbys = d.topicMap("prev standbys")
	n := d.count("offset topics")
	s.Offsets = make(map[string]map[int32]int64, n)
	for range n {
		t := d.str("offset topic")
		k := d.count("offset partitions")
		if d.err != nil {
			break
		}
		m := make(map[int32]int64, k)
		for range k {
			p := d.uvarint("offset partition")
			o := d.varint("offset")
			if p > math.MaxInt32 {
				d.fail("offset partition out of range")
			}
			if d.err != nil {
				break
			}
			m[int32(p)] = o
		}
		s.Offsets[t] = m
	}
	d.end(v, subscriptionVersion)
	if d.err != nil {
		return subscription{}, fmt.Errorf("decode subscription: %w", d.err)
	}
	return s, nil
}

func encodeAssignment(a assignmentData) []byte {
	e := &encoder{b: []byte{assignmentVersion}}
	e.varint(int64(a.Generation))
	e.str(a.MemberID)
	e.str(a.LeaderID)
	var flags uint64
	if a.Probe {
		flags |= 1
	}
	e.uvarint(flags)
	e.topicMap(a.Actives)
	e.topicMap(a.Standbys)
	e.topicMap(a.Warmups)
	e.topicMap(a.Globals)
	idx := map[string]int{}
	var urls []string
	topics := sortedKeys(a.URLs)
	for _, t := range topics {
		for _, u := range a.URLs[t] {
			if _, ok := idx[u]; !ok {
				idx[u] = 0
				urls = append(urls, u)
			}
		}
	}
	slices.Sort(urls)
	for i, u := range urls {
		idx[u] = i
	}
	e.uvarint(uint64(len(urls)))
	for _, u := range urls {
		e.str(u)
	}
	e.uvarint(uint64(len(topics)))
	for _, t := range topics {
		var n int32
		for p := range a.URLs[t] {
			n = max(n, p+1)
		}
		e.str(t)
		e.uvarint(uint64(n))
		for p := range n {
			if u, ok := a.URLs[t][p]; ok {
				e.uvarint(uint64(idx[u] + 1))
			} else {
				e.uvarint(0)
			}
		}
	}
	e.topicMap(a.Pending)
	return e.b
}

func decodeAssignment(b []byte) (assignmentData, error) {
	d := &decoder{b: b}
	v := d.version()
	var a assignmentData
	a.Generation = d.int32v("generation")
	a.MemberID = d.str("member")
	a.LeaderID = d.str("leader")
	a.Probe = d.uvarint("flags")&1 != 0
	a.Actives = d.topicMap("actives")
	a.Standbys = d.topicMap("standbys")
	a.Warmups = d.topicMap("warmups")
	a.Globals = d.topicMap("globals")
	nu := d.count("urls")
	urls := make([]string, 0, nu)
	for range nu {
		urls = append(urls, d.str("url"))
	}
	nt := d.count("url topics")
	a.URLs = make(map[string]map[int32]string, nt)
	for range nt {
		t := d.str("url topic")
		k := d.count("url partitions")
		if d.err != nil {
			break
		}
		m := make(map[int32]string, k)
		for p := range k {
			i := d.uvarint("url index")
			if i > uint64(len(urls)) {
				d.fail(fmt.Sprintf("url index %d of %d", i, len(urls)))
			}
			if d.err != nil {
				break
			}
			if i > 0 {
				m[int32(p)] = urls[i-1]
			}
		}
		a.URLs[t] = m
	}
	if v >= 2 {
		a.Pending = d.topicMap("pending")
	}
	d.end(v, assignmentVersion)
	if d.err != nil {
		return assignmentData{}, fmt.Errorf("decode assignment: %w", d.err)
	}
	return a, nil
}
