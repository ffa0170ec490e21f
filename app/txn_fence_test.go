// The fence tests make a transactional producer fail while its batches for
// several partitions are in flight. They ran without the race detector while
// exactly-once produced through Sarama's transactional producer, whose
// goroutines raced on its last transaction error (IBM/sarama#2913); the
// producer is kgo's now, and they run in every build.

package app_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// fenceApp runs under ExactlyOnce: agent "count" counts each record's key
// into table "counts" and sends two records per input record to topic "out"
// ("<value>-a" and "<value>-b"), so a read_committed reader of "out" sees
// each input value's two records exactly once or the transaction machinery
// is wrong. The first delivery of the record whose value is stallValue
// sends "-a", then blocks for stall before "-b": its transaction outlives
// the transaction timeout.
type fenceApp struct {
	app    *app.App
	words  *agent.Topic[string, string]
	out    *agent.Topic[string, string]
	counts *table.Table[string, int64]
	addr   string

	stallValue string
	stall      time.Duration
	// delay is how long each record takes (a slow agent, or one starved of
	// CPU); set before the worker starts.
	delay   time.Duration
	stalled atomic.Int32 // deliveries of stallValue that stalled
}

func newFenceApp(t *testing.T, id string, opts ...app.Option) *fenceApp {
	t.Helper()
	f := &fenceApp{addr: freeAddr(t)}
	opts = append([]app.Option{
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200 * time.Millisecond),
		app.WithGuarantee(app.ExactlyOnce),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id + "-"),
		app.WithHTTPAddr(f.addr),
	}, opts...)
	f.app = app.New(id, opts...)
	f.words = app.Topic(f.app, "words", codec.String(), codec.String(), app.Partitions(parts))
	f.out = app.Topic(f.app, "out", codec.String(), codec.String(), app.Partitions(parts))
	f.counts = table.New(f.app, "counts", codec.String(), codec.DecimalInt64())
	agent.New(f.app, "count", f.words, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if f.delay > 0 {
				time.Sleep(f.delay)
			}
			f.counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			f.out.Send(ev, ev.Key, ev.Value+"-a")
			if ev.Value == f.stallValue && f.stalled.Add(1) == 1 {
				select {
				case <-time.After(f.stall):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			f.out.Send(ev, ev.Key, ev.Value+"-b")
		}
		return s.Err()
	}, agent.WritesTo(f.counts), agent.SendsTo(f.out))
	return f
}

// valueRecords returns n records with distinct values "<prefix><i>" over
// the keys, round robin, and adds each key's count to want.
func valueRecords(prefix string, n int, keys []string, want map[string]int) []kv {
	recs := make([]kv, n)
	for i := range recs {
		k := keys[i%len(keys)]
		recs[i] = kv{k, fmt.Sprintf("%s%d", prefix, i)}
		want[k]++
	}
	return recs
}

// readCommittedValues counts the values of every partition of topic as a
// read_committed consumer gets them, up to the highwaters.
func readCommittedValues(t *testing.T, brokers []string, topic string) map[string]int {
	t.Helper()
	cfg := testbroker.SaramaConfig(t)
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	cons, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	rs := &changelog.Restorer{Client: client}
	out := map[string]int{}
	for p := int32(0); p < parts; p++ {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		pc, err := cons.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		next := int64(0)
		deadline := time.Now().Add(20 * time.Second)
		for next < hwm {
			select {
			case m := <-pc.Messages():
				out[string(m.Value)]++
				next = m.Offset + 1
				continue
			case <-time.After(100 * time.Millisecond):
			}
			// Nothing more given: only transaction markers and aborted
			// records may be left below the highwater.
			if to, err := rs.SkipControl(topic, p, next); err == nil && to >= hwm {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("read %s[%d] (read_committed): stuck at %d, highwater %d", topic, p, next, hwm)
			}
		}
		pc.Close()
	}
	return out
}

// wantSinkExact checks that out holds "<v>-a" and "<v>-b" exactly once for
// every value of recs, and nothing else.
func wantSinkExact(t *testing.T, out map[string]int, recs []kv) {
	t.Helper()
	for _, r := range recs {
		for _, suf := range []string{"-a", "-b"} {
			if n := out[r.v+suf]; n != 1 {
				t.Errorf("out holds %s %d times, want 1", r.v+suf, n)
			}
		}
	}
	if len(out) != 2*len(recs) {
		t.Errorf("out holds %d distinct values, want %d", len(out), 2*len(recs))
	}
}

// transactionalID is the worker's transactional ID: runnel-<app>-<process
// ID>, the process ID read from its data dir.
func transactionalID(t *testing.T, appID, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "process-id"))
	if err != nil {
		t.Fatal(err)
	}
	return "runnel-" + appID + "-" + strings.TrimSpace(string(b))
}

// txnConfig is the configuration of a producer of transactional ID txnID.
func txnConfig(t *testing.T, txnID string) *sarama.Config {
	t.Helper()
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Errors = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Transaction.ID = txnID
	return cfg
}

// initProducerID initializes the transactional ID of cfg as a new producer
// does (InitProducerId: the epoch is bumped, the previous producer of the ID
// fenced) and closes that producer. Safe to call from any goroutine.
func initProducerID(brokers []string, cfg *sarama.Config) error {
	p, err := sarama.NewAsyncProducer(brokers, cfg)
	if err != nil {
		return fmt.Errorf("init producer ID %s: %w", cfg.Producer.Transaction.ID, err)
	}
	_ = p.Close()
	return nil
}

// metric returns a sample of the worker's /metrics (0 when absent).
func (f *fenceApp) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, _ := sample(httpGet(t, "http://"+f.addr+"/metrics"), name, labels...)
	return v
}

// runFenceWorker runs a worker of a with data dir dir; running ends when Run
// returns (a worker that stops on its own fails the waits bound to it at
// once), and stop cancels the worker and returns Run's error.
func runFenceWorker(t *testing.T, a *app.App, brokers []string, dir string) (w *app.Worker, running context.Context, stop func() error) {
	t.Helper()
	w, err := a.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	running, ended := context.WithCancel(context.Background())
	var runErr error
	go func() { runErr = w.Run(ctx); ended() }()
	t.Cleanup(func() { cancel(); <-running.Done() })
	return w, running, func() error { cancel(); <-running.Done(); return runErr }
}

// waitGroupLag0 waits until the group committed every record of topic, failing
// at once when the worker stopped.
func waitGroupLag0(t *testing.T, running context.Context, client sarama.Client, group, topic string, d time.Duration) {
	t.Helper()
	if err := app.WaitForLag0(running, app.WrapClient(client), group, []string{topic}, d); err != nil {
		t.Fatalf("%v (worker stopped: %v)", err, running.Err() != nil)
	}
}

// waitProcessed waits until the worker resolved at least n records.
func waitProcessed(t *testing.T, w *app.Worker, n int64) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); w.Processed() < n; {
		if time.Now().After(deadline) {
			t.Fatalf("processed %d records, want at least %d", w.Processed(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A second producer that initializes the worker's transactional ID while
// the worker runs fences the worker's producer. The worker renews its
// producer in place (new epoch), restarts every partition from its committed
// offsets and goes on: it keeps running, the table and the sink are exact,
// and the metrics and the log say it was fenced.
func TestExactlyOnceSurvivesFencedProducer(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	f := newFenceApp(t, id)
	dir := t.TempDir()
	w, running, stop := runFenceWorker(t, f.app, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, f.words.Name())
	keys := append(wordPerPartition("a"), wordPerPartition("b")...)
	want := map[string]int{}
	first := valueRecords("x", 400, keys, want)
	send(t, brokers, f.words.Name(), first...)
	// The fence lands while the worker processes and commits: its open
	// transaction holds records, or its next one will.
	waitProcessed(t, w, 100)
	if err := initProducerID(brokers, txnConfig(t, transactionalID(t, id, dir))); err != nil {
		t.Fatal(err)
	}
	second := valueRecords("y", 400, keys, want)
	send(t, brokers, f.words.Name(), second...)
	waitGroupLag0(t, running, client, id, f.words.Name(), 60*time.Second)
	// One renewal; or two when the fencing producer's InitProducerId, retried
	// until the broker aborted the worker's transaction, landed after the
	// first (group.ZombieRule).
	if n := f.metric(t, "runnel_transactional_producer_renewals_total", "reason=fenced"); n != 1 && n != 2 {
		t.Errorf("renewals (fenced) = %v, want 1 or 2", n)
	}
	if n := f.metric(t, "runnel_transactions_committed_total"); n < 1 {
		t.Errorf("transactions committed after the renewal: %v", n)
	}
	if err := stop(); err != nil {
		t.Fatalf("worker stopped with %v, want a clean stop", err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	wantSinkExact(t, readCommittedValues(t, brokers, f.out.Name()), append(first, second...))
}

// An agent that stalls longer than the transaction timeout keeps the worker's
// transaction open: the broker aborts it (transaction.timeout.ms) and bumps
// the producer's epoch. The next send into that transaction fails (another
// partition's, or the stalled agent's when it goes on); the worker aborts
// what it can, renews the producer if it must (it must on kfake and Kafka
// 4.4: the abort is refused with PRODUCER_FENCED), and processes everything
// again from the committed offsets: the sink record sent before the stall is
// gone (aborted), the table and the sink are exact.
func TestExactlyOnceSurvivesTransactionTimeout(t *testing.T) {
	defer app.SetMinTxnTimeout(2 * time.Second)()
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	f := newFenceApp(t, id)
	f.stallValue = "x150"
	// The broker aborts a timed-out transaction at its next check: kfake at
	// the timeout, Kafka every
	// transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s).
	f.stall = 3 * 2 * time.Second
	if testbroker.Real() {
		f.stall = 2*time.Second + 12*time.Second
	}
	dir := t.TempDir()
	w, running, stop := runFenceWorker(t, f.app, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, f.words.Name())
	keys := append(wordPerPartition("a"), wordPerPartition("b")...)
	want := map[string]int{}
	first := valueRecords("x", 400, keys, want)
	send(t, brokers, f.words.Name(), first...)
	waitProcessed(t, w, 1)
	second := valueRecords("y", 200, keys, want)
	send(t, brokers, f.words.Name(), second...)
	waitGroupLag0(t, running, client, id, f.words.Name(), 90*time.Second)
	if n := f.stalled.Load(); n < 2 {
		t.Errorf("%s delivered %d times, want a stalled delivery and its redelivery", f.stallValue, n)
	}
	if n := f.metric(t, "runnel_transactions_timed_out_total"); n < 1 {
		t.Errorf("transactions timed out = %v, want at least 1", n)
	}
	if err := stop(); err != nil {
		t.Fatalf("worker stopped with %v, want a clean stop", err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	wantSinkExact(t, readCommittedValues(t, brokers, f.out.Name()), append(first, second...))
}

// Another live process that keeps initializing the worker's transactional
// ID (two workers with the same data dir's process ID, say) would make the
// two fence each other for ever: a third fence within two minutes stops the
// worker with ErrTransactionalIDInUse (group.ZombieRule), whether the other
// process fences it faster than it commits (fast: every 20 ms) or slower
// (slow: once a second, five commit intervals, so that the worker commits
// between fences). Nothing it processed was committed twice or lost: a
// worker restarted on the data dir once the other process is gone leaves
// the table and the sink exact.
func TestExactlyOnceStopsWhenTransactionalIDInUse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
	}{{"fast", 20 * time.Millisecond}, {"slow", time.Second}} {
		t.Run(tc.name, func(t *testing.T) { testStopsWhenTransactionalIDInUse(t, tc.every) })
	}
}

func testStopsWhenTransactionalIDInUse(t *testing.T, every time.Duration) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	f := newFenceApp(t, id)
	dir := t.TempDir()
	w, err := f.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, f.words.Name())
	keys := append(wordPerPartition("a"), wordPerPartition("b")...)
	want := map[string]int{}
	recs := valueRecords("x", 200, keys, want)
	send(t, brokers, f.words.Name(), recs...)
	waitProcessed(t, w, 50)
	// The other process: it initializes the ID again and again, as a
	// worker renewing its own producer would. Records keep coming, so that
	// the worker's transactions hold records (an empty one never reaches
	// the broker).
	zcfg := txnConfig(t, transactionalID(t, id, dir))
	pcfg := testbroker.SaramaConfig(t)
	pcfg.Producer.Partitioner = sarama.NewManualPartitioner
	prod, err := sarama.NewSyncProducer(brokers, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	zctx, stopZombie := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for zctx.Err() == nil {
			if err := initProducerID(brokers, zcfg); err != nil {
				t.Error(err)
				return
			}
			select {
			case <-zctx.Done():
			case <-time.After(every):
			}
		}
	}()
	var more []kv // sent while the other process runs; read after wg.Wait
	go func() {
		defer wg.Done()
		for i := 0; zctx.Err() == nil; i++ {
			r := kv{keys[i%len(keys)], fmt.Sprintf("z%d", i)}
			m := &sarama.ProducerMessage{Topic: f.words.Name(), Partition: kafka.PartitionFor([]byte(r.k), parts),
				Key: sarama.StringEncoder(r.k), Value: sarama.StringEncoder(r.v)}
			if _, _, err := prod.SendMessage(m); err != nil {
				t.Error(err)
				return
			}
			more = append(more, r)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	select {
	case err := <-done:
		if !errors.Is(err, app.ErrTransactionalIDInUse) {
			t.Errorf("worker stopped with %v, want ErrTransactionalIDInUse", err)
		}
	case <-time.After(60 * time.Second):
		t.Error("worker still runs while another process keeps fencing it")
		cancel()
		<-done
	}
	stopZombie()
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, r := range more {
		want[r.k]++
	}
	recs = append(recs, more...)
	// The other process is gone: the data dir's worker takes the ID back
	// and processes what was not committed.
	_, running, stop := runFenceWorker(t, f.app, brokers, dir)
	waitGroupLag0(t, running, client, id, f.words.Name(), 60*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("restarted worker stopped with %v, want a clean stop", err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	wantSinkExact(t, readCommittedValues(t, brokers, f.out.Name()), recs)
}
