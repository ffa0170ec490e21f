package kafka_test

// The broker troubles an independent review found Runnel's previous producer
// failing on (issue #25, P1–P5), each as a kfake scenario: every record must
// be in the log once, in order, and reported successful.

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// sendPaced sends n records "<prefix>-<i>" round-robin over parts
// partitions, one every gap.
func (e *prodEnv) sendPaced(t *testing.T, l *ackLog, prefix string, n int, parts int32, gap time.Duration) {
	t.Helper()
	for i := range n {
		e.send(t, l, int32(i)%parts, fmt.Sprintf("%s-%d", prefix, i))
		time.Sleep(gap)
	}
}

// refuseProduce answers every Produce request with code for all its
// partitions while the time is before until (nanoseconds; 0 at first: no
// refusal), counting the requests refused.
func (e *prodEnv) refuseProduce(code int16) (until *atomic.Int64, refused *atomic.Int32) {
	until, refused = new(atomic.Int64), new(atomic.Int32)
	e.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if time.Now().UnixNano() >= until.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		return errorResponse(req, func(string, int32) int16 { return code }), nil, true
	})
	return until, refused
}

// P1: every partition's leader answers NOT_LEADER_OR_FOLLOWER for 10 s (its
// broker lost leadership and no new leader is elected yet): records sent
// before and during the outage wait and succeed once it ends.
func TestProducerLeaderOutage(t *testing.T) {
	const parts = 3
	e := newProdEnv(t, parts)
	until, refused := e.refuseProduce(6 /* NOT_LEADER_OR_FOLLOWER */)
	l := newAckLog()
	e.sendPaced(t, l, "before", 30, parts, time.Millisecond)
	e.flush(t)
	start := time.Now()
	until.Store(start.Add(10 * time.Second).UnixNano())
	e.sendPaced(t, l, "during", 60, parts, 100*time.Millisecond) // over 6 s of the outage
	e.flush(t)
	took := time.Since(start)
	l.allSucceeded(t, parts, 90)
	if took < 10*time.Second || refused.Load() == 0 {
		t.Fatalf("flushed %v after the outage began with %d requests refused: the outage did not hold", took, refused.Load())
	}
	e.checkLog(t, l, parts)
}

// P1: a topic created 5 s after its first records were sent (metadata not
// yet propagated, as for a changelog just created): they wait and succeed.
func TestProducerUnknownTopicWindow(t *testing.T) {
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: b.Addrs(), RetryBackoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	const topic, parts = "late-topic", 2
	l := newAckLog()
	for i := range 20 {
		v := fmt.Sprintf("s-%d", i)
		if err := p.SendRecord(topic, int32(i%parts), nil, []byte(v), &acker{log: l, part: int32(i % parts), value: v}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Second)
	if err := b.Cluster().CreateTopic(topic, parts, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	l.allSucceeded(t, parts, 20)
	e := &prodEnv{cluster: b.Cluster(), addrs: b.Addrs(), topic: topic}
	if e.client, err = sarama.NewClient(e.addrs, sarama.NewConfig()); err != nil {
		t.Fatal(err)
	}
	defer e.client.Close()
	e.checkLog(t, l, parts)
}

// P1: an existing topic's partitions answer UNKNOWN_TOPIC_OR_PARTITION for
// 5 s (a broker that has not caught up with the metadata): the records wait
// and succeed.
func TestProducerUnknownTopicAnswers(t *testing.T) {
	const parts = 2
	e := newProdEnv(t, parts)
	until, refused := e.refuseProduce(3 /* UNKNOWN_TOPIC_OR_PARTITION */)
	l := newAckLog()
	e.sendPaced(t, l, "warm", 10, parts, 0)
	e.flush(t)
	until.Store(time.Now().Add(5 * time.Second).UnixNano())
	e.sendPaced(t, l, "window", 40, parts, 50*time.Millisecond)
	e.flush(t)
	if refused.Load() < 2 {
		t.Fatalf("%d requests refused: the window did not hold", refused.Load())
	}
	l.allSucceeded(t, parts, 50)
	e.checkLog(t, l, parts)
}

// P2: one broker throttles the producer (every answer carries a 3 s
// throttle time, and the next request to it waits that long): records for
// partitions another broker leads are not delayed by more than 200 ms over
// their latency before the throttle.
func TestProducerThrottledBrokerDelaysOnlyItself(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(2))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	e := newProdEnvOn(t, c, c.ListenAddrs(), 2)
	// Partition 0 on broker 0 (throttled), partition 1 on broker 1.
	for p, node := range []int32{0, 1} {
		if err := c.MoveTopicPartition(e.topic, int32(p), node); err != nil {
			t.Fatal(err)
		}
	}
	var throttling atomic.Bool
	var throttled atomic.Int32
	// kfake does not throttle: broker 0 writes the request as usual
	// (through a connection of the test's own), and its answer reaches the
	// producer with a 3 s throttle time, the way a quota-enforcing broker
	// answers (KIP-219: answer at once with throttle_time_ms; the client
	// sends that broker nothing more until the time passed).
	var inner atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if inner.Load() || !throttling.Load() || c.CurrentNode() != 0 {
			return nil, nil, false
		}
		throttled.Add(1)
		var resp *kmsg.ProduceResponse
		var werr error
		inner.Store(true)
		c.SleepControl(func() { resp, werr = produceAnswer(c.ListenAddrs()[0], req.(*kmsg.ProduceRequest)) })
		inner.Store(false)
		if werr != nil {
			return nil, werr, true
		}
		resp.ThrottleMillis = 3000
		return resp, nil, true
	})
	latency := func(part int32, n int) []time.Duration {
		var mu sync.Mutex
		var out []time.Duration
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			start := time.Now()
			v := fmt.Sprintf("l-%d-%d", part, i)
			if err := e.p.SendRecord(e.topic, part, nil, []byte(v), ackFunc(func(_ int64, err error) {
				defer wg.Done()
				if err != nil {
					t.Errorf("record %s: %v", v, err)
				}
				mu.Lock()
				out = append(out, time.Since(start))
				mu.Unlock()
			})); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		wg.Wait()
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	base := latency(1, 20)
	throttling.Store(true)
	// Keep broker 0 busy with throttled requests while partition 1 sends.
	slow := make(chan struct{})
	go func() {
		defer close(slow)
		for i := range 10 {
			v := fmt.Sprintf("slow-%d", i)
			if err := e.p.SendRecord(e.topic, 0, nil, []byte(v), ackFunc(func(int64, error) {})); err != nil {
				t.Error(err)
			}
			time.Sleep(300 * time.Millisecond)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	measured := time.Now()
	during := latency(1, 50) // about 1 s, inside the first 3 s throttle
	if time.Since(measured) > 2500*time.Millisecond {
		t.Fatalf("measuring took %v, longer than the throttle", time.Since(measured))
	}
	throttling.Store(false)
	<-slow
	e.flush(t)
	p := func(d []time.Duration) time.Duration { return d[len(d)*9/10] }
	if throttled.Load() == 0 {
		t.Fatal("no answer of broker 0 was throttled")
	}
	if p(during) > p(base)+200*time.Millisecond || during[len(during)-1] > base[len(base)-1]+200*time.Millisecond {
		t.Fatalf("partition 1 (broker 1) p90/max latency %v/%v while broker 0 is throttled, %v/%v before: delayed by the other broker",
			p(during), during[len(during)-1], p(base), base[len(base)-1])
	}
	t.Logf("partition 1 p90/max latency: %v/%v before, %v/%v while broker 0 is throttled (%d throttled requests)",
		p(base), base[len(base)-1], p(during), during[len(during)-1], throttled.Load())
}

// P3: a topic with max.message.bytes of 64 KiB takes 200 records of 1 KiB
// sent at once (about 200 KiB queued for one partition, one batch under
// kgo's default 1 MB cap): the producer cuts batches under the topic's
// limit. (kfake skips its size check for a request a control function
// slept on, so the test holds no request.)
func TestProducerSmallTopicLimit(t *testing.T) {
	limit := "65536"
	e := newProdEnvTopic(t, nil, testbroker.Brokers(t), 1, map[string]*string{"max.message.bytes": &limit})
	l := newAckLog()
	pad := strings.Repeat(".", 1000)
	for i := range 200 {
		v := fmt.Sprintf("r-%d %s", i, pad)
		if err := e.p.SendRecord(e.topic, 0, nil, []byte(v), &acker{log: l, part: 0, value: v}); err != nil {
			t.Fatal(err)
		}
	}
	e.flush(t)
	l.allSucceeded(t, 1, 200)
	e.checkLog(t, l, 1)
}

// P4: a partition idle past retention: the broker forgot the producer's
// state with the deleted records and answers its next batch
// UNKNOWN_PRODUCER_ID (or OUT_OF_ORDER_SEQUENCE_NUMBER) with a log start
// offset past the producer's last record. Nothing was lost, so the producer
// bumps its epoch and resends: every record succeeds.
func TestProducerIdlePartitionPastRetention(t *testing.T) {
	for _, code := range []int16{59 /* UNKNOWN_PRODUCER_ID */, 45 /* OUT_OF_ORDER_SEQUENCE_NUMBER */} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			e := newProdEnv(t, 1)
			l := newAckLog()
			e.sendPaced(t, l, "old", 10, 1, 0)
			e.flush(t)
			if err := e.cluster.DeleteRecords(e.topic, 0, 10); err != nil {
				t.Fatal(err)
			}
			var forgot atomic.Bool
			e.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
				e.cluster.KeepControl()
				if forgot.Swap(true) {
					return nil, nil, false
				}
				resp := errorResponse(req, func(string, int32) int16 { return code }).(*kmsg.ProduceResponse)
				for i := range resp.Topics {
					for j := range resp.Topics[i].Partitions {
						resp.Topics[i].Partitions[j].LogStartOffset = 10
					}
				}
				return resp, nil, true
			})
			for i := range 10 {
				v := fmt.Sprintf("new-%d", i)
				if err := e.p.SendRecord(e.topic, 0, nil, []byte(v), &acker{log: l, part: 0, value: v}); err != nil {
					t.Fatal(err)
				}
			}
			e.flush(t)
			if !forgot.Load() {
				t.Fatal("the broker never answered with the forgotten producer")
			}
			l.allSucceeded(t, 1, 20)
			l.mu.Lock()
			defer l.mu.Unlock()
			for i, off := range l.offsets[0][10:] {
				if off != int64(10+i) {
					t.Fatalf("record new-%d at offset %d, want %d", i, off, 10+i)
				}
			}
		})
	}
}

// P5: a batch of one partition is refused for good (INVALID_RECORD) and the
// first InitProducerId after it fails (COORDINATOR_NOT_AVAILABLE): only that
// batch's records fail; the other partitions' records, sent before, during
// and after, all succeed, and so do the failing partition's later records.
func TestProducerFailedBatchStaysLocal(t *testing.T) {
	const parts = 3
	e := newProdEnv(t, parts)
	var armed, refused atomic.Bool  // armed: the x records are being sent
	var refusedRecords atomic.Int32 // records in the refused request
	e.cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if !armed.Load() || refused.Load() {
			return nil, nil, false
		}
		only1 := true
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				only1 = only1 && rp.Partition == 1
			}
		}
		if !only1 {
			return nil, nil, false
		}
		for _, rt := range req.(*kmsg.ProduceRequest).Topics {
			for _, rp := range rt.Partitions {
				for b := rp.Records; len(b) > 0; {
					var batch kmsg.RecordBatch
					if err := batch.ReadFrom(b); err != nil {
						break
					}
					refusedRecords.Add(batch.NumRecords)
					n := 12 + int(batch.Length) // base offset and length precede the length's bytes
					if n > len(b) {
						break
					}
					b = b[n:]
				}
			}
		}
		refused.Store(true)
		return errorResponse(req, func(string, int32) int16 { return 87 /* INVALID_RECORD */ }), nil, true
	})
	var initFailed atomic.Bool
	e.cluster.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		e.cluster.KeepControl()
		if !refused.Load() || initFailed.Swap(true) {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.InitProducerIDResponse)
		resp.ErrorCode = 15 // COORDINATOR_NOT_AVAILABLE
		return resp, nil, true
	})
	l := newAckLog()
	e.sendPaced(t, l, "a", 30, parts, 0)
	e.flush(t)
	// Partition 1 alone: its batch is refused.
	armed.Store(true)
	for i := range 5 {
		e.send(t, l, 1, fmt.Sprintf("x-%d", i))
	}
	e.flush(t)
	e.sendPaced(t, l, "b", 60, parts, time.Millisecond)
	e.flush(t)
	l.mu.Lock()
	if len(l.errs[0]) > 0 || len(l.errs[2]) > 0 {
		l.mu.Unlock()
		t.Fatalf("partitions 0 and 2 had %d and %d failures; only partition 1's refused batch may fail", len(l.errs[0]), len(l.errs[2]))
	}
	// The refused request carries the first x records (linger 0: the first
	// goes out alone or with the few queued behind it); a request already
	// in flight behind it may fail with it (its sequence numbers follow the
	// refused ones), so the failures are a prefix x-0..x-(k-1) holding at
	// least the refused records, and every later x record succeeds.
	got := l.errs[1]
	k := len(got)
	for i, v := range got {
		if v != fmt.Sprintf("x-%d", i) {
			l.mu.Unlock()
			t.Fatalf("partition 1 failures %v, want a prefix of x-0..x-4", got)
		}
	}
	if n := int(refusedRecords.Load()); k < n || k > 5 || n == 0 {
		l.mu.Unlock()
		t.Fatalf("partition 1 failures %v, want at least the %d refused records x-0..x-%d", got, n, n-1)
	}
	ok1 := len(l.values[1])
	l.mu.Unlock()
	t.Logf("refused request: %d records; failed: %v", refusedRecords.Load(), got)
	if !refused.Load() {
		t.Fatal("no batch was refused")
	}
	if want := 10 + 20 + 5 - k; ok1 != want {
		t.Fatalf("partition 1: %d records succeeded, want %d (%d of the x records failed)", ok1, want, k)
	}
	e.checkLog(t, l, parts)
}

// produceAnswer sends req to addr on a connection of its own and returns the
// broker's answer.
func produceAnswer(addr string, req *kmsg.ProduceRequest) (*kmsg.ProduceResponse, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(kmsg.NewRequestFormatter(kmsg.FormatterClientID("raw")).AppendRequest(nil, req, 1)); err != nil {
		return nil, err
	}
	var size [4]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return nil, err
	}
	body := make([]byte, binary.BigEndian.Uint32(size[:]))
	if _, err := io.ReadFull(conn, body); err != nil {
		return nil, err
	}
	body = body[4:] // correlation ID
	if req.IsFlexible() {
		body = body[1:] // the response header's empty tag section
	}
	resp := req.ResponseKind().(*kmsg.ProduceResponse)
	resp.SetVersion(req.GetVersion())
	if err := resp.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("decode produce answer: %w", err)
	}
	return resp, nil
}
