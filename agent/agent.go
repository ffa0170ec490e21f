package agent

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"iter"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/table"
)

// Func is an agent's body: it runs once per assigned partition of its topic,
// over the stream of that partition's records, until the stream ends (the
// partition was revoked or the worker stops) or it returns an error. A table
// write or send made with an event that fails ends the stream and fails the
// run with its error even when Func returns nil (Stream.Err).
type Func[K any, V any] func(ctx context.Context, s *Stream[K, V]) error

// Def is a declared agent independent of its key and value types, as it
// registers with its Host. Agent implements it; the worker runs it through a
// link that is no part of the API (internal/agentrt).
type Def interface {
	// Name is the agent's name.
	Name() string
	// Topic is the source topic's name.
	Topic() string
}

// Agent is a declared agent.
type Agent[K any, V any] struct {
	link  // the runtime side (runner), no part of the API
	name  string
	topic *Topic[K, V]
	fn    Func[K, V]
	set   settings
}

// link is unexported so that an agent's runtime side (agentrt.Link) is no
// field of its API.
type link = agentrt.Link

// New declares an agent named name that runs fn over topic, with options
// (OnError, WithDeadLetterTopic, ...). What the agent writes and sends is
// declared with WritesTo and SendsTo: the worker refuses a write or a send
// it did not declare (table.UndeclaredError).
func New[K any, V any](h Host, name string, topic *Topic[K, V], fn Func[K, V], opts ...Option) *Agent[K, V] {
	a := &Agent[K, V]{name: name, topic: topic, fn: fn}
	a.link = agentrt.NewLink((*runner[K, V])(a))
	for _, o := range opts {
		o(&a.set)
	}
	if ct := declareCronTable(h, name, topic.Partitions(), a.set.Timers); ct != nil { // cron.go
		// The Cron timers write their last firing: the agent writes its
		// cron table.
		a.set.Tables = append(a.set.Tables, ct)
	}
	h.RegisterAgent(a)
	return a
}

// Name returns the agent's name.
func (a *Agent[K, V]) Name() string { return a.name }

// Topic returns the source topic's name.
func (a *Agent[K, V]) Topic() string { return a.topic.Name() }

// runner gives an Agent the methods agentrt.Runner asks for without making
// them methods of Agent: a user calling Run would resolve records outside
// the worker's ack accounting.
type runner[K any, V any] Agent[K, V]

// Name implements agentrt.Runner.
func (r *runner[K, V]) Name() string { return r.name }

// Topic implements agentrt.Runner.
func (r *runner[K, V]) Topic() string { return r.topic.Name() }

// Settings implements agentrt.Runner: the agent's options.
func (r *runner[K, V]) Settings() agentrt.Settings {
	s := agentrt.Settings{OnError: agentrt.ErrorPolicy(r.set.OnError), DeadLetterTopic: r.set.DeadLetterTopic,
		Effects: r.set.Effects, Deterministic: r.set.Deterministic}
	for _, t := range r.set.Sinks {
		s.Sinks = append(s.Sinks, t)
	}
	for _, d := range r.set.Tables {
		s.Tables = append(s.Tables, d)
	}
	for _, tm := range r.set.Timers {
		s.Timers = append(s.Timers, tm)
	}
	for _, d := range r.set.Lookups {
		s.Lookups = append(s.Lookups, d)
	}
	return s
}

// Run implements agentrt.Runner.
func (r *runner[K, V]) Run(ctx context.Context, p int32, sub *source.Subscription, env *tablestate.Env) error {
	return (*Agent[K, V])(r).run(ctx, p, sub, env)
}

// run runs the agent body once over sub (agentrt.Runner.Run).
func (a *Agent[K, V]) run(ctx context.Context, p int32, sub *source.Subscription, env *tablestate.Env) error {
	s := &Stream[K, V]{ctx: ctx, sub: sub, partition: p, kc: a.topic.kc, vc: a.topic.vc, env: env}
	panicked, err := a.call(ctx, s)
	if s.err != nil {
		// The subscription itself failed; whatever the body returned, the
		// stream is over.
		return &Error{Agent: a.name, Partition: p, Offset: -1, Stream: true, Err: s.err}
	}
	if ferr := s.failed.get(); ferr != nil && !errors.Is(err, ferr) {
		// A write or send failed the event (Table.Put, Topic.Send, …): the
		// run fails with that error whatever the body returned, as if the
		// body had returned it where the write was made. A body that
		// returned it (s.Err(), wrapped or not) keeps its own wording; one
		// that returned something else afterwards (or panicked) has it
		// joined after the write's.
		if err == nil {
			err = ferr
		} else {
			err = errors.Join(ferr, err)
		}
	}
	if err == nil {
		return nil
	}
	e := &Error{Agent: a.name, Partition: p, Offset: -1, Panic: panicked, Err: err}
	if d := s.cur; d != nil {
		// The agent failed inside this record's window: never ack it. The
		// error is built before it is handed over (the producer reads it).
		on := *e
		on.Offset = d.Record.Offset
		var took bool
		// A table key outside the event's partition is a property of the
		// record (its data, or how the topic is keyed): no redelivery can
		// fix it, so it is dead-lettered at once, unless the agent stops
		// the worker on errors.
		deterministic := errors.Is(err, table.ErrNotCoPartitioned) && a.set.OnError != StopWorker
		// A write or send the agent did not declare is a fix of the code:
		// the record is failed, never dead-lettered, and the worker stops
		// on it.
		var undeclared *table.UndeclaredError
		if errors.As(err, &undeclared) {
			took = d.Fail(&on)
		} else if a.set.OnError == DeadLetter || deterministic {
			took = d.Reject(&on)
		} else {
			took = d.Fail(&on)
		}
		if took {
			return &on
		}
	}
	return e
}

// call runs the body once, recovering a panic into an error.
func (a *Agent[K, V]) call(ctx context.Context, s *Stream[K, V]) (panicked bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			panicked, err = true, fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return false, a.fn(ctx, s)
}

// Stream is the sequence of records of one partition of an agent's topic.
type Stream[K any, V any] struct {
	ctx       context.Context
	sub       *source.Subscription
	partition int32
	kc        codec.Codec[K]
	vc        codec.Codec[V]
	env       *tablestate.Env
	err       error
	// failed is the first write or send that failed one of the stream's
	// events (Table.Put, Topic.Send, …): the iteration stops at the next
	// pull and Run fails the record the body is on with it.
	failed failure
	// cur is the delivery last handed to the body: its window is open until
	// the iteration pulls the next record (or, after a failed write, until
	// Run resolves it).
	cur *source.Delivery
}

// failure holds the first error recorded by evbind.Binder.Fail for a run. Its
// zero value holds none. Sends of one event may run on several goroutines,
// so it is one atomic pointer.
type failure struct{ p atomic.Pointer[error] }

// set records err unless an error is already recorded.
func (f *failure) set(err error) { f.p.CompareAndSwap(nil, &err) }

// get returns the recorded error, nil when none.
func (f *failure) get() error {
	if p := f.p.Load(); p != nil {
		return *p
	}
	return nil
}

// Partition is the source partition this stream reads.
func (s *Stream[K, V]) Partition() int32 { return s.partition }

// Events iterates over the stream's events. Pulling the next event closes the
// window of the previous one: everything the agent derives from an event
// (table writes, sends to topics) must happen before it asks for the next.
//
// A record whose key or value does not decode is rejected (dead-lettered with
// the decode error as reason) and skipped, never lost. The iteration ends when
// the partition is revoked or the worker stops, and when a write or send made
// with one of the events failed (Table.Put, Topic.Send and the other write
// methods that return no error): Err then tells whether it ended on an error.
func (s *Stream[K, V]) Events() iter.Seq[*Event[K, V]] {
	return func(yield func(*Event[K, V]) bool) {
		for {
			if s.failed.get() != nil {
				// A write failed the event the body is on: pull nothing
				// more (the window stays open, s.cur stays set) and let
				// Run resolve the event by the error policy.
				return
			}
			s.cur = nil
			// One allocation per record holds the event and its delivery.
			ev := &Event[K, V]{env: s.env, failed: &s.failed}
			ev.handle = evbind.New[*tablestate.Env]((*eventBinder[K, V])(ev))
			d := &ev.d
			if err := s.sub.NextInto(s.ctx, d); err != nil {
				if !errors.Is(err, source.ErrGroupStopped) && s.ctx.Err() == nil {
					s.err = err
				}
				return
			}
			ev.rec = d.Record
			var err error
			if d.Record.Key != nil {
				if ev.Key, err = s.kc.Decode(d.Record.Key); err != nil {
					d.Reject(fmt.Errorf("decode key of %s[%d]@%d: %w", d.Record.Topic, d.Record.Partition, d.Record.Offset, err))
					continue
				}
			}
			if ev.Value, err = s.vc.Decode(d.Record.Value); err != nil {
				d.Reject(fmt.Errorf("decode value of %s[%d]@%d: %w", d.Record.Topic, d.Record.Partition, d.Record.Offset, err))
				continue
			}
			s.cur = d
			if s.env != nil && s.env.StreamTime != nil {
				s.env.StreamTime.Observe(d.Record.Timestamp)
			}
			if !yield(ev) {
				return
			}
		}
	}
}

// Err is the error that ended the stream, nil for a revoke or a stop: the
// subscription's, or else the first failed write or send made with one of the
// stream's events (Table.Put, Table.Update, Topic.Send, …; their Try…
// variants return the error instead and record nothing). The agent fails with
// a failed write's error even when its function returns nil: return s.Err()
// to say so in the code.
func (s *Stream[K, V]) Err() error {
	if s.err != nil {
		return s.err
	}
	return s.failed.get()
}

// Event is one record of a stream, decoded: its key and value, and the
// source record's topic, partition, offset, timestamp and headers through
// accessors. An event is valid until the agent pulls the next one; table
// writes and sends made with it after that are refused
// (table.ErrOutsideWindow).
type Event[K any, V any] struct {
	Key   K
	Value V

	handle                 // links table writes and sends to the worker (evbind)
	rec    *source.Record  // the source record
	d      source.Delivery // its address names the record's window
	env    *tablestate.Env
	failed *failure // the stream's (Stream.failed)
	// ack receives the broker's answer for the event's first sink record
	// (bindSink); ackUsed says it is taken.
	ack     sinkAck
	ackUsed atomic.Bool
	// stamped counts the event's stamped sends (tablestate.Origin.Sends).
	stamped uint32
}

// origin implements sourced: the event's source record, while its window is
// open.
func (e *Event[K, V]) origin(agent string) (tablestate.Origin, bool) {
	pl := e.d.Payload()
	if pl == nil || e.rec == nil {
		return tablestate.Origin{}, false
	}
	return tablestate.Origin{Agent: agent, Topic: e.rec.Topic, Partition: e.rec.Partition, Offset: e.rec.Offset,
		Payload: pl, Sends: &e.stamped}, true
}

// handle is unexported so that the event's link to its worker is no field
// of Event's API.
type handle = evbind.Handle[*tablestate.Env]

// eventBinder gives an Event the methods evbind.Binder asks for without
// making them methods of Event: a user calling BindPersist out of turn would
// break the record's ack accounting.
type eventBinder[K any, V any] Event[K, V]

// Env implements evbind.Binder.
func (b *eventBinder[K, V]) Env() *tablestate.Env { return b.env }

// Fail implements evbind.Binder: it records err as the stream's failure.
func (b *eventBinder[K, V]) Fail(err error) { b.failed.set(err) }

// Failed implements evbind.Binder.
func (b *eventBinder[K, V]) Failed() error { return b.failed.get() }

// BindPersist implements evbind.Binder: it binds one derived record to the
// event.
func (b *eventBinder[K, V]) BindPersist() (func(error), bool) {
	a, ok := (*Event[K, V])(b).bindSink()
	if !ok {
		return nil, false
	}
	return func(err error) { a.Acked(-1, err) }, true
}

// EventTime implements evbind.Binder: the source record's timestamp.
func (b *eventBinder[K, V]) EventTime() time.Time { return b.rec.Timestamp }

// Topic is the name of the record's topic.
func (e *Event[K, V]) Topic() string { return e.rec.Topic }

// Partition is the record's partition.
func (e *Event[K, V]) Partition() int32 { return e.rec.Partition }

// Offset is the record's offset in its partition.
func (e *Event[K, V]) Offset() int64 { return e.rec.Offset }

// Timestamp is the record's timestamp (its CreateTime, or LogAppendTime when
// the topic says so): the event time that windowed tables and stream time
// follow.
func (e *Event[K, V]) Timestamp() time.Time { return e.rec.Timestamp }

// Headers are the record's headers (KIP-82), in the order they were
// produced; nil when it has none. The slice is the record's: do not modify it.
func (e *Event[K, V]) Headers() []Header { return e.rec.Headers }

// Header returns the value of the record's last header named key (Kafka allows
// several of one name; the last one wins, as in Kafka Streams' lastHeader), and
// whether there is one.
func (e *Event[K, V]) Header(key string) ([]byte, bool) {
	hs := e.rec.Headers
	for i := len(hs) - 1; i >= 0; i-- {
		if string(hs[i].Key) == key {
			return hs[i].Value, true
		}
	}
	return nil, false
}

// RawKey is the record's key as it was read, before decoding; nil when the
// record had none. The slice is the record's: do not modify it.
func (e *Event[K, V]) RawKey() []byte { return e.rec.Key }

// RawValue is the record's value as it was read, before decoding. The slice
// is the record's: do not modify it.
func (e *Event[K, V]) RawValue() []byte { return e.rec.Value }

// Header is a record header (KIP-82).
type Header = source.Header

// InWindow reports whether the event's window is still open (the agent has
// not pulled the next event). Table writes check it: a write outside the
// window is table.ErrOutsideWindow.
func (e *Event[K, V]) InWindow() bool { return e.d.Open() }

// bindSink binds one derived record to the event like BindPersist, returning
// its broker answer's receiver as one value (Topic.Send hands it to the
// producer without a closure per record).
func (e *Event[K, V]) bindSink() (*sinkAck, bool) {
	tok, ok := e.d.Bind()
	if !ok {
		return nil, false
	}
	// The first sink record's receiver lives in the event (most events
	// derive one record); later ones get their own.
	// (Sends of one event may run on several goroutines.)
	a := &e.ack
	if !e.ackUsed.CompareAndSwap(false, true) {
		a = &sinkAck{}
	}
	a.tok, a.inc = tok, nil
	if e.env != nil && e.env.InFlight != nil {
		a.inflight = e.env.InFlight
		a.inflight.Add()
	}
	return a, true
}

// sinkAck receives the broker's answer for one derived record bound to an
// event: it confirms or fails the record's persist token, counts the record
// answered in the partition's in-flight counter and, when the sender asked
// (CountAcked), calls its success counter.
type sinkAck struct {
	tok      source.Token
	inflight *tablestate.InFlight
	inc      func() // called on a successful answer; nil: none
}

// Acked implements tablestate.Acker.
func (a *sinkAck) Acked(_ int64, err error) {
	if err == nil {
		if a.inc != nil {
			a.inc()
		}
		a.tok.Confirm()
	} else {
		if a.inflight != nil {
			// Counted before the token fails: sends refused or made after
			// the failure see it (a stamped send then leaves a gap).
			a.inflight.Fail()
		}
		a.tok.Fail(err)
	}
	if a.inflight != nil {
		a.inflight.Done()
	}
}

// CountAcked makes a successful answer call inc (the worker counts
// acknowledged sink records with it, without wrapping the receiver). The
// sender calls it before it hands the record to the producer, so it
// happens before Acked; it returns true.
func (a *sinkAck) CountAcked(inc func()) bool {
	a.inc = inc
	return true
}

// Reject resolves the event as rejected: it goes to the agent's dead-letter
// topic with reason in its headers, and its offset is then committed. It
// returns false when the event's window is already closed.
func (e *Event[K, V]) Reject(reason error) bool { return e.d.Reject(reason) }
