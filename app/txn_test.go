package app

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// readCommitted counts the values of partition 0 of topic as a
// read_committed consumer sees them.
func (f *ackFixture) readCommitted(topic string) map[string]int {
	f.t.Helper()
	out := map[string]int{}
	for _, m := range f.readCommittedRecords(topic) {
		out[string(m.Value)]++
	}
	return out
}

// readCommittedRecords returns the records of partition 0 of topic as a
// read_committed consumer gets them, up to the highwater: it ends when only
// control records (transaction markers) or aborted ones are left below it.
func (f *ackFixture) readCommittedRecords(topic string) []*sarama.ConsumerMessage {
	f.t.Helper()
	f.waitTopic(topic)
	// The embedded broker compacts at once: a read from the log start can
	// find it moved (the partition consumer then closes); read again.
	for attempt := 0; ; attempt++ {
		out, closedAt, ok := f.readCommittedOnce(topic)
		if ok {
			return out
		}
		if attempt == 4 {
			f.t.Fatalf("read %s (read_committed): the partition consumer closed at %d five times", topic, closedAt)
		}
	}
}

// readCommittedOnce is one read of readCommittedRecords; ok is false when the
// partition consumer closed at closedAt before the read ended.
func (f *ackFixture) readCommittedOnce(topic string) (out []*sarama.ConsumerMessage, closedAt int64, ok bool) {
	f.t.Helper()
	cfg := testbroker.SaramaConfig(f.t)
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	client, err := sarama.NewClient(f.brokers, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	defer client.Close()
	hwm, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		f.t.Fatal(err)
	}
	cons, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		f.t.Fatal(err)
	}
	defer cons.Close()
	pc, err := cons.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		f.t.Fatal(err)
	}
	defer pc.Close()
	rs := &changelog.Restorer{Client: client}
	next := int64(0)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if to, err := rs.SkipControl(topic, 0, next); err == nil && to >= hwm {
			return out, next, true
		}
		select {
		case m, open := <-pc.Messages():
			if !open {
				return nil, next, false
			}
			out = append(out, m)
			next = m.Offset + 1
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("read %s (read_committed): %d records before the timeout, highwater %d", topic, len(out), hwm)
		}
	}
}

// eosSinkRun runs the agent "twice" (two sink records per input, "<v>-a" and
// "<v>-b"; the first delivery of v5 fails between the two) over v0..v19
// under g and returns the sink as read_committed sees it.
func eosSinkRun(t *testing.T, g Guarantee) map[string]int {
	f := newAckFixture(t, testbroker.Brokers(t), WithGuarantee(g))
	var seen counter
	agent.New(f.app, "twice", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			f.sink.Send(ev, ev.Key, ev.Value+"-a")
			if ev.Value == "v5" && seen.inc(ev.Value) == 1 {
				return errors.New("transient failure after the first sink record")
			}
			f.sink.Send(ev, ev.Key, ev.Value+"-b")
		}
		return s.Err()
	}, agent.SendsTo(f.sink))
	f.start()
	var vs []string
	for i := range 20 {
		vs = append(vs, fmt.Sprintf("v%d", i))
	}
	f.produce(vs...)
	f.eventually(30*time.Second, "committed offset 20", func() bool { return f.committed() == 20 })
	return f.readCommitted(f.sink.Name())
}

// Under ExactlyOnce a record that fails after one of its two sink records was
// acknowledged leaves no trace: the transaction holding that record is
// aborted and the redelivery's records are the only ones a read_committed
// reader sees. Under AtLeastOnce the same run holds the first record twice
// (the test tells the guarantees apart).
func TestExactlyOnceFailedRecordLeavesNoDuplicate(t *testing.T) {
	sink := eosSinkRun(t, ExactlyOnce)
	for i := range 20 {
		for _, suf := range []string{"-a", "-b"} {
			v := fmt.Sprintf("v%d%s", i, suf)
			if sink[v] != 1 {
				t.Errorf("sink holds %s %d times, want 1", v, sink[v])
			}
		}
	}
	if len(sink) != 40 {
		t.Errorf("sink holds %d distinct values, want 40: %v", len(sink), sink)
	}
}

func TestAtLeastOnceFailedRecordDuplicates(t *testing.T) {
	sink := eosSinkRun(t, AtLeastOnce)
	if sink["v5-a"] != 2 || sink["v5-b"] != 1 {
		t.Fatalf("at-least-once sink: v5-a %d times, v5-b %d, want 2 and 1", sink["v5-a"], sink["v5-b"])
	}
}
