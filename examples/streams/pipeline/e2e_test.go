package pipeline_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/examples/streams/pipeline"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

const dataFile = "../../changeaudit/testdata/git-history.jsonl.gz"

// expected is every table and each partition's top actor, computed from the
// JSONL lines without any Runnel code.
type expected struct {
	commits, lines, dirs, committers map[string]int64
	top                              map[int32]pipeline.Top
}

func compute(t *testing.T, lines [][]byte) expected {
	t.Helper()
	e := expected{commits: map[string]int64{}, lines: map[string]int64{}, dirs: map[string]int64{}, committers: map[string]int64{},
		top: map[int32]pipeline.Top{}}
	for i, l := range lines {
		var c struct {
			Actor, Committer string
			Added, Deleted   int64
			Dirs             []string
		}
		if err := json.Unmarshal(l, &c); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		e.commits[c.Actor]++
		e.lines[c.Actor] += c.Added + c.Deleted
		e.committers[c.Committer]++
		for _, d := range c.Dirs {
			e.dirs[d]++
		}
	}
	for a, n := range e.commits {
		p := kafka.PartitionFor([]byte(a), 8)
		if cur := e.top[p]; n > cur.Commits || (n == cur.Commits && a < cur.Actor) {
			e.top[p] = pipeline.Top{Partition: p, Actor: a, Commits: n}
		}
	}
	return e
}

func assertCounts(t *testing.T, name string, got map[string]any, want map[string]int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d keys, want %d", name, len(got), len(want))
	}
	bad := 0
	for k, w := range want {
		if g, ok := got[k].(int64); !ok || g != w {
			if bad++; bad <= 5 {
				t.Errorf("%s[%s] = %v, want %d", name, k, got[k], w)
			}
		}
	}
}

// lastTops reads top-actors and returns each partition's last emission.
func lastTops(t *testing.T, client sarama.Client, topic string) map[int32]pipeline.Top {
	t.Helper()
	c, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := map[int32]pipeline.Top{}
	for p := int32(0); p < 8; p++ {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		if hw == 0 {
			continue
		}
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
		for m := range pc.Messages() {
			var top pipeline.Top
			if err := json.Unmarshal(m.Value, &top); err != nil {
				t.Fatal(err)
			}
			if prev, ok := out[top.Partition]; !ok || !top.At.Before(prev.At) {
				out[top.Partition] = top
			}
			if m.Offset >= hw-1 {
				break
			}
		}
		pc.Close()
	}
	return out
}

// The example on the first 20 000 lines of the real data: the counts through
// both repartition topics, the per-actor tables and their join, and the top
// actor each partition's timer emits after the last record, all equal to
// what the lines say.
//
// One worker: under at-least-once, a hand-over whose final cycle cannot cut
// in its drain budget (two workers under -race and CPU load) leaves the next
// owner to process the records again, and the records they sent to the
// repartition topics are sent again: the downstream counts are then above
// exact (never below). Exact results across hand-overs need exactly-once.
func TestExampleOneWorker(t *testing.T) {
	lines := testbroker.GzipLines(t, dataFile, 20000)
	want := compute(t, lines)
	id := testbroker.Topic(t, "st")
	logger := slog.New(slog.NewTextHandler(testbroker.LogWriter{T: t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := pipeline.Build(id, 100*time.Millisecond,
		app.WithTopicPrefix(id+"-"),
		app.WithLogger(logger),
		app.WithCommitInterval(200*time.Millisecond),
		app.WithGroupTimeouts(10*time.Second, 300*time.Millisecond, 15*time.Second, kafka.TestTimeouts.MaxWait))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	brokers := testbroker.Brokers(t)
	var tops map[int32]pipeline.Top
	res, err := p.App.Process(ctx, brokers, app.DevOptions{Workers: 1, Input: testbroker.WriteLines(t, lines), InputTopic: "change-events", KeyField: "actor", DataDir: t.TempDir(),
		Inspect: func([]*app.Worker) {
			client, err := sarama.NewClient(brokers, testbroker.SaramaConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			// Every partition's timer fires after its last record was
			// counted: its last emission is the partition's final top.
			for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				tops = lastTops(t, client, p.TopActors.Name())
				done := len(tops) == len(want.top)
				for q, w := range want.top {
					done = done && tops[q].Actor == w.Actor && tops[q].Commits == w.Commits
				}
				if done {
					return
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	assertCounts(t, "commits-per-actor", res.Tables["commits-per-actor"], want.commits)
	assertCounts(t, "lines-per-actor", res.Tables["lines-per-actor"], want.lines)
	assertCounts(t, "events-per-dir", res.Tables["events-per-dir"], want.dirs)
	assertCounts(t, "commits-per-committer", res.Tables["commits-per-committer"], want.committers)
	profiles := res.Tables["actor-profiles"]
	if len(profiles) != len(want.commits) {
		t.Errorf("actor-profiles: %d keys, want %d", len(profiles), len(want.commits))
	}
	for a, n := range want.commits {
		if got, ok := profiles[a].(pipeline.Profile); !ok || got != (pipeline.Profile{Commits: n, Lines: want.lines[a]}) {
			t.Fatalf("actor-profiles[%s] = %#v, want {%d %d}", a, profiles[a], n, want.lines[a])
		}
	}
	for q, w := range want.top {
		if tops[q].Actor != w.Actor || tops[q].Commits != w.Commits {
			t.Errorf("partition %d: last top actor emitted %s (%d), want %s (%d)", q, tops[q].Actor, tops[q].Commits, w.Actor, w.Commits)
		}
	}
}
