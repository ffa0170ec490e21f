package table

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
)

// Event is the record being processed, as tables see it: an *agent.Event
// (the record an agent is on) or an *agent.Tick (a timer's firing); no other
// type implements it. A table write goes to the event's partition of the
// table (co-partitioning), and the record's offset is committed only with the
// commit cycle that holds the write.
//
// Tables and topics are declared once per app but run on every worker of a
// process (dev mode runs several), so they find the worker's runtime through
// the event, by a link that is no part of the event's API.
type Event interface {
	// Partition is the source partition of the record; a table write goes to the
	// same partition of the table (co-partitioning).
	Partition() int32
	carrier
}

// carrier is unexported so that the link from an event to its worker's
// runtime is no method of Event's API.
type carrier = evbind.Carrier[*Env]

// envOf returns the runtime of the worker processing ev, nil outside a worker.
func envOf(ev Event) *Env {
	if b := evbind.Of(ev); b != nil {
		return b.Env()
	}
	return nil
}

// Env is one worker's runtime as tables and sinks see it: each table's state
// and the producer for derived records.
type Env struct {
	// States maps a table name to its runtime on this worker.
	States map[string]*State
	// Send produces derived records (sinks).
	Send SendFunc
	// SendAt, when set, is Send with the record's timestamp (zero: the
	// producer's clock); repartition topics use it to keep the source
	// record's event time, timers to stamp their records with the firing's.
	SendAt func(topic string, p int32, key, value []byte, ts time.Time, ack Acker) error
	// StreamTime, when set, is advanced by the agents of one source
	// partition to the timestamp of every record they receive: the
	// partition's stream time, which stream-time timers follow.
	StreamTime *StreamTime
	// Globals maps a global table's name to this worker's replica (global.go).
	Globals map[string]*GlobalState
	// InFlight, when set, counts the derived records of the events of one
	// source partition that the broker has not answered yet; the worker waits
	// for it before it gives the partition up.
	InFlight *InFlight
	// Partitions is the partition count of the source topic whose events
	// use this Env (0: not checked). A table write goes to partition p of
	// the table for an event of partition p, so a table must have the
	// source's count (co-partitioning): otherwise a write from partition p
	// would land in the cache of another task's partition p, whose cycles
	// never commit the writer's offsets (ErrNotCoPartitioned).
	Partitions int32
	// Replay is set when the events are replayed (package replay) rather
	// than processed live: it decides which named external effect
	// (agent.Effect) still applies. Nil in a live worker: every effect
	// applies.
	Replay ReplayGate
	// Agent, when not empty, names the agent whose events and timer
	// firings use this Env; Writes and Sends are the tables and topics it
	// declared (agent.WritesTo, agent.SendsTo). A write to another table
	// or a send to another topic is refused with an *UndeclaredError, so
	// what describe shows is everything the agent writes. Empty: nothing
	// is checked (the worker's own writes, such as a join's backfill).
	Agent         string
	Writes, Sends []string
}

// UndeclaredError is the error of a table write or a send that the agent
// making it did not declare: Table names a table it wrote without
// agent.WritesTo, or Topic a topic it sent to without agent.SendsTo. It is a
// fix of the code that no redelivery makes: the worker stops on it, and the
// record is not committed.
type UndeclaredError struct {
	Agent string
	// Table or Topic (one of them) is what the agent wrote or sent to.
	Table, Topic string
}

func (e *UndeclaredError) Error() string {
	if e.Table != "" {
		return fmt.Sprintf("agent %s writes table %s, which it did not declare: add agent.WritesTo(<table %s>) to the options of agent.New for %s", e.Agent, e.Table, e.Table, e.Agent)
	}
	return fmt.Sprintf("agent %s sends to topic %s, which it did not declare: add agent.SendsTo(<topic %s>) to the options of agent.New for %s", e.Agent, e.Topic, e.Topic, e.Agent)
}

// checkWrite returns an *UndeclaredError when e's agent did not declare that
// it writes the table name (agent.WritesTo); nil when it did or e checks
// nothing.
func (e *Env) checkWrite(name string) error {
	if e == nil || e.Agent == "" || slices.Contains(e.Writes, name) {
		return nil
	}
	return &UndeclaredError{Agent: e.Agent, Table: name}
}

// ReplayGate is how a replay (package replay) tells an agent's named effects
// (agent.Effect) whether they are live. A replay names one effect; every
// other is skipped, so replaying history never re-sends notifications.
type ReplayGate interface {
	// Live reports whether the effect named effect applies in this replay.
	Live(effect string) bool
	// Done records one call of a live effect: applied is false when the
	// effect found it had already been applied (a duplicate), err is the
	// effect's error.
	Done(effect string, applied bool, err error)
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

// Option configures a table (New, NewGlobal, Join). Every Option is also a
// WindowOption, so Partitions configures a windowed table too.
type Option interface {
	WindowOption
	apply(*options)
}

type options struct{ partitions int32 }

// Partitions sets the table's partition count (New, NewGlobal, Join,
// NewWindowed); default: that of the source topics of the app (which must
// then agree). It is the partition count of the table's changelog topic, and
// a table is written from a topic with the same count (co-partitioning: the
// App refuses another at build). app.Partitions sets a topic's, and
// agent.Partitions a repartition topic's.
func Partitions(n int32) Option { return partitionsOption(n) }

// partitionsOption is Partitions: a table option and a window option.
type partitionsOption int32

func (n partitionsOption) apply(o *options)             { o.partitions = int32(n) }
func (n partitionsOption) applyWindow(o *windowOptions) { o.partitions = int32(n) }

// Table is a typed, partitioned key/value table. Writes go to the write cache
// of the event's partition and reach the changelog and the store in the
// partition's commit cycles (State); reads see the worker's own writes at
// once.
type Table[K any, V any] struct {
	declared[K, V]
	// watchers run after every successful write (Put, Delete), with the same
	// event (the joins of the table: join.go). Set at declaration.
	watchers []func(ev Event, key K) error
	// joined is set on the table of a join (Join): the join writes it when
	// an agent writes one of its sides, which the agent declared, so its
	// writes are not checked against the agent's declarations.
	joined bool
}

// watch adds fn to the functions run after every write of the table.
func (t *Table[K, V]) watch(fn func(ev Event, key K) error) { t.watchers = append(t.watchers, fn) }

// written runs the watchers after a write of key.
func (t *Table[K, V]) written(ev Event, key K) error {
	for _, fn := range t.watchers {
		if err := fn(ev, key); err != nil {
			return err
		}
	}
	return nil
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

// encodeValue encodes the value of key (the error names both the table and
// the key).
func (d *declared[K, V]) encodeValue(key K, value V) ([]byte, error) {
	vb, err := d.vc.Encode(value)
	if err != nil {
		return nil, fmt.Errorf("table %s: encode value (key %v): %w", d.name, key, err)
	}
	return vb, nil
}

func declare[K any, V any](h Host, name string, kc codec.Codec[K], vc codec.Codec[V], opts []Option) declared[K, V] {
	d := declared[K, V]{name: name, topic: changelog.Topic(h.AppID(), name), kc: kc, vc: vc}
	for _, o := range opts {
		o.apply(&d.opts)
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
	env := envOf(ev)
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

// Put writes value under key in the current commit cycle of ev's partition
// (read at once; in the changelog and the store when the cycle ends): Kafka
// Streams' store.put, Faust's table[key] = value.
//
// A write that fails fails the event (see the package documentation): the
// agent's stream yields no further event, Stream.Err returns the error, and
// the agent fails with it by its error policy, even if its function returns
// nil. Use TryPut to handle the error instead.
func (t *Table[K, V]) Put(ev Event, key K, value V) { failOn(ev, t.TryPut(ev, key, value)) }

// TryPut is Put returning the write's error instead of failing the event.
// Errors: ErrNotRunning, ErrEventFailed, the codecs', ErrNotCoPartitioned,
// ErrNotActive, ErrOutsideWindow, and those of the joins the table feeds.
func (t *Table[K, V]) TryPut(ev Event, key K, value V) error {
	return setKey[K, V](t, ev, key, value)
}

// Update replaces the value of key with fn(old), where old is the zero value
// when the key is absent, and returns the new value. The write goes to the
// current commit cycle of ev's partition.
//
// The read and the write are one step for the partition: agents that update
// the same table partition concurrently (several agents on one topic, or on
// co-partitioned topics) never lose each other's updates. fn must not use the
// same table.
//
// A read or write that fails fails the event, as Put's does; use TryUpdate
// to handle the error instead.
func (t *Table[K, V]) Update(ev Event, key K, fn func(old V) V) V {
	v, err := t.TryUpdate(ev, key, fn)
	failOn(ev, err)
	return v
}

// TryUpdate is Update returning the error instead of failing the event.
// Errors: Get's and TryPut's.
func (t *Table[K, V]) TryUpdate(ev Event, key K, fn func(old V) V) (V, error) {
	return updateKey[K, V](t, ev, key, fn)
}

// Compute sets, keeps or deletes key by what fn returns for its current value
// (Java's Map.compute, Faust's table[key] = f(table.get(key))): fn gets the old
// value and whether the key exists (found false: old is the zero value), and
// returns the new value and whether the key is to exist. keep false deletes
// the key (a tombstone in the changelog), or writes nothing when it was
// absent. Compute returns the new value (the zero value when deleted) and
// whether the key exists now. Like Update, the read and the write are one
// step for the partition and fn must not use the same table; a failure fails
// the event (TryCompute returns it instead).
//
//	// a session per user, deleted at logout
//	sessions.Compute(ev, ev.Key, func(s Session, found bool) (Session, bool) {
//		if ev.Value.Kind == "logout" {
//			return s, false
//		}
//		if !found {
//			s.Start = ev.Timestamp()
//		}
//		s.Events++
//		return s, true
//	})
func (t *Table[K, V]) Compute(ev Event, key K, fn func(old V, found bool) (V, bool)) (V, bool) {
	v, ok, err := t.TryCompute(ev, key, fn)
	failOn(ev, err)
	return v, ok
}

// TryCompute is Compute returning the error instead of failing the event.
// Errors: Get's, TryPut's and TryDelete's.
func (t *Table[K, V]) TryCompute(ev Event, key K, fn func(old V, found bool) (V, bool)) (V, bool, error) {
	return computeKey[K, V](t, ev, key, fn)
}

// Delete removes key (a tombstone in the changelog) in the current commit
// cycle of ev's partition. A failure fails the event, as Put's does; use
// TryDelete to handle the error instead.
func (t *Table[K, V]) Delete(ev Event, key K) { failOn(ev, t.TryDelete(ev, key)) }

// TryDelete is Delete returning the error instead of failing the event.
// Errors: those of TryPut.
func (t *Table[K, V]) TryDelete(ev Event, key K) error { return deleteKey[K, V](t, ev, key) }

// writer implements writable.
func (t *Table[K, V]) writer(ev Event) (partitionWriter, error) {
	if !t.joined {
		if err := envOf(ev).checkWrite(t.name); err != nil {
			return nil, err
		}
	}
	return writerOf(t.current(ev))
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

// ErrEventFailed is returned for a write or send made with an event whose
// run already failed: an earlier write or send made with one of the run's
// events (the agent's stream, the timer's firing) failed it (Put, Update,
// Topic.Send and the other write methods that return no error). The error
// wraps that first failure. The run ends there, so its later writes are
// refused rather than made for an event that is redelivered or dead-lettered.
var ErrEventFailed = errors.New("an earlier write failed the event")

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

// SendFunc produces one derived record (a sink record) to partition p of
// topic (value nil is a tombstone) and reports the broker's answer to ack,
// exactly once, unless it returns an error (then ack is never called). ack is
// an interface rather than a func so that a sink record costs no closure.
type SendFunc func(topic string, p int32, key, value []byte, ack Acker) error

// Acker receives the broker's answer for one produced record: the record's
// offset and a nil error once the broker acknowledged it (acks=all), or the
// error after the producer's retries.
type Acker interface {
	Acked(offset int64, err error)
}

// AckFunc adapts a func to Acker.
type AckFunc func(offset int64, err error)

// Acked implements Acker.
func (f AckFunc) Acked(offset int64, err error) { f(offset, err) }

// DefaultCacheBytes is the size of one table partition's write cache (keys
// and values of the current cycle's writes, plus 64 bytes per entry) at which
// the partition asks its task for an early commit cycle (Kafka Streams'
// statestore.cache.max.bytes, per partition here). The cache keeps taking
// writes until the cycle cuts it.
const DefaultCacheBytes = 4 << 20

// State is a table's runtime on one worker: its store, the changelog producer,
// and per active partition the write cache of the current commit cycle.
//
// Commit cycles (docs/tables.md): a write goes to the partition's cache (one
// entry per key; reads see it at once). The partition's task ends a cycle by
// cutting the cache (Cut) at a point where every source record before the
// cycle's commit point was processed and none after it was, sending one
// changelog record per key (Flush.Send), waiting for the broker's acks
// (Flush.Wait), committing the source offsets, and applying the cycle to the
// store in one batch with the changelog checkpoint and the marks
// (Flush.Apply).
//
// Invariant (kept by Cut and Flush.Apply): the store holds exactly the
// changelog's records up to its checkpoint; a write is in the store only once
// its changelog record was acknowledged. Reads see the cache, then the cycle
// being flushed, then the store.
type State struct {
	stateBase

	// CacheBytes overrides DefaultCacheBytes (set before the worker starts).
	CacheBytes int
	// OnFull, if set, is called (without locks held) when partition p's cache
	// reached CacheBytes; the worker asks p's task for a cycle.
	OnFull func(p int32)
	// OwnedWrites, set before the first write, makes an active partition
	// writable only while a task owns it (Own): a write no task's cycle
	// would cut fails with ErrNotOwned instead of waiting in a cache that
	// is never flushed while the records' offsets commit (lost updates).
	// The worker sets it; replay's scratch tables and standalone uses,
	// which cut by hand, leave it off.
	OwnedWrites bool

	mu    sync.Mutex
	parts map[int32]*partState // active partitions; guarded by mu
	// owned are the partitions a task cuts (Own); guarded by mu. Kept
	// across SetActive, so that a task that resets a partition in place
	// keeps owning it.
	owned map[int32]bool

	hits, misses atomic.Int64 // reads answered by the caches, by the store (CacheStats)
}

// CacheStats returns how many reads of active partitions the write caches
// (the current cycle's and the one being flushed) answered, and how many
// reads went to the store, since the State was created.
func (s *State) CacheStats() (hits, misses int64) { return s.hits.Load(), s.misses.Load() }

// partState is one active partition's cycle state.
type partState struct {
	mu       sync.Mutex
	epoch    int64                // writer epoch of this activation (changelog.Stamp)
	dirty    map[string]cacheItem // the current cycle's writes; guarded by mu
	flushing map[string]cacheItem // the cycle being flushed, nil when none; guarded by mu
	bytes    int                  // size of dirty; guarded by mu
	full     bool                 // OnFull called for this cycle; guarded by mu
	// miss is the last store read of a key in neither layer (State.get),
	// kept so that the write that usually follows it (Update's
	// read-modify-write) takes it as the key's before-image instead of the
	// flush reading the store again (issue #28: each key was read from
	// Pebble twice per cycle). gen counts the flushing layers dropped
	// (applied or abandoned): a read older than the last one is not kept.
	// Guarded by mu.
	miss missRead
	gen  uint64
}

// missRead is a store read of one key (partState.miss).
type missRead struct {
	key          string
	value        []byte
	found, valid bool
}

type cacheItem struct {
	value   []byte // nil for a delete
	deleted bool
	// before is the key's value in the store before the cycle (its
	// before-image) when the cycle's first write of the key came right
	// after a read of it that missed the caches (hasBefore; beforeFound:
	// the store held the key). Invariant: a key in neither layer has the
	// same value in the store from that read to the cycle's flush, as only
	// the apply of a cycle holding the key changes it (partState.noteMiss).
	before                 []byte
	hasBefore, beforeFound bool
}

// NewState creates the runtime of table d with the given store and producer.
func NewState(d Def, partitions int32, st stores.Store, send ChangelogSendFunc) *State {
	return &State{stateBase: newStateBase(d, partitions, st, send), parts: map[int32]*partState{}, owned: map[int32]bool{}}
}

// ErrNotOwned is returned for a write to an active partition that no running
// task owns (State.OwnedWrites): no cycle would cut it. It wraps
// ErrNotActive. In a worker it means a broken invariant, not bad input: the
// worker stops.
var ErrNotOwned = fmt.Errorf("no running task cuts the partition: %w", ErrNotActive)

// ErrOwned is returned by Own for a partition another task already owns.
var ErrOwned = errors.New("partition is already owned by another task")

// Own makes the calling task the owner of partition p, the one task whose
// cycles cut it: with OwnedWrites, the partition accepts writes until Disown
// (Cut itself does not check the owner; the worker cuts a partition only in
// its owner's cycles). Errors: ErrOwned when another task owns p (two tasks
// cutting one partition would each commit offsets for writes the other
// flushed).
func (s *State) Own(p int32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.owned[p] {
		return fmt.Errorf("table %s[%d]: %w", s.name, p, ErrOwned)
	}
	s.owned[p] = true
	return nil
}

// Disown ends the ownership Own gave: with OwnedWrites, writes to p fail
// until a task owns it again.
func (s *State) Disown(p int32) {
	s.mu.Lock()
	delete(s.owned, p)
	s.mu.Unlock()
}

// Store returns the table's store.
func (s *State) Store() stores.Store { return s.store }

// stateBase is what a table's runtime (State) and a global table's replica
// (GlobalState) share: the table's names and partition count, its store and
// changelog producer, and Update's per-partition lock.
type stateBase struct {
	name, topic string
	partitions  int32
	store       stores.Store
	send        ChangelogSendFunc
	rmw         partitionLocks // Update's read-modify-write, per partition
}

func newStateBase(d Def, partitions int32, st stores.Store, send ChangelogSendFunc) stateBase {
	return stateBase{name: d.Name(), topic: d.Changelog(), partitions: partitions, store: st, send: send}
}

// Topic returns the changelog topic.
func (s *stateBase) Topic() string { return s.topic }

// Name returns the table's name.
func (s *stateBase) Name() string { return s.name }

// Partitions returns the table's partition count (its changelog's).
func (s *stateBase) Partitions() int32 { return s.partitions }

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

// SetActive marks partition p as owned (writable) by this worker or not. An
// activation takes the writer epoch one above the highest the store's
// partition applied (changelog.EpochMark, raised by the restore that precedes
// it); a deactivation drops the cache and any cycle not applied: after the
// release the store is brought up to date from the changelog. Errors: the
// store's, reading the marks.
func (s *State) SetActive(p int32, active bool) error {
	if !active {
		s.mu.Lock()
		delete(s.parts, p)
		s.mu.Unlock()
		return nil
	}
	marks, err := s.store.Marks(p)
	if err != nil {
		return fmt.Errorf("table %s[%d]: read marks: %w", s.name, p, err)
	}
	ps := &partState{epoch: marks[changelog.EpochMark] + 1, dirty: map[string]cacheItem{}}
	s.mu.Lock()
	s.parts[p] = ps
	s.mu.Unlock()
	return nil
}

// Epoch returns the writer epoch of active partition p (0 when inactive).
func (s *State) Epoch(p int32) int64 {
	if ps := s.part(p); ps != nil {
		return ps.epoch
	}
	return 0
}

func (s *State) part(p int32) *partState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parts[p]
}

func (s *State) get(p int32, key []byte) ([]byte, bool, error) {
	ps := s.part(p)
	var gen uint64
	if ps != nil {
		it, ok, g := ps.lookupGen(key)
		if ok {
			s.hits.Add(1)
			if it.deleted {
				return nil, false, nil
			}
			return it.value, true, nil
		}
		gen = g
	}
	s.misses.Add(1)
	v, found, err := s.store.Get(p, key)
	if err == nil && ps != nil {
		ps.noteMiss(key, v, found, gen)
	}
	return v, found, err
}

// eachUnapplied calls fn for every write of partition p not yet in the store
// (the cycle being flushed, then the cache over it).
func (s *State) eachUnapplied(p int32, fn func(key string, value []byte, deleted bool)) {
	ps := s.part(p)
	if ps == nil {
		return
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k, it := range ps.flushing {
		if _, ok := ps.dirty[k]; !ok {
			fn(k, it.value, it.deleted)
		}
	}
	for k, it := range ps.dirty {
		fn(k, it.value, it.deleted)
	}
}

// windowChecker is implemented by events that can tell whether their window
// is still open (agent.Event).
type windowChecker interface{ InWindow() bool }

func (s *State) write(ev Event, key, value []byte, del bool) error {
	return s.writeRouted(ev, key, key, value, del)
}

// writeRouted is write with the co-partitioning check made on route instead
// of key: a windowed table stores key+window start, and the partition is that
// of the table key alone (window.go).
func (s *State) writeRouted(ev Event, route, key, value []byte, del bool) error {
	p, err := s.partitionOf(ev, route, key)
	if err != nil {
		return err
	}
	s.mu.Lock()
	ps, owned := s.parts[p], s.owned[p] || !s.OwnedWrites
	s.mu.Unlock()
	if ps != nil && !owned {
		return fmt.Errorf("table %s[%d]: %w", s.name, p, ErrNotOwned)
	}
	return s.cache(ev, p, ps, key, value, del, s.CacheBytes, s.OnFull)
}

// partitionOf returns the partition of ev, which route must belong to
// (ErrNotCoPartitioned otherwise; key names the write in the error).
func (b *stateBase) partitionOf(ev Event, route, key []byte) (int32, error) {
	p := ev.Partition()
	if env := envOf(ev); env != nil && env.Partitions > 0 && env.Partitions != b.partitions {
		return p, fmt.Errorf("table %s (%d partitions): write of key %q from a topic with %d partitions: %w", b.name, b.partitions, key, env.Partitions, ErrNotCoPartitioned)
	}
	if q := kafka.PartitionFor(route, b.partitions); q != p {
		return p, fmt.Errorf("table %s: write of key %q from partition %d: the key belongs to partition %d: %w", b.name, key, p, q, ErrNotCoPartitioned)
	}
	return p, nil
}

// cache puts a checked write into partition p's write cache ps (nil: the
// partition is not active here, ErrNotActive) unless ev's window closed
// (ErrOutsideWindow), and calls onFull (if set) when the cache reached limit
// bytes. State and GlobalState write through it.
func (b *stateBase) cache(ev Event, p int32, ps *partState, key, value []byte, del bool, limit int, onFull func(int32)) error {
	if ps == nil {
		return fmt.Errorf("table %s[%d]: %w", b.name, p, ErrNotActive)
	}
	if wc, ok := ev.(windowChecker); ok && !wc.InWindow() {
		return fmt.Errorf("table %s[%d]: %w", b.name, p, ErrOutsideWindow)
	}
	if ps.put(string(key), value, del, limit) && onFull != nil {
		onFull(p)
	}
	return nil
}

// CacheSize returns the size of active partition p's write cache, the
// writes of the current cycle: entries is one per key, bytes counts keys and
// values plus 64 bytes per entry (the measure CacheBytes is compared with).
// The cycle being flushed is not counted. Both are 0 when p is inactive.
func (s *State) CacheSize(p int32) (entries, bytes int) {
	if ps := s.part(p); ps != nil {
		return ps.size()
	}
	return 0, 0
}

// Drop discards partition p's cache (the writes of the current cycle), as a
// failed record's task does before it resumes from its last cycle.
func (s *State) Drop(p int32) {
	if ps := s.part(p); ps != nil {
		ps.drop()
	}
}

// Cutter is a table runtime whose writes a task commits in cycles: State
// (plain and windowed tables) and GlobalState.
type Cutter interface {
	// Name is the table's name.
	Name() string
	// Cut ends partition p's current cycle and returns it, nil when nothing
	// was written (see State.Cut).
	Cut(p int32) Cycle
	// Drop discards partition p's cache.
	Drop(p int32)
	// CacheSize is the size of partition p's write cache (see
	// State.CacheSize): the task holds its sources back while it is at or
	// over the hard limit (task.Task.OverLimit).
	CacheSize(p int32) (entries, bytes int)
}

// Cycle is one cut commit cycle of one table partition (Flush, for plain
// tables).
type Cycle interface {
	// Records is how many changelog records the cycle writes.
	Records() int
	// Send produces the cycle's changelog records, stamped with sources.
	Send(sources []changelog.Source) error
	// Wait waits for the broker's answers (nil: all acknowledged).
	Wait(ctx context.Context) error
	// Apply makes the acknowledged cycle the table's state.
	Apply() error
	// Drop abandons the cycle.
	Drop()
}

// Flush is one cut commit cycle of one table partition: its writes, sent as
// changelog records and then applied to the store.
type Flush struct {
	name, topic string
	send        ChangelogSendFunc
	p           int32
	ps          *partState
	keys        []string
	items       []cacheItem
	// before reads a key's value before the cycle (the before-image);
	// applyFn makes the acknowledged cycle the table's state.
	before  func(key []byte) ([]byte, bool, error)
	applyFn func(f *Flush) error
	// offs, when not nil, receives each key's changelog offset.
	offs []int64

	mu      sync.Mutex
	pending int           // records not answered; guarded by mu
	last    int64         // highest acknowledged offset; guarded by mu
	err     error         // first send or broker error; guarded by mu
	done    chan struct{} // closed when pending reaches 0 after Send
	sources []changelog.Source
}

// Cut ends partition p's current cycle: its cache becomes the cycle being
// flushed (still read through) and a new cache starts. It returns nil when p
// is not active or nothing was written. The caller (the task) runs one cycle
// of a partition at a time: Cut again only after the last Flush was applied
// or dropped.
func (s *State) Cut(p int32) Cycle {
	ps := s.part(p)
	if ps == nil {
		return nil
	}
	keys, items := ps.cut()
	if keys == nil {
		return nil
	}
	return &Flush{name: s.name, topic: s.topic, send: s.send, p: p, ps: ps, keys: keys, items: items,
		done: make(chan struct{}), last: stores.NoOffset,
		before:  func(key []byte) ([]byte, bool, error) { return s.store.Get(p, key) },
		applyFn: s.applyCycle}
}

// cut moves the cache to the flushing layer and returns its keys and items
// (nil when the cache is empty).
func (ps *partState) cut() ([]string, []cacheItem) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if len(ps.dirty) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(ps.dirty))
	items := make([]cacheItem, 0, len(ps.dirty))
	for k, it := range ps.dirty {
		keys = append(keys, k)
		items = append(items, it)
	}
	ps.flushing = ps.dirty
	ps.dirty = make(map[string]cacheItem, len(keys))
	ps.bytes, ps.full = 0, false
	return keys, items
}

// lookup reads key from the cache, then the flushing layer; found is false
// when neither has it.
// lookupGen is lookup that also returns the count of flushing layers
// dropped so far (partState.gen), read with it.
func (ps *partState) lookupGen(key []byte) (it cacheItem, found bool, gen uint64) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if it, ok := ps.dirty[string(key)]; ok {
		return it, true, ps.gen
	}
	it, ok := ps.flushing[string(key)]
	return it, ok, ps.gen
}

// noteMiss keeps a store read of key that missed both layers (State.get)
// for the key's next write to take as its before-image. It is kept only
// when nothing could have changed the key in the store since the lookup
// that missed (gen): no flushing layer was dropped since (an apply
// changes the store) and the key is still in neither layer.
func (ps *partState) noteMiss(key, value []byte, found bool, gen uint64) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.gen != gen {
		return
	}
	k := string(key)
	if _, ok := ps.dirty[k]; ok {
		return
	}
	if _, ok := ps.flushing[k]; ok {
		return
	}
	ps.miss = missRead{key: k, value: value, found: found, valid: true}
}

func (ps *partState) lookup(key []byte) (it cacheItem, found bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if it, ok := ps.dirty[string(key)]; ok {
		return it, true
	}
	it, ok := ps.flushing[string(key)]
	return it, ok
}

// put writes key to the cache and reports whether the cache just reached
// limit bytes (once per cycle).
func (ps *partState) put(key string, value []byte, del bool, limit int) (full bool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	it := cacheItem{value: value, deleted: del}
	if old, ok := ps.dirty[key]; ok {
		ps.bytes -= len(key) + len(old.value) + len(old.before) + 64
		it.before, it.hasBefore, it.beforeFound = old.before, old.hasBefore, old.beforeFound
	} else if _, flushing := ps.flushing[key]; !flushing && ps.miss.valid && ps.miss.key == key {
		// The cycle's first write of a key read from the store just before:
		// that read is its before-image (cacheItem.before).
		it.before, it.hasBefore, it.beforeFound = ps.miss.value, true, ps.miss.found
	}
	if ps.miss.key == key {
		ps.miss = missRead{} // used, or older than this write
	}
	ps.dirty[key] = it
	ps.bytes += len(key) + len(value) + len(it.before) + 64
	if limit <= 0 {
		limit = DefaultCacheBytes
	}
	if ps.bytes >= limit && !ps.full {
		ps.full = true
		return true
	}
	return false
}

// size returns the cache's entries and bytes (see State.CacheSize).
func (ps *partState) size() (entries, bytes int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.dirty), ps.bytes
}

// drop empties the cache.
func (ps *partState) drop() {
	ps.mu.Lock()
	ps.dirty = map[string]cacheItem{}
	ps.bytes, ps.full = 0, false
	ps.mu.Unlock()
}

// Records returns how many changelog records the flush writes (one per key).
func (f *Flush) Records() int { return len(f.keys) }

// Send produces one changelog record per key of the cycle, stamped with the
// partition's writer epoch, the cycle's sources (each with the last source
// offset whose effect the cycle holds) and the key's before-image read from
// the store (changelog.Stamp). The broker's answers are collected for Wait.
// Errors: the store's (reading a before-image) and the producer's; records
// already sent are still waited for.
func (f *Flush) Send(sources []changelog.Source) error {
	f.sources = sources
	f.mu.Lock()
	f.pending = len(f.keys) + 1 // +1 until every record is handed over
	f.mu.Unlock()
	var stampBuf []byte
	var sendErr error
	for i, k := range f.keys {
		key := []byte(k)
		var before []byte
		var found bool
		var err error
		if it := f.items[i]; it.hasBefore {
			before, found = it.before, it.beforeFound
		} else {
			before, found, err = f.before(key)
		}
		if err != nil {
			sendErr = fmt.Errorf("table %s[%d]: read before-image: %w", f.name, f.p, err)
			f.answer(stores.NoOffset, sendErr, len(f.keys)-i)
			break
		}
		if !found {
			before = nil
		} else if before == nil {
			before = []byte{}
		}
		st := changelog.Stamp{Epoch: f.ps.epoch, Sources: sources, HasBefore: true, Before: before}
		stampBuf = st.Append(stampBuf[:0])
		hs := []Header{{Key: []byte(changelog.HeaderStamp), Value: append([]byte(nil), stampBuf...)}}
		it := f.items[i]
		var value []byte
		if !it.deleted {
			value = it.value
			if value == nil {
				value = []byte{}
			}
		}
		done := f.answer1
		if f.offs != nil {
			i := i
			done = func(offset int64, err error) {
				f.mu.Lock()
				f.offs[i] = offset
				f.mu.Unlock()
				f.answer(offset, err, 1)
			}
		}
		if err := f.send(f.topic, f.p, key, value, hs, done); err != nil {
			sendErr = fmt.Errorf("table %s[%d]: send changelog record: %w", f.name, f.p, err)
			f.answer(stores.NoOffset, sendErr, len(f.keys)-i)
			break
		}
	}
	f.answer(stores.NoOffset, nil, 1)
	return sendErr
}

func (f *Flush) answer1(offset int64, err error) { f.answer(offset, err, 1) }

func (f *Flush) answer(offset int64, err error, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil && f.err == nil {
		f.err = err
	}
	f.last = max(f.last, offset)
	f.pending -= n
	if f.pending == 0 {
		close(f.done)
	}
}

// Wait returns when the broker answered every record of the flush: nil when
// it acknowledged all of them, else the first error (with the table and
// partition), or ctx's error.
func (f *Flush) Wait(ctx context.Context) error {
	select {
	case <-f.done:
	case <-ctx.Done():
		return fmt.Errorf("table %s[%d]: waiting for %d changelog acks: %w", f.name, f.p, f.pendingCount(), ctx.Err())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return fmt.Errorf("table %s[%d]: changelog write: %w", f.name, f.p, f.err)
	}
	return nil
}

func (f *Flush) pendingCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pending
}

// Apply makes the acknowledged cycle the table's state (for a plain table:
// one store batch with the data, the checkpoint, the source marks and the
// epoch mark; State.applyCycle) and stops reading the cycle through. Call it
// only after Wait returned nil.
func (f *Flush) Apply() error {
	err := f.applyFn(f)
	f.Drop()
	return err
}

// applyCycle writes an acknowledged cycle to the store in one batch: the
// data, the checkpoint (the highest acknowledged offset), the source marks
// (the cycle's sources) and the epoch mark. A partition released in the
// meantime is not written (its store belongs to the restore or the standby
// follower now).
func (s *State) applyCycle(f *Flush) error {
	s.mu.Lock()
	current := s.parts[f.p] == f.ps
	s.mu.Unlock()
	if !current {
		return nil
	}
	b := &stores.Batch{Offset: f.last, Ops: make([]stores.Op, 0, len(f.keys))}
	for i, k := range f.keys {
		if f.items[i].deleted {
			b.Delete([]byte(k))
		} else {
			b.Put([]byte(k), f.items[i].value)
		}
	}
	for _, src := range f.sources {
		b.Mark(src.MarkKey(), src.Offset)
	}
	b.Mark(changelog.EpochMark, f.ps.epoch)
	if err := s.store.Apply(f.p, b); err != nil {
		return fmt.Errorf("table %s[%d]: apply cycle: %w", s.name, f.p, err)
	}
	return nil
}

// Drop stops reading the cycle through (after Apply, or when the cycle is
// abandoned: the task reverts to its last applied cycle).
func (f *Flush) Drop() {
	f.ps.mu.Lock()
	f.ps.flushing = nil
	f.ps.gen++ // the store may hold the cycle now: older reads are not kept (noteMiss)
	f.ps.mu.Unlock()
}
