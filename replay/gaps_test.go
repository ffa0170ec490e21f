package replay

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/internal/testbroker"
)

// TestRunCompactedGaps: on a compacted topic whose superseded records were
// removed, the replay reads the survivors, counts every removed offset as a
// gap, and still reaches and commits its stop offset.
func TestRunCompactedGaps(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("compact", 1, map[string]string{"cleanup.policy": "compact"})
	keys := []string{"a", "b", "b", "c", "b", "d", "c", "e", "b"} // offsets 0..8
	for _, k := range keys {
		f.produce(topic, 0, k, "v", time.Now())
	}
	if testbroker.Real() {
		// Kafka cleans only closed segments: scripts/kafka rolls them after
		// 1 s, on the next append.
		time.Sleep(1500 * time.Millisecond)
		f.produce(topic, 0, "z", "v", time.Now())
	}
	// Wait for the cleaner to remove superseded records, then read the
	// survivors with a sarama consumer (independently of the code under
	// test). The last record of each key always survives.
	var want []int64
	deadline := time.Now().Add(60 * time.Second)
	for len(want) == 0 || len(want) == len(keys) {
		if time.Now().After(deadline) {
			t.Fatalf("not compacted: %v", want)
		}
		time.Sleep(200 * time.Millisecond)
		want = survivors(t, f, topic)
	}
	if want[0] != 0 || want[len(want)-1] != 8 {
		t.Fatalf("survivors %v: expected the unique head and the last record", want)
	}
	plan, err := newPlan(f.client, Spec{Topic: topic, Offsets: map[int32]Range{0: {0, 9}}, Group: "r-" + topic, LiveGroup: "live"})
	if err != nil {
		t.Fatal(err)
	}
	pr := newProbe(topic, 1)
	res, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pr.offsets(0); !slices.Equal(got, want) {
		t.Errorf("audited %v, want %v", got, want)
	}
	if res.Records != int64(len(want)) || res.Gaps != 9-int64(len(want)) || res.Partitions[0].Committed != 9 {
		t.Errorf("result %+v", res.Partitions[0])
	}
}

// TestRunTransactionMarkers: transaction markers are gaps, including the
// trailing one that makes the end offset one past the last data record;
// under read_committed the records of an aborted transaction are gaps too.
func TestRunTransactionMarkers(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("txn", 1, nil)
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Producer.Transaction.ID = testbroker.Topic(t, "txid")
	cfg.Net.MaxOpenRequests = 1
	prod, err := sarama.NewSyncProducer(f.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var last int64
	txn := func(n int, commit bool) {
		t.Helper()
		if err := prod.BeginTxn(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			_, off, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 0, Value: sarama.StringEncoder("v"), Timestamp: day0})
			if err != nil {
				t.Fatal(err)
			}
			last = off
		}
		if commit {
			err = prod.CommitTxn()
		} else {
			err = prod.AbortTxn()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	txn(3, true)  // 3 records, a commit marker
	txn(2, false) // 2 records, an abort marker
	txn(2, true)  // 2 records, a commit marker
	// Kafka answers EndTxn before the coordinator wrote the markers: wait
	// for the final one (one past the last record).
	var end int64
	for deadline := time.Now().Add(30 * time.Second); end < last+2; {
		if end, err = f.client.GetOffset(topic, 0, sarama.OffsetNewest); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("end offset %d, last record %d: the final marker never came", end, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// What a reader gets, read independently with sarama consumers.
	uncommitted := dataOffsets(t, f.brokers, sarama.ReadUncommitted, topic, end)
	committed := dataOffsets(t, f.brokers, sarama.ReadCommitted, topic, end)
	if len(uncommitted) != 7 || len(committed) != 5 || uncommitted[len(uncommitted)-1]+1 >= end {
		t.Fatalf("log: end %d, data %v, committed data %v: want 7 and 5 records and a trailing marker", end, uncommitted, committed)
	}
	run := func(client sarama.Client, group string) (*Result, []int64) {
		plan, err := newPlan(client, Spec{Topic: topic, Offsets: map[int32]Range{0: {0, end}}, Group: group, LiveGroup: "live"})
		if err != nil {
			t.Fatal(err)
		}
		pr := newProbe(topic, 1)
		res, err := run(context.Background(), client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		return res, pr.offsets(0)
	}
	res, got := run(f.client, "r-uncommitted-"+topic)
	if !slices.Equal(got, uncommitted) || res.Gaps != end-7 || res.Partitions[0].Committed != end {
		t.Errorf("read_uncommitted: audited %v, result %+v", got, res.Partitions[0])
	}
	rc := testbroker.SaramaConfig(t)
	rc.Consumer.IsolationLevel = sarama.ReadCommitted
	client, err := sarama.NewClient(f.brokers, rc)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	res, got = run(client, "r-committed-"+topic)
	if !slices.Equal(got, committed) || res.Gaps != end-5 || res.Partitions[0].Committed != end {
		t.Errorf("read_committed: audited %v, result %+v", got, res.Partitions[0])
	}
}

// survivors reads partition 0 of topic from offset 0 to its end with a sarama
// consumer and returns the offsets it got.
func survivors(t *testing.T, f *fixture, topic string) []int64 {
	t.Helper()
	c, err := sarama.NewConsumerFromClient(f.client)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var out []int64
	for m := range pc.Messages() {
		out = append(out, m.Offset)
		if m.Offset == 8 {
			break
		}
	}
	return out
}

// dataOffsets reads partition 0 of topic up to end with a sarama consumer at
// isolation level iso and returns the offsets of the records it got.
func dataOffsets(t *testing.T, brokers []string, iso sarama.IsolationLevel, topic string, end int64) []int64 {
	t.Helper()
	cfg := testbroker.SaramaConfig(t)
	cfg.Consumer.IsolationLevel = iso
	c, err := sarama.NewConsumer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	// The last transaction is committed: its last record is end-2, just
	// before the final commit marker, at both isolation levels.
	var out []int64
	timeout := time.After(30 * time.Second)
	for {
		select {
		case m := <-pc.Messages():
			out = append(out, m.Offset)
			if m.Offset == end-2 {
				return out
			}
		case <-timeout:
			t.Fatalf("isolation %v: read %v, never offset %d", iso, out, end-2)
		}
	}
}

// TestPlanReadCommittedEnd: with a transaction open, a read_committed plan
// ends at the last stable offset (the open transaction's first record) and
// its read_committed replay completes without waiting for the transaction;
// a read_uncommitted plan ends at the highwater.
func TestPlanReadCommittedEnd(t *testing.T) {
	f := newFixture(t)
	topic := f.topic("lso", 1, nil)
	for i := 0; i < 3; i++ {
		f.produce(topic, 0, "k", "v", day0) // 0, 1, 2
	}
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Producer.Transaction.ID = testbroker.Topic(t, "txid")
	cfg.Net.MaxOpenRequests = 1
	prod, err := sarama.NewSyncProducer(f.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = prod.AbortTxn() }()
	for i := 0; i < 2; i++ { // 3, 4: open
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 0, Value: sarama.StringEncoder("v"), Timestamp: day0}); err != nil {
			t.Fatal(err)
		}
	}
	spec := Spec{Topic: topic, From: day0, To: day0.Add(time.Hour), Group: "r-" + topic, LiveGroup: "live"}
	plan, err := newPlan(f.client, spec)
	if err != nil {
		t.Fatal(err)
	}
	if pp := plan.Partitions[0]; pp.End != 5 || pp.Stop != 5 {
		t.Fatalf("read_uncommitted plan %+v, want end and stop 5", pp)
	}
	spec.ReadCommitted = true
	plan, err = newPlan(f.client, spec)
	if err != nil {
		t.Fatal(err)
	}
	if pp := plan.Partitions[0]; pp.End != 3 || pp.Stop != 3 || pp.Start != 0 {
		t.Fatalf("read_committed plan %+v, want [0, 3), end 3", pp)
	}
	pr := newProbe(topic, 1)
	res, err := run(context.Background(), f.client, plan, Target{Agent: pr.runner, Effect: "audit"}, Options{ReadCommitted: true, IdleTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := pr.offsets(0); !slices.Equal(got, []int64{0, 1, 2}) || res.Partitions[0].Committed != 3 {
		t.Fatalf("audited %v, result %+v", got, res.Partitions[0])
	}
}
