package app

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/internal/kafka"
)

// Dead-letter record headers (Kafka record headers, KIP-82). The key and
// value of a dead letter are the source record's, its timestamp the source
// record's timestamp.
const (
	HeaderReason    = "runnel-reason"    // the agent's reject reason or failure cause (text)
	HeaderTopic     = "runnel-topic"     // source topic
	HeaderPartition = "runnel-partition" // source partition (decimal)
	HeaderOffset    = "runnel-offset"    // source offset (decimal)
	HeaderAgent     = "runnel-agent"     // the agent that rejected or failed the record
	HeaderAttempts  = "runnel-attempts"  // deliveries of the record to the agent, this one included (decimal)
	HeaderTimestamp = "runnel-timestamp" // when it was dead-lettered (RFC 3339, UTC, nanoseconds)
)

// DeadLetterTopic returns the dead-letter topic of the agent named agentName:
// its WithDeadLetterTopic setting, or "<app>-<agent>-dlq". It returns "" when
// the app has no such agent.
func (a *App) DeadLetterTopic(agentName string) string {
	for _, r := range a.agents {
		if r.Name() == agentName {
			if t := r.Settings().DeadLetterTopic; t != "" {
				return t
			}
			return a.id + "-" + agentName + "-dlq"
		}
	}
	return ""
}

// dlqSpecs are the dead-letter topics to create: one per agent, one
// partition each (dead letters are rare; their order across source partitions
// carries no meaning).
func (w *Worker) dlqSpecs() []kafka.TopicSpec {
	seen := map[string]bool{}
	var specs []kafka.TopicSpec
	for _, r := range w.app.agents {
		t := w.app.DeadLetterTopic(r.Name())
		if !seen[t] {
			seen[t] = true
			specs = append(specs, kafka.TopicSpec{Name: t, Partitions: 1})
		}
	}
	return specs
}

// deadLetter writes rec to the dead-letter topic of every agent named in
// causeIDs (with that agent's cause as reason) and waits for the broker's
// acknowledgement of each. attempts is the number of deliveries of the record
// (1 for a first-delivery reject).
func (w *Worker) deadLetter(ctx context.Context, rec *source.Record, causes []error, causeIDs []string, attempts int) error {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	type sent struct {
		topic string
		done  chan error
	}
	var all []sent
	for i, id := range causeIDs {
		topic := w.app.DeadLetterTopic(id)
		if topic == "" {
			topic = w.app.id + "-" + id + "-dlq"
		}
		reason := ""
		if i < len(causes) && causes[i] != nil {
			reason = causes[i].Error()
		}
		msg := &sarama.ProducerMessage{Topic: topic, Partition: 0, Key: bytesOrNil(rec.Key), Value: bytesOrNil(rec.Value),
			Timestamp: rec.Timestamp,
			Headers: []sarama.RecordHeader{
				{Key: []byte(HeaderReason), Value: []byte(reason)},
				{Key: []byte(HeaderTopic), Value: []byte(rec.Topic)},
				{Key: []byte(HeaderPartition), Value: strconv.AppendInt(nil, int64(rec.Partition), 10)},
				{Key: []byte(HeaderOffset), Value: strconv.AppendInt(nil, rec.Offset, 10)},
				{Key: []byte(HeaderAgent), Value: []byte(id)},
				{Key: []byte(HeaderAttempts), Value: strconv.AppendInt(nil, int64(attempts), 10)},
				{Key: []byte(HeaderTimestamp), Value: []byte(now)},
			}}
		for _, h := range rec.Headers {
			msg.Headers = append(msg.Headers, sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		s := sent{topic: topic, done: make(chan error, 1)}
		if err := w.producer.Send(msg, func(_ int32, _ int64, err error) { s.done <- err }); err != nil {
			return fmt.Errorf("dead-letter %s[%d]@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, topic, err)
		}
		all = append(all, s)
	}
	for i, s := range all {
		select {
		case err := <-s.done:
			if err != nil {
				return fmt.Errorf("dead-letter %s[%d]@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, s.topic, err)
			}
			w.metrics.deadLettered(rec.Topic, causeIDs[i])
			w.log.Warn("record dead-lettered", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"agent", causeIDs[i], "dlq", s.topic, "attempts", attempts, "reason", causes[i])
		case <-ctx.Done():
			return fmt.Errorf("dead-letter %s[%d]@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, s.topic, ctx.Err())
		}
	}
	return nil
}
