package changelog_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/stores"
)

// produceAbortedTxn writes recs in one transaction and aborts it, so the
// partition ends with aborted records and an abort marker.
func (e *env) produceAbortedTxn(topic string, recs ...rec) { e.produceTxnEnd(topic, false, recs...) }

// readCommittedRestorer is e's restorer reading read_committed, as a restore
// under exactly-once must (docs/design.md §5.2: restore reads read_committed; the
// target is then the last stable offset).
func readCommittedRestorer(e *env) *changelog.Restorer {
	e.t.Helper()
	cfg := testbroker.SaramaConfig(e.t)
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	client, err := sarama.NewClient(e.brokers, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { consumer.Close(); client.Close() })
	return &changelog.Restorer{Client: client, Consumer: consumer, BatchSize: 7, IdleProbe: 100 * time.Millisecond}
}

// The offsets just below the target hold nothing a read_committed reader is
// given: an aborted transaction (its records and the abort marker) ends the
// partition. Sarama delivers none of them, so the position stays at the first
// aborted offset; the idle probe fetches [position, target) read_uncommitted,
// sees the aborted data records, concludes that data is still to come, and
// waits again, forever: the partition and /readyz never become ready (#12,
// "Restore that never ends").
//
// This fails on the Restorer of this commit (the restore runs until its
// 10 s context ends). The fix belongs in changelog.go (see the report of the
// robustness branch): the probe must judge [position, target) with the
// reader's isolation (a record of an aborted transaction is not data for
// read_committed, as KIP-98's AbortedTransactions list in the fetch response
// says), and a fetch at a position below the target that returns no batch at
// all, with the highwater at or past the target, must end the restore too
// (Kafka after compaction removed a trailing marker or tombstone).
func TestRestoreEndsWhenOnlyAbortedRecordsRemain(t *testing.T) {
	e := newEnv(t)
	// Without compaction: kfake's cleaner (1 s tick) drops aborted batches,
	// which would hide the case.
	topic := e.topic("cl", map[string]string{"cleanup.policy": "delete"})
	var committed []rec
	for i := range 10 {
		committed = append(committed, rec{key: fmt.Sprintf("k%d", i%5), value: strconv.Itoa(i)})
	}
	e.produce(topic, committed...)
	var aborted []rec
	for i := range 5 {
		aborted = append(aborted, rec{key: fmt.Sprintf("k%d", i), value: "aborted"})
	}
	e.produceAbortedTxn(topic, aborted...)
	// 10 records, 5 aborted records, the abort marker; the marker is written
	// after AbortTxn returns (WriteTxnMarkers), so wait for it.
	_, end := e.offsets(topic)
	for deadline := time.Now().Add(10 * time.Second); end != 16 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		_, end = e.offsets(topic)
	}
	if end != 16 {
		t.Fatalf("highwater %d, want 16 (10 records, 5 aborted, the abort marker)", end)
	}

	r := readCommittedRestorer(e)
	st := stores.NewMemory()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	res, err := r.Restore(ctx, topic, 0, st)
	if err != nil {
		t.Fatalf("restore did not end after %v: %v (result %+v)", time.Since(start).Round(time.Millisecond), err, res)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("restore took %v; it should end by the idle probe", el)
	}
	if res.Records != 10 || res.To != 16 {
		t.Fatalf("result %+v, want the 10 committed records, target 16", res)
	}
	wantMap(t, dump(t, st), map[string]string{"k0": "5", "k1": "6", "k2": "7", "k3": "8", "k4": "9"})
	if off, _ := st.Offset(0); off < 9 {
		t.Fatalf("checkpoint %d, want at least 9 (the last committed record)", off)
	}
}

// One transactional producer commits, aborts, then commits again. A reader at
// the aborted transaction skips its records and the abort marker and stops
// at the first record of the next, committed transaction: an aborted
// transaction of a producer does not make that producer's later batches
// aborted too (the restore's idle probe would otherwise end a restore
// before records it must apply, and a source would commit past them).
func TestSkipControlStopsAtCommittedDataAfterAbort(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", map[string]string{"cleanup.policy": "delete"})
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Idempotent = true
	cfg.Producer.Transaction.ID = testbroker.Topic(t, "txn")
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Net.MaxOpenRequests = 1
	prod, err := sarama.NewSyncProducer(e.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	txn := func(commit bool, recs ...rec) {
		t.Helper()
		if err := prod.BeginTxn(); err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if _, _, err := prod.SendMessage(r.message(topic)); err != nil {
				t.Fatal(err)
			}
		}
		end := prod.CommitTxn
		if !commit {
			end = prod.AbortTxn
		}
		if err := end(); err != nil {
			t.Fatal(err)
		}
	}
	txn(true, rec{key: "a", value: "1"})                                   // offsets 0, marker 1
	txn(false, rec{key: "b", value: "aborted"}, rec{key: "b", value: "x"}) // 2, 3, marker 4
	txn(true, rec{key: "c", value: "3"})                                   // 5, marker 6
	_, end := e.offsets(topic)
	for deadline := time.Now().Add(10 * time.Second); end != 7 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		_, end = e.offsets(topic)
	}
	if end != 7 {
		t.Fatalf("highwater %d, want 7", end)
	}
	r := readCommittedRestorer(e)
	for _, c := range []struct{ from, want int64 }{{0, 0}, {1, 5}, {2, 5}, {5, 5}, {6, 7}} {
		got, err := r.SkipControl(topic, 0, c.from)
		if err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("SkipControl from %d = %d, want %d", c.from, got, c.want)
		}
	}
	st := stores.NewMemory()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.Restore(ctx, topic, 0, st); err != nil {
		t.Fatal(err)
	}
	wantMap(t, dump(t, st), map[string]string{"a": "1", "c": "3"})
}
