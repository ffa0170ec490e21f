package app_test

import (
	"context"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/twmb/franz-go/pkg/kgo"
)

// writeTxns writes each group of records in a transaction of its own,
// committed or, where abort[i] is set, aborted: the log then holds, besides
// the records, one transaction marker per transaction and the aborted
// records, as a topic an ExactlyOnce worker writes does.
func writeTxns(t *testing.T, brokers []string, abort []bool, groups ...[]*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(testbroker.Topic(t, "txn")),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for i, recs := range groups {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(!abort[i])); err != nil {
			t.Fatal(err)
		}
	}
}

// deadLetterRec is a dead letter of agent for the record at offset of topic
// partition 0, as a worker writes it (the headers dlq list reads).
func deadLetterRec(dlq, agentName, topic string, offset int) *kgo.Record {
	return &kgo.Record{Topic: dlq, Partition: 0, Key: []byte("k"), Value: []byte("bad"), Headers: []kgo.RecordHeader{
		{Key: app.HeaderAgent, Value: []byte(agentName)}, {Key: app.HeaderTopic, Value: []byte(topic)},
		{Key: app.HeaderPartition, Value: []byte("0")}, {Key: app.HeaderOffset, Value: []byte(itoa(int64(offset)))},
		{Key: app.HeaderReason, Value: []byte("value is bad")}}}
}

// Under ExactlyOnce a dead-letter topic and a changelog hold transaction
// markers and records of aborted transactions: `dlq list` counts the dead
// letters a read_committed reader gets (3 here, at 7 offsets; issue #26: it
// counted offsets), and `tables dump` shows no value of an aborted
// transaction.
func TestDeadLetterListAndTableDumpReadCommitted(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	o := newOpsApp(t, id)
	dlq, changelog := o.app.DeadLetterTopic("fwd"), o.counts.Changelog()
	testbroker.CreateTopic(t, brokers, dlq, 1, nil)
	testbroker.CreateTopic(t, brokers, changelog, parts, nil)
	src := o.words.Name()
	writeTxns(t, brokers, []bool{false, true, false},
		[]*kgo.Record{deadLetterRec(dlq, "fwd", src, 1), deadLetterRec(dlq, "fwd", src, 2),
			{Topic: changelog, Partition: 0, Key: []byte("a"), Value: []byte("1")}},
		[]*kgo.Record{deadLetterRec(dlq, "fwd", src, 3),
			{Topic: changelog, Partition: 0, Key: []byte("ghost"), Value: []byte("7")}},
		[]*kgo.Record{deadLetterRec(dlq, "fwd", src, 4)},
	)
	if hw := testbroker.Highwaters(t, testbroker.Client(t, brokers), dlq)[0]; hw != 7 {
		t.Fatalf("dead-letter topic highwater %d, want 7 (4 records, 3 markers)", hw)
	}

	list := runCLI(t, o.app, brokers, "dlq", "list")
	var fwd []string
	for _, l := range strings.Split(list, "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "fwd" {
			fwd = f
		}
	}
	if fwd == nil || fwd[2] != "3" || fwd[3] != "3" {
		t.Errorf("dlq list, fwd line %q, want 3 records, 3 not replayed:\n%s", fwd, list)
	}

	dump := runCLI(t, o.app, brokers, "tables", "dump", "counts", "--json")
	if strings.TrimSpace(dump) != `{"a":1}` {
		t.Errorf("tables dump: %s, want only the committed value {\"a\":1}", dump)
	}
}

// `dlq replay` sends a source record back once even when its agent's topic
// holds two dead letters of it (what a worker that crashed after writing a
// dead letter, before committing its offset, leaves: the next owner rejects
// the record again).
func TestReplaySendsEachSourceRecordOnce(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	o := newOpsApp(t, id)
	dlq, src := o.app.DeadLetterTopic("fwd"), o.words.Name()
	testbroker.CreateTopic(t, brokers, dlq, 1, nil)
	testbroker.CreateTopic(t, brokers, src, parts, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := []*kgo.Record{deadLetterRec(dlq, "fwd", src, 1), deadLetterRec(dlq, "fwd", src, 1), deadLetterRec(dlq, "fwd", src, 2)}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	dry := runCLI(t, o.app, brokers, "dlq", "replay", "fwd", "--dry-run")
	if n := strings.Count(dry, " -> "+src); n != 2 {
		t.Errorf("dry run lists %d records, want 2:\n%s", n, dry)
	}
	runCLI(t, o.app, brokers, "dlq", "replay", "fwd")
	if n := total(t, testbroker.Client(t, brokers), src); n != 2 {
		t.Errorf("replay sent %d records to %s, want 2 (one per source record)", n, src)
	}
}
