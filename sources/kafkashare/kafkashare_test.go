package kafkashare

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// produce sends values to partition 0 of topic, in order, and waits for the
// broker's acknowledgement.
func produce(t testing.TB, brokers []string, topic string, values ...string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(values))
	for i, v := range values {
		recs[i] = &kgo.Record{Topic: topic, Partition: 0, Value: []byte(v)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testbroker.WaitTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// readAll reads every record of partition 0 of topic up to its highwater
// (want records) with a plain consumer.
func readAll(t testing.TB, brokers []string, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testbroker.WaitTimeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %s: %d of %d records: %v", topic, len(out), want, err)
		}
		fs.EachError(func(_ string, _ int32, err error) { t.Logf("read %s: %v", topic, err) })
		out = append(out, fs.Records()...)
	}
	return out
}

func header(r *kgo.Record, k string) string {
	for _, h := range r.Headers {
		if h.Key == k {
			return string(h.Value)
		}
	}
	return ""
}

// subscribe builds a manager and one ack-mode subscription over a share
// group member of cfg.
func subscribe(t testing.TB, cfg Config, id string) (*source.Manager, *source.Subscription) {
	t.Helper()
	m, err := source.NewManager(source.Config{Logger: quiet(), Overflow: source.Backpressure})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.StopAll)
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	sub, err := m.Subscribe("kafkashare:"+cfg.Group+"/"+id, id, Factory(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return m, sub
}

// subscribeProducer is subscribe that also returns the producer (built
// when the group starts, before the first record is delivered).
func subscribeProducer(t testing.TB, cfg Config, id string) (*Producer, *source.Subscription) {
	t.Helper()
	built := make(chan *Producer, 1)
	m, err := source.NewManager(source.Config{Logger: quiet(), Overflow: source.Backpressure})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.StopAll)
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	sub, err := m.Subscribe("kafkashare:"+cfg.Group+"/"+id, id, func(ctx context.Context) (source.Producer, error) {
		p, err := New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		built <- p
		return p, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-built:
		return p, sub
	case <-time.After(testbroker.WaitTimeout):
		t.Fatal("producer not built")
		return nil, nil
	}
}

// newTopic creates a one-partition topic and returns it with a fresh group
// name.
func newTopic(t testing.TB, brokers []string) (topic, group string) {
	t.Helper()
	topic = testbroker.Topic(t, "in")
	testbroker.CreateTopic(t, brokers, topic, 1, nil)
	return topic, testbroker.Topic(t, "share")
}

// Clean -> accepted once; rejected -> one dead letter (attempts 1) and never
// delivered again; failed -> released and delivered again with the broker's
// delivery count raised, accepted on its third delivery; failed every time
// -> dead-lettered after MaxRetries+1 = 3 deliveries (attempts 3).
func TestAcceptRejectRelease(t *testing.T) {
	brokers := testbroker.Brokers(t)
	topic, group := newTopic(t, brokers)
	produce(t, brokers, topic, "ok", "reject", "flaky", "broken", "ok2")
	p, sub := subscribeProducer(t, Config{Brokers: brokers, Group: group, Topics: []string{topic}, AutoOffsetReset: "earliest",
		MaxRetries: 2, Backoff: 20 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}, "auditor")

	ctx, cancel := context.WithTimeout(context.Background(), testbroker.WaitTimeout)
	defer cancel()
	counts := map[string][]int{} // value -> delivery counts seen
	total := 0
	for total < 1+1+3+3+1 {
		d, err := sub.Next(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", counts, err)
		}
		v := string(d.Record.Value)
		counts[v] = append(counts[v], DeliveryCount(d.Record))
		total++
		switch {
		case v == "reject":
			d.Reject(errors.New("not auditable"))
		case v == "flaky" && len(counts[v]) < 3, v == "broken":
			d.Fail(fmt.Errorf("transient %d", len(counts[v])))
		}
	}
	want := map[string][]int{"ok": {1}, "reject": {1}, "flaky": {1, 2, 3}, "broken": {1, 2, 3}, "ok2": {1}}
	if !maps.EqualFunc(counts, want, slices.Equal) {
		t.Fatalf("delivery counts %v, want %v", counts, want)
	}
	// Every record was resolved (the last one when Next is called again):
	// the next record delivered is one sent now. A record still available
	// (released and not delivered again) has a lower offset and would come
	// first.
	produce(t, brokers, topic, "end")
	d, err := sub.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := string(d.Record.Value); v != "end" || DeliveryCount(d.Record) != 1 {
		t.Fatalf("after the last record: %s (delivery %d), want end (delivery 1)", v, DeliveryCount(d.Record))
	}
	testbroker.Eventually(t, testbroker.WaitTimeout, "the last record accepted", func() bool { return p.Stats().Accepted >= 3 })
	if err := p.FlushAcks(ctx); err != nil {
		t.Fatal(err)
	}
	if st, want := p.Stats(), (Stats{Accepted: 3, Rejected: 2, Released: 4, DeadLettered: 2}); st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
	dl := readAll(t, brokers, group+"-auditor-dlq", 2)
	got := map[string]string{}
	for _, r := range dl {
		got[string(r.Value)] = header(r, "runnel-attempts") + " " + header(r, "runnel-offset") + " " + header(r, "runnel-agent") + " " + header(r, "runnel-reason")
	}
	wantDL := map[string]string{"reject": "1 1 auditor not auditable", "broken": "3 3 auditor transient 3"}
	if !maps.Equal(got, wantDL) {
		t.Fatalf("dead letters %v, want %v", got, wantDL)
	}
}

// Several members of one share group read one partition: every record is
// accepted by exactly one of them, and each member gets some.
func TestMembersShareOnePartition(t *testing.T) {
	brokers := testbroker.Brokers(t)
	topic, group := newTopic(t, brokers)
	const n = 300
	vals := make([]string, n)
	for i := range vals {
		vals[i] = strconv.Itoa(i)
	}
	produce(t, brokers, topic, vals...)
	const members = 3
	ctx, cancel := context.WithTimeout(context.Background(), testbroker.WaitTimeout)
	defer cancel()
	var mu sync.Mutex
	by := map[string][]string{} // member -> values
	seen := map[string]string{} // value -> member
	allStarted := make(chan struct{})
	started := map[string]bool{}
	var wg sync.WaitGroup
	errs := make(chan error, members)
	for i := range members {
		id := fmt.Sprintf("m%d", i)
		// Small fetches (10 records, one in flight): a member holding its
		// first fetch cannot take the whole partition.
		_, sub := subscribe(t, Config{Brokers: brokers, Group: group, Topics: []string{topic}, AutoOffsetReset: "earliest",
			ClientOpts: []kgo.Opt{kgo.ShareMaxRecords(10), kgo.ShareMaxRecordsStrict()}}, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				d, err := sub.Next(ctx)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", id, err)
					return
				}
				mu.Lock()
				v := string(d.Record.Value)
				if prev, dup := seen[v]; dup {
					mu.Unlock()
					errs <- fmt.Errorf("record %s delivered to %s after %s accepted it", v, id, prev)
					return
				}
				seen[v] = id
				by[id] = append(by[id], v)
				if !started[id] {
					started[id] = true
					if len(started) == members {
						close(allStarted)
					}
				}
				done := len(seen) == n
				mu.Unlock()
				// Hold the first record until every member has one.
				select {
				case <-allStarted:
				case <-ctx.Done():
					errs <- fmt.Errorf("%s: members started %v: %w", id, started, ctx.Err())
					return
				}
				if done {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct records delivered, want %d", len(seen), n)
	}
	for id, vs := range by {
		t.Logf("%s: %d records", id, len(vs))
	}
	if len(by) != members {
		t.Fatalf("records went to %d members, want %d", len(by), members)
	}
}

// A cluster without share groups: the subscription ends at once with an
// error naming the share.version feature.
func TestShareGroupsDisabled(t *testing.T) {
	brokers := noShareBrokers(t)
	topic := testbroker.Topic(t, "in")
	testbroker.CreateTopic(t, brokers, topic, 1, nil)
	_, sub := subscribe(t, Config{Brokers: brokers, Group: testbroker.Topic(t, "share"), Topics: []string{topic}}, "a")
	ctx, cancel := context.WithTimeout(context.Background(), testbroker.WaitTimeout)
	defer cancel()
	_, err := sub.Next(ctx)
	if !errors.Is(err, ErrShareGroupsDisabled) {
		t.Fatalf("Next: %v, want ErrShareGroupsDisabled", err)
	}
	for _, s := range []string{"share.version", "kafka-features.sh", "upgrade --feature share.version=1"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not name %q", err, s)
		}
	}
	t.Log(err)
}

// Lanes: with LanePerRecord a record resolved while an earlier one of its
// partition is still open is accepted at once; with LanePerPartition it
// waits for the earlier one.
func TestLanes(t *testing.T) {
	brokers := testbroker.Brokers(t)
	for _, tc := range []struct {
		lane         Lane
		acceptedHeld int64 // accepted while the first record is held
	}{{LanePerRecord, 1}, {LanePerPartition, 0}} {
		topic, group := newTopic(t, brokers)
		produce(t, brokers, topic, "held", "quick")
		m, err := source.NewManager(source.Config{Logger: quiet(), Overflow: source.Backpressure})
		if err != nil {
			t.Fatal(err)
		}
		built := make(chan *Producer, 1)
		factory := func(ctx context.Context) (source.Producer, error) {
			p, err := New(ctx, Config{Brokers: brokers, Group: group, Topics: []string{topic}, AutoOffsetReset: "earliest", Lane: tc.lane, Logger: quiet()})
			if err != nil {
				return nil, err
			}
			built <- p
			return p, nil
		}
		holder, err := m.Subscribe("k", "holder", factory)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), testbroker.WaitTimeout)
		d, err := holder.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tok, ok := d.Bind() // "held" stays unresolved until tok is confirmed
		if string(d.Record.Value) != "held" || !ok {
			t.Fatalf("lane %d: first record %q (bound %v)", tc.lane, d.Record.Value, ok)
		}
		if d, err = holder.Next(ctx); err != nil || string(d.Record.Value) != "quick" {
			t.Fatalf("lane %d: second record %v, %v", tc.lane, d, err)
		}
		go func() { _, _ = holder.Next(ctx) }() // resolves "quick"
		p := <-built
		if tc.acceptedHeld > 0 {
			testbroker.Eventually(t, testbroker.WaitTimeout, "quick accepted", func() bool { return p.Stats().Accepted == 1 })
		}
		if got := p.Stats().Accepted; got != tc.acceptedHeld {
			t.Fatalf("lane %d: %d accepted while the first record is held, want %d", tc.lane, got, tc.acceptedHeld)
		}
		tok.Confirm()
		testbroker.Eventually(t, testbroker.WaitTimeout, "both accepted", func() bool { return p.Stats().Accepted == 2 })
		cancel()
		m.StopAll()
	}
}
