package app_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/stores"
)

// wordPerPartition returns one word per partition of the count app's topic:
// the first "<prefix><i>" that murmur2 puts in partition 0, 1, ...
func wordPerPartition(prefix string) []string {
	out := make([]string, parts)
	for i, found := 0, 0; found < parts; i++ {
		w := fmt.Sprintf("%s%d", prefix, i)
		if p := kafka.PartitionFor([]byte(w), parts); out[p] == "" {
			out[p] = w
			found++
		}
	}
	return out
}

// present reports whether partition p of topic holds a record at offset.
func present(t *testing.T, brokers []string, topic string, p int32, offset int64) bool {
	t.Helper()
	c, err := sarama.NewConsumer(brokers, testbroker.SaramaConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, p, offset)
	if errors.Is(err, sarama.ErrOffsetOutOfRange) {
		return false // below the log start
	}
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	select {
	case m := <-pc.Messages():
		return m.Offset == offset
	case <-time.After(2 * time.Second):
		t.Fatalf("%s[%d]: no record at or after %d", topic, p, offset)
		return false
	}
}

// waitCompacted waits until compaction removed the record at offsets[p] of
// every partition p of topic. kfake's cleaner runs every second; a real
// broker keeps the records of a changelog for min.compaction.lag.ms (10 min),
// so there the test goes on with the records present and logs it.
func waitCompacted(t *testing.T, brokers []string, topic string, offsets map[int32]int64) {
	t.Helper()
	if testbroker.Real() {
		t.Logf("real broker: %s keeps its records for min.compaction.lag.ms; continuing without compaction", topic)
		return
	}
	deadline := time.Now().Add(15 * time.Second)
	for p, off := range offsets {
		for present(t, brokers, topic, p, off) {
			if time.Now().After(deadline) {
				t.Fatalf("compaction never removed %s[%d] offset %d", topic, p, off)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// wantMarksBelowCommitted checks the marks of the worker's counts store after
// a clean stop: every record of the count app writes the table, so the mark of
// each source partition is exactly its last processed offset, committed - 1.
func wantMarksBelowCommitted(t *testing.T, brokers []string, dir, group, topic string) {
	t.Helper()
	committed := testbroker.Committed(t, brokers, group, topic)
	st, err := stores.OpenPebble(filepath.Join(dir, "tables", "counts"), stores.PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for p := int32(0); p < parts; p++ {
		marks, err := st.Marks(p)
		if err != nil {
			t.Fatal(err)
		}
		key := changelog.Source{Topic: topic, Partition: p}.MarkKey()
		if committed[p] <= 0 {
			continue
		}
		if got, ok := marks[key]; !ok || got != committed[p]-1 {
			t.Fatalf("partition %d: marks %v, want %s = %d (committed %d)", p, marks, key, committed[p]-1, committed[p])
		}
	}
}

// checkpoints returns the changelog checkpoint of every partition of the
// worker's counts store (stores.NoOffset where it has none).
func checkpoints(t *testing.T, dir string) map[int32]int64 {
	t.Helper()
	st, err := stores.OpenPebble(filepath.Join(dir, "tables", "counts"), stores.PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	out := map[int32]int64{}
	for p := int32(0); p < parts; p++ {
		if out[p], err = st.Offset(p); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestCleanStopThenCompactionKeepsStore: a worker stops cleanly; another one
// (own data dir) then writes the same keys in two runs, and compaction removes
// the records at the first worker's checkpoints. Restarted on its data dir,
// the first worker finds its marks below the committed offsets, keeps its
// store and replays exactly the changelog tail after its checkpoints. (A check
// that needs the checkpoint record would have to guess here, and a guess of
// "dirty" would replay the whole changelog.)
func TestCleanStopThenCompactionKeepsStore(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id)
	dirA, dirB := t.TempDir(), t.TempDir()
	topic := changelog.Topic(id, "counts")
	// A once-word first in every partition keeps the first changelog batch,
	// and so kfake's log start, in place (kfake moves the log start up to the
	// first batch it keeps; Kafka does not).
	once, words := wordPerPartition("once"), wordPerPartition("w")
	round := func() []kv {
		var out []kv
		for _, w := range words {
			out = append(out, kv{w, "x"})
		}
		return out
	}
	var first []kv
	for _, w := range once {
		first = append(first, kv{w, "x"})
	}
	// Two runs, so two commit cycles and two changelog batches per
	// partition: a cycle writes one record per key.
	first = append(first, round()...)
	runWorker(t, brokers, c, dirA, first...)
	runWorker(t, brokers, c, dirA, round()...)
	wantMarksBelowCommitted(t, brokers, dirA, id, c.words.Name())
	cpA := checkpoints(t, dirA)

	// B restores everything, then counts each word twice more, in two runs
	// (two separate changelog batches per partition, so that the first one
	// is not the last batch, which kfake never cleans).
	runWorker(t, brokers, c, dirB, round()...)
	runWorker(t, brokers, c, dirB, round()...)
	waitCompacted(t, brokers, topic, cpA)

	client := testbroker.Client(t, brokers)
	var tail int64
	for p := int32(0); p < parts; p++ {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		tail += hw - (cpA[p] + 1) // cpA[p] is NoOffset (-1) where A has nothing
	}

	w := runWorker(t, brokers, c, dirA)
	if w.RestoredSpan() != tail {
		t.Fatalf("restarted worker replayed %d changelog offsets, want the tail %d after its checkpoints %v", w.RestoredSpan(), tail, cpA)
	}
	want := map[string]int{}
	for _, w := range once {
		want[w] = 1
	}
	for _, w := range words {
		want[w] = 4
	}
	wantCounts(t, storeTable(t, dirA, "counts"), want)
	wantMarksBelowCommitted(t, brokers, dirA, id, c.words.Name())
}
