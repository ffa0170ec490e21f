package changelog

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// HeaderStamp is the key of the one header a table's commit cycle puts on
// every changelog record it writes: the record's Stamp, binary encoded
// (Stamp.Append). It replaces the three decimal source headers
// (HeaderSourceTopic and its siblings, still read) and carries what those
// could not: the writer's epoch and the key's before-image.
const HeaderStamp = "runnel"

// stampVersion is the first byte of an encoded Stamp.
const stampVersion = 1

// Stamp is what a changelog record written by a commit cycle says about
// itself (docs/tables.md, "Commit cycles"):
//
//   - Epoch is the writer's epoch for the partition: one more than the highest
//     epoch the writer found in the changelog partition when it took the
//     partition over. A restore or standby ignores a record whose epoch is
//     below one it already applied to the partition, so a stale owner's late
//     write never wins over its successor's (a fencing token in the manner of
//     Kafka's leader epochs, KIP-101).
//   - Sources are the source partitions of the cycle, each with the last
//     source offset whose effect the cycle holds (the cycle's commit point
//     minus one). The record is committed when the group's committed offset of
//     every source is above that offset; until then a restore applies the
//     before-image instead of the value.
//   - Before is the key's value before the cycle (nil with HasBefore when the
//     key was absent): the committed value, since a task keeps at most one
//     uncommitted cycle. A restore that finds the record uncommitted puts the
//     key back to Before, which is right even when compaction already removed
//     the committed record the value replaced.
type Stamp struct {
	Epoch     int64
	Sources   []Source
	HasBefore bool
	Before    []byte // nil with HasBefore: the key was absent (a tombstone)
}

// Append appends the encoding of s to dst: version byte, uvarint epoch, flags
// (bit 0 has before, bit 1 before present), the before-image (uvarint length
// and bytes, when present), uvarint source count and per source the topic
// (uvarint length and bytes), varint partition and varint offset.
func (s *Stamp) Append(dst []byte) []byte {
	dst = append(dst, stampVersion)
	dst = binary.AppendUvarint(dst, uint64(s.Epoch))
	var flags byte
	if s.HasBefore {
		flags |= 1
		if s.Before != nil {
			flags |= 2
		}
	}
	dst = append(dst, flags)
	if flags&2 != 0 {
		dst = binary.AppendUvarint(dst, uint64(len(s.Before)))
		dst = append(dst, s.Before...)
	}
	dst = binary.AppendUvarint(dst, uint64(len(s.Sources)))
	for _, src := range s.Sources {
		dst = binary.AppendUvarint(dst, uint64(len(src.Topic)))
		dst = append(dst, src.Topic...)
		dst = binary.AppendVarint(dst, int64(src.Partition))
		dst = binary.AppendVarint(dst, src.Offset)
	}
	return dst
}

var errStamp = errors.New("malformed changelog stamp")

// ParseStamp decodes a stamp made by Append. Errors: a wrapped errStamp for
// bytes that are not one (unknown version, truncated, trailing bytes).
func ParseStamp(b []byte) (Stamp, error) {
	var s Stamp
	if len(b) == 0 || b[0] != stampVersion {
		return s, fmt.Errorf("%w: version", errStamp)
	}
	b = b[1:]
	uv := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	sv := func() (int64, bool) {
		v, n := binary.Varint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	bytesOf := func() ([]byte, bool) {
		n, ok := uv()
		if !ok || n > uint64(len(b)) {
			return nil, false
		}
		v := b[:n:n]
		b = b[n:]
		return v, true
	}
	epoch, ok := uv()
	if !ok || len(b) == 0 {
		return s, fmt.Errorf("%w: epoch", errStamp)
	}
	s.Epoch = int64(epoch)
	flags := b[0]
	b = b[1:]
	s.HasBefore = flags&1 != 0
	if flags&2 != 0 {
		v, ok := bytesOf()
		if !ok {
			return s, fmt.Errorf("%w: before-image", errStamp)
		}
		s.Before = append([]byte{}, v...)
	}
	n, ok := uv()
	if !ok || n > uint64(len(b)) {
		return s, fmt.Errorf("%w: sources", errStamp)
	}
	for range n {
		t, ok1 := bytesOf()
		p, ok2 := sv()
		o, ok3 := sv()
		if !ok1 || !ok2 || !ok3 {
			return s, fmt.Errorf("%w: source", errStamp)
		}
		s.Sources = append(s.Sources, Source{Topic: string(t), Partition: int32(p), Offset: o})
	}
	if len(b) != 0 {
		return s, fmt.Errorf("%w: %d trailing bytes", errStamp, len(b))
	}
	return s, nil
}

// StampOf returns the stamp of a changelog record: its HeaderStamp header,
// or for a record written before stamps existed one built from the three
// source headers (epoch 0, no before-image). ok is false when the record
// carries neither (it is then always applied).
func StampOf(hs []*sarama.RecordHeader) (s Stamp, ok bool) {
	for _, h := range hs {
		if h != nil && string(h.Key) == HeaderStamp {
			st, err := ParseStamp(h.Value)
			if err != nil {
				return Stamp{}, false
			}
			return st, true
		}
	}
	if src, ok := SourceOf(hs); ok {
		return Stamp{Sources: []Source{src}}, true
	}
	return Stamp{}, false
}

// committed reports whether every source of s is committed under f (its
// offset below the committed offset of its source partition; untracked
// sources count as committed).
func (s *Stamp) committed(f CommittedFunc) bool {
	if f == nil {
		return true
	}
	for _, src := range s.Sources {
		if c, tracked := f(src.Topic, src.Partition); tracked && src.Offset >= c {
			return false
		}
	}
	return true
}

// EpochMark is the name of the store mark that keeps the highest writer epoch
// applied to a partition (Stamp.Epoch). It has no '/', so ParseMarkKey never
// takes it for a source mark.
const EpochMark = "epoch"
