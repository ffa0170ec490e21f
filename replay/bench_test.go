package replay

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// Replay throughput, opt-in (docs/replay.md):
//
//	go test -run '^$' -bench Replay -benchtime 1x ./replay
//
// BenchmarkReplayRealData produces the whole real data set (81 966 change
// events, timestamp = recorded_at) and replays all of it, and its busiest
// day, through the change-audit agent with the audit effect into SQLite;
// BenchmarkReplayNoop replays 500 000 synthetic records (the side-by-side
// stateless workload's shape: 10 000 keys, 100-byte values, 8 partitions)
// through an agent whose effect only counts. Each checks the exact effect
// count and reports records/s (plan to last commit).

func BenchmarkReplayRealData(b *testing.B) {
	all := loadChanges(b)
	f := newBenchFixture(b)
	topic := testbroker.Topic(b, "change-events")
	createTopic(b, f, topic, 8)
	t0 := time.Now()
	produceChanges(b, f.brokers, f.client.Config(), topic, all)
	b.Logf("produced %d records in %s", len(all), time.Since(t0).Round(time.Millisecond))
	day := busiestDay(all)
	ranges := []struct {
		name     string
		from, to time.Time
	}{
		{"busiest-day", day, day.AddDate(0, 0, 1)},
		{"all", time.Date(2005, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	for _, r := range ranges {
		b.Run(r.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				db, once := openAuditDB(b, filepath.Join(b.TempDir(), "audit.db"))
				want := expectedIDs(all, r.from, r.to)
				plan, err := newPlan(f.client, Spec{Topic: topic, From: r.from, To: r.to, Group: fmt.Sprintf("replay-%s-%d-%s", r.name, i, topic), LiveGroup: "change-audit"})
				if err != nil {
					b.Fatal(err)
				}
				app := newAuditApp(topic, once, 0, nil)
				res, err := run(context.Background(), f.client, plan, Target{Agent: app.runner, Effect: "audit", Tables: app.tables}, Options{})
				if err != nil {
					b.Fatal(err)
				}
				_, rows := auditIDs(b, db)
				if rows != len(want) || res.Effects != int64(len(want)) || res.Suppressed != res.Delivered || app.notified.Load() != 0 {
					b.Fatalf("rows %d, effects %d, want %d; suppressed %d of %d; notified %d", rows, res.Effects, len(want), res.Suppressed, res.Delivered, app.notified.Load())
				}
				rate := float64(res.Records) / res.Elapsed.Seconds()
				b.ReportMetric(rate, "records/s")
				b.Logf("%s: %d records, %d effects (= the %d events of the range), %d out of range, %d gaps, %s, %.0f records/s",
					r.name, res.Records, res.Effects, len(want), res.OutOfRange, res.Gaps, res.Elapsed.Round(time.Millisecond), rate)
			}
		})
	}
}

func BenchmarkReplayNoop(b *testing.B) {
	const n, keys, parts = 500_000, 10_000, 8
	f := newBenchFixture(b)
	topic := testbroker.Topic(b, "noop")
	createTopic(b, f, topic, parts)
	c := *f.client.Config()
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.Return.Successes = true
	c.Producer.Flush.Bytes = 1 << 20
	c.Producer.Flush.Frequency = 5 * time.Millisecond
	p, err := sarama.NewAsyncProducer(f.brokers, &c)
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("key-%011d", i%keys)
			v := fmt.Sprintf("%0100d", i)
			p.Input() <- &sarama.ProducerMessage{Topic: topic, Partition: kafka.PartitionFor([]byte(k), parts), Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(v)}
		}
	}()
	for i := 0; i < n; i++ {
		select {
		case <-p.Successes():
		case e := <-p.Errors():
			b.Fatal(e)
		}
	}
	_ = p.Close()
	for i := 0; i < b.N; i++ {
		h := &host{}
		src := newTopic(h, topic, codec.String(), codec.String(), parts)
		fx := agent.NewEffect("count")
		var counted [parts]int64
		runner := agent.New(h, "noop", src, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				if _, err := fx.Apply(ev, func() (bool, error) { counted[ev.Partition()]++; return true, nil }); err != nil {
					return err
				}
			}
			return s.Err()
		})
		offs := map[int32]Range{}
		for q := int32(0); q < parts; q++ {
			end, err := f.client.GetOffset(topic, q, sarama.OffsetNewest)
			if err != nil {
				b.Fatal(err)
			}
			offs[q] = Range{0, end}
		}
		plan, err := newPlan(f.client, Spec{Topic: topic, Offsets: offs, Group: fmt.Sprintf("replay-noop-%d-%s", i, topic), LiveGroup: "live"})
		if err != nil {
			b.Fatal(err)
		}
		res, err := run(context.Background(), f.client, plan, Target{Agent: runner, Effect: "count"}, Options{})
		if err != nil {
			b.Fatal(err)
		}
		var total int64
		for _, c := range counted {
			total += c
		}
		if res.Effects != n || total != n {
			b.Fatalf("effects %d, counted %d, want %d", res.Effects, total, n)
		}
		rate := float64(res.Records) / res.Elapsed.Seconds()
		b.ReportMetric(rate, "records/s")
		b.Logf("noop: %d records in %s, %.0f records/s", res.Records, res.Elapsed.Round(time.Millisecond), rate)
	}
}

// benchFixture is fixture for benchmarks.
type benchFixture struct {
	brokers []string
	client  sarama.Client
	admin   sarama.ClusterAdmin
}

func newBenchFixture(b *testing.B) *benchFixture {
	b.Helper()
	brokers := testbroker.Brokers(b)
	cfg := testbroker.SaramaConfig(b)
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = client.Close() })
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = admin.Close() })
	return &benchFixture{brokers: brokers, client: client, admin: admin}
}

func createTopic(b *testing.B, f *benchFixture, topic string, n int32) {
	b.Helper()
	infinite := "-1" // the real data's timestamps are years old: no retention
	if err := f.admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: n, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"retention.ms": &infinite}}, false); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.admin.DeleteTopic(topic) })
	if err := f.client.RefreshMetadata(topic); err != nil {
		b.Fatal(err)
	}
}
