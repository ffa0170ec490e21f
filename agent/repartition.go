package agent

import (
	"context"
	"fmt"

	"github.com/runnel-dev/runnel/codec"
)

// RepartitionTopic returns the name of the internal topic of the repartition
// named name in app: "<app>-<name>-repartition", the name Kafka Streams gives
// the internal topics of groupBy and repartition (KIP-221) and Faust the
// topics of group_by.
func RepartitionTopic(app, name string) string { return app + "-" + name + "-repartition" }

// RepartitionOption configures a repartition topic (Repartition, GroupBy).
type RepartitionOption func(*repartitionOptions)

type repartitionOptions struct {
	partitions int32
	agent      []Option
}

// Partitions sets the partition count of the repartition topic (Repartition,
// GroupBy); default: the partition count of the topic it is derived from. A
// table written from the repartitioned stream must have the same count (the
// topology check at App build says so otherwise). app.Partitions sets a
// declared topic's, and table.Partitions a table's.
func Partitions(n int32) RepartitionOption {
	return func(o *repartitionOptions) { o.partitions = n }
}

// WithAgentOptions sets the options of the re-keying agent GroupBy declares
// (its error policy, its dead-letter topic); Repartition ignores them.
func WithAgentOptions(opts ...Option) RepartitionOption {
	return func(o *repartitionOptions) { o.agent = append(o.agent, opts...) }
}

// Repartition declares the internal topic "<app>-<name>-repartition" that
// re-keys the records of from: it is created by `worker` and `dev` with
// from's partition count (or Partitions), with key and value
// codecs kc and vc. Agents send to it with Topic.Send, keyed by the new key,
// and an agent declared on it sees every record of one new key in one
// partition, so it may keep tables keyed by that key (co-partitioning).
//
// A record sent to the topic is a sink of the event it was derived from, as
// any Send: the source record's offset is committed only after the broker
// acknowledged it (at-least-once through the repartition; under
// exactly-once it belongs to the event's transaction). The record keeps the
// source record's timestamp, so windowed tables downstream see event time.
//
// Use Repartition when one record maps to several new records or a new
// value type (a flat map); GroupBy when each record only changes its key.
func Repartition[K any, V any](h Host, name string, from TopicDef, kc codec.Codec[K], vc codec.Codec[V], opts ...RepartitionOption) *Topic[K, V] {
	o := repartitionOptions{partitions: from.Partitions()}
	for _, f := range opts {
		f(&o)
	}
	t := &Topic[K, V]{name: RepartitionTopic(h.AppID(), name), partitions: o.partitions, kc: kc, vc: vc,
		repartitionOf: from.Name()}
	h.RegisterTopic(t)
	return t
}

// KeyFunc selects the new key of an event for GroupBy; an error fails the
// event as an agent error would (the agent's error policy applies).
type KeyFunc[K any, V any, K2 any] func(ev *Event[K, V]) (K2, error)

// GroupBy re-keys every record of from by key: it declares the repartition
// topic "<app>-<name>-repartition" (as Repartition, with from's value codec
// and kc for the new key) and an agent named name on from that sends each
// record's value, unchanged and with its timestamp, under key(ev). It returns
// the topic: declare the agents that aggregate by the new key on it. The
// agent is Deterministic: key must depend only on the event. This is
// Kafka Streams' selectKey + groupByKey (or groupBy) and Faust's group_by.
func GroupBy[K any, V any, K2 any](h Host, name string, from *Topic[K, V], kc codec.Codec[K2], key KeyFunc[K, V, K2], opts ...RepartitionOption) *Topic[K2, V] {
	var o repartitionOptions
	for _, f := range opts {
		f(&o)
	}
	t := Repartition(h, name, from, kc, from.vc, opts...)
	New(h, name, from, func(ctx context.Context, s *Stream[K, V]) error {
		for ev := range s.Events() {
			k, err := key(ev)
			if err != nil {
				return fmt.Errorf("group by: %w", err)
			}
			kb, err := kc.Encode(k)
			if err != nil {
				return fmt.Errorf("send to %s: encode key: %w", t.name, err)
			}
			// The value is passed on as it was read: no decode/encode round
			// trip can change it.
			if err := t.sendBytes(ev, kb, ev.rec.Value); err != nil {
				return err
			}
		}
		return s.Err()
	}, append([]Option{SendsTo(t), Deterministic()}, o.agent...)...)
	return t
}
