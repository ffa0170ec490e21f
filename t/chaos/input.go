package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
)

// event is the part of an input line the independent computation reads. It
// is declared here, not taken from the example, so that a decoding mistake
// in the app cannot hide in the expected values.
type event struct {
	EventID string   `json:"event_id"`
	Actor   string   `json:"actor"`
	Added   int64    `json:"added"`
	Deleted int64    `json:"deleted"`
	Dirs    []string `json:"dirs"`
}

// inputRecord is one record to produce: the key (the actor, as the app's
// `send --key-field actor` would) and the JSON line. bad names the kind of a
// bad value (badValues); it goes out as the header chaos-bad, so that the
// verification tells the injected records from the input's.
type inputRecord struct {
	key   string
	value []byte
	bad   string
}

// headerBad marks an injected bad value on the input topic (its kind).
const headerBad = "chaos-bad"

// badValue is one of the seven bad values of issue #12, as a user's data
// would hold them. tableKey, when set, is the table key the app derives
// from the value: the record is keyed so that this table key lies in
// another partition (the app's count-by-actor agent cannot write it there).
// undecodable says the value does not decode as a change at all: every
// agent of the input topic dead-letters it; the others only count-by-actor.
type badValue struct {
	kind        string
	value       []byte
	tableKey    *string
	undecodable bool
}

func ptr(s string) *string { return &s }

// badValues are the seven bad values: JSON null (it once decoded to an
// empty change whose table key "" lay outside the record's partition; the
// JSON codec now refuses it), a valid event keyed by another field than its
// actor (issue #12's two values that once stopped every worker), and five
// other values that do not decode. The wrong-key event has no dirs, so that
// it changes nothing but count-by-actor's dead letters.
var badValues = []badValue{
	{kind: "json-null", value: []byte("null"), undecodable: true},
	{kind: "wrong-key", value: []byte(`{"event_id":"chaos-bad-wrong-key","actor":"chaos-bad-actor","added":3,"deleted":4,"dirs":[]}`), tableKey: ptr("chaos-bad-actor")},
	{kind: "empty", value: []byte{}, undecodable: true},
	{kind: "truncated", value: []byte(`{"event_id":"chaos-bad-truncated","actor":`), undecodable: true},
	{kind: "array", value: []byte(`[1,2,3]`), undecodable: true},
	{kind: "wrong-type", value: []byte(`{"event_id":"chaos-bad-wrong-type","actor":"chaos-bad-actor","added":"many"}`), undecodable: true},
	{kind: "not-utf8", value: []byte("\xff\xfe\x00\x01 not json"), undecodable: true},
}

// withBadValues returns recs with the seven bad values spread over the
// middle of the stream (one after every eighth of it). A value with a table
// key gets a record key whose partition (of partitions) differs from the
// table key's; the others are keyed "chaos-bad".
func withBadValues(recs []inputRecord, partitions int32) []inputRecord {
	out := make([]inputRecord, 0, len(recs)+len(badValues))
	next := 0
	for i, b := range badValues {
		at := (i + 1) * len(recs) / (len(badValues) + 1)
		out = append(out, recs[next:at]...)
		next = at
		key := "chaos-bad"
		if b.tableKey != nil {
			for n := 0; ; n++ {
				key = fmt.Sprintf("chaos-bad-%d", n)
				if kafka.PartitionFor([]byte(key), partitions) != kafka.PartitionFor([]byte(*b.tableKey), partitions) {
					break
				}
			}
		}
		out = append(out, inputRecord{key: key, value: b.value, bad: b.kind})
	}
	return append(out, recs[next:]...)
}

// badKind returns the kind of an injected bad value (its chaos-bad header),
// or "".
func badKind(m *sarama.ConsumerMessage) string {
	for _, h := range m.Headers {
		if h != nil && string(h.Key) == headerBad {
			return string(h.Value)
		}
	}
	return ""
}

// loadInput reads the JSONL file at path (.gz allowed) and returns rounds
// replays of its first limit lines (0: all). Round r > 0 appends "-r<r>" to
// every event_id, so that every produced record has an ID of its own and a
// duplicate can be told from a replay.
func loadInput(path string, limit, rounds int) ([]inputRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("input: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("input %s: %w", path, err)
		}
		defer gz.Close()
		r = gz
	}
	type line struct {
		ev  event
		raw []byte
	}
	var lines []line
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() && (limit <= 0 || len(lines) < limit) {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var ev event
		if err := json.Unmarshal(b, &ev); err != nil {
			return nil, fmt.Errorf("input %s line %d: %w", path, len(lines)+1, err)
		}
		if ev.EventID == "" || ev.Actor == "" {
			return nil, fmt.Errorf("input %s line %d: no event_id or actor", path, len(lines)+1)
		}
		lines = append(lines, line{ev, bytes.Clone(b)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("input %s: %w", path, err)
	}
	out := make([]inputRecord, 0, len(lines)*rounds)
	for round := range rounds {
		for _, l := range lines {
			v := l.raw
			if round > 0 {
				old := []byte(`"event_id":"` + l.ev.EventID + `"`)
				if !bytes.Contains(v, old) {
					return nil, fmt.Errorf("input %s: event_id %s is not written as %s", path, l.ev.EventID, old)
				}
				v = bytes.Replace(v, old, []byte(fmt.Sprintf(`"event_id":"%s-r%d"`, l.ev.EventID, round)), 1)
			}
			out = append(out, inputRecord{key: l.ev.Actor, value: v})
		}
	}
	return out, nil
}

// producer produces the input at a steady rate, in batches, with an
// idempotent producer whose retries ride out a broker outage of a minute.
type producer struct {
	ackedBy []bool       // per record: the broker acknowledged it; written by produce only
	acked   atomic.Int64 // records the broker acknowledged
	failed  atomic.Int64 // records of batches that failed after every retry (not resent)
	errs    []error
	// stop, when not nil, ends the input early (without an error) once
	// closed: the records not sent by then are not part of the run.
	stop chan struct{}
}

// produce sends recs to topic (partitions partitions, the app's murmur2
// placement) at rate records per second until all are sent or ctx ends.
func (p *producer) produce(ctx context.Context, brokers []string, cfg *sarama.Config, topic string, partitions int32, recs []inputRecord, rate int) error {
	c := *cfg
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.Retry.Max = 600
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	c.Metadata.Retry.Max = 600
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	prod, err := sarama.NewSyncProducer(brokers, &c)
	if err != nil {
		return fmt.Errorf("input producer: %w", err)
	}
	defer prod.Close()
	const tick = 100 * time.Millisecond
	batch := max(1, rate/10)
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; i < len(recs); i += batch {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.stop: // nil unless the run ends the input early
			return nil
		case <-t.C:
		}
		end := min(len(recs), i+batch)
		msgs := make([]*sarama.ProducerMessage, 0, end-i)
		for _, r := range recs[i:end] {
			m := &sarama.ProducerMessage{Topic: topic, Partition: kafka.PartitionFor([]byte(r.key), partitions),
				Key: sarama.StringEncoder(r.key), Value: sarama.ByteEncoder(r.value)}
			if r.bad != "" {
				m.Headers = []sarama.RecordHeader{{Key: []byte(headerBad), Value: []byte(r.bad)}}
			}
			msgs = append(msgs, m)
		}
		err := prod.SendMessages(msgs)
		failed := map[*sarama.ProducerMessage]bool{}
		if err != nil {
			// Not resent: a resend could duplicate what the broker did
			// write. The expected values come from the topic itself.
			var perr sarama.ProducerErrors
			if errors.As(err, &perr) {
				for _, e := range perr {
					failed[e.Msg] = true
				}
			} else {
				for _, m := range msgs {
					failed[m] = true
				}
			}
			p.failed.Add(int64(len(failed)))
			if len(p.errs) < 5 {
				p.errs = append(p.errs, err)
			}
		}
		for j, m := range msgs {
			if !failed[m] {
				p.ackedBy[i+j] = true
				p.acked.Add(1)
			}
		}
	}
	return nil
}
