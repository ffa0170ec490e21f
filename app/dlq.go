package app

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
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
// carries no meaning), kept without time limit (retention.ms=-1): a dead
// letter carries its source record's timestamp (a replay puts the record back
// at its event time), so under a time-based retention the broker deleted the
// dead letter of an old record at its next retention check, with every
// younger dead letter before it. An operator who wants them to expire sets
// retention on the topic (docs/ack-mode.md); a topic that exists is left as
// it is.
func (w *Worker) dlqSpecs() []kafka.TopicSpec {
	seen := map[string]bool{}
	var specs []kafka.TopicSpec
	for _, r := range w.app.agents {
		t := w.app.DeadLetterTopic(r.Name())
		if !seen[t] {
			seen[t] = true
			specs = append(specs, kafka.TopicSpec{Name: t, Partitions: 1, Config: map[string]string{"retention.ms": "-1"}})
		}
	}
	return specs
}

// deadLettered remembers which records of one claimed partition were
// dead-lettered, so that a record is dead-lettered once per agent however
// often it is handed out again (issue #26). Under at-least-once a partition
// restarts in place after a failed record from its last commit point
// (claimProducer.resumeOffset: with tables, the task's last cycle, which can
// lie before records rejected since), so the agents see a rejected record
// again and reject it again; without this set each such record went to the
// dead-letter topic once more per restart, and `dlq replay` sent it back as
// often.
//
// The set also survives the claim: every offset the claim marks for commit
// carries, as its commit metadata (dlqMetadata), the offset in each
// dead-letter topic from which on every dead letter of a record at or after
// the marked offset lies. Whoever claims the partition next (this worker
// after a session restart, another one after a crash, a kill or a revoke
// whose final commit failed) reads the dead-letter topics from there up to
// their highwater (loadDeadLetters) and finds the dead letters of the
// records it is about to process again.
//
// Invariant: m holds only offsets at or after the offset last marked for
// commit on the claim, and only (offset, agent) pairs whose dead letter the
// broker acknowledged (acks=all), with the dead letter's own topic and
// offset. No incarnation of the claim hands out a record below the marked
// offset again (a new incarnation starts at resumeOffset, never below it),
// so nothing it prunes could still be needed. floor[topic] is at most the
// dead-letter topic's highwater and at most the offset of every dead letter
// of the partition's records at or after the claim's start offset that was
// not in m when it was set; next[topic] is one past the last dead letter the
// claim wrote there. Dead letters of one claim are written one record at a
// time (Advance waits for their acknowledgements), so next only grows.
// Guarded by mu: Advance (the advance pump) adds and prunes, Committable (a
// task's commit cycle) prunes.
//
// ExactlyOnce never uses the set: an aborted transaction took its dead
// letters with it.
type deadLettered struct {
	mu    sync.Mutex
	m     map[int64][]dlqEntry // source offset -> the agents' dead letters the broker acknowledged
	floor map[string]int64     // dead-letter topic -> lower bound of later dead letters (see above)
	next  map[string]int64     // dead-letter topic -> one past the claim's last dead letter there
}

// dlqEntry is one agent's dead letter of a record: where it was written.
type dlqEntry struct {
	agent  string
	topic  string
	offset int64 // in the dead-letter topic (partition 0)
}

// has reports whether agent's dead letter of the record at offset was
// written. A nil set has nothing.
func (d *deadLettered) has(offset int64, agent string) bool {
	if d == nil {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.ContainsFunc(d.m[offset], func(e dlqEntry) bool { return e.agent == agent })
}

// add records that agent's dead letter of the record at offset was
// acknowledged at dlqOffset of topic. A nil set records nothing.
func (d *deadLettered) add(offset int64, agent, topic string, dlqOffset int64) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[int64][]dlqEntry{}
	}
	if d.next == nil {
		d.next = map[string]int64{}
	}
	d.m[offset] = append(d.m[offset], dlqEntry{agent: agent, topic: topic, offset: dlqOffset})
	d.next[topic] = max(d.next[topic], dlqOffset+1)
}

// setFloor records floor as the lower bound of topic's later dead letters
// (loadDeadLetters, at the claim's start).
func (d *deadLettered) setFloor(topic string, floor int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.floor == nil {
		d.floor = map[string]int64{}
	}
	d.floor[topic] = floor
}

// prune forgets the offsets below marked, the offset just marked for commit.
func (d *deadLettered) prune(marked int64) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pruneLocked(marked)
}

func (d *deadLettered) pruneLocked(marked int64) {
	for off := range d.m {
		if off < marked {
			delete(d.m, off)
		}
	}
}

// dlqMetaPrefix starts the commit metadata of an at-least-once source offset.
const dlqMetaPrefix = "runnel-dlq:"

// maxDLQMetadata bounds the commit metadata, well below the broker's
// offset.metadata.max.bytes (4096 by default), which would refuse the commit
// itself: topics past it are left out.
const maxDLQMetadata = 1024

// metadata prunes the offsets below marked and returns the commit metadata
// of marked: for each dead-letter topic it knows, the offset from which on
// every dead letter of a record at or after marked lies (the lowest of those
// it holds, else the highest lower bound of dead letters not written yet).
// The format is "runnel-dlq:" then "topic=offset" pairs joined by ","
// (topic names hold neither character), at most maxDLQMetadata bytes. A nil
// set returns "".
func (d *deadLettered) metadata(marked int64) string {
	if d == nil {
		return ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pruneLocked(marked)
	return d.metadataLocked(marked)
}

// metadataFrom is metadata of an offset not yet committed (a commit cycle's
// OffsetCommit, commitMetadata): the same string, without forgetting the
// offsets below from, which a restart from the last commit point still needs
// if the commit fails.
func (d *deadLettered) metadataFrom(from int64) string {
	if d == nil {
		return ""
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.metadataLocked(from)
}

// metadataLocked builds metadata's string from the dead letters of records
// at or after from. Guarded by mu.
func (d *deadLettered) metadataLocked(from int64) string {
	w := map[string]int64{}
	for topic, f := range d.floor {
		w[topic] = max(f, d.next[topic])
	}
	for topic, n := range d.next {
		if _, ok := w[topic]; !ok {
			w[topic] = n
		}
	}
	for off, es := range d.m {
		if off < from {
			continue
		}
		for _, e := range es {
			w[e.topic] = min(w[e.topic], e.offset)
		}
	}
	if len(w) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(dlqMetaPrefix)
	for _, topic := range slices.Sorted(maps.Keys(w)) {
		pair := topic + "=" + strconv.FormatInt(w[topic], 10)
		if b.Len()+1+len(pair) > maxDLQMetadata {
			continue // not named: the next owner does not read that topic
		}
		if b.Len() > len(dlqMetaPrefix) {
			b.WriteByte(',')
		}
		b.WriteString(pair)
	}
	if b.Len() == len(dlqMetaPrefix) {
		return ""
	}
	return b.String()
}

// parseDLQMetadata reads what metadata wrote; anything else (no metadata,
// another writer's) yields an empty map, a malformed pair is skipped.
func parseDLQMetadata(s string) map[string]int64 {
	out := map[string]int64{}
	rest, ok := strings.CutPrefix(s, dlqMetaPrefix)
	if !ok {
		return out
	}
	for _, pair := range strings.Split(rest, ",") {
		topic, off, ok := strings.Cut(pair, "=")
		if n, err := strconv.ParseInt(off, 10, 64); ok && topic != "" && err == nil && n >= 0 {
			out[topic] = n
		}
	}
	return out
}

// loadDeadLetters fills pt's set, at the claim's start under AtLeastOnce,
// with the dead letters of the partition's records at or after from (the
// offset the claim starts at, the committed one) that an earlier owner
// wrote: for each dead-letter topic of the partition's agents, it reads from
// the offset the commit metadata of from names up to the highwater. A topic
// the metadata does not name (no commit yet, or one written before this
// bookkeeping) is not read; its floor is its highwater now. On an error the
// set holds what was read: a record may then be dead-lettered again, as
// before.
func (w *Worker) loadDeadLetters(ctx context.Context, pt *partition, from int64, committed string) error {
	d := pt.deadLetters()
	if d == nil {
		return nil
	}
	agentsOf := map[string][]string{} // dead-letter topic -> agents of the partition writing to it
	for _, r := range pt.runners {
		t := w.app.DeadLetterTopic(r.Name())
		agentsOf[t] = append(agentsOf[t], r.Name())
	}
	meta := map[string]int64{}
	if from >= 0 {
		meta = parseDLQMetadata(dlqPart(committed))
	}
	for _, topic := range slices.Sorted(maps.Keys(agentsOf)) {
		hw, err := w.meta.GetOffset(topic, 0, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("highwater of dead-letter topic %s: %w", topic, err)
		}
		start, ok := meta[topic]
		if !ok || start >= hw {
			d.setFloor(topic, hw)
			continue
		}
		n, err := w.scanDeadLetters(ctx, topic, start, hw, func(dl DeadLetter, dlqOffset int64) {
			if dl.Topic == pt.topic && dl.Partition == pt.p && dl.Offset >= from && slices.Contains(agentsOf[topic], dl.Agent) &&
				!d.has(dl.Offset, dl.Agent) {
				d.add(dl.Offset, dl.Agent, topic, dlqOffset)
			}
		})
		if err != nil {
			return err
		}
		d.setFloor(topic, start)
		if n > 0 {
			w.log.Info("dead letters of records to be processed again found; they are not written again",
				"topic", pt.topic, "partition", pt.p, "from", from, "dlq", topic, "dead_letters", n)
		}
	}
	return nil
}

// committedMetadata returns the metadata committed with the group's offset
// of topic[p] ("" when none).
func (w *Worker) committedMetadata(topic string, p int32) (string, error) {
	coord, err := w.client.Coordinator(w.app.id)
	if err != nil {
		return "", fmt.Errorf("coordinator of group %s: %w", w.app.id, err)
	}
	resp, err := coord.FetchOffset(sarama.NewOffsetFetchRequest(w.client.Config().Version, w.app.id, map[string][]int32{topic: {p}}))
	if err != nil {
		return "", fmt.Errorf("committed offset of %s[%d]: %w", topic, p, err)
	}
	if resp.Err != sarama.ErrNoError {
		return "", fmt.Errorf("committed offset of %s[%d]: %w", topic, p, resp.Err)
	}
	b := resp.GetBlock(topic, p)
	if b == nil {
		return "", nil
	}
	if b.Err != sarama.ErrNoError {
		return "", fmt.Errorf("committed offset of %s[%d]: %w", topic, p, b.Err)
	}
	return b.Metadata, nil
}

// scanDeadLetters calls fn for each record of the dead-letter topic's
// partition 0 from start up to hw (exclusive) and returns the number of
// records fn was called with. It ends early, without error, when nothing arrives
// for 2 s (a log ending with transaction markers, from an earlier
// ExactlyOnce run, never reaches hw).
func (w *Worker) scanDeadLetters(ctx context.Context, topic string, start, hw int64, fn func(DeadLetter, int64)) (int, error) {
	consumer, err := sarama.NewConsumerFromClient(w.meta)
	if err != nil {
		return 0, fmt.Errorf("read dead-letter topic %s: %w", topic, err)
	}
	defer consumer.Close()
	if oldest, err := w.meta.GetOffset(topic, 0, sarama.OffsetOldest); err == nil && start < oldest {
		start = oldest // deleted by retention: nothing to find there
	}
	if start >= hw {
		return 0, nil
	}
	pc, err := consumer.ConsumePartition(topic, 0, start)
	if err != nil {
		return 0, fmt.Errorf("read dead-letter topic %s from %d: %w", topic, start, err)
	}
	defer pc.Close()
	n := 0
	idle := time.NewTimer(2 * time.Second)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("read dead-letter topic %s: %w", topic, ctx.Err())
		case <-idle.C:
			return n, nil
		case m := <-pc.Messages():
			fn(decodeDeadLetter(m), m.Offset)
			n++
			if m.Offset >= hw-1 {
				return n, nil
			}
			idle.Reset(2 * time.Second)
		case e := <-pc.Errors():
			return n, fmt.Errorf("read dead-letter topic %s: %w", topic, e)
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
	type ack struct {
		offset int64 // where the dead letter was written
		err    error
	}
	type sent struct {
		i      int // index in causeIDs
		topic  string
		reason string
		done   chan ack
	}
	var all []sent
	for i, id := range causeIDs {
		if done.has(rec.Offset, id) {
			w.log.Info("record already dead-lettered; not writing it again", "topic", rec.Topic,
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
		s := sent{i: i, topic: topic, reason: reason, done: make(chan ack, 1)}
		if err := w.producer.Send(msg, func(_ int32, off int64, err error) { s.done <- ack{off, err} }); err != nil {
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
		case a := <-s.done:
			if err := a.err; err != nil {
				if first == nil {
					first = fmt.Errorf("dead-letter %s[%d]@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, s.topic, err)
				}
				continue
			}
			done.add(rec.Offset, causeIDs[s.i], s.topic, a.offset)
			w.metrics.deadLettered(rec.Topic, causeIDs[s.i])
			w.log.Warn("record dead-lettered", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset,
				"agent", causeIDs[s.i], "dlq", s.topic, "attempts", attempts, "reason", s.reason)
		case <-ctx.Done():
			return fmt.Errorf("dead-letter %s[%d]@%d to %s: %w", rec.Topic, rec.Partition, rec.Offset, s.topic, ctx.Err())
		}
	}
	return first
}
