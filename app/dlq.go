package app

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
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

// deadLettered remembers which records of one claimed partition were
// dead-lettered, so that a record is dead-lettered once per agent however
// often the claim hands it out again (issue #26). Under at-least-once a
// partition restarts in place after a failed record from its last commit
// point (claimProducer.resumeOffset: with tables, the task's last cycle,
// which can lie before records rejected since), so the agents see a rejected
// record again and reject it again; without this set each such record went
// to the dead-letter topic once more per restart, and `dlq replay` sent it
// back as often.
//
// Invariant: m holds only offsets at or after the offset last marked for
// commit on the claim, and only (offset, agent) pairs whose dead letter the
// broker acknowledged (acks=all). No incarnation of the claim hands out a
// record below the marked offset again (a new incarnation starts at
// resumeOffset, never below it), so nothing it prunes could still be needed.
// Kept by add (after the acknowledgement) and prune (called wherever the
// claimProducer marks an offset). Guarded by mu: Advance (the advance pump)
// adds and prunes, Committable (a task's commit cycle) prunes.
//
// The set lives as long as the claim (the partition value) and in memory
// only: a record whose dead letter was written but whose offset was not
// committed is dead-lettered again by whoever processes it next after a crash
// of the worker, a session restart (ExactlyOnce never uses the set: an
// aborted transaction took its dead letters with it), or a revoke whose
// final commit failed (docs/ack-mode.md).
type deadLettered struct {
	mu sync.Mutex
	m  map[int64][]string // source offset -> agents whose dead letter the broker acknowledged
}

// has reports whether agent's dead letter of the record at offset was
// written. A nil set has nothing.
func (d *deadLettered) has(offset int64, agent string) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(d.m[offset], agent)
}

// add records that agent's dead letter of the record at offset was
// acknowledged. A nil set records nothing.
func (d *deadLettered) add(offset int64, agent string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[int64][]string{}
	}
	d.m[offset] = append(d.m[offset], agent)
}

// prune forgets the offsets below marked, the offset just marked for commit.
func (d *deadLettered) prune(marked int64) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for off := range d.m {
		if off < marked {
			delete(d.m, off)
		}
	}
}

// deadLetter writes rec to the dead-letter topic of every agent named in
// causeIDs (with that agent's cause as reason) and waits for the broker's
// acknowledgement of each. attempts is the number of deliveries of the record
// (1 for a first-delivery reject). An agent whose dead letter of rec is in
// done already is skipped; each one acknowledged is added to done (nil: no
// such bookkeeping).
func (w *Worker) deadLetter(ctx context.Context, rec *source.Record, causes []error, causeIDs []string, attempts int, done *deadLettered) error {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	type sent struct {
		i      int // index in causeIDs
		topic  string
		reason string
		done   chan error
	}
	var all []sent
	for i, id := range causeIDs {
		if done.has(rec.Offset, id) {
			w.log.Info("record already dead-lettered by this worker; not writing it again", "topic", rec.Topic,
				"partition", rec.Partition, "offset", rec.Offset, "agent", id)
			continue
		}
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
		s := sent{i: i, topic: topic, reason: reason, done: make(chan error, 1)}
		if err := w.producer.Send(msg, func(_ int32, _ int64, err error) { s.done <- err }); err != nil {
			return fmt.Errorf("dead-letter %s[%d]@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, topic, err)
		}
		all = append(all, s)
	}
	// Every answer is awaited, also after a failed one: each acknowledged
	// dead letter is recorded in done, so that the record's redelivery
	// writes only the ones that failed.
	var first error
	for _, s := range all {
		select {
		case err := <-s.done:
			if err != nil {
				if first == nil {
					first = fmt.Errorf("dead-letter %s[%d]@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, s.topic, err)
				}
				continue
			}
			done.add(rec.Offset, causeIDs[s.i])
			w.metrics.deadLettered(rec.Topic, causeIDs[s.i])
			w.log.Warn("record dead-lettered", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"agent", causeIDs[s.i], "dlq", s.topic, "attempts", attempts, "reason", s.reason)
		case <-ctx.Done():
			return fmt.Errorf("dead-letter %s[%d]@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, s.topic, ctx.Err())
		}
	}
	return first
}
