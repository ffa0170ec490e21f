package kafka_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// prodEnv is a broker with one topic and a non-transactional producer on
// it; client reads the topic back.
type prodEnv struct {
	cluster *kfake.Cluster
	addrs   []string
	topic   string
	client  sarama.Client
	p       *kafka.Producer
}

// newProdEnv starts kfake (a test injects faults through its cluster),
// creates a topic of parts partitions and a producer with a short retry
// backoff.
func newProdEnv(t *testing.T, parts int32, configure ...func(*kafka.ProducerConfig)) *prodEnv {
	t.Helper()
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return newProdEnvOn(t, b.Cluster(), b.Addrs(), parts, configure...)
}

// newProdEnvTier is newProdEnv on the test tier's broker (real Kafka when
// RUNNEL_KAFKA_BROKERS is set), for tests that inject no fault.
func newProdEnvTier(t *testing.T, parts int32, configure ...func(*kafka.ProducerConfig)) *prodEnv {
	t.Helper()
	return newProdEnvOn(t, nil, testbroker.Brokers(t), parts, configure...)
}

// newProdEnvOn is newProdEnv on the broker at addrs (cluster, when not nil,
// is that broker for fault injection); configure changes the producer's
// configuration.
func newProdEnvOn(t *testing.T, cluster *kfake.Cluster, addrs []string, parts int32, configure ...func(*kafka.ProducerConfig)) *prodEnv {
	t.Helper()
	return newProdEnvTopic(t, cluster, addrs, parts, nil, configure...)
}

// newProdEnvTopic is newProdEnvOn with topic configs (nil: the broker's
// defaults).
func newProdEnvTopic(t *testing.T, cluster *kfake.Cluster, addrs []string, parts int32, configs map[string]*string, configure ...func(*kafka.ProducerConfig)) *prodEnv {
	t.Helper()
	e := &prodEnv{cluster: cluster, addrs: addrs, topic: testbroker.Topic(t, "prod")}
	admin, err := sarama.NewClusterAdmin(e.addrs, testbroker.SaramaConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(e.topic, &sarama.TopicDetail{NumPartitions: parts, ReplicationFactor: 1, ConfigEntries: configs}, false); err != nil {
		t.Fatal(err)
	}
	if e.client, err = sarama.NewClient(e.addrs, testbroker.SaramaConfig(t)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.client.Close() })
	pc := kafka.ProducerConfig{Brokers: addrs, ClientID: "producer-test", RetryBackoff: 10 * time.Millisecond,
		DeliveryTimeout: 60 * time.Second}
	for _, f := range configure {
		f(&pc)
	}
	if e.p, err = kafka.NewProducer(pc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.p.Close() })
	return e
}

// ackLog records every delivery report per partition, in arrival order.
type ackLog struct {
	mu      sync.Mutex
	offsets map[int32][]int64
	values  map[int32][]string
	errs    map[int32][]string // value of each failed record, in report order
}

func newAckLog() *ackLog {
	return &ackLog{offsets: map[int32][]int64{}, values: map[int32][]string{}, errs: map[int32][]string{}}
}

// allSucceeded fails the test unless every report in l is a success and
// there are want of them over partitions 0..parts-1.
func (l *ackLog) allSucceeded(t *testing.T, parts int32, want int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	total := 0
	for part := range parts {
		if errs := l.errs[part]; len(errs) > 0 {
			t.Fatalf("partition %d: %d records failed (first: %s)", part, len(errs), errs[0])
		}
		total += len(l.values[part])
	}
	if total != want {
		t.Fatalf("%d successful reports, want %d", total, want)
	}
}

// acker is one record's Acker.
type acker struct {
	log   *ackLog
	part  int32
	value string
	err   error
}

func (a *acker) Acked(off int64, err error) {
	a.log.mu.Lock()
	defer a.log.mu.Unlock()
	a.err = err
	if err != nil {
		a.log.errs[a.part] = append(a.log.errs[a.part], a.value)
		return
	}
	a.log.offsets[a.part] = append(a.log.offsets[a.part], off)
	a.log.values[a.part] = append(a.log.values[a.part], a.value)
}

// send sends value to partition part with an acker logging into l.
func (e *prodEnv) send(t *testing.T, l *ackLog, part int32, value string) {
	t.Helper()
	if err := e.p.SendRecord(e.topic, part, nil, []byte(value), &acker{log: l, part: part, value: value}); err != nil {
		t.Fatal(err)
	}
}

// flush waits for every report.
func (e *prodEnv) flush(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// readAll returns the values and offsets of every record of partition part
// up to its highwater, with a fresh client.
func (e *prodEnv) readAll(t *testing.T, part int32) ([]string, []int64) {
	t.Helper()
	client, err := sarama.NewClient(e.addrs, testbroker.SaramaConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	hwm, err := client.GetOffset(e.topic, part, sarama.OffsetNewest)
	if err != nil {
		t.Fatal(err)
	}
	if hwm == 0 {
		return nil, nil
	}
	cons, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	pc, err := cons.ConsumePartition(e.topic, part, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var vals []string
	var offs []int64
	for {
		select {
		case m := <-pc.Messages():
			vals = append(vals, string(m.Value))
			offs = append(offs, m.Offset)
			if m.Offset+1 >= hwm {
				return vals, offs
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("partition %d: read %d records, highwater %d", part, len(vals), hwm)
		}
	}
}

// checkLog checks that every partition's successful reports have
// consecutive offsets from 0, that the log holds exactly the acknowledged
// values at those offsets, and that each sender's records (values
// "<sender>-<i>") are in send order.
func (e *prodEnv) checkLog(t *testing.T, l *ackLog, parts int32) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for part := range parts {
		offs, vals := l.offsets[part], l.values[part]
		for i, off := range offs {
			if off != int64(i) {
				t.Fatalf("partition %d: report %d has offset %d, want %d", part, i, off, i)
			}
		}
		got, gotOffs := e.readAll(t, part)
		if len(got) != len(vals) {
			t.Fatalf("partition %d: log has %d records, %d acknowledged", part, len(got), len(vals))
		}
		for i := range got {
			if got[i] != vals[i] || gotOffs[i] != offs[i] {
				t.Fatalf("partition %d: log record %d is %q@%d, acknowledged %q@%d", part, i, got[i], gotOffs[i], vals[i], offs[i])
			}
		}
		last := map[string]int{}
		for _, v := range got {
			var sender string
			var i int
			if _, err := fmt.Sscanf(strings.Replace(v, "-", " ", 1), "%s %d", &sender, &i); err != nil {
				t.Fatalf("partition %d: value %q: %v", part, v, err)
			}
			if prev, ok := last[sender]; ok && i <= prev {
				t.Fatalf("partition %d: %s-%d after %s-%d (reordered or duplicated)", part, sender, i, sender, prev)
			}
			last[sender] = i
		}
	}
}

// sendMany sends n records from each of senders goroutines, record i of
// sender g to partition (g+i) % parts, pausing a millisecond every 50
// records (so that they make many requests).
func (e *prodEnv) sendMany(t *testing.T, l *ackLog, senders, n int, parts int32) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				part := int32((g + i) % int(parts))
				if i%50 == 49 {
					time.Sleep(time.Millisecond)
				}
				v := fmt.Sprintf("s%d-%d", g, i)
				if err := e.p.SendRecord(e.topic, part, nil, []byte(v), &acker{log: l, part: part, value: v}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// Many records over several partitions from several goroutines: every
// report is a success, offsets per partition are consecutive from 0, and
// the log holds exactly the records sent, in send order per sender.
func TestProducerManyRecords(t *testing.T) {
	const parts = 5
	e := newProdEnvTier(t, parts)
	l := newAckLog()
	e.sendMany(t, l, 4, 5000, parts)
	e.flush(t)
	l.allSucceeded(t, parts, 4*5000)
	e.checkLog(t, l, parts)
}

// Send (with a DeliveryFunc) reports partition and offset, and sets the
// message's offset.
func TestProducerSendMessage(t *testing.T) {
	e := newProdEnvTier(t, 2)
	type rep struct {
		part int32
		off  int64
		err  error
	}
	reps := make(chan rep, 10)
	var msgs []*sarama.ProducerMessage
	for i := range 10 {
		m := &sarama.ProducerMessage{Topic: e.topic, Partition: 1, Key: sarama.StringEncoder("k"),
			Value: sarama.StringEncoder(fmt.Sprint(i)), Headers: []sarama.RecordHeader{{Key: []byte("h"), Value: []byte("v")}}}
		msgs = append(msgs, m)
		if err := e.p.Send(m, func(part int32, off int64, err error) { reps <- rep{part, off, err} }); err != nil {
			t.Fatal(err)
		}
	}
	e.flush(t)
	for i := range 10 {
		r := <-reps
		if r.err != nil || r.part != 1 || r.off != int64(i) || msgs[i].Offset != int64(i) {
			t.Fatalf("report %d: %+v (message offset %d)", i, r, msgs[i].Offset)
		}
	}
	vals, _ := e.readAll(t, 1)
	if len(vals) != 10 || vals[9] != "9" {
		t.Fatalf("log: %v", vals)
	}
}

// errorResponse answers req with code for every partition.
func errorResponse(req kmsg.Request, code func(topic string, part int32) int16) kmsg.Response {
	r := req.(*kmsg.ProduceRequest)
	resp := r.ResponseKind().(*kmsg.ProduceResponse)
	for _, rt := range r.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID // v13 names topics by ID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code(rt.Topic, rp.Partition)
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

// produceRaw sends req to addr on a connection of its own and waits for the
// answer (which it does not decode).
func produceRaw(addr string, req kmsg.Request) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	buf := kmsg.NewRequestFormatter(kmsg.FormatterClientID("raw")).AppendRequest(nil, req, 1)
	if _, err := conn.Write(buf); err != nil {
		return err
	}
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return err
	}
	_, err = io.CopyN(io.Discard, conn, int64(binary.BigEndian.Uint32(size[:])))
	return err
}

// Retriable errors: NOT_LEADER_OR_FOLLOWER answers, a connection dropped
// before the broker saw the request, and one dropped after the broker
// wrote it (the retry is a duplicate the broker recognizes by its
// sequence). The log still holds every record exactly once, in order, and
// every report is a success.
func TestProducerRetriableErrors(t *testing.T) {
	const parts = 4
	e := newProdEnv(t, parts)
	var n, notLeader, dropped, written atomic.Int32
	var inner atomic.Bool
	e.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if inner.Load() {
			return nil, nil, false // the raw copy below: the broker writes it
		}
		// Faults early in the run: under CPU load the producer batches
		// more, so the run may take few requests (topped up below).
		switch i := n.Add(1); {
		case i == 3 || i == 7:
			notLeader.Add(1)
			return errorResponse(req, func(string, int32) int16 { return 6 /* NOT_LEADER_OR_FOLLOWER */ }), nil, true
		case i == 2 || i == 6:
			dropped.Add(1)
			return nil, errors.New("drop before writing"), true
		case i == 4 || i == 8:
			// Write the request through another connection, then drop
			// this one: the producer never learns that it was written.
			var werr error
			inner.Store(true)
			e.cluster.SleepControl(func() { werr = produceRaw(e.addrs[0], req) })
			inner.Store(false)
			if werr != nil {
				t.Errorf("raw produce: %v", werr)
			}
			written.Add(1)
			return nil, errors.New("drop after writing"), true
		}
		return nil, nil, false
	})
	l := newAckLog()
	e.sendMany(t, l, 3, 3000, parts)
	e.flush(t)
	extra := 0
	for ; n.Load() < 9; extra++ { // each flushed record takes a request of its own
		e.send(t, l, int32(extra%parts), fmt.Sprintf("x-%d", extra))
		e.flush(t)
	}
	l.allSucceeded(t, parts, 3*3000+extra)
	if notLeader.Load() == 0 || dropped.Load() < 2 || written.Load() < 2 {
		t.Fatalf("faults injected: %d not-leader, %d dropped, %d written then dropped (%d requests)",
			notLeader.Load(), dropped.Load(), written.Load(), n.Load())
	}
	e.checkLog(t, l, parts)
}

// A non-retriable error on one partition fails that partition's batch and
// the records queued behind it; the other partitions are unaffected, and
// records sent afterwards on the failing partition succeed (under a new
// producer ID, from sequence 0).
func TestProducerNonRetriableError(t *testing.T) {
	const parts = 3
	e := newProdEnv(t, parts)
	l := newAckLog()
	// Partition 1's first batch goes out alone, and is refused.
	var refused atomic.Bool
	release := make(chan struct{})
	e.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if refused.Load() {
			return nil, nil, false
		}
		has1 := false
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				has1 = has1 || rp.Partition == 1
			}
		}
		if !has1 {
			return nil, nil, false
		}
		refused.Store(true)
		// Hold the answer until more records queue behind the batch.
		e.cluster.SleepControl(func() { <-release })
		return errorResponse(req, func(_ string, part int32) int16 {
			if part == 1 {
				return 87 // INVALID_RECORD
			}
			return 6 // NOT_LEADER_OR_FOLLOWER: the others are resent
		}), nil, true
	})
	for i := range 50 {
		e.send(t, l, int32(i%parts), fmt.Sprintf("a-%d", i))
	}
	time.Sleep(100 * time.Millisecond)
	for i := 50; i < 100; i++ {
		e.send(t, l, int32(i%parts), fmt.Sprintf("a-%d", i))
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	e.flush(t)
	l.mu.Lock()
	failed := len(l.errs[1])
	if failed == 0 || len(l.errs[0]) > 0 || len(l.errs[2]) > 0 {
		l.mu.Unlock()
		t.Fatalf("failures per partition: %d, %d, %d; want only partition 1's", len(l.errs[0]), failed, len(l.errs[2]))
	}
	if failed+len(l.values[1]) != 33 {
		l.mu.Unlock()
		t.Fatalf("partition 1: %d failed + %d ok, want 33 reports", failed, len(l.values[1]))
	}
	// The failures are the first records of the partition, in send order.
	for i, v := range l.errs[1] {
		if want := fmt.Sprintf("a-%d", 1+3*i); v != want {
			l.mu.Unlock()
			t.Fatalf("failure %d is %q, want %q", i, v, want)
		}
	}
	l.mu.Unlock()
	for i := 100; i < 130; i++ {
		e.send(t, l, int32(i%parts), fmt.Sprintf("a-%d", i))
	}
	e.flush(t)
	l.mu.Lock()
	if len(l.errs[1]) != failed {
		l.mu.Unlock()
		t.Fatalf("records sent after the failure failed too: %v", l.errs[1][failed:])
	}
	l.mu.Unlock()
	e.checkLog(t, l, parts)
}

// Flush returns once every record sent before it has its report; Close
// sends what is buffered and reports everything; Send after Close fails.
func TestProducerFlushClose(t *testing.T) {
	e := newProdEnvTier(t, 2)
	var acks countAcks
	for i := range 1000 {
		if err := e.p.SendRecord(e.topic, int32(i%2), nil, []byte("v"), &acks); err != nil {
			t.Fatal(err)
		}
	}
	e.flush(t)
	if acks.ok.Load() != 1000 {
		t.Fatalf("after Flush: %d ok, %d failed, want 1000 ok", acks.ok.Load(), acks.failed.Load())
	}
	for i := range 1000 {
		if err := e.p.SendRecord(e.topic, int32(i%2), nil, []byte("w"), &acks); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.p.Close(); err != nil {
		t.Fatal(err)
	}
	if acks.ok.Load() != 2000 {
		t.Fatalf("after Close: %d ok, %d failed, want 2000 ok", acks.ok.Load(), acks.failed.Load())
	}
	if err := e.p.SendRecord(e.topic, 0, nil, []byte("x"), &acks); !errors.Is(err, kafka.ErrProducerClosed) {
		t.Fatalf("SendRecord after Close: %v, want ErrProducerClosed", err)
	}
	if err := e.p.Send(&sarama.ProducerMessage{Topic: e.topic}, nil); !errors.Is(err, kafka.ErrProducerClosed) {
		t.Fatalf("Send after Close: %v, want ErrProducerClosed", err)
	}
	if err := e.p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := e.p.Begin(); err == nil {
		t.Fatal("Begin on a closed non-transactional producer succeeded")
	}
}

// A record over the topic's max.message.bytes fails in its report with
// MESSAGE_TOO_LARGE, which Permanent calls permanent; the partition goes on.
func TestProducerRecordTooLarge(t *testing.T) {
	limit := "65536"
	e := newProdEnvTopic(t, nil, testbroker.Brokers(t), 1, map[string]*string{"max.message.bytes": &limit})
	l := newAckLog()
	var tooLarge error
	if err := e.p.SendRecord(e.topic, 0, nil, make([]byte, 70_000), ackFunc(func(_ int64, err error) { tooLarge = err })); err != nil {
		t.Fatal(err)
	}
	e.send(t, l, 0, "after")
	e.flush(t)
	if !errors.Is(tooLarge, kerr.MessageTooLarge) || !kafka.Permanent(tooLarge) {
		t.Fatalf("oversized record: %v, want MESSAGE_TOO_LARGE (permanent)", tooLarge)
	}
	l.allSucceeded(t, 1, 1)
}

// Send blocks while the unanswered bytes are over the bound (16 MiB of keys
// and values) and resumes once the broker answers.
func TestProducerBackpressure(t *testing.T) {
	e := newProdEnv(t, 1)
	release := make(chan struct{})
	var held atomic.Bool
	e.cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		if held.CompareAndSwap(false, true) {
			e.cluster.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	const n = 100
	value := make([]byte, 900<<10)
	var acks countAcks
	var sent atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			if err := e.p.SendRecord(e.topic, 0, nil, value, &acks); err != nil {
				t.Error(err)
				return
			}
			sent.Add(1)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	// 16 MiB holds 18 records of 900 KiB: the 19th waits.
	if s := sent.Load(); s < 15 || s > 20 {
		t.Fatalf("%d of %d records sent while the broker holds the first request, want 15..20", s, n)
	}
	before := sent.Load()
	time.Sleep(200 * time.Millisecond)
	if s := sent.Load(); s != before {
		t.Fatalf("Send did not block: %d then %d records sent", before, s)
	}
	close(release)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("senders still blocked after the release: %d sent", sent.Load())
	}
	e.flush(t)
	if acks.ok.Load() != n {
		t.Fatalf("%d ok, %d failed, want %d ok", acks.ok.Load(), acks.failed.Load(), n)
	}
}

// A partition answered NOT_LEADER_OR_FOLLOWER on every attempt fails its
// records once the delivery timeout passed (ErrDeliveryTimeout: transient,
// not Permanent), counted from Send even for records stamped an hour ago, retrying until then; once the broker answers again, later
// records of the partition succeed.
func TestProducerDeliveryTimeout(t *testing.T) {
	e := newProdEnv(t, 1, func(c *kafka.ProducerConfig) { c.DeliveryTimeout = 2 * time.Second })
	var failing atomic.Bool
	failing.Store(true)
	var attempts atomic.Int32
	e.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if !failing.Load() {
			return nil, nil, false
		}
		attempts.Add(1)
		return errorResponse(req, func(string, int32) int16 { return 6 }), nil, true
	})
	l := newAckLog()
	var last error
	start := time.Now()
	for i := range 20 {
		v := fmt.Sprintf("a-%d", i)
		a := &acker{log: l, part: 0, value: v}
		if err := e.p.SendRecordAt(e.topic, 0, nil, []byte(v), time.Now().Add(-time.Hour), ackFunc(func(off int64, err error) {
			last = err
			a.Acked(off, err)
		})); err != nil {
			t.Fatal(err)
		}
	}
	e.flush(t)
	took := time.Since(start)
	l.mu.Lock()
	failed := len(l.errs[0])
	l.mu.Unlock()
	if failed != 20 || !errors.Is(last, kafka.ErrDeliveryTimeout) || kafka.Permanent(last) {
		t.Fatalf("%d of 20 records failed (last: %v), want all with a (transient) record timeout", failed, last)
	}
	if took < 2*time.Second || attempts.Load() < 3 {
		t.Fatalf("records failed after %v and %d attempts, want retries for the 2 s delivery timeout", took, attempts.Load())
	}
	failing.Store(false)
	for i := 20; i < 40; i++ {
		v := fmt.Sprintf("a-%d", i)
		if err := e.p.SendRecordAt(e.topic, 0, nil, []byte(v), time.Now().Add(-time.Hour), &acker{log: l, part: 0, value: v}); err != nil {
			t.Fatal(err)
		}
	}
	e.flush(t)
	l.mu.Lock()
	ok := len(l.values[0])
	l.mu.Unlock()
	if ok != 20 {
		t.Fatalf("%d records sent after the broker recovered succeeded, want 20", ok)
	}
	e.checkLog(t, l, 1)
}

// Partition leaders move between three brokers while records are sent: the
// producer follows them (NOT_LEADER_OR_FOLLOWER, a metadata refresh, the same
// batch to the new leader) and every record is in the log once, in order,
// reported successful with its offset.
func TestProducerFollowsMovingLeaders(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	const parts = 4
	e := newProdEnvOn(t, c, c.ListenAddrs(), parts)
	// The producer's client asks for metadata while sending only when a
	// broker said it no longer leads a partition.
	var counting atomic.Bool
	var refreshes atomic.Int32
	c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if counting.Load() {
			refreshes.Add(1)
		}
		return nil, nil, false
	})
	counting.Store(true)
	stop := make(chan struct{})
	moved := make(chan int)
	go func() {
		n := 0
		defer func() { moved <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(15 * time.Millisecond):
			}
			for p := range int32(parts) {
				next := (c.LeaderFor(e.topic, p) + 1) % 3
				if err := c.MoveTopicPartition(e.topic, p, next); err != nil {
					t.Errorf("move %s[%d] to %d: %v", e.topic, p, next, err)
					return
				}
			}
			n++
		}
	}()
	l := newAckLog()
	e.sendMany(t, l, 4, 4000, parts)
	close(stop)
	moves := <-moved
	e.flush(t)
	counting.Store(false)
	l.allSucceeded(t, parts, 4*4000)
	if moves < 3 || refreshes.Load() == 0 {
		t.Fatalf("leaders moved %d times while sending and the producer refreshed metadata %d times, want at least 3 and 1",
			moves, refreshes.Load())
	}
	t.Logf("leaders of %d partitions moved %d times; %d metadata refreshes", parts, moves, refreshes.Load())
	e.checkLog(t, l, parts)
}

// With ProducerConfig.Compression set, the batches are compressed and read back
// whole and in order, on the test tier's broker.
func TestProducerCompressed(t *testing.T) {
	for name, codec := range map[string]sarama.CompressionCodec{"snappy": sarama.CompressionSnappy, "zstd": sarama.CompressionZSTD} {
		t.Run(name, func(t *testing.T) {
			const parts = 2
			e := newProdEnvTier(t, parts, func(c *kafka.ProducerConfig) { c.Compression = name })
			l := newAckLog()
			e.sendMany(t, l, 2, 3000, parts)
			e.flush(t)
			l.allSucceeded(t, parts, 2*3000)
			e.checkLog(t, l, parts)
			// kgo writes a batch uncompressed when compressing does not make
			// it smaller (a first batch of one short record), so the check is
			// that batches are compressed with the codec asked for and with no
			// other.
			codecs := e.batchCodecs(t, 0)
			if codecs[codec] == 0 {
				t.Fatalf("no batch of partition 0 is compressed with %v: %v", codec, codecs)
			}
			for c, n := range codecs {
				if c != codec && c != sarama.CompressionNone {
					t.Fatalf("%d batches of partition 0 are compressed with %v, want %v or none", n, c, codec)
				}
			}
		})
	}
}

// batchCodecs fetches the first MiB of partition part as written and
// counts its record batches by compression codec.
func (e *prodEnv) batchCodecs(t *testing.T, part int32) map[sarama.CompressionCodec]int {
	t.Helper()
	b, err := e.client.Leader(e.topic, part)
	if err != nil {
		t.Fatal(err)
	}
	// Fetch v10 or later: a broker answers older fetches of zstd batches with
	// UNSUPPORTED_COMPRESSION_TYPE.
	req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 1 << 20}
	req.AddBlock(e.topic, part, 0, 1<<20, -1)
	resp, err := b.Fetch(req)
	if err != nil {
		t.Fatal(err)
	}
	blk := resp.GetBlock(e.topic, part)
	if blk == nil || blk.Err != sarama.ErrNoError {
		t.Fatalf("fetch %s[%d]: %v", e.topic, part, blk)
	}
	codecs := map[sarama.CompressionCodec]int{}
	for _, rs := range blk.RecordsSet {
		if rs != nil && rs.RecordBatch != nil {
			codecs[rs.RecordBatch.Codec]++
		}
	}
	if len(codecs) == 0 {
		t.Fatalf("fetch %s[%d]: no record batch", e.topic, part)
	}
	return codecs
}

// ackFunc adapts a function to kafka.Acker.
type ackFunc func(offset int64, err error)

func (f ackFunc) Acked(offset int64, err error) { f(offset, err) }
