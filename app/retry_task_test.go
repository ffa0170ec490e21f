package app_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// A record that keeps failing is redelivered by restarting only its own
// partition: the other partitions keep processing and committing, the
// worker's session (generation) does not change, and once the record
// succeeds the failing partition's tables are exact: the updates the agent
// made before it failed, each time, to a table and to a global table, were
// dropped with the task's caches (a redelivered record applies once).
func TestFailingRecordRestartsOnlyItsPartition(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	a := app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(100*time.Millisecond),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id+"-"),
		app.WithRedelivery(app.Redelivery{MaxRetries: 1000, Backoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}),
	)
	in := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(parts))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	gcounts := table.NewGlobal(a, "gcounts", codec.String(), codec.DecimalInt64(), table.Partitions(parts))
	var blocked atomic.Bool
	var attempts atomic.Int64
	blocked.Store(true)
	agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			gcounts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			if ev.Value == "fail" && blocked.Load() {
				attempts.Add(1)
				return errors.New("not yet")
			}
		}
		return s.Err()
	}, agent.WritesTo(counts, gcounts))
	dir := t.TempDir()
	w, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, in.Name())

	ws := wordPerPartition("w") // ws[p] lives in partition p
	var recs []kv
	for _, word := range ws {
		for range 5 {
			recs = append(recs, kv{word, "x"})
		}
	}
	recs = append(recs, kv{ws[0], "fail"})
	for range 5 {
		recs = append(recs, kv{ws[0], "x"})
	}
	send(t, brokers, in.Name(), recs...)
	waitUntil(t, 30*time.Second, "three failed deliveries", func() bool { return attempts.Load() >= 3 })
	gen := w.Assignment().Generation

	// While partition 0 keeps failing, the others process and commit.
	var more []kv
	for _, word := range ws[1:] {
		for range 20 {
			more = append(more, kv{word, "y"})
		}
	}
	send(t, brokers, in.Name(), more...)
	waitUntil(t, 30*time.Second, "partitions 1-3 committed to their ends", func() bool {
		lag, err := app.GroupLag(context.Background(), app.WrapClient(client), id, []string{in.Name()})
		if err != nil {
			return false
		}
		l := lag[in.Name()]
		return l[1] == 0 && l[2] == 0 && l[3] == 0 && l[0] > 0
	})
	if g := w.Assignment().Generation; g != gen {
		t.Fatalf("generation %d -> %d: a failing record restarted the session", gen, g)
	}
	before := attempts.Load()
	blocked.Store(false)
	testbroker.WaitLag0(t, brokers, id, in.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{ws[0]: 11, ws[1]: 25, ws[2]: 25, ws[3]: 25}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	got, err := app.ReadTable(context.Background(), app.WrapClient(client), gcounts)
	if err != nil {
		t.Fatal(err)
	}
	for k, n := range want {
		if got[k] != int64(n) {
			t.Fatalf("global count of %s = %v, want %d (table %v)", k, got[k], n, got)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("global table %v, want %v", got, want)
	}
	t.Logf("failing record delivered %d times while the other partitions committed", before)
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
