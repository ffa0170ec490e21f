package tablestate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/internal/evbind"
)

// Event is the record being processed, as the runtime sees it: the same
// method set as table.Event (an *agent.Event or an *agent.Tick), so that a
// table.Event is an Event. The link to the worker's runtime is no method of
// the event's API (evbind).
type Event interface {
	// Partition is the source partition of the record; a table write goes
	// to the same partition of the table (co-partitioning).
	Partition() int32
	carrier
}

// carrier is unexported so that the link from an event to its worker's
// runtime is no method of Event's API.
type carrier = evbind.Carrier[*Env]

// EnvOf returns the runtime of the worker processing ev, nil outside a worker.
func EnvOf(ev Event) *Env {
	if b := evbind.Of(ev); b != nil {
		return b.Env()
	}
	return nil
}

// EventTime returns ev's event time: the source record's timestamp for an
// agent's event, the firing's time for a timer's tick; zero when ev carries
// none (an event not made by a worker).
func EventTime(ev Event) time.Time {
	if b := evbind.Of(ev); b != nil {
		return b.EventTime()
	}
	return time.Time{}
}

// Def is a table as the runtime manages it, independent of its key and value
// types: the same method set as table.Def, so that every table.Def is a Def.
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
	// SendFrom, when set, is SendAt for a record a Deterministic agent
	// derives from o's source record into a repartition topic: the worker
	// stamps it with where it comes from (package dedup). Set under
	// at-least-once only.
	SendFrom func(o Origin, topic string, p int32, key, value []byte, ts time.Time, ack Acker) error
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
	// or a send to another topic is refused with a *table.UndeclaredError,
	// so what describe shows is everything the agent writes. Empty: nothing
	// is checked (the worker's own writes, such as a join's backfill).
	Agent         string
	Writes, Sends []string
}

// Origin is the source record a derived record comes from, as SendFrom
// stamps it.
type Origin struct {
	Agent     string
	Topic     string
	Partition int32
	Offset    int64
	// Payload is what the source producer delivered the record with
	// (source.Delivery.Payload): the worker's incarnation of the partition.
	Payload any
	// Sends counts the event's stamped sends so far; SendFrom numbers the
	// record with it and increments it (under the run's lock).
	Sends *uint32
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
	// failures counts the partition's events left unfinished: a derived
	// record the broker refused (Fail), an agent that failed (the worker's
	// supervisor). Stamped sends leave a gap after each (app/dedup.go).
	failures atomic.Uint64
}

// Fail counts one failure of an event of the partition: call it before the
// failure is made visible to the agent (the event's token failed, the agent
// run again), so that the agent's later sends see it.
func (f *InFlight) Fail() { f.failures.Add(1) }

// Failures returns how many failures Fail counted.
func (f *InFlight) Failures() uint64 { return f.failures.Load() }

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

// The errors a table write can meet. Package table exports them under the
// same names (table.ErrNotCoPartitioned is ErrNotCoPartitioned): a user
// branches on them with errors.Is.
var (
	// ErrNotCoPartitioned is returned for a write whose key belongs to another
	// partition than the event's. A table is partitioned like its source topic: the
	// record with key k is in partition hash(k) of the topic, and table writes of that
	// record go to the same partition of the table. Writing under a different key
	// (one that hashes elsewhere) would put the key in a partition whose owner never
	// sees it; re-key the stream through a topic first (emit to a topic keyed by the
	// new key and update the table from an agent on that topic).
	ErrNotCoPartitioned = errors.New("key does not belong to the event's partition")

	// ErrNotActive is returned for a write to a partition this worker does not own.
	ErrNotActive = errors.New("partition is not active on this worker")

	// ErrOutsideWindow is returned for a write made after the agent pulled the next
	// record (or after the event was resolved): it could not be bound to its event.
	ErrOutsideWindow = errors.New("table write outside the event's window")
)

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
