package app_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
	"github.com/twmb/franz-go/pkg/kerr"
)

// goWorker runs a worker of a with its own data dir until stop, which
// cancels it and returns Run's error.
func goWorker(t *testing.T, a *app.App, brokers []string, dir string) (w *app.Worker, stop func() error) {
	t.Helper()
	w, err := a.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return w, testbroker.Start(t, w)
}

// words returns n records over the given words, round robin, and the count
// each word gets.
func words(n int, ws ...string) ([]kv, map[string]int) {
	var recs []kv
	want := map[string]int{}
	for i := range n {
		w := ws[i%len(ws)]
		recs = append(recs, kv{w, "x"})
		want[w]++
	}
	return recs, want
}

// With a commit interval longer than the test (and no cycle when idle), the
// only cycle is the final one at the clean stop: the changelog gets one record per key, however many
// updates each key had, and the counts are exact in the store and in a
// restore from the changelog on another worker. The epoch mark is 1 (the
// first owner), and the next activation of the partition writes with 2.
func TestFinalCycleWritesOneRecordPerKey(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id, app.WithCommitInterval(time.Hour), app.WithIdleCommit(-1))
	keys := append(wordPerPartition("a"), wordPerPartition("b")...)
	recs, want := words(400, keys...)
	dir := t.TempDir()
	w, stop := goWorker(t, c.app, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, c.words.Name())
	send(t, brokers, c.words.Name(), recs...)
	// Every record is processed (and held in the caches: no cycle yet, so no
	// changelog record and no commit) before the stop.
	cl := changelog.Topic(id, "counts")
	deadline := time.Now().Add(30 * time.Second)
	for w.Processed() < int64(len(recs)) {
		if time.Now().After(deadline) {
			t.Fatalf("processed %d of %d records", w.Processed(), len(recs))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for p, hw := range testbroker.Highwaters(t, client, cl) {
		if hw != 0 {
			t.Fatalf("changelog partition %d has %d records before any cycle", p, hw)
		}
	}
	tasks := w.Tasks()
	if len(tasks) != parts {
		t.Fatalf("tasks %+v, want %d", tasks, parts)
	}
	for i, ts := range tasks {
		if ts.Partition != int32(i) || ts.State != app.TaskRunning || ts.Sources != 1 || len(ts.Tables) != 1 || ts.Tables[0] != "counts" || ts.Cycles != 0 {
			t.Fatalf("task %d: %+v, want running with one source, table counts and no cycle yet", i, ts)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, hw := range testbroker.Highwaters(t, client, cl) {
		total += hw
	}
	if total != int64(len(keys)) {
		t.Fatalf("changelog holds %d records, want one per key (%d) for %d updates", total, len(keys), len(recs))
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	if tasks := w.Tasks(); len(tasks) != 0 {
		t.Fatalf("tasks after the stop: %+v", tasks)
	}
	if err := app.WaitForLag0(context.Background(), app.WrapClient(client), id, []string{c.words.Name()}, 10*time.Second); err != nil {
		t.Fatalf("offsets not committed by the final cycle: %v", err)
	}
	wantEpochs(t, dir, 1)

	// Another worker (of the same app, with a short interval) restores the
	// same counts; a restart of it takes the partitions over with epoch 2.
	c2 := newCountApp(t, id)
	other := t.TempDir()
	runWorker(t, brokers, c2, other)
	wantCounts(t, storeTable(t, other, "counts"), want)
	wantEpochs(t, other, 1) // restored, never written: the mark of the record read
	recs2, _ := words(len(keys), keys...)
	runWorker(t, brokers, c2, other, recs2...)
	wantEpochs(t, other, 2)
	for k := range want {
		want[k]++
	}
	wantCounts(t, storeTable(t, other, "counts"), want)
}

func wantEpochs(t *testing.T, dir string, epoch int64) {
	t.Helper()
	st, err := stores.OpenPebble(filepath.Join(dir, "tables", "counts"), stores.PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for p := int32(0); p < parts; p++ {
		m, err := st.Marks(p)
		if err != nil {
			t.Fatal(err)
		}
		if m[changelog.EpochMark] != epoch {
			t.Fatalf("partition %d: epoch mark %d, want %d (marks %v)", p, m[changelog.EpochMark], epoch, m)
		}
	}
}

// A cache over its size starts a cycle at once: with a commit interval
// longer than the test, the offsets are still committed while the worker
// runs (each of three rounds reaches lag 0 before the next is sent), so the
// changelog gets a record per key per round, and the counts read through
// cache, flushing cycle and store stay exact.
func TestFullCacheStartsCycle(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id, app.WithCommitInterval(time.Hour), app.WithIdleCommit(-1), app.WithCacheBytes(1))
	keys := wordPerPartition("k")
	dir := t.TempDir()
	_, stop := goWorker(t, c.app, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, c.words.Name())
	want := map[string]int{}
	for range 3 {
		recs, n := words(100, keys...)
		for k, v := range n {
			want[k] += v
		}
		send(t, brokers, c.words.Name(), recs...)
		testbroker.WaitLag0(t, brokers, id, c.words.Name())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	var total int64
	for _, hw := range testbroker.Highwaters(t, client, changelog.Topic(id, "counts")) {
		total += hw
	}
	if total < 3*int64(len(keys)) || total > 300 {
		t.Fatalf("changelog holds %d records for %d keys and 300 updates in 3 rounds: want a cycle per round at least", total, len(keys))
	}
	fresh := t.TempDir()
	runWorker(t, brokers, newCountApp(t, id), fresh)
	wantCounts(t, storeTable(t, fresh, "counts"), want)
}

// A record whose table write has a key of another partition (bad data, or a
// topic keyed by another field) is dead-lettered at once with the reason,
// and the worker goes on: the other records are counted, including those of
// the same partition after it.
func TestForeignKeyIsDeadLettered(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id)
	ws := wordPerPartition("w")
	recs := []kv{{ws[0], "x"}, {ws[0], "return-elsewhere:" + ws[1]}, {ws[0], "x"}, {ws[1], "x"}}
	dir := t.TempDir()
	runWorker(t, brokers, c, dir, recs...) // lag 0: nothing stopped the worker
	wantCounts(t, storeTable(t, dir, "counts"), map[string]int{ws[0]: 2, ws[1]: 1})
	client := testbroker.Client(t, brokers)
	dlq := id + "-count-dlq"
	testbroker.WaitTopic(t, client, dlq)
	var msgs []*sarama.ConsumerMessage
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	for p, hw := range testbroker.Highwaters(t, client, dlq) {
		if hw == 0 {
			continue
		}
		pc, err := consumer.ConsumePartition(dlq, p, 0)
		if err != nil {
			t.Fatal(err)
		}
		for int64(len(msgs)) < hw {
			msgs = append(msgs, <-pc.Messages())
		}
		pc.Close()
	}
	if len(msgs) != 1 {
		t.Fatalf("dead letters %d, want 1", len(msgs))
	}
	var reason string
	for _, h := range msgs[0].Headers {
		if string(h.Key) == app.HeaderReason {
			reason = string(h.Value)
		}
	}
	if !strings.Contains(reason, "table counts") || !strings.Contains(reason, "belongs to partition 1") {
		t.Fatalf("dead-letter reason %q: want the table and the key's partition", reason)
	}
}

// A changelog write that no retry can make (a value above the broker's
// record size limit) stops the worker with the cause instead of restarting
// the partition forever or losing the write.
func TestChangelogRecordTooLargeStopsWorker(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id)
	blobs := table.New(c.app, "blobs", codec.String(), codec.String())
	agent.New(c.app, "blob", c.words, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if ev.Value == "big" {
				blobs.Put(ev, ev.Key, strings.Repeat("x", 2<<20))
			}
		}
		return s.Err()
	}, agent.WritesTo(blobs))
	w, err := c.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), c.words.Name())
	send(t, brokers, c.words.Name(), kv{wordPerPartition("w")[0], "big"})
	select {
	case err := <-done:
		if !errors.Is(err, kerr.MessageTooLarge) {
			t.Fatalf("worker stopped with %v, want the record-too-large cause", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("worker still running 30 s after a changelog record too large to write")
	}
}

// A task that processed records and then hands out none for the idle
// interval cycles at once: with a commit interval longer than the test, the
// group still reaches lag 0 while the worker runs, the changelog holds the
// counts, and no cache had to fill.
func TestIdleTaskCyclesEarly(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id, app.WithCommitInterval(time.Hour))
	recs, want := words(200, wordPerPartition("i")...)
	dir := t.TempDir()
	runWorker(t, brokers, c, dir, recs...) // waits for lag 0 before it stops the worker
	wantCounts(t, storeTable(t, dir, "counts"), want)
}
