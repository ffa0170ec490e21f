package stores

import "errors"

// ErrClosed is returned by every Store method called after Close, including a
// second Close.
var ErrClosed = errors.New("stores: store is closed")

// ErrInvalidPartition is returned (wrapped) by every Store method given a
// negative partition; Kafka partitions are numbered from 0.
var ErrInvalidPartition = errors.New("stores: invalid partition")

// ErrInvalidOffset is returned (wrapped) by Apply when Batch.Offset is below
// NoOffset.
var ErrInvalidOffset = errors.New("stores: invalid offset")

// NoOffset is the applied changelog offset of a partition that has none yet.
const NoOffset int64 = -1

// Batch is an atomic group of writes to one partition of a store, together with
// the changelog offset those writes bring the partition up to and the
// source-offset marks they set.
//
// Invariant: a Store applies Puts, Deletes, Offset and Marks in one atomic
// step, so a crash never leaves the data, the applied offset and the marks out
// of step.
type Batch struct {
	// Puts and Deletes are applied in the order Ops lists them.
	Ops []Op
	// Offset is the changelog offset of the last record this batch covers, or
	// NoOffset to leave the partition's applied offset unchanged.
	Offset int64
	// Marks set named offsets of the partition, in order (the last mark of a
	// name wins, within the batch and over earlier batches). Tables use them
	// to record, per source topic partition, the highest source offset whose
	// effect the partition holds (docs/tables.md).
	Marks []Mark
}

// Mark is one named offset of a partition, kept with its data. Key is any
// string (tables use "<source topic>/<source partition>", see
// table.MarkKey); Offset any int64.
type Mark struct {
	Key    string
	Offset int64
}

// Op is one write: a put of Value under Key, or a delete of Key (a tombstone)
// when Delete is set.
type Op struct {
	Key    []byte
	Value  []byte
	Delete bool
}

// Put appends a put of value under key.
func (b *Batch) Put(key, value []byte) { b.Ops = append(b.Ops, Op{Key: key, Value: value}) }

// Delete appends a delete of key.
func (b *Batch) Delete(key []byte) { b.Ops = append(b.Ops, Op{Key: key, Delete: true}) }

// Mark appends a mark setting key to offset.
func (b *Batch) Mark(key string, offset int64) {
	b.Marks = append(b.Marks, Mark{Key: key, Offset: offset})
}

// empty reports whether b changes nothing.
func (b *Batch) empty() bool {
	return b == nil || (len(b.Ops) == 0 && b.Offset == NoOffset && len(b.Marks) == 0)
}

// Store is the local state of one table on one worker, partitioned like the
// table's changelog topic. Implementations are safe for concurrent use.
//
// Keys and values are opaque bytes; a key lives in exactly one partition, and
// the same key in two partitions is two independent entries. Partitions are
// int32 >= 0 (ErrInvalidPartition otherwise). Slices passed in may be reused by
// the caller after the call returns; slices returned, including those passed
// to an Iterate callback, are owned by the caller. An empty value reads back
// as a non-nil empty slice.
type Store interface {
	// Get returns the value of key in partition, and false when it is absent.
	Get(partition int32, key []byte) (value []byte, ok bool, err error)
	// Apply writes b to partition atomically (data, applied offset and marks
	// together). A nil batch, or one without ops and marks and with Offset
	// NoOffset, is a no-op. Apply does not make the write durable by itself;
	// see Sync.
	Apply(partition int32, b *Batch) error
	// Offset returns the changelog offset last applied to partition, or
	// NoOffset when the partition has none.
	Offset(partition int32) (int64, error)
	// Marks returns the marks of partition (name -> offset, as the last
	// Apply that set each name left it); an empty map when it has none.
	Marks(partition int32) (map[string]int64, error)
	// Iterate calls fn for every key of partition in ascending byte order; a
	// non-nil error from fn stops the iteration and is returned. fn sees a
	// consistent snapshot of the partition taken when Iterate starts and may
	// call other methods of the store (not Close, which waits for Iterate).
	Iterate(partition int32, fn func(key, value []byte) error) error
	// Partitions lists the partitions that hold data, an applied offset or
	// marks, ascending.
	Partitions() ([]int32, error)
	// DropPartition removes every key, the applied offset and the marks of
	// partition, atomically.
	DropPartition(partition int32) error
	// Sync makes every applied batch durable (fsync for on-disk stores).
	Sync() error
	// Close syncs and releases the store; later calls return ErrClosed.
	Close() error
}

// Seeker is a Store that starts an iteration at a key: IterateFrom is
// Iterate restricted to the keys >= start (every key when start is nil),
// reaching the first without reading the keys before it. Pebble and Memory
// implement it; range scans over a table use it when the store does.
type Seeker interface {
	IterateFrom(partition int32, start []byte, fn func(key, value []byte) error) error
}
