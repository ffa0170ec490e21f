package app_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// TestReplayCommand runs `replay --day` on an app whose agent has two
// effects, a sink and a table: the named effect applies to exactly the
// day's records, the other effect never runs, the result is printed, the
// live group is refused, and running the command again resumes (applies
// nothing).
func TestReplayCommand(t *testing.T) {
	brokers := testbroker.Brokers(t)
	topicBase := testbroker.Topic(t, "events")
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	infinite := "-1"
	if err := admin.CreateTopic(topicBase, &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"retention.ms": &infinite}}, false); err != nil {
		t.Fatal(err)
	}
	prod, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	day := time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)
	want := map[string]bool{}
	for i := 0; i < 60; i++ {
		ts := day.Add(time.Duration(i-10) * 30 * time.Minute) // 10 before the day, 48 in it, 2 after
		key := fmt.Sprintf("actor-%d", i%7)
		id := fmt.Sprintf("evt-%02d", i)
		if !ts.Before(day) && ts.Before(day.AddDate(0, 0, 1)) {
			want[id] = true
		}
		for {
			_, _, err = prod.SendMessage(&sarama.ProducerMessage{Topic: topicBase, Partition: kafka.PartitionFor([]byte(key), 4),
				Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(id), Timestamp: ts})
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), "leader") {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if len(want) != 48 {
		t.Fatalf("%d events in the day", len(want))
	}

	var mu sync.Mutex
	audited, liveAudited := map[string]int{}, map[string]int{}
	notified, liveNotified := 0, 0
	appID := "replay-cli-" + topicBase[len(topicBase)-8:]
	build := func(live bool) *app.App {
		a := app.New(appID, app.WithBrokers(brokers...), app.WithCommitInterval(200*time.Millisecond))
		events := app.Topic(a, topicBase, codec.String(), codec.String(), app.Partitions(4))
		out := app.Topic(a, topicBase+"-out", codec.String(), codec.String(), app.Partitions(4))
		counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
		audit, notify := agent.NewEffect("audit"), agent.NewEffect("notify")
		aud, nt := audited, &notified
		if live {
			aud, nt = liveAudited, &liveNotified
		}
		agent.New(a, "auditor", events, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
				out.Send(ev, ev.Key, ev.Value)
				if _, err := notify.Apply(ev, func() (bool, error) { mu.Lock(); *nt++; mu.Unlock(); return true, nil }); err != nil {
					return err
				}
				if _, err := audit.Apply(ev, func() (bool, error) { mu.Lock(); aud[ev.Value]++; mu.Unlock(); return true, nil }); err != nil {
					return err
				}
			}
			return s.Err()
		}, agent.WritesTo(counts), agent.SendsTo(out))
		return a
	}
	run := func(args ...string) (string, error) {
		cmd := build(false).Command()
		var stdout bytes.Buffer
		cmd.SetOut(&stdout)
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(append([]string{"replay", "--no-progress", "--log-level", "error"}, args...))
		err := cmd.ExecuteContext(context.Background())
		return stdout.String(), err
	}
	counted := func(m map[string]int) int {
		mu.Lock()
		defer mu.Unlock()
		return len(m)
	}
	// The live worker processes everything and keeps running during the
	// replay.
	_, stopLive := goWorker(t, build(true), brokers, t.TempDir())
	defer func() {
		if err := stopLive(); err != nil {
			t.Errorf("live worker: %v", err)
		}
	}()
	client := testbroker.Client(t, brokers)
	ends := testbroker.Highwaters(t, client, topicBase)
	liveCommitted := func() map[int32]int64 {
		resp, err := admin.ListConsumerGroupOffsets(appID, map[string][]int32{topicBase: {0, 1, 2, 3}})
		if err != nil {
			t.Fatal(err)
		}
		out := map[int32]int64{}
		for p := int32(0); p < 4; p++ {
			if b := resp.GetBlock(topicBase, p); b != nil {
				out[p] = b.Offset
			}
		}
		return out
	}
	for deadline := time.Now().Add(60 * time.Second); counted(liveAudited) < 60 || fmt.Sprint(liveCommitted()) != fmt.Sprint(ends); {
		if time.Now().After(deadline) {
			t.Fatalf("live worker: %d of 60 audited, committed %v of %v", counted(liveAudited), liveCommitted(), ends)
		}
		time.Sleep(50 * time.Millisecond)
	}
	liveBefore := liveCommitted()

	outText, err := run("--agent", "auditor", "--effect", "audit", "--day", "2026-03-10")
	if err != nil {
		t.Fatalf("%v\n%s", err, outText)
	}
	if counted(audited) != 48 || notified != 0 {
		t.Fatalf("audited %d events, notified %d; want 48 and 0\n%s", len(audited), notified, outText)
	}
	for id, n := range audited {
		if !want[id] || n != 1 {
			t.Errorf("%s audited %d times (in the day: %v)", id, n, want[id])
		}
	}
	if !strings.Contains(outText, "48 records (0 out of the time range, 0 rejected), 0 gaps; effect applied 48, duplicates 0, errors 0; other effects skipped 48, sends suppressed 48") {
		t.Errorf("result not printed:\n%s", outText)
	}
	// The same command again resumes the completed replay: nothing applies.
	outText, err = run("--agent", "auditor", "--effect", "audit", "--day", "2026-03-10")
	if err != nil || len(audited) != 48 || !strings.Contains(outText, "0 records") {
		t.Fatalf("second run: %v, audited %d\n%s", err, len(audited), outText)
	}
	if _, err := run("--agent", "auditor", "--effect", "audit", "--day", "2026-03-10", "--group", appID); err == nil || !strings.Contains(err.Error(), "differ from the live group") {
		t.Errorf("live group: %v", err)
	}
	if _, err := run("--agent", "nobody", "--effect", "audit", "--day", "2026-03-10"); err == nil || !strings.Contains(err.Error(), "agents: auditor") {
		t.Errorf("unknown agent: %v", err)
	}
	if _, err := run("--agent", "auditor", "--effect", "audit", "--offsets", "0:0-1000"); err == nil || !strings.Contains(err.Error(), "beyond the captured end") {
		t.Errorf("stop past the end: %v", err)
	}
	outText, err = run("--agent", "auditor", "--effect", "audit", "--offsets", "0:0-0,1:0-1", "--dry-run")
	if err != nil || !strings.Contains(outText, "[0] [0, 0) (empty)") || !strings.Contains(outText, "[1] [0, 1)") {
		t.Errorf("dry run: %v\n%s", err, outText)
	}
	// The live group did not move, the live effects ran once per record,
	// and the live worker still processes new records.
	if after := liveCommitted(); fmt.Sprint(after) != fmt.Sprint(liveBefore) {
		t.Errorf("live group offsets moved: %v → %v", liveBefore, after)
	}
	mu.Lock()
	if liveNotified != 60 {
		t.Errorf("live notify ran %d times, want 60", liveNotified)
	}
	mu.Unlock()
	if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topicBase, Partition: 0, Key: sarama.StringEncoder("k"),
		Value: sarama.StringEncoder("evt-new"), Timestamp: day}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); counted(liveAudited) < 61; {
		if time.Now().After(deadline) {
			t.Fatalf("live worker stopped processing: %d audited", counted(liveAudited))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An agent that declares its effects (agent.Applies) has `replay --effect`
// checked before anything connects: a name it does not apply is refused at
// once, naming the ones it does (the brokers here answer nothing).
func TestReplayRefusesUndeclaredEffect(t *testing.T) {
	a := app.New("replay-effect-check", app.WithBrokers("127.0.0.1:1"))
	events := app.Topic(a, "events", codec.String(), codec.String(), app.Partitions(1))
	audit, notify := agent.NewEffect("audit"), agent.NewEffect("notify")
	agent.New(a, "auditor", events, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if _, err := audit.Apply(ev, func() (bool, error) { return true, nil }); err != nil {
				return err
			}
			if _, err := notify.Apply(ev, func() (bool, error) { return true, nil }); err != nil {
				return err
			}
		}
		return s.Err()
	}, agent.Applies(audit, notify))
	cmd := a.Command()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"replay", "--no-progress", "--log-level", "error", "--agent", "auditor", "--effect", "audti", "--day", "2026-03-10"})
	start := time.Now()
	err := cmd.ExecuteContext(context.Background())
	if want := `--effect "audti": agent auditor applies no such effect (declared with agent.Applies: audit, notify)`; err == nil || err.Error() != want {
		t.Fatalf("replay --effect audti: %v\nwant %s", err, want)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the refusal took %v: it should come before connecting", d)
	}
}
