package replay

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/table"
)

// The version guard (docs/replay.md, issue #15): events of one entity may
// arrive out of order (two producers, a retry, a replay of history beside
// the live stream), and a table that keeps "the entity's current state" must
// never let an older event overwrite a newer one. Each write carries the
// entity's business version (a sequence number, an updated-at in
// nanoseconds, a database row version); the table keeps the version beside
// the value, in the store and in the changelog, so the guard holds across
// redelivery, restarts, restores and rebalances: whoever owns the partition
// reads the version with the value.

// Versioned is a table value with the business version that wrote it. A
// deletion keeps its version (Deleted, no Value): a versioned tombstone, so
// that an older update arriving after the delete does not bring the entity
// back. Versioned tombstones are ordinary changelog records, never removed by
// compaction.
type Versioned[V any] struct {
	Version int64
	Value   V
	Deleted bool
	// stored is true for a value read from the table (VersionedCodec's
	// Decode), false for the zero value Table.Update passes for a missing
	// key: version 0 of a stored value and no value at all differ.
	stored bool
}

// String formats a Versioned as "VALUE@vVERSION" ("deleted@vVERSION"): the
// text of `tables dump` and runneltest's Table.
func (v Versioned[V]) String() string {
	if v.Deleted {
		return fmt.Sprintf("deleted@v%d", v.Version)
	}
	return fmt.Sprintf("%v@v%d", v.Value, v.Version)
}

// versionedCodec encodes a Versioned as one flag byte (bit 0: deleted; the
// other bits zero, reserved), the version as 8 bytes big-endian two's
// complement, and the value in the inner codec (nothing for a deletion).
type versionedCodec[V any] struct{ inner codec.Codec[V] }

// VersionedCodec returns the codec of a versioned table's values, with vc
// for the value itself.
func VersionedCodec[V any](vc codec.Codec[V]) codec.Codec[Versioned[V]] {
	return versionedCodec[V]{inner: vc}
}

const versionedHeader = 9 // flag byte + version

func (c versionedCodec[V]) Encode(v Versioned[V]) ([]byte, error) {
	b := make([]byte, versionedHeader, versionedHeader+32)
	binary.BigEndian.PutUint64(b[1:], uint64(v.Version))
	if v.Deleted {
		b[0] = 1
		return b, nil
	}
	vb, err := c.inner.Encode(v.Value)
	if err != nil {
		return nil, err
	}
	return append(b, vb...), nil
}

func (c versionedCodec[V]) Decode(b []byte) (Versioned[V], error) {
	var v Versioned[V]
	if len(b) < versionedHeader {
		return v, fmt.Errorf("versioned value: %d bytes, want at least %d", len(b), versionedHeader)
	}
	if b[0]&^1 != 0 {
		return v, fmt.Errorf("versioned value: unknown flags %#x", b[0])
	}
	v.Version, v.Deleted, v.stored = int64(binary.BigEndian.Uint64(b[1:])), b[0] == 1, true
	if v.Deleted {
		if len(b) != versionedHeader {
			return v, errors.New("versioned value: a deletion with a value")
		}
		return v, nil
	}
	var err error
	if v.Value, err = c.inner.Decode(b[versionedHeader:]); err != nil {
		return v, fmt.Errorf("versioned value (v%d): %w", v.Version, err)
	}
	return v, nil
}

func (c versionedCodec[V]) Name() string { return "versioned(" + c.inner.Name() + ")" }

// NewVersionedTable declares a table of versioned values (table.New with
// VersionedCodec(vc)). Write it with SetVersion and DeleteVersion; a plain
// Put bypasses the guard.
func NewVersionedTable[K any, V any](h table.Host, name string, kc codec.Codec[K], vc codec.Codec[V], opts ...table.Option) *table.Table[K, Versioned[V]] {
	return table.New(h, name, kc, VersionedCodec(vc), opts...)
}

// SetVersion writes value under key at version, unless the table already
// holds key (a value or a deletion) at a version equal or newer; it reports
// whether it wrote. An equal version is refused: the redelivery of the event
// that wrote it changes nothing, and of two different events claiming one
// version the first processed wins. The write goes to the current commit
// cycle of ev's partition like table.Table.Put, and like it, a failure (the
// read's or the write's) fails the event (package table, "Writes fail the
// event"); use TrySetVersion to handle the error instead.
func SetVersion[K any, V any](ev table.Event, t *table.Table[K, Versioned[V]], key K, version int64, value V) bool {
	applied, err := TrySetVersion(ev, t, key, version, value)
	failOn(ev, err)
	return applied
}

// TrySetVersion is SetVersion returning the error instead of failing the
// event: the table's (codecs, ErrNotCoPartitioned, ErrNotActive,
// ErrOutsideWindow, ErrEventFailed).
func TrySetVersion[K any, V any](ev table.Event, t *table.Table[K, Versioned[V]], key K, version int64, value V) (bool, error) {
	return guarded(ev, t, key, Versioned[V]{Version: version, Value: value})
}

// DeleteVersion deletes key at version, leaving a versioned tombstone (see
// Versioned), unless the table holds key at an equal or newer version; it
// reports whether it wrote. A failure fails the event, as SetVersion's does.
func DeleteVersion[K any, V any](ev table.Event, t *table.Table[K, Versioned[V]], key K, version int64) bool {
	applied, err := TryDeleteVersion(ev, t, key, version)
	failOn(ev, err)
	return applied
}

// TryDeleteVersion is DeleteVersion returning the error instead of failing
// the event.
func TryDeleteVersion[K any, V any](ev table.Event, t *table.Table[K, Versioned[V]], key K, version int64) (bool, error) {
	return guarded(ev, t, key, Versioned[V]{Version: version, Deleted: true})
}

// failOn fails ev's run with err (nil: nothing), as table.Table.Put does.
func failOn(ev table.Event, err error) {
	if err != nil {
		evbind.Fail[*table.Env](ev, err)
	}
}

// GetVersion returns key's value and version; exists is false when the key
// was never written or its latest version is a deletion (whose version is
// then returned).
func GetVersion[K any, V any](ev table.Event, t *table.Table[K, Versioned[V]], key K) (value V, version int64, exists bool, err error) {
	v, ok, err := t.Get(ev, key)
	if err != nil || !ok {
		return value, 0, false, err
	}
	return v.Value, v.Version, !v.Deleted, nil
}

// guarded writes nv under key unless the stored version is equal or newer.
//
// The check is first made on a plain read: under the guard a key's version
// only grows, so a refusal seen there holds (no write, no changelog record).
// A write goes through Table.Update, whose read and write are one step for
// the partition, and checks again there: an agent on a co-partitioned topic
// may have written a newer version in between, and Update then writes the
// stored value back unchanged.
func guarded[K any, V any](ev table.Event, t *table.Table[K, Versioned[V]], key K, nv Versioned[V]) (bool, error) {
	old, ok, err := t.Get(ev, key)
	if err != nil {
		return false, err
	}
	if ok && old.Version >= nv.Version {
		return false, nil
	}
	applied := false
	_, err = t.TryUpdate(ev, key, func(old Versioned[V]) Versioned[V] {
		if old.stored && old.Version >= nv.Version {
			return old
		}
		applied = true
		return nv
	})
	if err != nil {
		return false, err
	}
	return applied, nil
}
