package changelog_test

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/stores"
)

// env is one test's broker, client, consumer and restorer.
type env struct {
	t        *testing.T
	brokers  []string
	client   sarama.Client
	admin    sarama.ClusterAdmin
	restorer *changelog.Restorer
}

func newEnv(t *testing.T) *env {
	t.Helper()
	brokers := testbroker.Brokers(t)
	cfg := testbroker.SaramaConfig(t)
	cfg.Consumer.Return.Errors = true
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sarama.NewClusterAdmin(brokers, testbroker.SaramaConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { consumer.Close(); admin.Close(); client.Close() })
	return &env{t: t, brokers: brokers, client: client, admin: admin,
		restorer: &changelog.Restorer{Client: client, Consumer: consumer, BatchSize: 7, IdleProbe: 100 * time.Millisecond}}
}

// topic creates a changelog topic with one partition and the given extra configs.
func (e *env) topic(base string, cfg map[string]string) string {
	e.t.Helper()
	name := testbroker.Topic(e.t, base)
	entries := map[string]*string{"cleanup.policy": strPtr("compact")}
	for k, v := range cfg {
		entries[k] = strPtr(v)
	}
	if err := e.admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1, ConfigEntries: entries}, false); err != nil {
		e.t.Fatal(err)
	}
	e.waitMetadata(name)
	return name
}

func (e *env) waitMetadata(topic string) {
	e.t.Helper()
	for i := 0; ; i++ {
		if err := e.client.RefreshMetadata(topic); err == nil {
			if ps, err := e.client.Partitions(topic); err == nil && len(ps) > 0 {
				return
			}
		}
		if i > 50 {
			e.t.Fatalf("topic %s never appeared in metadata", topic)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func strPtr(s string) *string { return &s }

type rec struct {
	key, value string
	tombstone  bool
	src        *changelog.Source
	stamp      *changelog.Stamp // a commit cycle's stamp (instead of src)
}

func (r rec) message(topic string) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: topic, Partition: 0, Key: sarama.StringEncoder(r.key)}
	if !r.tombstone {
		m.Value = sarama.StringEncoder(r.value)
	}
	if r.src != nil {
		for _, h := range r.src.Headers() {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: h[0], Value: h[1]})
		}
	}
	if r.stamp != nil {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(changelog.HeaderStamp), Value: r.stamp.Append(nil)})
	}
	return m
}

// produce writes recs to partition 0 one by one (one batch per record, so that
// compaction can remove individual records).
func (e *env) produce(topic string, recs ...rec) {
	e.t.Helper()
	cfg := testbroker.SaramaConfig(e.t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	prod, err := sarama.NewSyncProducer(e.brokers, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	defer prod.Close()
	for _, r := range recs {
		if _, _, err := prod.SendMessage(r.message(topic)); err != nil {
			e.t.Fatal(err)
		}
	}
}

// produceTxn writes recs in one transaction and commits it, so the partition
// ends with a commit marker (the highwater is one past the last data record).
func (e *env) produceTxn(topic string, recs ...rec) { e.produceTxnEnd(topic, true, recs...) }

// produceTxnEnd writes recs in one transaction and commits or aborts it.
func (e *env) produceTxnEnd(topic string, commit bool, recs ...rec) {
	e.t.Helper()
	cfg := testbroker.SaramaConfig(e.t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Idempotent = true
	cfg.Producer.Transaction.ID = testbroker.Topic(e.t, "txn")
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Net.MaxOpenRequests = 1
	prod, err := sarama.NewSyncProducer(e.brokers, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	defer prod.Close()
	if err := prod.BeginTxn(); err != nil {
		e.t.Fatal(err)
	}
	for _, r := range recs {
		if _, _, err := prod.SendMessage(r.message(topic)); err != nil {
			e.t.Fatal(err)
		}
	}
	end := prod.CommitTxn
	if !commit {
		end = prod.AbortTxn
	}
	if err := end(); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) offsets(topic string) (oldest, newest int64) {
	e.t.Helper()
	var err error
	if oldest, err = e.client.GetOffset(topic, 0, sarama.OffsetOldest); err != nil {
		e.t.Fatal(err)
	}
	if newest, err = e.client.GetOffset(topic, 0, sarama.OffsetNewest); err != nil {
		e.t.Fatal(err)
	}
	return oldest, newest
}

func dump(t *testing.T, st stores.Store) map[string]string {
	t.Helper()
	m := map[string]string{}
	if err := st.Iterate(0, func(k, v []byte) error { m[string(k)] = string(v); return nil }); err != nil {
		t.Fatal(err)
	}
	return m
}

func restore(t *testing.T, e *env, topic string, st stores.Store, opts ...changelog.Option) changelog.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := e.restorer.Restore(ctx, topic, 0, st, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func wantMap(t *testing.T, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("table has %d keys, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("key %q = %q, want %q (table %v)", k, got[k], v, got)
		}
	}
}

func TestRestoreEndsOnTrailingTransactionMarker(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	var recs []rec
	for i := range 20 {
		recs = append(recs, rec{key: fmt.Sprintf("k%d", i%5), value: strconv.Itoa(i)})
	}
	e.produceTxn(topic, recs...)
	// Kafka writes the commit marker after EndTxn returns (the coordinator
	// sends WriteTxnMarkers to the partition leader), so wait for it.
	_, end := e.offsets(topic)
	for deadline := time.Now().Add(10 * time.Second); end != 21 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		_, end = e.offsets(topic)
	}
	if end != 21 { // 20 data records + the commit marker
		t.Fatalf("highwater %d, want 21 (20 records + commit marker)", end)
	}
	st := stores.NewMemory()
	start := time.Now()
	res := restore(t, e, topic, st)
	if res.Records != 20 || res.To != 21 || res.From != 0 {
		t.Fatalf("result %+v, want 20 records from 0 to 21", res)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("restore took %v; it should end by the idle probe", el)
	}
	wantMap(t, dump(t, st), map[string]string{"k0": "15", "k1": "16", "k2": "17", "k3": "18", "k4": "19"})
	if off, _ := st.Offset(0); off != 19 {
		t.Fatalf("checkpoint %d, want 19 (the last data record)", off)
	}
	// A second restore from the checkpoint: 19+1 = 20 < 21, only the marker
	// remains; it must finish without reading anything.
	res = restore(t, e, topic, st)
	if res.Records != 0 || res.From != 20 {
		t.Fatalf("second restore %+v, want 0 records from 20", res)
	}
}

func TestRestoreEmptyPartition(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	st := stores.NewMemory()
	res := restore(t, e, topic, st)
	if res.Records != 0 || res.From != 0 || res.To != 0 || res.Rebuilt {
		t.Fatalf("result %+v, want an immediate empty restore", res)
	}
	if off, _ := st.Offset(0); off != stores.NoOffset {
		t.Fatalf("checkpoint %d on an empty partition", off)
	}
}

func TestRestoreTombstones(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	e.produce(topic,
		rec{key: "revived", value: "1"}, rec{key: "revived", tombstone: true}, rec{key: "revived", value: "2"},
		rec{key: "deleted", value: "1"}, rec{key: "deleted", value: "2"}, rec{key: "deleted", tombstone: true},
		rec{key: "kept", value: "x"})
	for _, bs := range []int{1, 1000} { // tombstone and value in separate batches, and in one
		e.restorer.BatchSize = bs
		st := stores.NewMemory()
		// A stale local value of "deleted" must be removed by the tombstone.
		if err := st.Apply(0, &stores.Batch{Ops: []stores.Op{{Key: []byte("deleted"), Value: []byte("stale")}}, Offset: stores.NoOffset}); err != nil {
			t.Fatal(err)
		}
		restore(t, e, topic, st)
		wantMap(t, dump(t, st), map[string]string{"revived": "2", "kept": "x"})
	}
}

func TestRestoreAcrossCompactionGaps(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", map[string]string{"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0"})
	var recs []rec
	want := map[string]string{}
	for i := range 60 {
		k := fmt.Sprintf("k%d", i%6)
		recs = append(recs, rec{key: k, value: strconv.Itoa(i)})
		want[k] = strconv.Itoa(i)
	}
	recs = append(recs, rec{key: "gone", value: "x"}, rec{key: "gone", tombstone: true}, rec{key: "k0", value: "last"})
	want["k0"] = "last"
	e.produce(topic, recs...)
	_, end := e.offsets(topic)

	// Wait for the cleaner (kfake runs it every second) to leave gaps.
	deadline := time.Now().Add(15 * time.Second)
	var read int64
	for {
		st := stores.NewMemory()
		res := restore(t, e, topic, st)
		wantMap(t, dump(t, st), want)
		if res.To != end {
			t.Fatalf("target %d, want %d", res.To, end)
		}
		read = res.Records
		if read < end || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	if read == end {
		if !testbroker.Real() {
			t.Fatalf("kfake never compacted %s (read %d of %d offsets)", topic, read, end)
		}
		t.Logf("real broker did not compact within the wait; restore checked without gaps")
	}
	t.Logf("restored %d records across %d offsets", read, end)

	// A checkpoint just before a gap resumes at the next existing record
	// without a rebuild. (kfake's cleaner also moves the log start forward;
	// Kafka's does not, so look for a gap at or after the log start.)
	oldest, _ := e.offsets(topic)
	present := e.presentOffsets(topic, oldest, end)
	gap := int64(-1)
	for o := oldest; o+1 < end; o++ {
		if present[o] && !present[o+1] {
			gap = o
			break
		}
	}
	if gap < 0 {
		t.Logf("no gap at or after the log start %d; resume-at-gap not checked", oldest)
		return
	}
	st := stores.NewMemory()
	restore(t, e, topic, st)
	// Pretend the store stopped at the gap: k0's last record (end-1) lies after it.
	if err := st.Apply(0, &stores.Batch{Ops: []stores.Op{{Key: []byte("k0"), Value: []byte("old")}}, Offset: gap}); err != nil {
		t.Fatal(err)
	}
	res := restore(t, e, topic, st)
	if res.From != gap+1 || res.Rebuilt {
		t.Fatalf("resume %+v, want from %d (a gap) without rebuild", res, gap+1)
	}
	delete(want, "gone")
	wantMap(t, dump(t, st), want)
}

// presentOffsets reads [from, end) and returns the offsets that hold records.
func (e *env) presentOffsets(topic string, from, end int64) map[int64]bool {
	e.t.Helper()
	c, err := sarama.NewConsumer(e.brokers, testbroker.SaramaConfig(e.t))
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, 0, from)
	if err != nil {
		e.t.Fatal(err)
	}
	defer pc.Close()
	out := map[int64]bool{}
	for {
		select {
		case m := <-pc.Messages():
			out[m.Offset] = true
			if m.Offset+1 >= end {
				return out
			}
		case <-time.After(time.Second):
			return out
		}
	}
}

func TestRestoreCheckpointAheadOfRecreatedTopic(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	e.produce(topic, rec{key: "a", value: "1"}, rec{key: "b", value: "2"})
	st := stores.NewMemory()
	// The store was restored from an earlier incarnation of the topic that
	// reached offset 500, and holds a key the new topic does not have.
	if err := st.Apply(0, &stores.Batch{Ops: []stores.Op{{Key: []byte("old"), Value: []byte("x")}}, Offset: 500}); err != nil {
		t.Fatal(err)
	}
	res := restore(t, e, topic, st)
	if !res.Rebuilt || res.Records != 2 || res.From != 0 {
		t.Fatalf("result %+v, want a rebuild of 2 records from 0", res)
	}
	wantMap(t, dump(t, st), map[string]string{"a": "1", "b": "2"})
	if off, _ := st.Offset(0); off != 1 {
		t.Fatalf("checkpoint %d, want 1", off)
	}
}

func TestRestoreAfterLogStartMoved(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", map[string]string{"cleanup.policy": "delete"})
	for i := range 10 {
		e.produce(topic, rec{key: fmt.Sprintf("k%d", i), value: strconv.Itoa(i)})
	}
	st := stores.NewMemory()
	if err := st.Apply(0, &stores.Batch{Ops: []stores.Op{{Key: []byte("k0"), Value: []byte("0")}, {Key: []byte("k1"), Value: []byte("1")}}, Offset: 1}); err != nil {
		t.Fatal(err)
	}
	if err := e.admin.DeleteRecords(topic, map[int32]int64{0: 6}); err != nil {
		t.Fatal(err)
	}
	res := restore(t, e, topic, st)
	if !res.Rebuilt || res.From != 6 || res.Records != 4 {
		t.Fatalf("result %+v, want a rebuild of 4 records from 6", res)
	}
	wantMap(t, dump(t, st), map[string]string{"k6": "6", "k7": "7", "k8": "8", "k9": "9"})
}

func TestRestoreReportsProgress(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	var recs []rec
	for i := range 50 {
		recs = append(recs, rec{key: fmt.Sprintf("k%d", i), value: "v"})
	}
	e.produce(topic, recs...)
	var mu sync.Mutex
	var got []changelog.Progress
	e.restorer.ProgressInterval = time.Nanosecond
	e.restorer.OnProgress = func(p changelog.Progress) { mu.Lock(); got = append(got, p); mu.Unlock() }
	restore(t, e, topic, stores.NewMemory())
	mu.Lock()
	defer mu.Unlock()
	if len(got) < 2 {
		t.Fatalf("%d progress reports, want intermediate ones and a final one", len(got))
	}
	last := got[len(got)-1]
	if !last.Done || last.Records != 50 || last.Position != 50 || last.Target != 50 || last.Rate <= 0 {
		t.Fatalf("final progress %+v", last)
	}
	for _, p := range got[:len(got)-1] {
		if p.Done || p.Position > p.Target {
			t.Fatalf("intermediate progress %+v", p)
		}
	}
}

// committed is a CommittedFunc over a fixed map for source topic "src".
func committed(m map[int32]int64) changelog.CommittedFunc {
	return func(topic string, p int32) (int64, bool) {
		if topic != "src" {
			return 0, false
		}
		return m[p], true
	}
}

func src(off int64) *changelog.Source {
	return &changelog.Source{Topic: "src", Partition: 0, Offset: off}
}

func TestRestoreSkipsUncommittedSourceRecords(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	// Counts per key; source offsets 0..5, the group committed 4 (records 4 and
	// 5 will be processed again).
	e.produce(topic,
		rec{key: "a", value: "1", src: src(0)}, rec{key: "b", value: "1", src: src(1)},
		rec{key: "a", value: "2", src: src(2)}, rec{key: "c", value: "1", src: src(3)},
		rec{key: "a", value: "3", src: src(4)}, rec{key: "d", value: "1", src: src(5)},
		rec{key: "other", value: "x", src: &changelog.Source{Topic: "untracked", Offset: 99}})
	st := stores.NewMemory()
	res := restore(t, e, topic, st, changelog.SkipUncommitted(committed(map[int32]int64{0: 4})))
	if res.Records != 5 || res.Skipped != 2 {
		t.Fatalf("result %+v, want 5 applied and 2 skipped", res)
	}
	wantMap(t, dump(t, st), map[string]string{"a": "2", "b": "1", "c": "1", "other": "x"})
	if off, _ := st.Offset(0); off != 6 {
		t.Fatalf("checkpoint %d, want 6 (past the skipped records)", off)
	}

	// A store whose last applied record is uncommitted (a worker that crashed
	// after the changelog ack, before the source commit) is rebuilt.
	dirty := stores.NewMemory()
	restore(t, e, topic, dirty) // applies everything, checkpoint 6
	if got := dump(t, dirty)["a"]; got != "3" {
		t.Fatalf("unfiltered a = %q", got)
	}
	wantMarks(t, dirty, map[string]int64{"src/0": 5, "untracked/0": 99})
	e.produce(topic, rec{key: "a", value: "4", src: src(6)})
	// What the table's ack path writes: data, offset and mark in one batch.
	if err := dirty.Apply(0, &stores.Batch{Ops: []stores.Op{{Key: []byte("a"), Value: []byte("4")}}, Offset: 7,
		Marks: []stores.Mark{{Key: src(6).MarkKey(), Offset: 6}}}); err != nil {
		t.Fatal(err)
	}
	res = restore(t, e, topic, dirty, changelog.SkipUncommitted(committed(map[int32]int64{0: 4})))
	if !res.Rebuilt || res.Skipped != 3 {
		t.Fatalf("result %+v, want a rebuild skipping 3", res)
	}
	wantMap(t, dump(t, dirty), map[string]string{"a": "2", "b": "1", "c": "1", "other": "x"})
	// The rebuilt store's marks are those of the applied records only.
	wantMarks(t, dirty, map[string]int64{"src/0": 3, "untracked/0": 99})

	// With everything committed, a clean checkpoint is kept and the tail applied.
	res = restore(t, e, topic, dirty, changelog.SkipUncommitted(committed(map[int32]int64{0: 7})))
	if res.Rebuilt || res.From != 8 || res.Records != 0 {
		t.Fatalf("result %+v, want nothing to do from 8", res)
	}
}

func TestFollowHoldsBackUncommittedRecords(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	e.produce(topic, rec{key: "a", value: "1", src: src(0)}, rec{key: "a", value: "2", src: src(1)}, rec{key: "b", value: "1", src: src(2)})
	var mu sync.Mutex
	commits := map[int32]int64{0: 1}
	f := func(topic string, p int32) (int64, bool) {
		mu.Lock()
		defer mu.Unlock()
		return commits[p], true
	}
	st := stores.NewMemory()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.restorer.Follow(ctx, topic, 0, st, changelog.SkipUncommitted(f)) }()
	waitFor(t, func() bool { off, _ := st.Offset(0); return off == 0 })
	time.Sleep(300 * time.Millisecond)
	if off, _ := st.Offset(0); off != 0 {
		t.Fatalf("standby checkpoint %d, want 0: records 1 and 2 are not committed", off)
	}
	wantMap(t, dump(t, st), map[string]string{"a": "1"})
	mu.Lock()
	commits[0] = 3
	mu.Unlock()
	wantMarks(t, st, map[string]int64{"src/0": 0})
	waitFor(t, func() bool { off, _ := st.Offset(0); return off == 2 })
	wantMap(t, dump(t, st), map[string]string{"a": "2", "b": "1"})
	wantMarks(t, st, map[string]int64{"src/0": 2})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func wantMarks(t *testing.T, st stores.Store, want map[string]int64) {
	t.Helper()
	got, err := st.Marks(0)
	if err != nil {
		t.Fatal(err)
	}
	// The changelog topic's ID is recorded with every restore (topicid.go,
	// TestRecreatedChangelogRebuilds).
	delete(got, changelog.TopicIDHighMark)
	delete(got, changelog.TopicIDLowMark)
	if !maps.Equal(got, want) {
		t.Fatalf("marks %v, want %v", got, want)
	}
}

// TestRestoreDecidesByMarksWhenCheckpointRecordCompacted: the dirty check
// reads the store's marks, not the changelog record at the checkpoint, so it
// answers the same when compaction removed that record. A store whose marks
// are committed keeps its checkpoint and restores only the tail; a store with
// an uncommitted mark is rebuilt, skipping. (The older check could not read a
// compacted checkpoint record and kept the dirty store: b would restore as 1.)
func TestRestoreDecidesByMarksWhenCheckpointRecordCompacted(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", map[string]string{"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"})
	e.produce(topic, rec{key: "a", value: "1", src: src(0)}, rec{key: "b", value: "1", src: src(1)})
	base := stores.NewMemory()
	restore(t, e, topic, base) // checkpoint 1: the record b=1
	wantMarks(t, base, map[string]int64{"src/0": 1})
	// b=2 supersedes the checkpoint record; c=1 keeps b=2 out of the last
	// batch, which kfake's cleaner never touches.
	e.produce(topic, rec{key: "b", value: "2", src: src(2)}, rec{key: "c", value: "1", src: src(3)})
	deadline := time.Now().Add(10 * time.Second)
	for e.presentOffsets(topic, 1, 4)[1] && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if e.presentOffsets(topic, 1, 4)[1] {
		if !testbroker.Real() {
			t.Fatal("kfake never compacted the checkpoint record")
		}
		t.Log("real broker did not compact within the wait; the check is made with the record present")
	}
	clone := func() stores.Store {
		st := stores.NewMemory()
		b := &stores.Batch{Offset: 1, Marks: []stores.Mark{{Key: "src/0", Offset: 1}}}
		if err := base.Iterate(0, func(k, v []byte) error { b.Put(k, v); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := st.Apply(0, b); err != nil {
			t.Fatal(err)
		}
		return st
	}

	// Clean: the group committed past every mark.
	clean := clone()
	res := restore(t, e, topic, clean, changelog.SkipUncommitted(committed(map[int32]int64{0: 4})))
	if res.Rebuilt || res.From != 2 || res.Records != 2 {
		t.Fatalf("clean store: %+v, want the tail [2, 4) without a rebuild", res)
	}
	wantMap(t, dump(t, clean), map[string]string{"a": "1", "b": "2", "c": "1"})
	wantMarks(t, clean, map[string]int64{"src/0": 3})

	// Dirty: the group committed 1, so b=1 (source offset 1) will be
	// processed again and the store must not keep it.
	dirty := clone()
	res = restore(t, e, topic, dirty, changelog.SkipUncommitted(committed(map[int32]int64{0: 1})))
	if !res.Rebuilt {
		t.Fatalf("dirty store: %+v, want a rebuild", res)
	}
	wantMap(t, dump(t, dirty), map[string]string{"a": "1"})
	wantMarks(t, dirty, map[string]int64{"src/0": 0})
}

func TestMarkKey(t *testing.T) {
	for _, c := range []struct {
		k     string
		topic string
		p     int32
		ok    bool
	}{
		{"in/0", "in", 0, true}, {"a.b-c_d/17", "a.b-c_d", 17, true},
		{"in", "", 0, false}, {"/3", "", 0, false}, {"in/x", "", 0, false}, {"in/-1", "", 0, false}, {"in/", "", 0, false},
	} {
		topic, p, ok := changelog.ParseMarkKey(c.k)
		if topic != c.topic || p != c.p || ok != c.ok {
			t.Errorf("ParseMarkKey(%q) = %q, %d, %v; want %q, %d, %v", c.k, topic, p, ok, c.topic, c.p, c.ok)
		}
		if ok {
			if got := (changelog.Source{Topic: topic, Partition: p}).MarkKey(); got != c.k {
				t.Errorf("MarkKey round trip of %q = %q", c.k, got)
			}
		}
	}
}
