package app_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

const parts = 4

// testLogger discards logs unless RUNNEL_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("RUNNEL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// countApp is a word-count app: records keyed by word, an agent that counts
// them into a table; a value "del" deletes the word instead, and a value
// "elsewhere:<key>" writes a key that belongs to another partition (the error
// is recorded, the record otherwise succeeds).
type countApp struct {
	app    *app.App
	words  *agent.Topic[string, string]
	counts *table.Table[string, int64]
	mu     sync.Mutex
	errs   []error
}

func newCountApp(t *testing.T, id string, opts ...app.Option) *countApp {
	t.Helper()
	opts = append([]app.Option{
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200 * time.Millisecond),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id + "-"),
	}, opts...)
	c := &countApp{app: app.New(id, opts...)}
	c.words = app.Topic(c.app, "words", codec.String(), codec.String(), app.Partitions(parts))
	c.counts = table.New(c.app, "counts", codec.String(), codec.DecimalInt64())
	agent.New(c.app, "count", c.words, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			switch {
			case ev.Value == "del":
				c.counts.Delete(ev, ev.Key)
			case strings.HasPrefix(ev.Value, "return-elsewhere:"):
				// The write fails the event (the agent returns nil).
				c.counts.Put(ev, strings.TrimPrefix(ev.Value, "return-elsewhere:"), 1)
			case len(ev.Value) > 10 && ev.Value[:10] == "elsewhere:":
				err := c.counts.TryPut(ev, ev.Value[10:], 1)
				c.mu.Lock()
				c.errs = append(c.errs, err)
				c.mu.Unlock()
			default:
				c.counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			}
		}
		return s.Err()
	}, agent.WritesTo(c.counts))
	return c
}

type kv struct{ k, v string }

// send produces records keyed by word to the partition murmur2 gives the key,
// and returns their (partition, offset).
func send(t *testing.T, brokers []string, topic string, recs ...kv) [][2]int64 {
	t.Helper()
	prod := testbroker.SyncProducer(t, brokers)
	defer prod.Close()
	var out [][2]int64
	for _, r := range recs {
		p := kafka.PartitionFor([]byte(r.k), parts)
		_, off, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: p, Key: sarama.StringEncoder(r.k), Value: sarama.StringEncoder(r.v)})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, [2]int64{int64(p), off})
	}
	return out
}

// runWorker runs one worker, sends recs once the topic exists, waits until the
// group has consumed everything, then stops the worker cleanly and returns it.
func runWorker(t *testing.T, brokers []string, c *countApp, dir string, recs ...kv) *app.Worker {
	t.Helper()
	w, err := c.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	stop := testbroker.Start(t, w)
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), c.words.Name())
	send(t, brokers, c.words.Name(), recs...)
	testbroker.WaitLag0(t, brokers, c.app.ID(), c.words.Name())
	// Lag 0 alone does not mean the worker restored its tables (a worker with
	// nothing to process reaches it at once).
	testbroker.Eventually(t, 30*time.Second, "worker ready", w.Ready)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return w
}

// storeTable reads every partition of the worker's Pebble store of table.
func storeTable(t *testing.T, dir, name string) map[string]string {
	t.Helper()
	st, err := stores.OpenPebble(filepath.Join(dir, "tables", name), stores.PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := map[string]string{}
	for p := int32(0); p < parts; p++ {
		if err := st.Iterate(p, func(k, v []byte) error { m[string(k)] = string(v); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

func wantCounts(t *testing.T, got map[string]string, want map[string]int) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("table has %d keys, want %d: %v", len(got), len(want), got)
	}
	for k, n := range want {
		if got[k] != strconv.Itoa(n) {
			t.Fatalf("count of %q = %q, want %d (table %v)", k, got[k], n, got)
		}
	}
}

// TestCrashAfterChangelogAckBeforeCommit simulates a worker that wrote and got
// acknowledged the changelog records of source records whose offsets it never
// committed (killed between the ack and the commit), and had applied some of
// them, with their source-offset marks, to its store. Compaction then removes
// the record at the store's checkpoint before the restart. The restarted
// worker must find the store dirty from its marks, rebuild it without those
// records, reprocess, and count exactly.
func TestCrashAfterChangelogAckBeforeCommit(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id)
	dir := t.TempDir()
	// One committed word and one new word per partition: the committed word's
	// record is never superseded, so compaction keeps it (and the log start)
	// in every partition; the new words are only ever written by the crash.
	old, fresh := wordPerPartition("w"), wordPerPartition("n")
	var first []kv
	want := map[string]int{}
	for _, w := range old {
		first = append(first, kv{w, "x"})
		want[w] = 1
	}
	// Phase 1: a clean run counts every old word once and commits.
	runWorker(t, brokers, c, dir, first...)
	wantCounts(t, storeTable(t, dir, "counts"), want)

	// Phase 2, the crash: the source gets each new word three times. The
	// crashed worker processed all of them and the broker acknowledged their
	// changelog records (counts 1, 2, 3; one batch each), but the worker
	// applied only round 1 to its store (with the marks the table's ack path
	// writes) and never committed the source offsets.
	var recs []kv
	for range 3 {
		for _, w := range fresh {
			recs = append(recs, kv{w, "x"})
		}
	}
	at := send(t, brokers, c.words.Name(), recs...)
	prod := testbroker.SyncProducer(t, brokers)
	defer prod.Close()
	st, err := stores.OpenPebble(filepath.Join(dir, "tables", "counts"), stores.PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkpoints := map[int32]int64{}
	for i, r := range recs {
		p, off := int32(at[i][0]), at[i][1]
		n := i/len(fresh) + 1
		src := changelog.Source{Topic: c.words.Name(), Partition: p, Offset: off}
		m := &sarama.ProducerMessage{Topic: changelog.Topic(id, "counts"), Partition: p, Key: sarama.StringEncoder(r.k), Value: sarama.StringEncoder(strconv.Itoa(n))}
		for _, h := range src.Headers() {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: h[0], Value: h[1]})
		}
		if _, _, err := prod.SendMessage(m); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			b := &stores.Batch{Offset: m.Offset, Marks: []stores.Mark{{Key: src.MarkKey(), Offset: off}}}
			b.Put([]byte(r.k), []byte("1"))
			if err := st.Apply(p, b); err != nil {
				t.Fatal(err)
			}
			checkpoints[p] = m.Offset
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// Round 2 supersedes every checkpoint record, and round 3 keeps round 2
	// out of the last batch (kfake never cleans the last batch). Kafka keeps
	// the changelog's records for min.compaction.lag.ms (10 min) first.
	waitCompacted(t, brokers, changelog.Topic(id, "counts"), checkpoints)

	// Restart on the same data dir: the marks of round 1 are not below the
	// committed offsets, so the store is rebuilt without the uncommitted
	// records, and reprocessing counts each new word exactly 3 times. (Kept,
	// the store would give 4; restored, the crash's records would give 6.)
	for _, w := range fresh {
		want[w] = 3
	}
	w := runWorker(t, brokers, c, dir)
	wantCounts(t, storeTable(t, dir, "counts"), want)
	if w.Restored() < int64(len(old)) {
		t.Fatalf("restarted worker restored %d records; the dirty store must have been rebuilt from the %d committed ones", w.Restored(), len(old))
	}
	// The rebuilt and reprocessed store's marks are the last source offsets
	// processed, all below the committed offsets.
	wantMarksBelowCommitted(t, brokers, dir, id, c.words.Name())

	// A fresh worker restores from scratch (skipping nothing now that the
	// reprocessed offsets are committed) and holds the same counts.
	freshDir := t.TempDir()
	runWorker(t, brokers, c, freshDir)
	wantCounts(t, storeTable(t, freshDir, "counts"), want)
}

// TestTombstonesAndCoPartitioningThroughWorker runs deletes end to end (local
// store, changelog tombstone, restore on another worker) and a write of a key
// of another partition (ErrNotCoPartitioned).
func TestTombstonesAndCoPartitioningThroughWorker(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id)
	dir := t.TempDir()
	// Find a key that belongs to another partition than "alpha".
	other := ""
	for i := 0; other == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		if kafka.PartitionFor([]byte(k), parts) != kafka.PartitionFor([]byte("alpha"), parts) {
			other = k
		}
	}
	client := testbroker.Client(t, brokers)
	runWorker(t, brokers, c, dir,
		kv{"alpha", "x"}, kv{"alpha", "x"}, kv{"alpha", "del"}, kv{"alpha", "x"}, // revived: 1
		kv{"beta", "x"}, kv{"beta", "del"}, // deleted
		kv{"gamma", "x"}, kv{"alpha", "elsewhere:" + other})
	want := map[string]int{"alpha": 1, "gamma": 1}
	wantCounts(t, storeTable(t, dir, "counts"), want)

	c.mu.Lock()
	errs := c.errs
	c.mu.Unlock()
	if len(errs) != 1 || !errors.Is(errs[0], table.ErrNotCoPartitioned) {
		t.Fatalf("write of %q from alpha's partition: errors %v, want one ErrNotCoPartitioned", other, errs)
	}
	// The changelog holds the tombstone of beta; a worker restoring from
	// scratch ends without beta.
	fresh := t.TempDir()
	runWorker(t, brokers, c, fresh)
	wantCounts(t, storeTable(t, fresh, "counts"), want)
	got, err := app.ReadTable(context.Background(), app.WrapClient(client), c.counts)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || fmt.Sprint(got["alpha"]) != "1" {
		t.Fatalf("ReadTable = %v, want alpha:1 gamma:1", got)
	}
}
