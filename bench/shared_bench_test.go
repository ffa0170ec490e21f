package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/internal/testtool"
	"github.com/runnel-dev/runnel/sources/kafkashare"
	natssource "github.com/runnel-dev/runnel/sources/nats"
)

// sharedRecords is how many records one op of BenchmarkSharedSources reads.
var sharedRecords = flag.Int("shared-records", 50_000, "records per op of BenchmarkSharedSources")

// BenchmarkSharedSources compares three ack-mode shared sources feeding one
// subscriber of the same manager (Backpressure, queue 1024) that accepts
// every record (Next closes the previous record's window clean), on the same
// machine: a Kafka share group (sources/kafkashare), a plain Kafka consumer
// group (franz-go, offsets marked at Advance and committed with
// AutoCommitMarks), both on testbroker (kfake unless RUNNEL_KAFKA_BROKERS
// names a real cluster; one topic of 4 partitions), and a NATS JetStream
// pull consumer (sources/nats; real nats-server, skipped without it). The
// records (100-byte values) are written before the op; one op reads all of
// them; the share group runs with ShareMaxRecords 500 (franz-go's default)
// and 5000 (the records of one fetch, all acknowledged before the next
// poll). Metrics: records/s from the first record delivered to the last one
// advanced (acknowledgement marked; its sending is asynchronous in all
// three), and the join time (subscribe to first record).
//
//	go test -run xxx -bench SharedSources -benchtime 3x ./bench/
func BenchmarkSharedSources(b *testing.B) {
	n := *sharedRecords
	value := []byte(strings.Repeat("v", 100))
	for _, maxRecords := range []int32{500, 5000} {
		b.Run(fmt.Sprintf("kafka-share-group/fetch=%d", maxRecords), func(b *testing.B) {
			brokers := testbroker.Brokers(b)
			topic := kafkaInput(b, brokers, n, value)
			run := &sharedRun{n: n}
			defer run.report(b)
			for range b.N {
				group := testbroker.Topic(b, "share")
				runShared(b, run, func(ctx context.Context) (source.Producer, error) {
					p, err := kafkashare.New(ctx, kafkashare.Config{Brokers: brokers, Group: group, Topics: []string{topic},
						AutoOffsetReset: "earliest", Logger: quietLogger(), ClientOpts: []kgo.Opt{kgo.ShareMaxRecords(maxRecords)}})
					if err != nil {
						return nil, err
					}
					return p, nil
				})
			}
		})
	}
	b.Run("kafka-consumer-group", func(b *testing.B) {
		brokers := testbroker.Brokers(b)
		topic := kafkaInput(b, brokers, n, value)
		run := &sharedRun{n: n}
		defer run.report(b)
		for range b.N {
			group := testbroker.Topic(b, "group")
			runShared(b, run, func(context.Context) (source.Producer, error) {
				cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.AutoCommitMarks())
				if err != nil {
					return nil, err
				}
				return &groupProducer{cl: cl}, nil
			})
		}
	})
	b.Run("nats-jetstream", func(b *testing.B) {
		url := testtool.NATSServer(b)
		nc, err := natsgo.Connect(url)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}}); err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		var failed atomic.Int64
		for i := range n {
			f, err := js.PublishAsync(fmt.Sprintf("bench.%d", i%4), value)
			if err != nil {
				b.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-f.Ok():
				case <-f.Err():
					failed.Add(1)
				}
			}()
		}
		wg.Wait()
		if failed.Load() > 0 {
			b.Fatalf("%d publishes failed", failed.Load())
		}
		run := &sharedRun{n: n}
		defer run.report(b)
		for i := range b.N {
			cons, err := js.CreateOrUpdateConsumer(ctx, "BENCH", jetstream.ConsumerConfig{Durable: fmt.Sprintf("bench%d", i),
				AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, MaxAckPending: 10_000})
			if err != nil {
				b.Fatal(err)
			}
			runShared(b, run, natssource.Factory(natssource.Config{Consumer: cons, Logger: quietLogger()}))
		}
	})
}

// sharedRun accumulates the runs of one sub-benchmark.
type sharedRun struct {
	n           int
	read, joins time.Duration
	runs        int
}

// report reports records/s over all runs (total records over total time
// from first record to last advanced) and the mean join time.
func (r *sharedRun) report(b *testing.B) {
	b.ReportMetric(float64(r.n*r.runs)/r.read.Seconds(), "records/s")
	b.ReportMetric(r.joins.Seconds()/float64(r.runs), "join-s")
}

// runShared subscribes one subscriber to a producer built by factory and
// accepts n records, adding the run's times to r.
func runShared(b *testing.B, r *sharedRun, factory source.ProducerFactory) {
	n := r.n
	b.Helper()
	m, err := source.NewManager(source.Config{Logger: quietLogger(), Overflow: source.Backpressure})
	if err != nil {
		b.Fatal(err)
	}
	defer m.StopAll()
	var advanced atomic.Int64
	all := make(chan struct{})
	count := func(k int) {
		if advanced.Add(int64(k)) == int64(n) {
			close(all)
		}
	}
	t0 := time.Now()
	sub, err := m.Subscribe("bench", "sub", func(ctx context.Context) (source.Producer, error) {
		p, err := factory(ctx)
		if err != nil {
			return nil, err
		}
		if bp, ok := p.(source.BatchProducer); ok {
			return &countingBatch{countingProducer{bp, count}, bp}, nil
		}
		return &countingProducer{p, count}, nil
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var first time.Time
	for i := range n {
		if _, err := sub.Next(ctx); err != nil {
			b.Fatalf("record %d of %d: %v", i, n, err)
		}
		if i == 0 {
			first = time.Now()
		}
	}
	go func() { _, _ = sub.Next(ctx) }() // closes the last record's window
	select {
	case <-all:
	case <-ctx.Done():
		b.Fatalf("%d of %d records advanced", advanced.Load(), n)
	}
	r.read += time.Since(first)
	r.joins += first.Sub(t0)
	r.runs++
}

// countingProducer counts the clean records a producer advanced.
type countingProducer struct {
	source.Producer
	count func(int)
}

func (c *countingProducer) Advance(ctx context.Context, batch []source.AdvanceItem) error {
	err := c.Producer.Advance(ctx, batch)
	k := 0
	for _, it := range batch {
		if it.Outcome.Clean() {
			k++
		}
	}
	c.count(k)
	return err
}

type countingBatch struct {
	countingProducer
	bp source.BatchProducer
}

func (c *countingBatch) OpenBatch(ctx context.Context, emit func([]source.Emit) error) error {
	return c.bp.OpenBatch(ctx, emit)
}

// groupProducer is a plain consumer-group source: franz-go fetches the
// group's partitions, Advance marks the last record of each resolved prefix
// for the next autocommit, Close commits the marks and leaves.
type groupProducer struct {
	cl    *kgo.Client
	batch []source.Emit
}

func (p *groupProducer) Open(ctx context.Context, emit func(*source.Record, any) error) error {
	return p.OpenBatch(ctx, func(batch []source.Emit) error {
		for _, e := range batch {
			if err := emit(e.Record, e.Payload); err != nil {
				return err
			}
		}
		return nil
	})
}

func (p *groupProducer) OpenBatch(ctx context.Context, emit func([]source.Emit) error) error {
	for {
		fs := p.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.batch = p.batch[:0]
		fs.EachRecord(func(r *kgo.Record) {
			p.batch = append(p.batch, source.Emit{Record: &source.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}, Payload: r})
		})
		if len(p.batch) > 0 {
			if err := emit(p.batch); err != nil {
				return err
			}
		}
	}
}

func (p *groupProducer) Lane(payload any) (any, error) { return payload.(*kgo.Record).Partition, nil }

func (p *groupProducer) Advance(_ context.Context, batch []source.AdvanceItem) error {
	last := len(batch)
	for i, it := range batch {
		if !it.Outcome.Clean() {
			last = i
			break
		}
	}
	if last > 0 {
		p.cl.MarkCommitRecords(batch[last-1].Payload.(*kgo.Record))
	}
	return nil
}

func (p *groupProducer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := p.cl.CommitMarkedOffsets(ctx)
	p.cl.Close()
	return err
}

// kafkaInput creates a 4-partition topic holding n records of value.
func kafkaInput(b *testing.B, brokers []string, n int, value []byte) string {
	b.Helper()
	topic := testbroker.Topic(b, "in")
	testbroker.CreateTopic(b, brokers, topic, 4, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	var failed atomic.Int64
	for i := range n {
		cl.Produce(context.Background(), &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: value}, func(_ *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
			}
		})
	}
	if err := cl.Flush(context.Background()); err != nil {
		b.Fatal(err)
	}
	if failed.Load() > 0 {
		b.Fatalf("%d records not written", failed.Load())
	}
	return topic
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
