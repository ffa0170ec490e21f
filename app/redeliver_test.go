package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// ackFixture is one app on a test broker: an input topic with one partition,
// a sink topic, and helpers to produce, read and check committed offsets.
type ackFixture struct {
	t       *testing.T
	brokers []string
	app     *App
	in      *agent.Topic[string, string]
	sink    *agent.Topic[string, string]
	client  sarama.Client
}

func newAckFixture(t *testing.T, brokers []string, opts ...Option) *ackFixture {
	t.Helper()
	id := testbroker.Topic(t, "ack")
	logLevel := slog.LevelError
	if testing.Verbose() {
		logLevel = slog.LevelInfo
	}
	base := []Option{WithBrokers(brokers...), WithDataDir(t.TempDir()), WithTopicPrefix(id + "-"),
		WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		WithCommitInterval(50 * time.Millisecond),
		WithRedelivery(Redelivery{MaxRetries: 3, Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}),
		WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})))}
	a := New(id, append(base, opts...)...)
	f := &ackFixture{t: t, brokers: brokers, app: a}
	f.in = Topic(a, "in", codec.String(), codec.String(), Partitions(1))
	f.sink = Topic(a, "sink", codec.String(), codec.String(), Partitions(1))
	c, err := sarama.NewClient(brokers, testbroker.SaramaConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	f.client = c
	return f
}

// start runs one worker until the test ends; the returned channel yields
// its Run error once it returned.
func (f *ackFixture) start() <-chan error {
	f.t.Helper()
	w, err := f.app.NewWorker(WorkerOptions{MemoryStores: true})
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		errc <- w.Run(ctx)
	}()
	f.t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(20 * time.Second):
			f.t.Error("worker did not stop")
		}
	})
	return errc
}

// produce waits for the input topic to exist and sends values in order to
// partition 0, key = value.
func (f *ackFixture) produce(values ...string) {
	f.t.Helper()
	f.waitTopic(f.in.Name())
	cfg := testbroker.SaramaConfig(f.t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(f.brokers, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	defer p.Close()
	for _, v := range values {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: f.in.Name(), Partition: 0, Key: sarama.StringEncoder(v), Value: sarama.StringEncoder(v)}); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *ackFixture) waitTopic(topic string) {
	f.t.Helper()
	f.eventually(20*time.Second, "topic "+topic+" created", func() bool {
		_ = f.client.RefreshMetadata(topic)
		ps, err := f.client.Partitions(topic)
		return err == nil && len(ps) > 0
	})
}

func (f *ackFixture) eventually(d time.Duration, what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// read returns every record of partition 0 of topic, oldest first. Under
// ExactlyOnce it reads as a read_committed consumer and ends at the last
// data record (the log ends with a commit marker).
func (f *ackFixture) read(topic string) []*sarama.ConsumerMessage {
	f.t.Helper()
	f.waitTopic(topic)
	if f.app.cfg.Guarantee == ExactlyOnce {
		return f.readCommittedRecords(topic)
	}
	hwm, err := f.client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		f.t.Fatal(err)
	}
	if hwm == 0 {
		return nil
	}
	cons, err := sarama.NewConsumerFromClient(f.client)
	if err != nil {
		f.t.Fatal(err)
	}
	defer cons.Close()
	pc, err := cons.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		f.t.Fatal(err)
	}
	defer func() { pc.Close() }()
	var out []*sarama.ConsumerMessage
	timeout := time.After(10 * time.Second)
	for {
		select {
		case m, ok := <-pc.Messages():
			if !ok {
				// kfake moved the log start past the read position (it does when
				// it compacts the head of a partition): resume at the new start.
				pc.Close()
				next := int64(sarama.OffsetOldest)
				if len(out) > 0 {
					next = out[len(out)-1].Offset + 1
				}
				if oldest, err := f.client.GetOffset(topic, 0, sarama.OffsetOldest); err == nil && oldest > next {
					next = oldest
				}
				if pc, err = cons.ConsumePartition(topic, 0, next); err != nil {
					f.t.Fatal(err)
				}
				continue
			}
			out = append(out, m)
			if m.Offset+1 >= hwm {
				return out
			}
		case <-timeout:
			f.t.Fatalf("read %s: %d records before the timeout, highwater %d", topic, len(out), hwm)
		}
	}
}

// values counts the values of topic.
func (f *ackFixture) values(topic string) map[string]int {
	n := map[string]int{}
	for _, m := range f.read(topic) {
		n[string(m.Value)]++
	}
	return n
}

// committed returns the group's committed offset of the input partition (-1 none).
func (f *ackFixture) committed() int64 {
	f.t.Helper()
	om, err := sarama.NewOffsetManagerFromClient(f.app.id, f.client)
	if err != nil {
		return -1
	}
	defer om.Close()
	pom, err := om.ManagePartition(f.in.Name(), 0)
	if err != nil {
		return -1
	}
	defer pom.AsyncClose()
	off, _ := pom.NextOffset()
	return off
}

// committedMetadata returns the commit metadata of the group's committed
// offset of the input's partition 0 ("" when none or on an error).
func (f *ackFixture) committedMetadata() string {
	f.t.Helper()
	om, err := sarama.NewOffsetManagerFromClient(f.app.id, f.client)
	if err != nil {
		return ""
	}
	defer om.Close()
	pom, err := om.ManagePartition(f.in.Name(), 0)
	if err != nil {
		return ""
	}
	defer pom.AsyncClose()
	_, meta := pom.NextOffset()
	return meta
}

// counter counts how often each value was processed.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) inc(v string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[v]++
	return c.n[v]
}

func (c *counter) get(v string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[v]
}

func header(m *sarama.ConsumerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}

// A record whose agent fails twice then succeeds is processed three times
// (seek back with backoff), its derived record is written once, nothing is
// dead-lettered, and the committed offset reaches the end exactly once past it.
func TestRecordFailsTwiceThenSucceeds(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t))
	var seen counter
	agent.New(f.app, "proc", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if seen.inc(ev.Value) <= 2 && ev.Value == "v2" {
				return fmt.Errorf("transient failure on %s", ev.Value)
			}
			f.sink.Send(ev, ev.Key, ev.Value)
		}
		return s.Err()
	}, agent.SendsTo(f.sink))
	f.start()
	f.produce("v0", "v1", "v2", "v3", "v4")
	f.eventually(20*time.Second, "committed offset 5", func() bool { return f.committed() == 5 })
	if n := seen.get("v2"); n != 3 {
		t.Fatalf("v2 processed %d times, want 3", n)
	}
	sink := f.values(f.sink.Name())
	if sink["v2"] != 1 {
		t.Fatalf("sink holds v2 %d times, want 1 (sink %v)", sink["v2"], sink)
	}
	for _, v := range []string{"v0", "v1", "v3", "v4"} {
		if sink[v] < 1 {
			t.Fatalf("sink lost %s: %v", v, sink)
		}
	}
	if sink["v0"] != 1 || sink["v1"] != 1 {
		t.Fatalf("records before the failed one were redelivered: %v", sink)
	}
	if dlq := f.read(f.app.DeadLetterTopic("proc")); len(dlq) != 0 {
		t.Fatalf("dead letters %d, want 0", len(dlq))
	}
}

// A poison record is delivered MaxRetries+1 times, then lands in
// <app>-<agent>-dlq with the documented headers, and the partition continues.
func TestPoisonRecordIsDeadLettered(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t))
	var seen counter
	agent.New(f.app, "proc", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			seen.inc(ev.Value)
			if ev.Value == "poison" {
				panic("cannot digest poison")
			}
			f.sink.Send(ev, ev.Key, ev.Value)
		}
		return s.Err()
	}, agent.SendsTo(f.sink))
	f.start()
	f.produce("v0", "v1", "poison", "v3", "v4")
	f.eventually(20*time.Second, "committed offset 5", func() bool { return f.committed() == 5 })
	if n := seen.get("poison"); n != 4 {
		t.Fatalf("poison delivered %d times, want 4 (MaxRetries 3 + 1)", n)
	}
	want := f.app.id + "-proc-dlq"
	if got := f.app.DeadLetterTopic("proc"); got != want {
		t.Fatalf("dead-letter topic %q, want %q", got, want)
	}
	dlq := f.read(want)
	if len(dlq) != 1 {
		t.Fatalf("dead letters %d, want 1", len(dlq))
	}
	m := dlq[0]
	if string(m.Value) != "poison" || string(m.Key) != "poison" {
		t.Fatalf("dead letter %q=%q", m.Key, m.Value)
	}
	checks := map[string]string{HeaderTopic: f.in.Name(), HeaderPartition: "0", HeaderOffset: "2", HeaderAgent: "proc", HeaderAttempts: "4"}
	for k, v := range checks {
		if got := header(m, k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if r := header(m, HeaderReason); !strings.Contains(r, "cannot digest poison") {
		t.Errorf("reason %q does not hold the panic", r)
	}
	if ts, err := time.Parse(time.RFC3339Nano, header(m, HeaderTimestamp)); err != nil || time.Since(ts) > time.Minute {
		t.Errorf("timestamp header %q: %v", header(m, HeaderTimestamp), err)
	}
	sink := f.values(f.sink.Name())
	for _, v := range []string{"v0", "v1", "v3", "v4"} {
		if sink[v] < 1 {
			t.Fatalf("partition did not continue: sink %v", sink)
		}
	}
	if sink["poison"] != 0 {
		t.Fatalf("poison reached the sink")
	}
}

// Two agents on one topic, one slow: the committed offset never passes a
// record the slow one has not finished, and both see every record once.
func TestTwoAgentsOneSlow(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t))
	slowSink := Topic(f.app, "slow-sink", codec.String(), codec.String(), Partitions(1))
	const n = 40
	var fast, slow counter
	fastDone := make(chan struct{})
	var committedAtHold int64 = -2
	agent.New(f.app, "fast", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			fast.inc(ev.Value)
			f.sink.Send(ev, ev.Key, ev.Value)
			if ev.Offset() == n-1 {
				close(fastDone)
			}
		}
		return s.Err()
	}, agent.SendsTo(f.sink))
	agent.New(f.app, "slow", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			slow.inc(ev.Value)
			if ev.Offset() == n/2 {
				// Hold record n/2 until the fast agent finished everything and
				// several commit intervals passed.
				<-fastDone
				time.Sleep(300 * time.Millisecond)
				committedAtHold = f.committed()
			}
			slowSink.Send(ev, ev.Key, ev.Value)
		}
		return s.Err()
	}, agent.SendsTo(slowSink))
	f.start()
	vals := make([]string, n)
	for i := range vals {
		vals[i] = "v" + strconv.Itoa(i)
	}
	f.produce(vals...)
	f.eventually(20*time.Second, "committed offset n", func() bool { return f.committed() == n })
	if committedAtHold > n/2 {
		t.Fatalf("committed offset %d while the slow agent held record %d", committedAtHold, n/2)
	}
	for _, v := range vals {
		if fast.get(v) != 1 || slow.get(v) != 1 {
			t.Fatalf("%s processed fast %d / slow %d times, want 1/1", v, fast.get(v), slow.get(v))
		}
	}
	a, b := f.values(f.sink.Name()), f.values(slowSink.Name())
	if len(a) != n || len(b) != n {
		t.Fatalf("sinks hold %d / %d distinct values, want %d", len(a), len(b), n)
	}
}

// agent.DeadLetter: the failing record goes to the agent's dead-letter topic
// on its first delivery, and the agent continues; only the rejecting agent's
// topic receives it.
func TestDeadLetterPolicy(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t))
	var seen counter
	agent.New(f.app, "strict", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			seen.inc(ev.Value)
			if ev.Value == "bad" {
				return errors.New("bad input")
			}
		}
		return s.Err()
	}, agent.OnError(agent.DeadLetter), agent.WithDeadLetterTopic(f.app.id+"-strict-errors"))
	agent.New(f.app, "lenient", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for range s.Events() {
		}
		return s.Err()
	})
	f.start()
	f.produce("v0", "bad", "v2")
	f.eventually(20*time.Second, "committed offset 3", func() bool { return f.committed() == 3 })
	if seen.get("bad") != 1 || seen.get("v2") != 1 {
		t.Fatalf("bad processed %d times, v2 %d times; want 1, 1", seen.get("bad"), seen.get("v2"))
	}
	dlq := f.read(f.app.id + "-strict-errors")
	if len(dlq) != 1 || string(dlq[0].Value) != "bad" || header(dlq[0], HeaderAgent) != "strict" || header(dlq[0], HeaderAttempts) != "1" {
		t.Fatalf("strict dead letters: %d", len(dlq))
	}
	if other := f.read(f.app.DeadLetterTopic("lenient")); len(other) != 0 {
		t.Fatalf("lenient's dead-letter topic got %d records", len(other))
	}
}

// agent.StopWorker: Worker.Run returns the agent's error, and the record is
// not committed.
func TestStopWorkerPolicy(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t))
	boom := errors.New("unrecoverable")
	agent.New(f.app, "proc", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if ev.Value == "stop" {
				return boom
			}
		}
		return s.Err()
	}, agent.OnError(agent.StopWorker))
	errc := f.start()
	f.produce("v0", "stop", "v2")
	select {
	case err := <-errc:
		if !errors.Is(err, boom) {
			t.Fatalf("Run returned %v, want %v", err, boom)
		}
		var ae *agent.Error
		if !errors.As(err, &ae) || ae.Offset != 1 {
			t.Fatalf("Run error %v is not an *agent.Error at offset 1", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not stop")
	}
	if c := f.committed(); c > 1 {
		t.Fatalf("committed offset %d past the failed record 1", c)
	}
}
