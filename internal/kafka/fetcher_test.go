package kafka_test

// The Fetcher against a broker (kfake, or real Kafka with
// RUNNEL_KAFKA_BROKERS): every record once, in offset order, with its key,
// value and headers; seeks; read_committed; offsets out of range; a topic
// that appears late; leaders moving (kfake); the bound on what a partition
// buffers.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

func newFetcher(t *testing.T, addrs []string, configure ...func(*kafka.FetcherConfig)) *kafka.Fetcher {
	t.Helper()
	cfg := kafka.FetcherConfig{Brokers: addrs, ClientID: "fetcher-test", MaxWait: 50 * time.Millisecond}
	for _, c := range configure {
		c(&cfg)
	}
	f, err := kafka.NewFetcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func kgoProducer(t *testing.T, addrs []string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.UnknownTopicRetries(-1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produce writes n records "<prefix>-<i>" to partition p, every third with
// a header and every fifth with a nil key.
func produce(t *testing.T, cl *kgo.Client, topic string, p int32, prefix string, n int) {
	t.Helper()
	var recs []*kgo.Record
	for i := range n {
		r := &kgo.Record{Topic: topic, Partition: p, Key: []byte(strconv.Itoa(i)), Value: fmt.Appendf(nil, "%s-%d", prefix, i)}
		if i%5 == 0 {
			r.Key = nil
		}
		if i%3 == 0 {
			r.Headers = []kgo.RecordHeader{{Key: "h", Value: []byte(strconv.Itoa(i))}, {Key: "empty"}}
		}
		recs = append(recs, r)
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// collect takes n records from sub (failing after timeout).
func collect(t *testing.T, sub *kafka.Sub, n int, timeout time.Duration) []*sarama.ConsumerMessage {
	t.Helper()
	var out []*sarama.ConsumerMessage
	deadline := time.After(timeout)
	for len(out) < n {
		select {
		case <-sub.Ready():
			out = sub.Take(out, n-len(out))
		case <-deadline:
			t.Fatalf("took %d of %d records in %v", len(out), n, timeout)
		}
	}
	return out
}

// checkRecords says msgs are records from..from+len(msgs)-1 of produce's
// prefix, in order, keys, values and headers intact.
func checkRecords(t *testing.T, msgs []*sarama.ConsumerMessage, topic string, p int32, prefix string, from int) {
	t.Helper()
	for j, m := range msgs {
		i := from + j
		if m.Topic != topic || m.Partition != p || m.Offset != int64(i) {
			t.Fatalf("record %d: %s[%d]@%d, want %s[%d]@%d", j, m.Topic, m.Partition, m.Offset, topic, p, i)
		}
		if got, want := string(m.Value), fmt.Sprintf("%s-%d", prefix, i); got != want {
			t.Fatalf("offset %d: value %q, want %q", i, got, want)
		}
		if i%5 == 0 {
			if m.Key != nil {
				t.Fatalf("offset %d: key %q, want nil", i, m.Key)
			}
		} else if string(m.Key) != strconv.Itoa(i) {
			t.Fatalf("offset %d: key %q", i, m.Key)
		}
		if i%3 == 0 {
			if len(m.Headers) != 2 || string(m.Headers[0].Key) != "h" || string(m.Headers[0].Value) != strconv.Itoa(i) ||
				string(m.Headers[1].Key) != "empty" || len(m.Headers[1].Value) != 0 {
				t.Fatalf("offset %d: headers %v", i, m.Headers)
			}
		} else if len(m.Headers) != 0 {
			t.Fatalf("offset %d: %d headers, want none", i, len(m.Headers))
		}
		if m.Timestamp.IsZero() {
			t.Fatalf("offset %d: no timestamp", i)
		}
	}
}

func TestFetcherReadsEveryRecordInOrder(t *testing.T) {
	addrs := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "fetch")
	testbroker.CreateTopic(t, addrs, topic, 3, nil)
	cl := kgoProducer(t, addrs)
	for p := range int32(3) {
		produce(t, cl, topic, p, fmt.Sprintf("p%d", p), 2000+int(p)*500)
	}
	// Small fetches, so that each partition takes many.
	f := newFetcher(t, addrs, func(c *kafka.FetcherConfig) { c.PartitionMaxBytes = 4 << 10 })
	subs := []*kafka.Sub{f.Subscribe(topic, 0, 0), f.Subscribe(topic, 1, 0), f.Subscribe(topic, 2, 1234)}
	for p, sub := range subs {
		from := 0
		if p == 2 {
			from = 1234
		}
		n := 2000 + p*500 - from
		got := collect(t, sub, n, 30*time.Second)
		checkRecords(t, got, topic, int32(p), fmt.Sprintf("p%d", p), from)
	}
	// Records written later arrive too, and nothing more than them.
	produce(t, cl, topic, 0, "p0", 0)
	later := []*kgo.Record{{Topic: topic, Partition: 1, Value: []byte("late")}}
	if err := cl.ProduceSync(context.Background(), later...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	got := collect(t, subs[1], 1, 10*time.Second)
	if got[0].Offset != 2500 || string(got[0].Value) != "late" {
		t.Fatalf("late record: @%d %q", got[0].Offset, got[0].Value)
	}
	if hw := subs[1].HighWatermark(); hw != 2501 {
		t.Fatalf("highwater %d, want 2501", hw)
	}
	time.Sleep(200 * time.Millisecond)
	for p, sub := range subs {
		if rest := sub.Take(nil, 1000); len(rest) != 0 {
			t.Fatalf("partition %d: %d records more than written (first @%d)", p, len(rest), rest[0].Offset)
		}
	}
}

func TestFetcherSeekTo(t *testing.T) {
	addrs := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "seek")
	testbroker.CreateTopic(t, addrs, topic, 1, nil)
	cl := kgoProducer(t, addrs)
	produce(t, cl, topic, 0, "v", 3000)
	f := newFetcher(t, addrs, func(c *kafka.FetcherConfig) { c.PartitionMaxBytes = 8 << 10 })
	sub := f.Subscribe(topic, 0, 0)
	checkRecords(t, collect(t, sub, 700, 10*time.Second), topic, 0, "v", 0)
	// Back, while more is buffered and fetches are in flight: the next record
	// taken is the one sought, and every later one follows once.
	sub.SeekTo(10)
	checkRecords(t, collect(t, sub, 2990, 20*time.Second), topic, 0, "v", 10)
	// Forward.
	sub.SeekTo(2995)
	checkRecords(t, collect(t, sub, 5, 10*time.Second), topic, 0, "v", 2995)
}

func TestFetcherReadCommitted(t *testing.T) {
	addrs := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "txn")
	testbroker.CreateTopic(t, addrs, topic, 1, nil)
	plain := kgoProducer(t, addrs)
	txn := kgoProducer(t, addrs, kgo.TransactionalID(testbroker.Topic(t, "txnid")))
	ctx := context.Background()
	write := func(values []string, commit bool) {
		t.Helper()
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			if err := txn.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	write([]string{"a1", "a2"}, true)
	write([]string{"x1", "x2", "x3"}, false)
	if err := plain.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte("plain")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	write([]string{"c1"}, true)
	values := func(ms []*sarama.ConsumerMessage) (out []string) {
		for _, m := range ms {
			out = append(out, string(m.Value))
		}
		return out
	}
	committed := newFetcher(t, addrs, func(c *kafka.FetcherConfig) { c.ReadCommitted = true })
	got := values(collect(t, committed.Subscribe(topic, 0, 0), 4, 10*time.Second))
	if fmt.Sprint(got) != "[a1 a2 plain c1]" {
		t.Fatalf("read_committed: %v, want [a1 a2 plain c1]", got)
	}
	all := newFetcher(t, addrs)
	got = values(collect(t, all.Subscribe(topic, 0, 0), 7, 10*time.Second))
	if fmt.Sprint(got) != "[a1 a2 x1 x2 x3 plain c1]" {
		t.Fatalf("read_uncommitted: %v", got)
	}
}

func TestFetcherOffsetOutOfRange(t *testing.T) {
	addrs := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "range")
	testbroker.CreateTopic(t, addrs, topic, 2, nil)
	cl := kgoProducer(t, addrs)
	produce(t, cl, topic, 0, "v", 20)
	produce(t, cl, topic, 1, "v", 20)
	admin := testbroker.Admin(t, addrs)
	if err := admin.DeleteRecords(topic, map[int32]int64{1: 8}); err != nil {
		t.Fatal(err)
	}
	f := newFetcher(t, addrs)
	// Below the log start: from the log start on, without a Reset (the
	// records skipped are gone).
	below := f.Subscribe(topic, 1, 2)
	checkRecords(t, collect(t, below, 12, 10*time.Second), topic, 1, "v", 8)
	if _, ok := below.Reset(); ok {
		t.Fatal("a Reset below the log start")
	}
	// Above the log end (as after records lost on the broker): a Reset to the
	// log start, and nothing taken until the reader seeks there.
	above := f.Subscribe(topic, 0, 1_000_000)
	testbroker.Eventually(t, 10*time.Second, "a Reset", func() bool { _, ok := above.Reset(); return ok })
	if to, _ := above.Reset(); to != 0 {
		t.Fatalf("Reset to %d, want the log start 0", to)
	}
	time.Sleep(300 * time.Millisecond)
	if got := above.Take(nil, 100); len(got) != 0 {
		t.Fatalf("%d records taken before the seek to the Reset", len(got))
	}
	above.SeekTo(0)
	checkRecords(t, collect(t, above, 20, 10*time.Second), topic, 0, "v", 0)
	if _, ok := above.Reset(); ok {
		t.Fatal("Reset still reported after SeekTo")
	}
}

// Negative start offsets: the log start (sarama.OffsetOldest) and its end
// (OffsetNewest; under read_committed the last stable offset).
func TestFetcherStartOldestNewest(t *testing.T) {
	addrs := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "ends")
	testbroker.CreateTopic(t, addrs, topic, 1, nil)
	cl := kgoProducer(t, addrs)
	produce(t, cl, topic, 0, "v", 10)
	admin := testbroker.Admin(t, addrs)
	if err := admin.DeleteRecords(topic, map[int32]int64{0: 3}); err != nil {
		t.Fatal(err)
	}
	txn := kgoProducer(t, addrs, kgo.TransactionalID(testbroker.Topic(t, "txnid")))
	ctx := context.Background()
	if err := txn.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := txn.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	} // offset 10, open: the last stable offset stays 10
	f := newFetcher(t, addrs, func(c *kafka.FetcherConfig) { c.ReadCommitted = true })
	oldest := f.Subscribe(topic, 0, sarama.OffsetOldest)
	checkRecords(t, collect(t, oldest, 7, 10*time.Second), topic, 0, "v", 3)
	newest := f.Subscribe(topic, 0, sarama.OffsetNewest)
	time.Sleep(500 * time.Millisecond)
	if err := txn.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	got := collect(t, newest, 1, 10*time.Second)
	if got[0].Offset != 10 || string(got[0].Value) != "open" {
		t.Fatalf("from the newest: @%d %q, want the transaction's record @10", got[0].Offset, got[0].Value)
	}
}

func TestFetcherTopicAppearsLate(t *testing.T) {
	addrs := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "late")
	f := newFetcher(t, addrs)
	sub := f.Subscribe(topic, 0, 0)
	time.Sleep(1500 * time.Millisecond)
	testbroker.CreateTopic(t, addrs, topic, 1, nil)
	produce(t, kgoProducer(t, addrs), topic, 0, "v", 50)
	checkRecords(t, collect(t, sub, 50, 20*time.Second), topic, 0, "v", 0)
}

// kfake only: leaders move between three brokers while records are written
// and read; every record arrives once, in order.
func TestFetcherLeadersMove(t *testing.T) {
	b, err := embedded.Start(embedded.Options{Brokers: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	addrs := b.Addrs()
	topic := testbroker.Topic(t, "move")
	testbroker.CreateTopic(t, addrs, topic, 4, nil)
	cl := kgoProducer(t, addrs)
	f := newFetcher(t, addrs, func(c *kafka.FetcherConfig) { c.PartitionMaxBytes = 2 << 10 })
	var subs []*kafka.Sub
	for p := range int32(4) {
		subs = append(subs, f.Subscribe(topic, p, 0))
	}
	const rounds, per = 10, 200
	got := make([][]*sarama.ConsumerMessage, 4)
	for r := range rounds {
		for p := range int32(4) {
			var recs []*kgo.Record
			for i := r * per; i < (r+1)*per; i++ {
				recs = append(recs, &kgo.Record{Topic: topic, Partition: p, Value: fmt.Appendf(nil, "v-%d", i)})
			}
			if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
				t.Fatal(err)
			}
			// Move the partition to the next broker while the fetcher reads.
			if err := b.Cluster().MoveTopicPartition(topic, p, (b.Cluster().LeaderFor(topic, p)+1)%3); err != nil {
				t.Fatal(err)
			}
		}
		for p := range 4 {
			got[p] = collect(t, subs[p], per, 30*time.Second)
			for j, m := range got[p] {
				if i := r*per + j; m.Offset != int64(i) || string(m.Value) != fmt.Sprintf("v-%d", i) {
					t.Fatalf("partition %d round %d: @%d %q, want @%d", p, r, m.Offset, m.Value, i)
				}
			}
		}
	}
}

// A partition nobody takes from holds one fetch at most; a
// batch larger than the bytes asked still comes through.
func TestFetcherBoundsWhatAPartitionHolds(t *testing.T) {
	addrs := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "bound")
	testbroker.CreateTopic(t, addrs, topic, 2, nil)
	// Batches of at most 8 KiB: a broker returns whole batches only.
	small := kgoProducer(t, addrs, kgo.ProducerBatchMaxBytes(8<<10), kgo.ProducerBatchCompression(kgo.NoCompression()))
	value := make([]byte, 1000)
	var recs []*kgo.Record
	for range 4000 { // ~4 MB
		recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Value: value})
	}
	if err := small.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	big := &kgo.Record{Topic: topic, Partition: 1, Value: make([]byte, 300<<10)}
	if err := kgoProducer(t, addrs, kgo.ProducerBatchMaxBytes(1<<20)).ProduceSync(context.Background(), big).FirstErr(); err != nil {
		t.Fatal(err)
	}
	const max = 32 << 10
	f := newFetcher(t, addrs, func(c *kafka.FetcherConfig) { c.PartitionMaxBytes = max })
	sub := f.Subscribe(topic, 0, 0)
	bigSub := f.Subscribe(topic, 1, 0)
	if got := collect(t, bigSub, 1, 10*time.Second); len(got[0].Value) != 300<<10 {
		t.Fatalf("big record: %d bytes", len(got[0].Value))
	}
	time.Sleep(time.Second)
	n, bytes := sub.Buffered()
	// One fetch at most beside kafka.RefetchBelow records: nothing more is
	// fetched while more records wait.
	if limit := 2*max + kafka.RefetchBelow*(1000+64); n == 0 || bytes > limit {
		t.Fatalf("buffered %d records, %d bytes; want some, at most %d bytes", n, bytes, limit)
	}
	got := collect(t, sub, 4000, 30*time.Second)
	for i, m := range got {
		if m.Offset != int64(i) {
			t.Fatalf("record %d at offset %d", i, m.Offset)
		}
	}
}

// Leaders moving every 7 ms between three brokers, small fetches, takes of
// random sizes and random seeks back and forward: every record taken
// continues the position exactly (from a cold review of the Fetcher).
func TestFetcherSeeksWhileLeadersMove(t *testing.T) {
	b, err := embedded.Start(embedded.Options{Brokers: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	addrs := b.Addrs()
	topic := testbroker.Topic(t, "stress")
	testbroker.CreateTopic(t, addrs, topic, 2, nil)
	cl := kgoProducer(t, addrs, kgo.ProducerBatchMaxBytes(2<<10))
	const n = 20000
	produce(t, cl, topic, 0, "v", n)
	produce(t, cl, topic, 1, "v", n)
	f := newFetcher(t, addrs, func(c *kafka.FetcherConfig) { c.PartitionMaxBytes = 3 << 10; c.MaxWait = 5 * time.Millisecond })
	stopMove := make(chan struct{})
	defer close(stopMove)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stopMove:
				return
			case <-time.After(7 * time.Millisecond):
			}
			p := int32(i % 2)
			_ = b.Cluster().MoveTopicPartition(topic, p, (b.Cluster().LeaderFor(topic, p)+1)%3)
		}
	}()
	done := make(chan error, 2)
	for p := range int32(2) {
		go func() {
			sub := f.Subscribe(topic, p, 0)
			defer sub.Close()
			rnd := rand.New(rand.NewPCG(uint64(p+1), 7))
			next, seeks := int64(0), 0
			deadline := time.After(60 * time.Second)
			for next < n {
				select {
				case <-sub.Ready():
				case <-time.After(5 * time.Second):
					done <- fmt.Errorf("partition %d stalled at %d (%d seeks)", p, next, seeks)
					return
				case <-deadline:
					done <- fmt.Errorf("partition %d at %d after 60 s", p, next)
					return
				}
				for _, m := range sub.Take(nil, 1+rnd.IntN(300)) {
					if m.Offset != next {
						done <- fmt.Errorf("partition %d: @%d, want @%d (%d seeks)", p, m.Offset, next, seeks)
						return
					}
					next++
				}
				if rnd.IntN(5) == 0 && next > 0 {
					to := next - rnd.Int64N(min(next, 500))
					if rnd.IntN(3) == 0 {
						to = min(next+rnd.Int64N(200), n-1)
					}
					sub.SeekTo(to)
					next = to
					seeks++
				}
			}
			done <- nil
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// read_committed over 150 committed and aborted transactions interleaved
// with plain records, with fetches of 300 bytes: exactly the committed
// records, in order, also after seeks into the middle (from a cold review).
func TestFetcherReadCommittedManyTransactions(t *testing.T) {
	addrs := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "aborts")
	testbroker.CreateTopic(t, addrs, topic, 1, nil)
	plain := kgoProducer(t, addrs)
	txn := kgoProducer(t, addrs, kgo.TransactionalID(testbroker.Topic(t, "txnid")), kgo.ProducerBatchMaxBytes(1<<10))
	ctx := context.Background()
	var want []string
	for i := range 150 {
		if err := txn.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		commit := i%3 != 0
		var recs []*kgo.Record
		for j := range 1 + i%7 {
			v := fmt.Sprintf("t%d-%d-%v", i, j, commit)
			recs = append(recs, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(v)})
			if commit {
				want = append(want, v)
			}
		}
		if err := txn.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			v := fmt.Sprintf("plain%d", i)
			if err := plain.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
			want = append(want, v)
		}
		if err := txn.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	f := newFetcher(t, addrs, func(c *kafka.FetcherConfig) { c.ReadCommitted = true; c.PartitionMaxBytes = 300 })
	sub := f.Subscribe(topic, 0, 0)
	got := collect(t, sub, len(want), 30*time.Second)
	for i, m := range got {
		if string(m.Value) != want[i] {
			t.Fatalf("record %d @%d: %q, want %q", i, m.Offset, m.Value, want[i])
		}
	}
	for k := range 20 {
		i := (k * 37) % len(got)
		sub.SeekTo(got[i].Offset)
		again := collect(t, sub, len(want)-i, 30*time.Second)
		for j, m := range again {
			if string(m.Value) != want[i+j] {
				t.Fatalf("seek %d: record %d @%d: %q, want %q", k, i+j, m.Offset, m.Value, want[i+j])
			}
		}
	}
}

// A start offset whose lookup fails twice (OFFSET_NOT_AVAILABLE, as a
// broker answers ListOffsets during a leader election) is looked up again,
// also when it is the only partition of its broker's fetch loop (the loop
// must not sleep without a timer; found by a cold review).
func TestFetcherResolveRetriedAlone(t *testing.T) {
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	addrs := b.Addrs()
	topic := testbroker.Topic(t, "resolve")
	testbroker.CreateTopic(t, addrs, topic, 1, nil)
	produce(t, kgoProducer(t, addrs), topic, 0, "v", 10)
	var failed atomic.Int32
	b.Cluster().ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		b.Cluster().KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if len(req.Topics) != 1 || req.Topics[0].Topic != topic || failed.Load() >= 2 {
			return nil, nil, false
		}
		failed.Add(1)
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = topic
		rp := kmsg.NewListOffsetsResponseTopicPartition()
		rp.ErrorCode = kerr.OffsetNotAvailable.Code
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
	f := newFetcher(t, addrs)
	sub := f.Subscribe(topic, 0, sarama.OffsetOldest)
	checkRecords(t, collect(t, sub, 10, 5*time.Second), topic, 0, "v", 0)
	if failed.Load() != 2 {
		t.Fatalf("%d lookups failed, want 2", failed.Load())
	}
}
