package app

import (
	"context"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/topology"
)

// sendAt produces one derived record with timestamp ts (tablestate.Env.SendAt):
// records of repartition topics keep the timestamp of the record they were
// derived from, records a timer sends carry the firing's time. The record goes through the worker's producer like every
// sink record (so it is bound to its event the same way).
func (w *Worker) sendAt(topic string, p int32, key, value []byte, ts time.Time, ack tablestate.Acker) error {
	return w.producer.SendRecordAt(topic, p, key, value, ts, ack)
}

// topicSpec is the creation spec of a declared topic. A repartition topic
// keeps its records without time limit (retention.ms=-1, as Kafka Streams
// creates its repartition topics): they carry their source records'
// timestamps, which may be older than any time-based retention, and a
// record deleted before the downstream agent read it would be lost. The
// worker deletes what the group committed instead (purgeRepartitions).
func topicSpec(t topology.Topic) kafka.TopicSpec {
	s := kafka.TopicSpec{Name: t.Name, Partitions: t.Partitions}
	if t.RepartitionOf != "" {
		s.Config = map[string]string{"retention.ms": "-1", "cleanup.policy": "delete"}
	}
	return s
}

// purgeRepartitions deletes, every purge interval until ctx ends, the records
// of the repartition topics below the group's committed offsets on the
// partitions this worker claims (DeleteRecords). A committed record is never
// read again by the group: a redelivery seeks back to a failed record, which
// is at or above the committed offset.
func (w *Worker) purgeRepartitions(ctx context.Context) {
	var topics []string
	for _, t := range w.graph.Topics {
		if t.RepartitionOf != "" && slices.Contains(w.graph.Subscriptions(), t.Name) {
			topics = append(topics, t.Name)
		}
	}
	d := w.cfg.repartitionPurge
	if d == 0 {
		d = DefaultRepartitionPurge
	}
	if len(topics) == 0 || d < 0 {
		return
	}
	tick := time.NewTicker(d)
	defer tick.Stop()
	purged := map[restoreKey]int64{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		claims, _ := w.Running()
		committed, err := w.committedOffsets(ctx) // also builds w.admin
		if err == nil && w.admin == nil {
			err = fmt.Errorf("no admin client")
		}
		if err != nil {
			w.log.Debug("repartition purge: committed offsets", "err", err)
			continue
		}
		for _, topic := range topics {
			for _, p := range claims[topic] {
				off := committed[topic][p]
				k := restoreKey{topic, p}
				if off <= purged[k] {
					continue
				}
				if err := w.admin.DeleteRecords(topic, map[int32]int64{p: off}); err != nil {
					w.log.Debug("repartition purge", "topic", topic, "partition", p, "offset", off, "err", err)
					continue
				}
				purged[k] = off
			}
		}
	}
}
