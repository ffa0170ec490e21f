package table

import (
	"context"
	"fmt"
	"sync"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
)

// GlobalDef is a table every worker holds in full (a global table): the worker
// restores every partition of its changelog before it joins the group and
// keeps tailing all of them. Plain tables do not implement it.
type GlobalDef interface {
	Def
	// AttachReplica registers a worker's replica of the table so that reads
	// without an event (GlobalTable.Lookup) find one; detach undoes it.
	AttachReplica(s *GlobalState) (detach func())
}

// GlobalTable is a typed global table (Kafka Streams' GlobalKTable, Faust's
// GlobalTable): every worker holds every partition, kept up to date by tailing
// the changelog "<app>-<table>-changelog" (compacted) on every worker.
//
// Reads (Get with an event, Lookup without one) are served from the local
// replica, from any agent and for any partition. The replica lags the
// changelog by the time the worker takes to fetch and apply a record (about one
// fetch wait plus a store batch; docs/tables.md gives measured numbers), except
// for the worker's own writes, which it reads at once (read-your-writes).
//
// Writes follow the rule of plain tables: a write goes to the event
// partition's commit cycle (docs/tables.md) and the key must belong to the event's partition (ErrNotCoPartitioned
// otherwise), so partition p of a global table is written only by the worker
// that owns partition p of the source topics (declare the table with the same
// partition count as the topics it is written from). Before that worker's
// agents process partition p, the worker's replica of partition p is brought to
// the changelog's highwater, so read-modify-write (Update) sees every earlier
// write of the previous owner.
type GlobalTable[K any, V any] struct {
	declared[K, V]

	mu       sync.Mutex
	replicas []*GlobalState // attached worker replicas, oldest first; guarded by mu
}

// NewGlobal declares a global table on h. The changelog topic is created by
// the worker, compacted, with the table's partition count (Partitions, or that
// of the app's source topics).
func NewGlobal[K any, V any](h Host, name string, kc codec.Codec[K], vc codec.Codec[V], opts ...Option) *GlobalTable[K, V] {
	t := &GlobalTable[K, V]{declared: declare(h, name, kc, vc, opts)}
	h.RegisterTable(t)
	return t
}

// AttachReplica implements GlobalDef.
func (t *GlobalTable[K, V]) AttachReplica(s *GlobalState) func() {
	t.mu.Lock()
	t.replicas = append(t.replicas, s)
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		for i, r := range t.replicas {
			if r == s {
				t.replicas = append(t.replicas[:i:i], t.replicas[i+1:]...)
				return
			}
		}
	}
}

func (t *GlobalTable[K, V]) current(ev Event) (*GlobalState, error) {
	env := envOf(ev)
	if env == nil || env.Globals[t.name] == nil {
		return nil, fmt.Errorf("table %s: %w", t.name, ErrNotRunning)
	}
	return env.Globals[t.name], nil
}

func (t *GlobalTable[K, V]) read(s *GlobalState, key K) (V, bool, error) {
	var zero V
	kb, err := t.kc.Encode(key)
	if err != nil {
		return zero, false, fmt.Errorf("table %s: encode key: %w", t.name, err)
	}
	b, ok, err := s.Lookup(kb)
	if err != nil || !ok {
		return zero, false, err
	}
	v, err := t.vc.Decode(b)
	if err != nil {
		return zero, false, fmt.Errorf("table %s: decode value: %w", t.name, err)
	}
	return v, true, nil
}

// Get returns the value of key from the replica of the worker processing ev,
// whatever partition the key belongs to, and whether it exists.
func (t *GlobalTable[K, V]) Get(ev Event, key K) (V, bool, error) {
	s, err := t.current(ev)
	if err != nil {
		var zero V
		return zero, false, err
	}
	return t.read(s, key)
}

// Lookup returns the value of key from a replica held by this process, without
// an event (HTTP handlers, timers, code outside agents). When the process runs
// several workers (dev mode) it reads the one attached first; all of them
// converge to the changelog. It returns ErrNotRunning (wrapped) when no worker
// of this process holds the table, and ctx's error if ctx is done.
//
// Staleness: a key written by another worker becomes visible here after the
// replica fetched and applied its changelog record (bounded by the fetch wait,
// 500 ms by default, plus the broker round trip); before the worker's first
// restore finished it may read an older value or none.
func (t *GlobalTable[K, V]) Lookup(ctx context.Context, key K) (V, bool, error) {
	var zero V
	if err := ctx.Err(); err != nil {
		return zero, false, err
	}
	t.mu.Lock()
	var s *GlobalState
	if len(t.replicas) > 0 {
		s = t.replicas[0]
	}
	t.mu.Unlock()
	if s == nil {
		return zero, false, fmt.Errorf("table %s: %w", t.name, ErrNotRunning)
	}
	return t.read(s, key)
}

// Put writes value under key in ev's partition's current commit cycle. The
// key must belong to ev's partition (ErrNotCoPartitioned), and this worker
// must own the partition (ErrNotActive). A failure fails the event, as
// Table.Put's does; use TryPut to handle the error instead.
func (t *GlobalTable[K, V]) Put(ev Event, key K, value V) { failOn(ev, t.TryPut(ev, key, value)) }

// TryPut is Put returning the write's error instead of failing the event.
func (t *GlobalTable[K, V]) TryPut(ev Event, key K, value V) error {
	return setKey[K, V](t, ev, key, value)
}

// Update replaces the value of key with fn(old), where old is the zero value
// when the key is absent, and returns the new value. The write goes to ev's
// partition's current commit cycle.
// Like Table.Update, the read and the write are one step for the partition,
// fn must not use the same table, and a failure fails the event (TryUpdate
// returns it instead).
func (t *GlobalTable[K, V]) Update(ev Event, key K, fn func(old V) V) V {
	v, err := t.TryUpdate(ev, key, fn)
	failOn(ev, err)
	return v
}

// TryUpdate is Update returning the error instead of failing the event.
func (t *GlobalTable[K, V]) TryUpdate(ev Event, key K, fn func(old V) V) (V, error) {
	return updateKey[K, V](t, ev, key, fn)
}

// Compute sets, keeps or deletes key by what fn returns for its current
// value, as Table.Compute does; a failure fails the event (TryCompute
// returns it instead).
func (t *GlobalTable[K, V]) Compute(ev Event, key K, fn func(old V, found bool) (V, bool)) (V, bool) {
	v, ok, err := t.TryCompute(ev, key, fn)
	failOn(ev, err)
	return v, ok
}

// TryCompute is Compute returning the error instead of failing the event.
func (t *GlobalTable[K, V]) TryCompute(ev Event, key K, fn func(old V, found bool) (V, bool)) (V, bool, error) {
	return computeKey[K, V](t, ev, key, fn)
}

// Delete removes key (a tombstone in the changelog) in ev's partition's
// current commit cycle; a failure fails the event (TryDelete returns it
// instead).
func (t *GlobalTable[K, V]) Delete(ev Event, key K) { failOn(ev, t.TryDelete(ev, key)) }

// TryDelete is Delete returning the error instead of failing the event.
func (t *GlobalTable[K, V]) TryDelete(ev Event, key K) error { return deleteKey[K, V](t, ev, key) }

// writer implements writable.
func (t *GlobalTable[K, V]) writer(ev Event) (partitionWriter, error) {
	if err := envOf(ev).checkWrite(t.name); err != nil {
		return nil, err
	}
	return writerOf(t.current(ev))
}

// written implements writable: a global table has no joins to run.
func (t *GlobalTable[K, V]) written(Event, K) error { return nil }

// GlobalState is one worker's replica of a global table: a store holding every
// partition, the changelog producer, and the worker's own writes that the
// replica has not applied yet.
//
// Invariant (kept by Store's Apply, Cut and applyCycle): the store holds
// exactly the changelog's records up to each partition's applied offset,
// applied in offset order by the worker's followers, nothing else; the
// worker's own writes never go to the store directly. A write lives in the
// partition's cache, then in the cycle being flushed, then (acknowledged) in
// the overlay until the follower applied an offset at or past its changelog
// offset, so reads see it at once and never see an older value after it
// (read-your-writes, no going back in time).
type GlobalState struct {
	stateBase

	// CacheBytes and OnFull work as State's (set before the worker starts).
	CacheBytes int
	OnFull     func(p int32)

	mu      sync.Mutex
	caches  map[int32]*partState              // write caches of the partitions this worker writes (Activate); guarded by mu
	overlay map[int32]map[string]*globalWrite // newest own acknowledged write per key not yet applied; guarded by mu
	applied map[int32]int64                   // changelog offset applied per partition; guarded by mu
	changed chan struct{}                     // closed and replaced when applied moves; guarded by mu
}

type globalWrite struct {
	value   []byte
	deleted bool
	offset  int64 // changelog offset
}

// NewGlobalState creates the replica of global table d over st (which may hold
// a previous run's data and checkpoints) with the given producer.
func NewGlobalState(d Def, partitions int32, st stores.Store, send ChangelogSendFunc) (*GlobalState, error) {
	s := &GlobalState{stateBase: newStateBase(d, partitions, st, send),
		caches: map[int32]*partState{}, overlay: map[int32]map[string]*globalWrite{}, applied: map[int32]int64{}, changed: make(chan struct{})}
	for p := int32(0); p < partitions; p++ {
		off, err := st.Offset(p)
		if err != nil {
			return nil, fmt.Errorf("table %s[%d]: read checkpoint: %w", s.name, p, err)
		}
		s.applied[p] = off
	}
	return s, nil
}

// Store returns the replica's store as followers must write it: its Apply
// also advances the applied offsets and retires own writes the batch covers,
// and DropPartition (a restore rebuilding the partition) resets them.
func (s *GlobalState) Store() stores.Store { return replicaStore{Store: s.store, s: s} }

// Applied returns the changelog offset applied to partition p
// (stores.NoOffset when none).
func (s *GlobalState) Applied(p int32) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied[p]
}

// WaitApplied blocks until partition p's applied offset is at least offset,
// and returns ctx's error if ctx ends first.
func (s *GlobalState) WaitApplied(ctx context.Context, p int32, offset int64) error {
	for {
		s.mu.Lock()
		ok, ch := s.applied[p] >= offset, s.changed
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("table %s[%d]: wait for offset %d: %w", s.name, p, offset, ctx.Err())
		}
	}
}

// Pending returns how many of the worker's own writes the replica has not
// applied yet (acknowledged or not).
func (s *GlobalState) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.overlay {
		n += len(m)
	}
	return n
}

// Lookup returns the replica's value of an encoded key: the worker's own
// newest write if the replica has not applied it yet, else the store's.
func (s *GlobalState) Lookup(key []byte) ([]byte, bool, error) {
	p := kafka.PartitionFor(key, s.partitions)
	s.mu.Lock()
	ps := s.caches[p]
	s.mu.Unlock()
	if ps != nil {
		if it, ok := ps.lookup(key); ok {
			if it.deleted {
				return nil, false, nil
			}
			return it.value, true, nil
		}
	}
	return s.lookupApplied(p, key)
}

// lookupApplied reads key of partition p from the acknowledged own writes,
// then the store: the value before the cycles not yet acknowledged.
func (s *GlobalState) lookupApplied(p int32, key []byte) ([]byte, bool, error) {
	s.mu.Lock()
	if o, ok := s.overlay[p][string(key)]; ok {
		s.mu.Unlock()
		if o.deleted {
			return nil, false, nil
		}
		return o.value, true, nil
	}
	s.mu.Unlock()
	v, ok, err := s.store.Get(p, key)
	if err != nil {
		return nil, false, fmt.Errorf("table %s[%d]: %w", s.name, p, err)
	}
	return v, ok, nil
}

// noteApplied records that the follower applied partition p up to offset and
// retires the own writes it covers; mu must not be held.
func (s *GlobalState) noteApplied(p int32, offset int64, reset bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !reset && offset <= s.applied[p] {
		return
	}
	s.applied[p] = offset
	for k, o := range s.overlay[p] {
		if o.offset <= offset {
			delete(s.overlay[p], k)
		}
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *GlobalState) write(ev Event, key, value []byte, del bool) error {
	p, err := s.partitionOf(ev, key, key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	ps := s.caches[p]
	s.mu.Unlock()
	return s.cache(ev, p, ps, key, value, del, s.CacheBytes, s.OnFull)
}

// Activate makes partition p writable by this worker (its task started): a
// write cache, and a writer epoch one above the highest the replica applied.
// The replica must have caught up with the partition first (the worker
// waits for it), so that the epoch is above every earlier owner's.
func (s *GlobalState) Activate(p int32) error {
	marks, err := s.store.Marks(p)
	if err != nil {
		return fmt.Errorf("table %s[%d]: read marks: %w", s.name, p, err)
	}
	s.mu.Lock()
	s.caches[p] = &partState{epoch: marks[changelog.EpochMark] + 1, dirty: map[string]cacheItem{}}
	s.mu.Unlock()
	return nil
}

// Deactivate ends this worker's writes to partition p, dropping its cache.
func (s *GlobalState) Deactivate(p int32) {
	s.mu.Lock()
	delete(s.caches, p)
	s.mu.Unlock()
}

// CacheSize implements Cutter: the size of partition p's write cache (see
// State.CacheSize), 0 when this worker does not write p.
func (s *GlobalState) CacheSize(p int32) (entries, bytes int) {
	s.mu.Lock()
	ps := s.caches[p]
	s.mu.Unlock()
	if ps == nil {
		return 0, 0
	}
	return ps.size()
}

// Cut implements Cutter: partition p's writes of the current cycle, sent
// like a plain table's (one stamped record per key, the before-image being
// the value before the cycle) and, once acknowledged, kept as own writes
// until the replica's follower applies them.
func (s *GlobalState) Cut(p int32) Cycle {
	s.mu.Lock()
	ps := s.caches[p]
	s.mu.Unlock()
	if ps == nil {
		return nil
	}
	keys, items := ps.cut()
	if keys == nil {
		return nil
	}
	return &Flush{name: s.name, topic: s.topic, send: s.send, p: p, ps: ps, keys: keys, items: items,
		done: make(chan struct{}), last: stores.NoOffset, offs: make([]int64, len(keys)),
		before:  func(key []byte) ([]byte, bool, error) { return s.lookupApplied(p, key) },
		applyFn: s.applyCycle}
}

// Drop implements Cutter.
func (s *GlobalState) Drop(p int32) {
	s.mu.Lock()
	ps := s.caches[p]
	s.mu.Unlock()
	if ps != nil {
		ps.drop()
	}
}

// applyCycle keeps an acknowledged cycle's writes as own writes, each with
// its changelog offset, until the follower applies that offset (noteApplied
// retires them); one the follower already applied is not kept.
func (s *GlobalState) applyCycle(f *Flush) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.overlay[f.p]
	if m == nil {
		m = map[string]*globalWrite{}
		s.overlay[f.p] = m
	}
	for i, k := range f.keys {
		if f.offs[i] <= s.applied[f.p] {
			delete(m, k)
			continue
		}
		m[k] = &globalWrite{value: f.items[i].value, deleted: f.items[i].deleted, offset: f.offs[i]}
	}
	return nil
}

// replicaStore is the store as a global table's followers write it.
type replicaStore struct {
	stores.Store
	s *GlobalState
}

func (r replicaStore) Apply(p int32, b *stores.Batch) error {
	if err := r.Store.Apply(p, b); err != nil {
		return err
	}
	if b != nil && b.Offset != stores.NoOffset {
		r.s.noteApplied(p, b.Offset, false)
	}
	return nil
}

func (r replicaStore) DropPartition(p int32) error {
	if err := r.Store.DropPartition(p); err != nil {
		return err
	}
	r.s.noteApplied(p, stores.NoOffset, true)
	return nil
}
