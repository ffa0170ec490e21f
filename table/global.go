package table

import (
	"context"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"sync"

	"github.com/runnel-dev/runnel/codec"
)

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
	link // the runtime side (globalRuntime), no part of the API

	mu       sync.Mutex
	replicas []*tablestate.GlobalState // attached worker replicas, oldest first; guarded by mu
}

// NewGlobal declares a global table on h. The changelog topic is created by
// the worker, compacted, with the table's partition count (Partitions, or that
// of the app's source topics).
func NewGlobal[K any, V any](h Host, name string, kc codec.Codec[K], vc codec.Codec[V], opts ...Option) *GlobalTable[K, V] {
	t := &GlobalTable[K, V]{declared: declare(h, name, kc, vc, opts)}
	t.link = tablestate.NewLink(globalRuntime[K, V]{t})
	h.RegisterTable(t)
	return t
}

// globalRuntime is a GlobalTable's runtime side (tablestate.RuntimeOf): the
// worker holds every partition of it (tablestate.Replicated).
type globalRuntime[K any, V any] struct{ t *GlobalTable[K, V] }

// AttachReplica implements tablestate.Replicated.
func (r globalRuntime[K, V]) AttachReplica(s *tablestate.GlobalState) func() {
	return r.t.attachReplica(s)
}

// attachReplica registers a worker's replica so that reads without an event
// (Lookup) find one; the returned func detaches it.
func (t *GlobalTable[K, V]) attachReplica(s *tablestate.GlobalState) func() {
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

func (t *GlobalTable[K, V]) current(ev Event) (*tablestate.GlobalState, error) {
	env := envOf(ev)
	if env == nil || env.Globals[t.name] == nil {
		return nil, fmt.Errorf("table %s: %w", t.name, ErrNotRunning)
	}
	return env.Globals[t.name], nil
}

func (t *GlobalTable[K, V]) read(s *tablestate.GlobalState, key K) (V, bool, error) {
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
	var s *tablestate.GlobalState
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
	if err := checkWrite(envOf(ev), t.name); err != nil {
		return nil, err
	}
	s, err := t.current(ev)
	return writerOf((*globalWriter)(s), err)
}

// written implements writable: a global table has no joins to run.
func (t *GlobalTable[K, V]) written(Event, K) error { return nil }
