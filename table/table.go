package table

import (
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"slices"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
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
type carrier = evbind.Carrier[*tablestate.Env]

// link is unexported so that a table's runtime side (tablestate.Link) is no
// field of its API.
type link = tablestate.Link

// envOf returns the runtime of the worker processing ev, nil outside a worker.
func envOf(ev Event) *tablestate.Env { return tablestate.EnvOf(ev) }

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

// checkWrite returns an *UndeclaredError when the agent of e (a worker's
// runtime) did not declare that
// it writes the table name (agent.WritesTo); nil when it did or e checks
// nothing.
func checkWrite(e *tablestate.Env, name string) error {
	if e == nil || e.Agent == "" || slices.Contains(e.Writes, name) {
		return nil
	}
	return &UndeclaredError{Agent: e.Agent, Table: name}
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
// partition's commit cycles (docs/tables.md); reads see the worker's own writes at
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

func (t *Table[K, V]) current(ev Event) (*tablestate.State, error) {
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
	b, ok, err := s.Get(ev.Partition(), kb)
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
		if err := checkWrite(envOf(ev), t.name); err != nil {
			return nil, err
		}
	}
	s, err := t.current(ev)
	return writerOf((*stateWriter)(s), err)
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
var ErrNotCoPartitioned = tablestate.ErrNotCoPartitioned

// ErrNotActive is returned for a write to a partition this worker does not own
// (a revoked partition's agent still writing, for one).
var ErrNotActive = tablestate.ErrNotActive

// ErrOutsideWindow is returned for a write made after the agent pulled the next
// record (or after the event was resolved): it could not be bound to its event.
var ErrOutsideWindow = tablestate.ErrOutsideWindow

// ErrEventFailed is returned for a write or send made with an event whose
// run already failed: an earlier write or send made with one of the run's
// events (the agent's stream, the timer's firing) failed it (Put, Update,
// Topic.Send and the other write methods that return no error). The error
// wraps that first failure. The run ends there, so its later writes are
// refused rather than made for an event that is redelivered or dead-lettered.
var ErrEventFailed = errors.New("an earlier write failed the event")
