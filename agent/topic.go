package agent

import (
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"slices"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/topicdecl"
	"github.com/runnel-dev/runnel/table"
)

// Host is what topics and agents register with: the App.
type Host interface {
	// AppID names the consumer group and prefixes internal topics
	// (repartition topics, like changelogs).
	AppID() string
	RegisterTopic(t TopicDef)
	RegisterAgent(a Def)
}

// TopicDef is a declared topic independent of its key and value types.
type TopicDef interface {
	Name() string
	// Partitions is the declared partition count.
	Partitions() int32
	KeyCodec() string
	ValueCodec() string
}

// Topic is a typed Kafka topic: agents consume it and sinks send to it.
// Declare one with app.Topic (a topic of the app) or agent.Repartition and
// agent.GroupBy (an internal repartition topic); a Topic made otherwise has
// no name and no codecs.
// Records are partitioned by Kafka's default partitioner (murmur2 of the
// encoded key), so a topic written by Runnel is co-partitioned with the same
// keys written by Kafka Streams or any default Java producer.
type Topic[K any, V any] struct {
	name       string
	partitions int32
	kc         codec.Codec[K]
	vc         codec.Codec[V]
	// repartitionOf is the topic a repartition topic re-keys ("" for a
	// declared topic); its records keep their source record's timestamp.
	repartitionOf string
}

func init() {
	topicdecl.Init = func(t any, name string, partitions int32, kc, vc any) {
		t.(topicSetter).set(name, partitions, kc, vc)
	}
	topicdecl.Of = func(t any) (topicdecl.Runtime, bool) {
		r, ok := t.(interface{ runtime() topicdecl.Runtime })
		if !ok {
			return nil, false
		}
		return r.runtime(), true
	}
}

// topicRuntime is a topic as the worker and the CLI see it
// (topicdecl.Runtime, reached through topicdecl.Of).
type topicRuntime[K any, V any] struct{ t *Topic[K, V] }

func (r topicRuntime[K, V]) CheckKey(b []byte) error           { return r.t.CheckKey(b) }
func (r topicRuntime[K, V]) CheckValue(b []byte) error         { return r.t.CheckValue(b) }
func (r topicRuntime[K, V]) DecodeKey(b []byte) (any, error)   { return r.t.decodeKey(b) }
func (r topicRuntime[K, V]) DecodeValue(b []byte) (any, error) { return r.t.decodeValue(b) }
func (r topicRuntime[K, V]) RepartitionOf() string             { return r.t.repartitionOf }
func (t *Topic[K, V]) runtime() topicdecl.Runtime              { return topicRuntime[K, V]{t} }

// topicSetter is a *Topic[K, V] as topicdecl.Init sets it up: app.Topic
// declares every topic a user declares (the one way to declare one).
type topicSetter interface {
	set(name string, partitions int32, kc, vc any)
}

// set implements topicSetter: kc and vc are the topic's codecs.
func (t *Topic[K, V]) set(name string, partitions int32, kc, vc any) {
	t.name, t.partitions = name, partitions
	t.kc, t.vc = kc.(codec.Codec[K]), vc.(codec.Codec[V])
}

// Name returns the topic name.
func (t *Topic[K, V]) Name() string { return t.name }

// Partitions returns the declared partition count.
func (t *Topic[K, V]) Partitions() int32 { return t.partitions }

// KeyCodec names the key codec.
func (t *Topic[K, V]) KeyCodec() string { return t.kc.Name() }

// ValueCodec names the value codec.
func (t *Topic[K, V]) ValueCodec() string { return t.vc.Name() }

// CheckValue returns the value codec's error for b, nil when b decodes: what
// `send` asks of every line before it produces anything.
func (t *Topic[K, V]) CheckValue(b []byte) error {
	_, err := t.decodeValue(b)
	return err
}

// CheckKey returns the key codec's error for b, nil when b decodes: what
// `send --key-field` asks of every line's key before it produces anything.
func (t *Topic[K, V]) CheckKey(b []byte) error {
	_, err := t.decodeKey(b)
	return err
}

// decodeKey decodes b with the key codec, as an agent of the topic does: the
// error names the codec. `dlq tail` shows dead letters with it.
func (t *Topic[K, V]) decodeKey(b []byte) (any, error) {
	k, err := t.kc.Decode(b)
	if err != nil {
		return nil, codecError("key", t.kc.Name(), err)
	}
	return k, nil
}

// decodeValue decodes b with the value codec, as an agent of the topic
// does: the error names the codec. `dlq tail` shows dead letters with it
// and `dlq replay` checks that the agent will decode what it sends back.
func (t *Topic[K, V]) decodeValue(b []byte) (any, error) {
	v, err := t.vc.Decode(b)
	if err != nil {
		return nil, codecError("value", t.vc.Name(), err)
	}
	return v, nil
}

// codecError names the codec of a failed decode once: "value codec json:
// …", whether or not the codec's own error already starts with "codec
// json:" (Runnel's codecs do; a user's need not).
func codecError(role, name string, err error) error {
	if strings.HasPrefix(err.Error(), "codec "+name+":") {
		return fmt.Errorf("%s %w", role, err)
	}
	return fmt.Errorf("%s codec %s: %w", role, name, err)
}

// Codecs returns the key and value codecs.
func (t *Topic[K, V]) Codecs() (codec.Codec[K], codec.Codec[V]) { return t.kc, t.vc }

// Send produces one record to the topic as a sink of the event ev: the source
// record of ev is not committed before the broker acknowledged this record.
// A send that fails fails the event, as a table write does (package table,
// "Writes fail the event"): the agent's stream yields no further event,
// Stream.Err returns the error, and the agent fails with it by its error
// policy even if its function returns nil. Use TrySend to handle the error
// instead.
func (t *Topic[K, V]) Send(ev table.Event, key K, value V) {
	if err := t.TrySend(ev, key, value); err != nil {
		evbind.Fail[*tablestate.Env](ev, err)
	}
}

// TrySend is Send returning the error instead of failing the event. Errors:
// table.ErrNotRunning outside a worker, table.ErrEventFailed after a failed
// write of the event's run, the encoding errors of the codecs,
// table.ErrOutsideWindow when ev's window is closed, a *table.UndeclaredError
// when ev's agent did not declare the topic (agent.SendsTo), the producer's
// refusal.
// The broker's answer comes later: a delivery error fails the event's record
// whichever variant sent it.
func (t *Topic[K, V]) TrySend(ev table.Event, key K, value V) error {
	env := envOf(ev)
	if env == nil || env.Send == nil {
		return fmt.Errorf("send to %s: %w", t.name, table.ErrNotRunning)
	}
	if ferr := evbind.Failed[*tablestate.Env](ev); ferr != nil {
		return fmt.Errorf("send to %s: %w: %w", t.name, table.ErrEventFailed, ferr)
	}
	kb, err := encodeView(t.kc, key)
	if err != nil {
		return fmt.Errorf("send to %s: encode key: %w", t.name, err)
	}
	vb, err := encodeView(t.vc, value)
	if err != nil {
		return fmt.Errorf("send to %s: encode value (key %v): %w", t.name, key, err)
	}
	return t.sendBytes(ev, kb, vb)
}

// encodeView encodes v with c, without a copy when c is a codec.Viewer: the
// bytes go to the producer, which only reads them.
func encodeView[T any](c codec.Codec[T], v T) ([]byte, error) {
	if vw, ok := c.(codec.Viewer[T]); ok {
		return vw.View(v), nil
	}
	return c.Encode(v)
}

// stamp returns the timestamp a record sent with ev carries; zero: the
// producer's clock.
//
// A timer's record carries the firing's time (Tick.Time: the stream time or
// the wall-clock time the timer fired for), as Kafka Streams forwards the
// records of a punctuation at the punctuation's time: a window a stream-time
// timer emits is stamped with the stream time that closed it, so a replay of
// last week emits records stamped as the live run's were, and event-time
// windows downstream put them where the data put them. A repartition
// topic's record carries the timestamp of ev's source record (Kafka Streams
// does the same), so that event-time windows downstream of a repartition see
// the event's time, not the time it was re-keyed.
func (t *Topic[K, V]) stamp(ev table.Event) time.Time {
	if tk, ok := ev.(*Tick); ok {
		return tk.Time
	}
	if t.repartitionOf != "" {
		return tablestate.EventTime(ev)
	}
	return time.Time{}
}

// sendBytes is Send of an encoded key and value, stamped as stamp says.
func (t *Topic[K, V]) sendBytes(ev table.Event, kb, vb []byte) error {
	env := envOf(ev)
	if env == nil || env.Send == nil {
		return fmt.Errorf("send to %s: %w", t.name, table.ErrNotRunning)
	}
	if env.Agent != "" && !slices.Contains(env.Sends, t.name) {
		return &table.UndeclaredError{Agent: env.Agent, Topic: t.name}
	}
	var ack tablestate.Acker
	if se, ok := ev.(sinkBinder); ok {
		// An agent's event: one value receives the answer, no closures.
		a, ok := se.bindSink()
		if !ok {
			return fmt.Errorf("send to %s: %w", t.name, table.ErrOutsideWindow)
		}
		ack = a
	} else {
		done, ok := evbind.Of(ev).BindPersist()
		if !ok {
			return fmt.Errorf("send to %s: %w", t.name, table.ErrOutsideWindow)
		}
		ack = tablestate.AckFunc(func(_ int64, err error) { done(err) })
	}
	p := kafka.PartitionFor(kb, t.partitions)
	var err error
	if o, ok := t.origin(ev, env); ok {
		err = env.SendFrom(o, t.name, p, kb, vb, t.stamp(ev), ack)
	} else if ts := t.stamp(ev); !ts.IsZero() && env.SendAt != nil {
		err = env.SendAt(t.name, p, kb, vb, ts, ack)
	} else {
		err = env.Send(t.name, p, kb, vb, ack)
	}
	if err != nil {
		ack.Acked(-1, err)
		return fmt.Errorf("send to %s[%d]: %w", t.name, p, err)
	}
	return nil
}

// origin returns the source record ev comes from when a send of it to t is
// stamped (tablestate.Env.SendFrom: t is a repartition topic, ev an agent's
// event delivered in an open window, the worker stamps).
func (t *Topic[K, V]) origin(ev table.Event, env *tablestate.Env) (tablestate.Origin, bool) {
	if t.repartitionOf == "" || env.SendFrom == nil {
		return tablestate.Origin{}, false
	}
	so, ok := ev.(sourced)
	if !ok {
		return tablestate.Origin{}, false
	}
	return so.origin(env.Agent)
}

// sourced is implemented by the agent's own Event: the source record it was
// made from.
type sourced interface {
	origin(agent string) (tablestate.Origin, bool)
}

// sinkBinder is implemented by the agent's own Event: it binds a sink record
// and returns the receiver of its broker answer.
type sinkBinder interface {
	bindSink() (*sinkAck, bool)
}

// envOf returns the runtime of the worker processing ev, nil outside a worker.
func envOf(ev table.Event) *tablestate.Env {
	if b := evbind.Of(ev); b != nil {
		return b.Env()
	}
	return nil
}
