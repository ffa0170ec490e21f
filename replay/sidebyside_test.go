package replay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/replay"
)

// BenchmarkReplaySideBySide measures a replay against the normal path on the
// same broker, the same input and the same agent (docs/replay.md, issue #15:
// a replay's throughput must be at least 80 % of the live pipeline's):
//
//	go test -run '^$' -bench ReplaySideBySide -benchtime 1x ./replay
//	RUNNEL_SIDEBYSIDE_RECORDS=500000 RUNNEL_SIDEBYSIDE_ROUNDS=3 go test -run '^$' -bench ReplaySideBySide -benchtime 1x -timeout 30m ./replay
//
// The input is the side-by-side stateless workload's shape (bench/sidebyside:
// 10 000 keys, 100-byte values, 8 partitions; default 200 000 records, quick).
// The agent is the stateless pipeline (upper-case the value, send it to an
// output topic) plus an effect that counts. Each round runs, alternately:
//
//   - live: a worker of a fresh app (its own group) processes the whole topic;
//     measured from its first processed record to the group's committed
//     offsets at the highwater (every output record acknowledged first), so
//     the group join is not counted;
//   - replay: replay.Run of [0, end) of every partition in a fresh replay
//     group with the counting effect live; measured as Result.Elapsed (from
//     the first fetch to the last commit). Its sends are suppressed, as in
//     every replay.
//
// Both counts are checked exact (every record once) before a rate is
// reported; the medians and their ratio are logged and reported.
func BenchmarkReplaySideBySide(b *testing.B) {
	n := envInt(b, "RUNNEL_SIDEBYSIDE_RECORDS", 200_000)
	rounds := envInt(b, "RUNNEL_SIDEBYSIDE_ROUNDS", 3)
	const keys, parts = 10_000, 8
	brokers := testbroker.Brokers(b)
	cfg := testbroker.SaramaConfig(b)
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	prefix := testbroker.Topic(b, "sbs") + "-"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// build declares the app of one round; the topics are the same in every
	// round (the prefix), the app ID (group, output changelogs) its own.
	type built struct {
		a       *app.App
		runner  agent.Runner
		in      *agent.Topic[string, string]
		counted *atomic.Int64
	}
	build := func(id string) built {
		a := app.New(id, app.WithTopicPrefix(prefix), app.WithLogger(quiet),
			app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime))
		in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(parts))
		out := app.Topic(a, "out", codec.String(), codec.String(), app.Partitions(parts))
		fx := agent.NewEffect("count")
		counted := &atomic.Int64{}
		r := agent.New(a, "upper", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				if _, err := fx.Apply(ev, func() (bool, error) { counted.Add(1); return true, nil }); err != nil {
					return err
				}
				out.Send(ev, ev.Key, strings.ToUpper(ev.Value))
			}
			return s.Err()
		}, agent.SendsTo(out))
		return built{a: a, runner: r, in: in, counted: counted}
	}

	// The input, produced once; every round reads all of it.
	first := build(testbroker.Topic(b, "sbs-live-0"))
	tools, err := app.Dial(context.Background(), brokers)
	if err != nil {
		b.Fatal(err)
	}
	defer tools.Close()
	produceSynthetic(b, brokers, cfg, client, first.in.Name(), n, keys, parts)

	live := func(round int, bt built) float64 {
		w, err := bt.a.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				b.Errorf("live worker: %v", err)
			}
		}()
		var firstAt time.Time
		deadline := time.Now().Add(10 * time.Minute)
		for {
			if firstAt.IsZero() && w.Processed() > 0 {
				firstAt = time.Now()
			}
			lag, err := app.GroupLag(ctx, tools, bt.a.ID(), []string{bt.in.Name()})
			if err == nil && sumLag(lag) == 0 && w.Processed() > 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("live round %d: lag %v after 10 min (%v)", round, lag, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		el := time.Since(firstAt)
		if got := bt.counted.Load(); got != int64(n) {
			b.Fatalf("live round %d: %d effects, want %d", round, got, n)
		}
		return float64(n) / el.Seconds()
	}
	replayRound := func(round int, bt built) float64 {
		offs := map[int32]replay.Range{}
		for p := int32(0); p < parts; p++ {
			end, err := client.GetOffset(bt.in.Name(), p, sarama.OffsetNewest)
			if err != nil {
				b.Fatal(err)
			}
			offs[p] = replay.Range{Start: 0, Stop: end}
		}
		plan, err := replay.NewPlan(tools, replay.Spec{Topic: bt.in.Name(), Offsets: offs, Group: bt.a.ID() + "-replay", LiveGroup: bt.a.ID()})
		if err != nil {
			b.Fatal(err)
		}
		res, err := replay.Run(context.Background(), tools, plan, replay.Target{Agent: bt.runner, Effect: "count"}, replay.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if res.Effects != int64(n) || bt.counted.Load() != int64(n) || res.Suppressed != int64(n) {
			b.Fatalf("replay round %d: %d effects (%d counted), %d sends suppressed; want %d", round, res.Effects, bt.counted.Load(), res.Suppressed, n)
		}
		return float64(res.Records) / res.Elapsed.Seconds()
	}

	for i := 0; i < b.N; i++ {
		var lives, replays []float64
		for r := range rounds {
			lb := first
			if r > 0 || i > 0 {
				lb = build(testbroker.Topic(b, fmt.Sprintf("sbs-live-%d-%d", i, r)))
			}
			lr := live(r, lb)
			rr := replayRound(r, build(testbroker.Topic(b, fmt.Sprintf("sbs-replay-%d-%d", i, r))))
			b.Logf("round %d: live %.0f records/s, replay %.0f records/s (%.0f %%)", r, lr, rr, 100*rr/lr)
			lives, replays = append(lives, lr), append(replays, rr)
		}
		ml, mr := median(lives), median(replays)
		b.ReportMetric(ml, "live-records/s")
		b.ReportMetric(mr, "replay-records/s")
		b.ReportMetric(100*mr/ml, "replay-%-of-live")
		b.Logf("%d records, %d rounds: median live %.0f records/s, median replay %.0f records/s: replay at %.0f %% of live (target ≥ 80 %%)",
			n, rounds, ml, mr, 100*mr/ml)
	}
}

func envInt(b *testing.B, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v <= 0 {
		b.Fatalf("%s=%q: a positive integer", name, s)
	}
	return v
}

func sumLag(lag map[string]map[int32]int64) int64 {
	var t int64
	for _, ps := range lag {
		for _, l := range ps {
			t += l
		}
	}
	return t
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// produceSynthetic creates topic and produces n records: key-%011d over
// keys keys, 100-byte values, partitioned as a worker's sinks would.
func produceSynthetic(b *testing.B, brokers []string, cfg *sarama.Config, client sarama.Client, topic string, n, keys int, parts int32) {
	b.Helper()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		b.Fatal(err)
	}
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: parts, ReplicationFactor: 1}, false); err != nil {
		b.Fatal(err)
	}
	if err := client.RefreshMetadata(topic); err != nil {
		b.Fatal(err)
	}
	c := *cfg
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.Return.Successes = true
	c.Producer.Flush.Bytes = 1 << 20
	c.Producer.Flush.Frequency = 5 * time.Millisecond
	p, err := sarama.NewAsyncProducer(brokers, &c)
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
}
