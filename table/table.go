package table

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
)

// Event is the record being processed, as tables see it: its partition, and a
// way to bind a derived record (the changelog write) to it so that the record's
// offset is not committed before the broker acknowledged the write.
// agent.Event implements it.
type Event interface {
	// Partition is the source partition of the record; a table write goes to the
	// same partition of the table (co-partitioning).
	Partition() int32
	// BindPersist binds one derived record to the event's open window. done must
	// be called exactly once, with nil when the broker acknowledged the record.
	// ok is false when the window is closed (the agent already pulled the next
	// record) or the event is no longer pending.
	BindPersist() (done func(error), ok bool)
	// Env is the runtime of the worker processing the event. Tables and topics
	// are declared once per app but run on every worker of a process (dev mode
	// runs several), so they find their per-worker state through the event.
	Env() *Env
}

// Env is one worker's runtime as tables and sinks see it: each table's state
// and the producer for derived records.
type Env struct {
	// States maps a table name to its runtime on this worker.
	States map[string]*State
	// Send produces derived records (sinks).
	Send SendFunc
	// Globals maps a global table's name to this worker's replica (global.go).
	Globals map[string]*GlobalState
	// InFlight, when set, counts the derived records of the events of one
	// source partition that the broker has not answered yet; the worker waits
	// for it before it gives the partition up.
	InFlight *InFlight
}

// InFlight counts derived records (changelog writes, sink records) sent and
// not yet answered by the broker. The zero value is ready to use.
type InFlight struct {
	mu   sync.Mutex
	n    int           // guarded by mu
	zero chan struct{} // closed when n drops to 0; nil while n is 0; guarded by mu
}

// Add counts one more record in flight.
func (f *InFlight) Add() {
	f.mu.Lock()
	if f.n == 0 {
		f.zero = make(chan struct{})
	}
	f.n++
	f.mu.Unlock()
}

// Done counts one record answered.
func (f *InFlight) Done() {
	f.mu.Lock()
	if f.n--; f.n == 0 {
		close(f.zero)
		f.zero = nil
	}
	f.mu.Unlock()
}

// Wait returns when no record is in flight, or ctx's error (with the count).
func (f *InFlight) Wait(ctx context.Context) error {
	f.mu.Lock()
	n, zero := f.n, f.zero
	f.mu.Unlock()
	if n == 0 {
		return nil
	}
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		f.mu.Lock()
		n = f.n
		f.mu.Unlock()
		return fmt.Errorf("%d derived records still in flight: %w", n, ctx.Err())
	}
}

// Host is what a table registers with: the App.
type Host interface {
	// AppID names the consumer group and prefixes the changelog topics.
	AppID() string
	// RegisterTable adds the table to the app's topology.
	RegisterTable(d Def)
}

// Def is a table as the worker manages it, independent of its key and value types.
type Def interface {
	Name() string
	// Changelog is the changelog topic, "<app>-<table>-changelog".
	Changelog() string
	// Partitions is the declared partition count, 0 when it follows the source topics.
	Partitions() int32
	// KeyCodec and ValueCodec name the codecs, for describe.
	KeyCodec() string
	ValueCodec() string
	// Format renders a stored key and value for dumps; errors are user data
	// that does not decode.
	Format(key, value []byte) (k string, v any, err error)
}

// Option configures a table.
type Option func(*options)

type options struct{ partitions int32 }

// Partitions sets the table's partition count; default: that of the source
// topics of the app (which must then agree).
func Partitions(n int32) Option { return func(o *options) { o.partitions = n } }

// Table is a typed, partitioned key/value table. Writes are bound to the event
// being processed (see Event); reads see the worker's own writes at once, before
// the changelog acknowledged them.
type Table[K any, V any] struct {
	declared[K, V]
}

// declared is what every kind of table is declared with: its name, changelog
// topic, codecs and options, and the methods of Def that only need those.
type declared[K any, V any] struct {
	name, topic string
	kc          codec.Codec[K]
	vc          codec.Codec[V]
	opts        options
}

func (d *declared[K, V]) encodeKey(key K) ([]byte, error) {
	kb, err := d.kc.Encode(key)
	if err != nil {
		return nil, fmt.Errorf("table %s: encode key: %w", d.name, err)
	}
	return kb, nil
}

func (d *declared[K, V]) encodeValue(value V) ([]byte, error) {
	vb, err := d.vc.Encode(value)
	if err != nil {
		return nil, fmt.Errorf("table %s: encode value: %w", d.name, err)
	}
	return vb, nil
}

func declare[K any, V any](h Host, name string, kc codec.Codec[K], vc codec.Codec[V], opts []Option) declared[K, V] {
	d := declared[K, V]{name: name, topic: changelog.Topic(h.AppID(), name), kc: kc, vc: vc}
	for _, o := range opts {
		o(&d.opts)
	}
	return d
}

// New declares a table on h. The changelog topic is created by the worker.
func New[K any, V any](h Host, name string, kc codec.Codec[K], vc codec.Codec[V], opts ...Option) *Table[K, V] {
	t := &Table[K, V]{declared: declare(h, name, kc, vc, opts)}
	h.RegisterTable(t)
	return t
}

// Name returns the table name.
func (t *declared[K, V]) Name() string { return t.name }

// Changelog returns the changelog topic name.
func (t *declared[K, V]) Changelog() string { return t.topic }

// Partitions returns the declared partition count (0 = follows the sources).
func (t *declared[K, V]) Partitions() int32 { return t.opts.partitions }

// KeyCodec names the key codec.
func (t *declared[K, V]) KeyCodec() string { return t.kc.Name() }

// ValueCodec names the value codec.
func (t *declared[K, V]) ValueCodec() string { return t.vc.Name() }

// Format decodes a stored key and value.
func (t *declared[K, V]) Format(key, value []byte) (string, any, error) {
	k, err := t.kc.Decode(key)
	if err != nil {
		return "", nil, fmt.Errorf("table %s: key: %w", t.name, err)
	}
	v, err := t.vc.Decode(value)
	if err != nil {
		return "", nil, fmt.Errorf("table %s: value of %v: %w", t.name, k, err)
	}
	return fmt.Sprint(k), v, nil
}

func (t *Table[K, V]) current(ev Event) (*State, error) {
	env := ev.Env()
	if env == nil || env.States[t.name] == nil {
		return nil, fmt.Errorf("table %s: %w", t.name, ErrNotRunning)
	}
	return env.States[t.name], nil
}

// Get returns the value of key in the event's partition and whether it exists.
func (t *Table[K, V]) Get(ev Event, key K) (V, bool, error) {
	var zero V
	s, err := t.current(ev)
	if err != nil {
		return zero, false, err
	}
	kb, err := t.kc.Encode(key)
	if err != nil {
		return zero, false, fmt.Errorf("table %s: encode key: %w", t.name, err)
	}
	b, ok, err := s.get(ev.Partition(), kb)
	if err != nil || !ok {
		return zero, false, err
	}
	v, err := t.vc.Decode(b)
	if err != nil {
		return zero, false, fmt.Errorf("table %s: decode value: %w", t.name, err)
	}
	return v, true, nil
}

// Set writes value under key, bound to ev.
func (t *Table[K, V]) Set(ev Event, key K, value V) error {
	s, err := t.current(ev)
	if err != nil {
		return err
	}
	kb, err := t.encodeKey(key)
	if err != nil {
		return err
	}
	vb, err := t.encodeValue(value)
	if err != nil {
		return err
	}
	return s.write(ev, kb, vb, false)
}

// Update replaces the value of key with fn(old), where old is the zero value
// when the key is absent, and returns the new value. The write is bound to ev.
//
// The read and the write are one step for the partition: agents that update
// the same table partition concurrently (several agents on one topic, or on
// co-partitioned topics) never lose each other's updates. fn must not use the
// same table.
func (t *Table[K, V]) Update(ev Event, key K, fn func(old V) V) (V, error) {
	if s, err := t.current(ev); err == nil {
		defer s.rmw.lock(ev.Partition())()
	}
	old, _, err := t.Get(ev, key)
	if err != nil {
		return old, err
	}
	nv := fn(old)
	return nv, t.Set(ev, key, nv)
}

// Delete removes key (a tombstone in the changelog), bound to ev.
func (t *Table[K, V]) Delete(ev Event, key K) error {
	s, err := t.current(ev)
	if err != nil {
		return err
	}
	kb, err := t.encodeKey(key)
	if err != nil {
		return err
	}
	return s.write(ev, kb, nil, true)
}

// ErrNotRunning is returned by table operations outside a running worker.
var ErrNotRunning = errors.New("table is not attached to a running worker")

// ErrNotCoPartitioned is returned for a write whose key belongs to another
// partition than the event's. A table is partitioned like its source topic: the
// record with key k is in partition hash(k) of the topic, and table writes of that
// record go to the same partition of the table. Writing under a different key
// (one that hashes elsewhere) would put the key in a partition whose owner never
// sees it; re-key the stream through a topic first (emit to a topic keyed by the
// new key and update the table from an agent on that topic).
var ErrNotCoPartitioned = errors.New("key does not belong to the event's partition")

// ErrNotActive is returned for a write to a partition this worker does not own.
var ErrNotActive = errors.New("partition is not active on this worker")

// ErrOutsideWindow is returned for a write made after the agent pulled the next
// record (or after the event was resolved): it could not be bound to its event.
var ErrOutsideWindow = errors.New("table write outside the event's window")

// Origin is the source record an event carries: where it was read from and
// its timestamp (event time).
type Origin struct {
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time
}

// Originator is implemented by events that know their source record
// (agent.Event does). Table writes stamp it on their changelog records
// (changelog.HeaderSource*), and windowed tables take event time from it.
type Originator interface {
	Origin() Origin
}

// Header is one record header.
type Header struct{ Key, Value []byte }

// ChangelogSendFunc produces one changelog record with headers to partition p
// (value nil is a tombstone) and reports the broker's answer to done.
type ChangelogSendFunc func(topic string, p int32, key, value []byte, headers []Header, done func(offset int64, err error)) error

// SendFunc produces one changelog record to partition p (value nil is a
// tombstone) and reports the broker's answer to done.
type SendFunc func(topic string, p int32, key, value []byte, done func(offset int64, err error)) error

// State is a table's runtime on one worker: its store, the changelog producer,
// and the writes not yet acknowledged by the broker.
//
// Invariant (kept by write and its delivery callback): the store holds exactly
// the changelog's records up to the store's checkpoint offset, nothing else. A
// local write lives in the overlay until the broker acknowledged its changelog
// record; only then is it applied to the store, together with its offset. So
// after a crash the store is a prefix of the changelog and restore only replays
// the tail; an unacknowledged write is never in the store.
type State struct {
	name, topic string
	partitions  int32
	store       stores.Store
	send        ChangelogSendFunc

	rmw partitionLocks // Update's read-modify-write, per partition

	mu      sync.Mutex
	seq     uint64                         // guarded by mu
	overlay map[int32]map[string]overlayed // newest unacknowledged write per key; guarded by mu
	active  map[int32]bool                 // partitions this worker may write; guarded by mu
	epoch   map[int32]uint64               // bumped on every activation change of a partition; guarded by mu

	// markMu serializes the application of acknowledged writes, so that a
	// mark read from marks is the one in the store when the batch raising it
	// is applied. marks caches the store's source-offset marks per partition
	// (loaded on the first acknowledged write, dropped by SetActive, since
	// restores and standby follows change them while a partition is not
	// active); guarded by markMu.
	markMu sync.Mutex
	marks  map[int32]map[string]int64
}

type overlayed struct {
	value   []byte // nil for a delete
	deleted bool
	seq     uint64
}

// NewState creates the runtime of table d with the given store and producer.
func NewState(d Def, partitions int32, st stores.Store, send ChangelogSendFunc) *State {
	return &State{name: d.Name(), topic: d.Changelog(), partitions: partitions, store: st, send: send,
		overlay: map[int32]map[string]overlayed{}, active: map[int32]bool{}, epoch: map[int32]uint64{}, marks: map[int32]map[string]int64{}}
}

// Store returns the table's store.
func (s *State) Store() stores.Store { return s.store }

// Topic returns the changelog topic.
func (s *State) Topic() string { return s.topic }

// partitionLocks serializes the read-modify-write of Update per partition.
// The zero value is ready to use.
type partitionLocks struct {
	mu sync.Mutex
	m  map[int32]*sync.Mutex // guarded by mu
}

// lock locks partition p and returns the unlock.
func (l *partitionLocks) lock(p int32) func() {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[int32]*sync.Mutex{}
	}
	m := l.m[p]
	if m == nil {
		m = &sync.Mutex{}
		l.m[p] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// SetActive marks partition p as owned (writable) by this worker or not.
func (s *State) SetActive(p int32, active bool) {
	s.markMu.Lock()
	delete(s.marks, p)
	s.markMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active[p] != active {
		s.epoch[p]++
	}
	if active {
		s.active[p] = true
	} else {
		delete(s.active, p)
		// Writes not acknowledged yet no longer shadow the store: after the
		// release the store is brought up to date from the changelog.
		delete(s.overlay, p)
	}
}

func (s *State) get(p int32, key []byte) ([]byte, bool, error) {
	s.mu.Lock()
	if o, ok := s.overlay[p][string(key)]; ok {
		s.mu.Unlock()
		if o.deleted {
			return nil, false, nil
		}
		return o.value, true, nil
	}
	s.mu.Unlock()
	return s.store.Get(p, key)
}

func (s *State) write(ev Event, key, value []byte, del bool) error {
	return s.writeRouted(ev, key, key, value, del)
}

// writeRouted is write with the co-partitioning check made on route instead
// of key: a windowed table stores key+window start, and the partition is that
// of the table key alone (window.go).
func (s *State) writeRouted(ev Event, route, key, value []byte, del bool) error {
	p := ev.Partition()
	if q := kafka.PartitionFor(route, s.partitions); q != p {
		return fmt.Errorf("table %s: write of key %q from partition %d: the key belongs to partition %d: %w", s.name, key, p, q, ErrNotCoPartitioned)
	}
	s.mu.Lock()
	if !s.active[p] {
		s.mu.Unlock()
		return fmt.Errorf("table %s[%d]: %w", s.name, p, ErrNotActive)
	}
	done, ok := ev.BindPersist()
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("table %s[%d]: %w", s.name, p, ErrOutsideWindow)
	}
	s.seq++
	seq := s.seq
	epoch := s.epoch[p]
	m := s.overlay[p]
	if m == nil {
		m = map[string]overlayed{}
		s.overlay[p] = m
	}
	k := string(key)
	m[k] = overlayed{value: value, deleted: del, seq: seq}
	s.mu.Unlock()

	kc := append([]byte(nil), key...)
	var hs []Header
	var src *changelog.Source
	if o, ok := ev.(Originator); ok {
		org := o.Origin()
		src = &changelog.Source{Topic: org.Topic, Partition: org.Partition, Offset: org.Offset}
		for _, h := range src.Headers() {
			hs = append(hs, Header{Key: h[0], Value: h[1]})
		}
	}
	err := s.send(s.topic, p, kc, value, hs, func(offset int64, err error) {
		s.mu.Lock()
		// Only the activation that made the write may apply its ack: once the
		// partition was released (or released and acquired again), the store
		// belongs to the restore or the standby follower, which apply this
		// record from the changelog in offset order. Applying a late ack there
		// could put an older value, and an older checkpoint, over newer ones.
		if err == nil && s.epoch[p] == epoch && s.active[p] {
			b := &stores.Batch{Offset: offset}
			if del {
				b.Delete(kc)
			} else {
				b.Put(kc, value)
			}
			err = s.applyAcked(p, b, src)
		}
		if o, ok := s.overlay[p][k]; ok && o.seq == seq {
			delete(s.overlay[p], k)
		}
		s.mu.Unlock()
		done(err)
	})
	if err != nil {
		s.mu.Lock()
		if o, ok := s.overlay[p][k]; ok && o.seq == seq {
			delete(s.overlay[p], k)
		}
		s.mu.Unlock()
		done(err)
		return fmt.Errorf("table %s[%d]: send changelog record: %w", s.name, p, err)
	}
	return nil
}

// applyAcked applies the batch of an acknowledged changelog write to the
// store. When the write has a source record (src non-nil) and its offset is
// above the partition's mark for that source partition, the same batch raises
// the mark (changelog.Source.MarkKey), so the store records, atomically with
// the data, the highest source offset whose effect it holds. A restore
// compares the marks with the group's committed offsets to find a store that
// holds effects of records that will be processed again (docs/tables.md).
func (s *State) applyAcked(p int32, b *stores.Batch, src *changelog.Source) error {
	if src == nil {
		return s.store.Apply(p, b)
	}
	s.markMu.Lock()
	defer s.markMu.Unlock()
	m := s.marks[p]
	if m == nil {
		var err error
		if m, err = s.store.Marks(p); err != nil {
			return fmt.Errorf("table %s[%d]: read marks: %w", s.name, p, err)
		}
		s.marks[p] = m
	}
	k := src.MarkKey()
	cur, ok := m[k]
	if ok && src.Offset <= cur {
		return s.store.Apply(p, b)
	}
	b.Mark(k, src.Offset)
	if err := s.store.Apply(p, b); err != nil {
		return err
	}
	m[k] = src.Offset
	return nil
}
