package app_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A rebalance that begins while an exactly-once cycle is between its cut
// and its offset commit must not abort the transaction. The coordinator
// bumps the group's generation when the join completes; a TxnOffsetCommit
// still carrying the old generation is refused (ILLEGAL_GENERATION), and
// the abort restarts every partition of the worker from its committed
// offsets: work thrown away at every rebalance (issue #24, the kill -9
// schedule on Kafka: 7 of 14 aborts). The cycle waits for the assignment
// instead and commits under the new generation (KIP-447).
//
// Worker A runs under a steady input with 100 ms cycles while worker B
// joins and leaves twice (cooperative rebalances): A sends refused commits
// again, aborts at most one transaction (see below), and the table and the
// sink are exact.
func TestExactlyOnceRebalanceDoesNotAbort(t *testing.T) {
	if testbroker.Real() {
		t.Skip("slows the group's SyncGroup through kfake's control functions")
	}
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	brokers := b.Addrs()
	// The window: every SyncGroup is answered 600 ms late (the generation
	// is bumped when the join completes, the member learns it from its
	// SyncGroup answer), and every AddOffsetsToTxn 300 ms late, so that a
	// cycle is mostly between its cut and its TxnOffsetCommit when a join
	// begins. SleepControl keeps the rest of the cluster answering.
	c := b.Cluster()
	slow := func(key kmsg.Key, d time.Duration) {
		c.ControlKey(int16(key), func(kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			c.SleepControl(func() { time.Sleep(d) })
			return nil, nil, false
		})
	}
	slow(kmsg.SyncGroup, 600*time.Millisecond)
	slow(kmsg.AddOffsetsToTxn, 300*time.Millisecond)
	id := testbroker.Topic(t, "app")
	fa := newFenceApp(t, id, app.WithCommitInterval(100*time.Millisecond))
	dirA := t.TempDir()
	_, running, stopA := runFenceWorker(t, fa.app, brokers, dirA)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, fa.words.Name())

	keys := append(wordPerPartition("a"), wordPerPartition("b")...)
	want := map[string]int{}
	// The input: 10 records every 20 ms until done, from a goroutine that
	// reports what it sent (or why it stopped) on sent.
	prod := testbroker.SyncProducer(t, brokers)
	defer prod.Close()
	type result struct {
		recs []kv
		err  error
	}
	done := make(chan struct{})
	sent := make(chan result, 1)
	go func() {
		var recs []kv
		for i := 0; ; i++ {
			select {
			case <-done:
				sent <- result{recs: recs}
				return
			case <-time.After(20 * time.Millisecond):
			}
			for _, r := range valueRecords(fmt.Sprintf("r%d-", i), 10, keys, map[string]int{}) {
				p := kafka.PartitionFor([]byte(r.k), parts)
				if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: fa.words.Name(), Partition: p,
					Key: sarama.StringEncoder(r.k), Value: sarama.StringEncoder(r.v)}); err != nil {
					sent <- result{err: err}
					return
				}
				recs = append(recs, r)
			}
		}
	}()
	stopInput := sync.OnceValue(func() result { close(done); return <-sent })
	defer stopInput()
	for round := range 2 {
		time.Sleep(time.Second)
		fb := newFenceApp(t, id, app.WithCommitInterval(100*time.Millisecond))
		wb, _, stopB := runFenceWorker(t, fb.app, brokers, t.TempDir())
		testbroker.Eventually(t, 60*time.Second, "worker B runs tasks", func() bool { return len(wb.Tasks()) > 0 })
		time.Sleep(time.Second)
		if v := fb.metric(t, "runnel_transactions_aborted_total"); v != 0 {
			t.Errorf("round %d: worker B aborted %v transactions while it ran, want 0", round, v)
		}
		if err := stopB(); err != nil {
			t.Fatalf("round %d: worker B stopped with %v", round, err)
		}
	}
	time.Sleep(time.Second)
	res := stopInput()
	if res.err != nil {
		t.Fatalf("input: %v", res.err)
	}
	all := res.recs
	for _, r := range all {
		want[r.k]++
	}
	waitGroupLag0(t, running, client, id, fa.words.Name(), 120*time.Second)
	aborts := fa.metric(t, "runnel_transactions_aborted_total")
	commits := fa.metric(t, "runnel_transactions_committed_total")
	resent := fa.metric(t, "runnel_transaction_offset_commits_resent_total")
	t.Logf("%d records; worker A: %v commits, %v aborts, %v offset commits sent again under a new generation", len(all), commits, aborts, resent)
	if resent == 0 {
		// The slowed SyncGroup and AddOffsetsToTxn make the window wide:
		// without a refusal the test proves nothing.
		t.Errorf("worker A sent no offset commit again under a new generation: the rebalances missed every cycle's commit")
	}
	if err := stopA(); err != nil {
		t.Fatalf("worker A stopped with %v", err)
	}
	// One abort is allowed: when a member's SyncGroup is superseded by the
	// next join (the slowed SyncGroup makes that likely here), its next
	// assignment is two generations on, and a commit refused meanwhile is
	// not sent again (a skipped generation may have given one of its
	// partitions to another member: group.TxnCommitter.rejoined). Without resending,
	// every rebalance aborts (3 or more here).
	if aborts > 1 {
		t.Errorf("worker A aborted %v transactions through two joins and leaves, want at most 1", aborts)
	}
	wantCounts(t, storeTable(t, dirA, "counts"), want)
	wantSinkExact(t, readCommittedValues(t, brokers, fa.out.Name()), all)
}
