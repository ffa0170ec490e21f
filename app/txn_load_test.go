package app_test

import (
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// Exactly-once progresses when records are slow (issue #24: under CPU
// starvation at the default commit interval, 0 offsets were committed in
// 40 minutes, every transaction open past its timeout). Each record takes
// 8 ms here, so what a source hands out at once (a fetched batch and the
// agent's queue of 1024) takes about 10 s to resolve: longer than a cut
// may wait at the default 2.8 s interval, about the 11.2 s transaction
// timeout. The worker must still commit, reach lag 0 and count exactly.
func TestExactlyOnceProgressesWithSlowRecords(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	f := newFenceApp(t, id, app.WithCommitInterval(2800*time.Millisecond))
	f.delay = 8 * time.Millisecond
	dir := t.TempDir()
	w, running, stop := runFenceWorker(t, f.app, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, f.words.Name())
	keys := append(wordPerPartition("a"), wordPerPartition("b")...)
	want := map[string]int{}
	recs := valueRecords("x", 8000, keys, want)
	start := time.Now()
	send(t, brokers, f.words.Name(), recs...)
	waitGroupLag0(t, running, client, id, f.words.Name(), 150*time.Second)
	t.Logf("lag 0 after %.1f s; processed %d records for %d; aborts %v, timed out %v, commits %v",
		time.Since(start).Seconds(), w.Processed(), len(recs),
		f.metric(t, "runnel_transactions_aborted_total"), f.metric(t, "runnel_transactions_timed_out_total"),
		f.metric(t, "runnel_transactions_committed_total"))
	if err := stop(); err != nil {
		t.Fatalf("worker stopped with %v, want a clean stop", err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	wantSinkExact(t, readCommittedValues(t, brokers, f.out.Name()), recs)
}
