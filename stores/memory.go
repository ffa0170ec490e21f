package stores

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Memory is an in-memory Store for tests: a map per partition, sorted on
// Iterate. It is safe for concurrent use. Nothing survives the process, and
// Sync is a no-op; unlike Faust's memory:// store it does keep the applied
// offset of each partition, so it behaves like Pebble in every respect except
// durability.
type Memory struct {
	// mu guards closed and parts. Apply, DropPartition and Close take it for
	// writing; readers take it for reading and copy out before returning.
	mu     sync.RWMutex
	closed bool
	// parts holds one entry per partition ever written. Invariant: a partition
	// with no keys, no marks and offset NoOffset is reported by no method, so
	// an entry left empty by deletes is the same as no entry.
	parts map[int32]*memPartition
}

type memPartition struct {
	data   map[string][]byte
	offset int64
	marks  map[string]int64
}

// NewMemory returns an empty Memory store.
func NewMemory() *Memory {
	return &Memory{parts: make(map[int32]*memPartition)}
}

var _ Store = (*Memory)(nil)

// Get implements Store.
func (m *Memory) Get(partition int32, key []byte) ([]byte, bool, error) {
	if err := checkPartition(partition); err != nil {
		return nil, false, fmt.Errorf("get [%d]: %w", partition, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, false, ErrClosed
	}
	p := m.parts[partition]
	if p == nil {
		return nil, false, nil
	}
	v, ok := p.data[string(key)]
	if !ok {
		return nil, false, nil
	}
	return append([]byte{}, v...), true, nil
}

// Apply implements Store. Keys and values are copied.
func (m *Memory) Apply(partition int32, b *Batch) error {
	if err := checkBatch(partition, b); err != nil {
		return err
	}
	if b == nil {
		b = &Batch{Offset: NoOffset}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if b.empty() {
		return nil
	}
	p := m.parts[partition]
	if p == nil {
		p = &memPartition{data: make(map[string][]byte), offset: NoOffset, marks: make(map[string]int64)}
		m.parts[partition] = p
	}
	for _, op := range b.Ops {
		if op.Delete {
			delete(p.data, string(op.Key))
		} else {
			p.data[string(op.Key)] = append([]byte{}, op.Value...)
		}
	}
	if b.Offset != NoOffset {
		p.offset = b.Offset
	}
	for _, mk := range b.Marks {
		p.marks[mk.Key] = mk.Offset
	}
	return nil
}

// Marks implements Store.
func (m *Memory) Marks(partition int32) (map[string]int64, error) {
	if err := checkPartition(partition); err != nil {
		return nil, fmt.Errorf("marks [%d]: %w", partition, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	out := make(map[string]int64)
	if p := m.parts[partition]; p != nil {
		maps.Copy(out, p.marks)
	}
	return out, nil
}

// Offset implements Store.
func (m *Memory) Offset(partition int32) (int64, error) {
	if err := checkPartition(partition); err != nil {
		return NoOffset, fmt.Errorf("offset [%d]: %w", partition, err)
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return NoOffset, ErrClosed
	}
	if p := m.parts[partition]; p != nil {
		return p.offset, nil
	}
	return NoOffset, nil
}

// Iterate implements Store. It copies the partition under the lock and calls
// fn without holding it.
func (m *Memory) Iterate(partition int32, fn func(key, value []byte) error) error {
	return m.IterateFrom(partition, nil, fn)
}

// IterateFrom implements Seeker. It copies the keys >= start under the lock.
func (m *Memory) IterateFrom(partition int32, start []byte, fn func(key, value []byte) error) error {
	if err := checkPartition(partition); err != nil {
		return fmt.Errorf("iterate [%d]: %w", partition, err)
	}
	type kv struct{ k, v []byte }
	var snap []kv
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		return ErrClosed
	}
	if p := m.parts[partition]; p != nil {
		snap = make([]kv, 0, len(p.data))
		for k, v := range p.data {
			if start != nil && k < string(start) {
				continue
			}
			snap = append(snap, kv{[]byte(k), append([]byte{}, v...)})
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(snap, func(a, b kv) int { return bytes.Compare(a.k, b.k) })
	for _, e := range snap {
		if err := fn(e.k, e.v); err != nil {
			return err
		}
	}
	return nil
}

// Partitions implements Store.
func (m *Memory) Partitions() ([]int32, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	var out []int32
	for id, p := range m.parts {
		if len(p.data) > 0 || p.offset != NoOffset || len(p.marks) > 0 {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out, nil
}

// DropPartition implements Store.
func (m *Memory) DropPartition(partition int32) error {
	if err := checkPartition(partition); err != nil {
		return fmt.Errorf("drop [%d]: %w", partition, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	delete(m.parts, partition)
	return nil
}

// Sync implements Store; it only checks that the store is open.
func (m *Memory) Sync() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return nil
}

// Close implements Store. It drops the data.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	m.parts = nil
	return nil
}

// checkPartition returns ErrInvalidPartition for a negative partition.
func checkPartition(partition int32) error {
	if partition < 0 {
		return ErrInvalidPartition
	}
	return nil
}

// checkBatch validates the arguments of Apply.
func checkBatch(partition int32, b *Batch) error {
	if err := checkPartition(partition); err != nil {
		return fmt.Errorf("apply [%d]: %w", partition, err)
	}
	if b != nil && b.Offset < NoOffset {
		return fmt.Errorf("apply [%d] offset %d: %w", partition, b.Offset, ErrInvalidOffset)
	}
	return nil
}
