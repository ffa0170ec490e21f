package assignor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
)

// Wire format (docs/assignment.md §Wire format).
//
// Since subscription v2 and assignment v3 every payload is an envelope:
//
//	magic "\x00RNL" (4 bytes), version byte, body, CRC-32C (Castagnoli,
//	big endian) of everything before it
//
// The leading zero byte makes a decoder of the previous versions (which read
// the first byte as the version) reject the payload as version 0 instead of
// misreading it; the magic lets this decoder tell Runnel data from a foreign
// assignor's (ErrForeign); the checksum rejects corrupt data before any field
// is trusted. A decoder reads the fields of the versions it knows and ignores
// the bytes after them when the version is newer than its own (later versions
// only append fields); on its own version trailing bytes are an error.
//
// The previous versions (no envelope: version byte 1 or 2, then the body) are
// still decoded, so a rolling upgrade keeps the state of members that run the
// previous release; drop them once no such release runs.
//
//	string   = uvarint length, bytes
//	parts    = uvarint count, then partitions ascending as uvarint deltas
//	           (first partition, then each minus the previous minus 1)
//	topicmap = uvarint count, then (string topic, parts) sorted by topic
//
// Subscription v1 (legacy) and v2 body (member -> leader, JoinGroup user data):
//
//	uvarint instance, string process, string url, varint generation,
//	topicmap prevActives, topicmap prevStandbys,
//	uvarint topics, then (string topic, uvarint count, then (uvarint partition, varint offset)...)
//	v3 appends: uvarint count, then (varint generation, topicmap) sorted by
//	generation: the previous actives held continuously since an earlier
//	generation than the subscription's (the others since that generation)
//	v4 appends, in the same form: the earlier actives (a restarted
//	member's persisted actives it has not been given back) by the
//	generation it held them at, below the subscription's
//
// Assignment v1/v2 (legacy, leader -> member, SyncGroup user data):
//
//	varint generation, string memberID, string leaderID, uvarint flags (bit 0: probe),
//	topicmap actives, standbys, warmups, globals,
//	uvarint urlCount, string url..., uvarint topics,
//	then (string topic, uvarint partitions, then per partition uvarint (url index + 1, 0 none))
//	v2 appends: topicmap pending
//
// Assignment v3 body (the URL map no longer costs a byte per partition and
// topic, and may be left out: issue #13, 9.5 MB at P=4096 N=256 with v2):
//
//	varint generation, string memberID, string leaderID,
//	uvarint flags (bit 0: probe, bit 1: URL map left out, see URLsFromGroup),
//	topicmap actives, standbys, warmups, globals, pending,
//	uvarint urlCount, string url... (sorted), uvarint sets, then per set of
//	topics that share one partition -> URL map: uvarint topics, string
//	topic..., then per URL in table order: parts (the partitions it serves)
const (
	subscriptionVersion = 4
	assignmentVersion   = 3

	legacySubscriptionVersion = 1
	legacyAssignmentVersion   = 2
)

// magic opens every enveloped payload (subscription v2+, assignment v3+).
var magic = [4]byte{0, 'R', 'N', 'L'}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// ErrMalformed is wrapped by every decoding error of the Runnel user data.
var ErrMalformed = errors.New("malformed runnel assignor user data")

// ErrForeign is returned (wrapping ErrMalformed) for user data that is neither
// an enveloped Runnel payload nor one of the previous Runnel versions: most
// likely another assignor's, from a member of a different application in the
// same group.
var ErrForeign = fmt.Errorf("%w: not runnel user data (no magic)", ErrMalformed)

// ErrChecksum is returned (wrapping ErrMalformed) when an enveloped payload's
// CRC-32C does not match: the data was corrupted and none of it is used.
var ErrChecksum = fmt.Errorf("%w: checksum mismatch", ErrMalformed)

const (
	flagProbe       = 1 << 0
	flagURLsOmitted = 1 << 1
)

// subscription is the member -> leader user data.
type subscription struct {
	Instance                  uint64 // random per Strategy: lets the leader find itself
	ProcessID, URL            string
	Generation                int32
	PrevActives, PrevStandbys map[string][]int32
	Offsets                   map[string]map[int32]int64
	// Since (v3): topic -> partition -> the generation since which the
	// member has held that previous active without a break, for those held
	// since before Generation.
	Since map[string]map[int32]int32
	// Earlier (v4): topic -> partition -> the generation, below Generation,
	// at which the member last held that active before a restart and has
	// not held it since (Assignment.Earlier).
	Earlier map[string]map[int32]int32
}

// assignmentData is the leader -> member user data.
type assignmentData struct {
	Generation                          int32
	MemberID, LeaderID                  string
	Probe                               bool
	Actives, Standbys, Warmups, Globals map[string][]int32
	URLs                                map[string]map[int32]string
	Pending                             map[string][]int32 // v2
	// URLsOmitted (v3, flag bit 1): the leader left the URL map out because
	// the group's assignments would be too large (Config.MaxURLMapBytes);
	// members derive it from the group description (URLsFromGroup).
	URLsOmitted bool
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

// genMap decodes what encoder.genMap wrote; nil when empty.
func (d *decoder) genMap(what string) map[string]map[int32]int32 {
	var out map[string]map[int32]int32
	ng := d.count(what + " generations")
	for range ng {
		g := d.int32v(what + " generation")
		tm := d.topicMap(what)
		if d.err != nil {
			return nil
		}
		for t, ps := range tm {
			if out == nil {
				out = map[string]map[int32]int32{}
			}
			if out[t] == nil {
				out[t] = map[int32]int32{}
			}
			for _, p := range ps {
				out[t][p] = g
			}
		}
	}
	return out
}

// openEnvelope checks the envelope and returns the version and a decoder over the
// body. Without the magic it accepts the legacy version byte legacy (a
// payload of the previous release) or fails with ErrForeign.
func openEnvelope(b []byte, legacyMax byte, what string) (byte, *decoder, error) {
	if len(b) == 0 {
		return 0, nil, fmt.Errorf("decode %s: %w: empty", what, ErrMalformed)
	}
	if len(b) >= len(magic) && [4]byte(b[:4]) == magic {
		if len(b) < len(magic)+1+4 {
			return 0, nil, fmt.Errorf("decode %s: %w: %d bytes, shorter than the envelope", what, ErrMalformed, len(b))
		}
		body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
		if got := crc32.Checksum(body, crcTable); got != sum {
			return 0, nil, fmt.Errorf("decode %s: %w (crc32c %08x, trailer %08x)", what, ErrChecksum, got, sum)
		}
		v := body[len(magic)]
		if v <= legacyMax {
			return 0, nil, fmt.Errorf("decode %s: %w: enveloped version %d", what, ErrMalformed, v)
		}
		return v, &decoder{b: body[len(magic)+1:]}, nil
	}
	if v := b[0]; v >= 1 && v <= legacyMax {
		return v, &decoder{b: b[1:]}, nil
	}
	return 0, nil, fmt.Errorf("decode %s: %w", what, ErrForeign)
}

// seal wraps a body in the envelope: magic, version, body, CRC-32C.
func seal(version byte, body []byte) []byte {
	out := make([]byte, 0, len(magic)+1+len(body)+4)
	out = append(out, magic[:]...)
	out = append(out, version)
	out = append(out, body...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, crcTable))
}

// end rejects trailing bytes after a payload of version known, the newest
// version this decoder reads.
func (d *decoder) end(v, known byte) {
	if d.err == nil && v == known && len(d.b) != 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
}

func encodeSubscription(s subscription) []byte {
	e := encodeSubscriptionV2Body(s)
	e.genMap(s.Since, s.Generation)   // v3
	e.genMap(s.Earlier, s.Generation) // v4
	return seal(subscriptionVersion, e.b)
}

// genMap encodes topic -> partition -> generation grouped by generation
// (uvarint count, then varint generation and the topicmap of its
// partitions, ascending), leaving out generations at or above below.
func (e *encoder) genMap(m map[string]map[int32]int32, below int32) {
	byGen := map[int32]map[string][]int32{}
	for t, ps := range m {
		for p, g := range ps {
			if g >= below {
				continue
			}
			if byGen[g] == nil {
				byGen[g] = map[string][]int32{}
			}
			byGen[g][t] = append(byGen[g][t], p)
		}
	}
	gens := make([]int32, 0, len(byGen))
	for g := range byGen {
		gens = append(gens, g)
	}
	slices.Sort(gens)
	e.uvarint(uint64(len(gens)))
	for _, g := range gens {
		e.varint(int64(g))
		e.topicMap(byGen[g])
	}
}

// encodeSubscriptionV2Body encodes the fields of subscription v2.
func encodeSubscriptionV2Body(s subscription) *encoder {
	e := &encoder{}
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
	return e
}

// decodeSubscription decodes a member's JoinGroup user data: the enveloped
// versions (2+) and the legacy version 1. Errors wrap ErrMalformed (and
// ErrForeign or ErrChecksum when that is the reason).
func decodeSubscription(b []byte) (subscription, error) {
	v, d, err := openEnvelope(b, legacySubscriptionVersion, "subscription")
	if err != nil {
		return subscription{}, err
	}
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
	if v >= 3 {
		s.Since = d.genMap("since")
	}
	if v >= 4 {
		s.Earlier = d.genMap("earlier")
	}
	if v == legacySubscriptionVersion {
		d.end(v, legacySubscriptionVersion)
	} else {
		d.end(v, subscriptionVersion)
	}
	if d.err != nil {
		return subscription{}, fmt.Errorf("decode subscription v%d: %w", v, d.err)
	}
	return s, nil
}

// urlTable returns the sorted distinct non-empty URLs of a URL map.
func urlTable(urls map[string]map[int32]string) []string {
	var out []string
	for _, m := range urls {
		for _, u := range m {
			if u != "" {
				out = append(out, u)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// encodeURLs appends the v3 URL section: the URL table, then the topics
// grouped by identical partition -> URL maps (co-partitioned topics share
// one), each group as one partition list per URL.
func (e *encoder) urls(urls map[string]map[int32]string) {
	table := urlTable(urls)
	idx := make(map[string]int, len(table))
	for i, u := range table {
		idx[u] = i
	}
	e.uvarint(uint64(len(table)))
	for _, u := range table {
		e.str(u)
	}
	type set struct {
		topics []string
		byURL  [][]int32
	}
	var sets []*set
	byKey := map[string]*set{}
	for _, t := range sortedKeys(urls) {
		byURL := make([][]int32, len(table))
		ps := make([]int32, 0, len(urls[t]))
		for p, u := range urls[t] {
			if u != "" && p >= 0 {
				ps = append(ps, p)
			}
		}
		slices.Sort(ps)
		for _, p := range ps {
			i := idx[urls[t][p]]
			byURL[i] = append(byURL[i], p)
		}
		key := fmt.Sprint(byURL)
		if s := byKey[key]; s != nil {
			s.topics = append(s.topics, t)
			continue
		}
		s := &set{topics: []string{t}, byURL: byURL}
		byKey[key] = s
		sets = append(sets, s)
	}
	e.uvarint(uint64(len(sets)))
	for _, s := range sets {
		e.uvarint(uint64(len(s.topics)))
		for _, t := range s.topics {
			e.str(t)
		}
		for _, ps := range s.byURL {
			e.parts(ps)
		}
	}
}

func (e *encoder) parts(ps []int32) {
	e.uvarint(uint64(len(ps)))
	prev := int64(-1)
	for _, p := range ps {
		e.uvarint(uint64(int64(p) - prev - 1))
		prev = int64(p)
	}
}

func (d *decoder) parts(what string) []int32 {
	k := d.count(what)
	if d.err != nil {
		return nil
	}
	ps := make([]int32, 0, k)
	prev := int64(-1)
	for range k {
		p := prev + 1 + int64(d.uvarint(what))
		if d.err != nil {
			return nil
		}
		if p > math.MaxInt32 || p < 0 {
			d.fail(what + " out of range")
			return nil
		}
		ps = append(ps, int32(p))
		prev = p
	}
	return ps
}

func (d *decoder) urls() map[string]map[int32]string {
	nu := d.count("urls")
	table := make([]string, 0, nu)
	for range nu {
		table = append(table, d.str("url"))
	}
	ns := d.count("url sets")
	out := map[string]map[int32]string{}
	for range ns {
		nt := d.count("url set topics")
		var topics []string
		for range nt {
			t := d.str("url topic")
			if _, dup := out[t]; dup && d.err == nil {
				d.fail("url map: duplicate topic " + t)
			}
			out[t] = nil
			topics = append(topics, t)
		}
		m := map[int32]string{}
		for _, u := range table {
			for _, p := range d.parts("url partitions") {
				if _, dup := m[p]; dup && d.err == nil {
					d.fail(fmt.Sprintf("url map: partition %d has two URLs", p))
				}
				m[p] = u
			}
		}
		if d.err != nil {
			return nil
		}
		for _, t := range topics {
			out[t] = m
		}
	}
	if d.err != nil {
		return nil
	}
	// Each topic gets its own map (callers may modify one).
	for t, m := range out {
		if m == nil {
			out[t] = map[int32]string{}
			continue
		}
		cp := make(map[int32]string, len(m))
		for p, u := range m {
			cp[p] = u
		}
		out[t] = cp
	}
	return out
}

func encodeAssignment(a assignmentData) []byte {
	e := &encoder{}
	e.varint(int64(a.Generation))
	e.str(a.MemberID)
	e.str(a.LeaderID)
	var flags uint64
	if a.Probe {
		flags |= flagProbe
	}
	if a.URLsOmitted {
		flags |= flagURLsOmitted
	}
	e.uvarint(flags)
	e.topicMap(a.Actives)
	e.topicMap(a.Standbys)
	e.topicMap(a.Warmups)
	e.topicMap(a.Globals)
	e.topicMap(a.Pending)
	if a.URLsOmitted {
		e.urls(nil)
	} else {
		e.urls(a.URLs)
	}
	return seal(assignmentVersion, e.b)
}

// decodeAssignment decodes a member's SyncGroup user data: the enveloped
// versions (3+) and the legacy versions 1 and 2. Errors wrap ErrMalformed
// (and ErrForeign or ErrChecksum when that is the reason).
func decodeAssignment(b []byte) (assignmentData, error) {
	v, d, err := openEnvelope(b, legacyAssignmentVersion, "assignment")
	if err != nil {
		return assignmentData{}, err
	}
	var a assignmentData
	a.Generation = d.int32v("generation")
	a.MemberID = d.str("member")
	a.LeaderID = d.str("leader")
	flags := d.uvarint("flags")
	a.Probe = flags&flagProbe != 0
	a.Actives = d.topicMap("actives")
	a.Standbys = d.topicMap("standbys")
	a.Warmups = d.topicMap("warmups")
	a.Globals = d.topicMap("globals")
	if v > legacyAssignmentVersion {
		a.URLsOmitted = flags&flagURLsOmitted != 0
		a.Pending = d.topicMap("pending")
		a.URLs = d.urls()
		d.end(v, assignmentVersion)
	} else {
		a.URLs = d.legacyURLs()
		if v == 2 {
			a.Pending = d.topicMap("pending")
		}
		d.end(v, legacyAssignmentVersion)
	}
	if d.err != nil {
		return assignmentData{}, fmt.Errorf("decode assignment v%d: %w", v, d.err)
	}
	return a, nil
}

// legacyURLs reads the URL map of assignment versions 1 and 2: a URL table,
// then per topic one URL index (+1, 0 none) per partition.
func (d *decoder) legacyURLs() map[string]map[int32]string {
	nu := d.count("urls")
	urls := make([]string, 0, nu)
	for range nu {
		urls = append(urls, d.str("url"))
	}
	nt := d.count("url topics")
	out := make(map[string]map[int32]string, nt)
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
		out[t] = m
	}
	return out
}
