package app_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// opsApp is an app with a table writer, a sink and dead letters: agent
// "count" counts words into table "counts"; agent "fwd" forwards each record
// to topic "out", rejects values containing "bad" (a dead letter) and fails
// on "poison" (redelivered, then dead-lettered).
type opsApp struct {
	app    *app.App
	words  *agent.Topic[string, string]
	out    *agent.Topic[string, string]
	counts *table.Table[string, int64]
	addr   string
	// fixed makes agent fwd forward "bad" too (the fix before a replay).
	fixed atomic.Bool
}

func newOpsApp(t *testing.T, id string, opts ...app.Option) *opsApp {
	t.Helper()
	o := &opsApp{addr: freeAddr(t)}
	opts = append([]app.Option{
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200 * time.Millisecond),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id + "-"),
		app.WithHTTPAddr(o.addr),
	}, opts...)
	o.app = app.New(id, opts...)
	o.words = app.Topic(o.app, "words", codec.String(), codec.String(), app.Partitions(parts))
	o.out = app.Topic(o.app, "out", codec.String(), codec.String(), app.Partitions(parts))
	o.counts = table.New(o.app, "counts", codec.String(), codec.DecimalInt64())
	agent.New(o.app, "count", o.words, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			o.counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(o.counts))
	agent.New(o.app, "fwd", o.words, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if strings.Contains(ev.Value, "bad") && !o.fixed.Load() {
				ev.Reject(errors.New("value is bad"))
				continue
			}
			if ev.Value == "poison" {
				return errors.New("poison")
			}
			o.out.Send(ev, ev.Key, ev.Value)
		}
		return s.Err()
	}, agent.SendsTo(o.out))
	return o
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

// sample returns the value of the sample of metric name whose labels are
// exactly labels ("k=v" pairs), from a text exposition; ok is false when
// there is none.
func sample(body, name string, labels ...string) (float64, bool) {
	want := map[string]string{}
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		want[k] = v
	}
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		got := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			for _, kv := range strings.Split(rest[1:end], ",") {
				k, v, _ := strings.Cut(kv, "=")
				got[k] = strings.Trim(v, `"`)
			}
			rest = rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // a longer name
		}
		if len(got) != len(want) {
			continue
		}
		match := true
		for k, v := range want {
			if got[k] != v {
				match = false
			}
		}
		if !match {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return f, err == nil
	}
	return 0, false
}

func wantSample(t *testing.T, body string, want float64, name string, labels ...string) {
	t.Helper()
	got, ok := sample(body, name, labels...)
	if !ok {
		t.Errorf("no sample %s%v in /metrics", name, labels)
		return
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// TestMetricsAfterRecords runs one worker on the test broker, sends 40
// records (3 of them rejected by agent fwd), waits until the group consumed
// them and scrapes /metrics while the worker still runs: per-agent counts,
// sink records, dead letters, lag 0 on the 4 claimed partitions, running
// tasks, cache reads, a rebalance, the cycle histograms and the Go and
// process collectors.
func TestMetricsAfterRecords(t *testing.T) { metricsAfterRecords(t) }

// TestMetricsAfterRecordsExactlyOnce is TestMetricsAfterRecords under
// ExactlyOnce (sink records and dead letters in the cycles' transactions).
func TestMetricsAfterRecordsExactlyOnce(t *testing.T) {
	metricsAfterRecords(t, app.WithGuarantee(app.ExactlyOnce))
}

func metricsAfterRecords(t *testing.T, opts ...app.Option) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	opts = append([]app.Option{app.WithRedelivery(app.Redelivery{MaxRetries: 2, Backoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})}, opts...)
	o := newOpsApp(t, id, opts...)
	w, err := o.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, o.words.Name())
	var recs []kv
	for i := range 40 {
		v := "ok"
		if i%13 == 5 { // i = 5, 18, 31
			v = "bad"
		}
		recs = append(recs, kv{fmt.Sprintf("w%d", i%10), v})
	}
	send(t, brokers, o.words.Name(), recs...)
	testbroker.WaitLag0(t, brokers, o.app.ID(), o.words.Name())
	body := httpGet(t, "http://"+o.addr+"/metrics")
	words := o.words.Name()
	wantSample(t, body, 40, "runnel_records_processed_total", "topic="+words, "agent=count")
	wantSample(t, body, 40, "runnel_records_processed_total", "topic="+words, "agent=fwd")
	wantSample(t, body, 40, "runnel_records_advanced_total", "topic="+words)
	wantSample(t, body, 37, "runnel_records_sent_total", "topic="+o.out.Name(), "agent=fwd")
	wantSample(t, body, 3, "runnel_dead_letters_total", "topic="+words, "agent=fwd")
	if w.DeadLettered() != 3 || w.Processed() != 40 || w.Retried() != 0 {
		t.Errorf("DeadLettered, Processed, Retried = %d, %d, %d; want 3, 40, 0", w.DeadLettered(), w.Processed(), w.Retried())
	}
	for p := range parts {
		wantSample(t, body, 0, "runnel_consumer_lag_records", "topic="+words, fmt.Sprintf("partition=%d", p))
		wantSample(t, body, 1, "runnel_task_state", fmt.Sprintf("partition=%d", p), fmt.Sprintf("partitions=%d", parts), "state=running")
	}
	// Update reads every key once per record: 40 reads, the first of each
	// key in a cycle from the store, the others from the cache.
	hits, _ := sample(body, "runnel_cache_hits_total", "table=counts")
	misses, _ := sample(body, "runnel_cache_misses_total", "table=counts")
	if hits+misses != 40 || misses < 10 {
		t.Errorf("cache hits %v + misses %v: want 40 reads, at least 10 from the store (10 keys)", hits, misses)
	}
	if n, _ := sample(body, "runnel_rebalances_total"); n < 1 {
		t.Errorf("runnel_rebalances_total = %v, want >= 1", n)
	}
	if n, _ := sample(body, "runnel_rebalance_duration_seconds_count"); n < 1 {
		t.Errorf("runnel_rebalance_duration_seconds_count = %v, want >= 1", n)
	}
	// Every changelog record of a cycle is one dirty key: 10 keys, so at
	// least 10 records and at most 40.
	cyc, _ := sample(body, "runnel_cycle_size_records_sum")
	if cyc < 10 || cyc > 40 {
		t.Errorf("runnel_cycle_size_records_sum = %v, want 10..40", cyc)
	}
	if c, _ := sample(body, "runnel_cycle_changelog_records_total"); c != cyc {
		t.Errorf("runnel_cycle_changelog_records_total = %v, want the size histogram's sum %v", c, cyc)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := sample(body, name); !ok {
			t.Errorf("no %s: Go or process collector missing", name)
		}
	}

	// Lag shows records not yet processed: a rejected-everything pause is
	// not needed; records sent while the worker runs are eventually
	// processed and the gauge returns to 0, with the new counts.
	send(t, brokers, words, kv{"w1", "ok"}, kv{"w2", "ok"})
	testbroker.WaitLag0(t, brokers, o.app.ID(), words)
	body = httpGet(t, "http://"+o.addr+"/metrics")
	wantSample(t, body, 42, "runnel_records_processed_total", "topic="+words, "agent=count")
	wantSample(t, body, 39, "runnel_records_sent_total", "topic="+o.out.Name(), "agent=fwd")

	// A record that always fails: 2 redeliveries (MaxRetries), then a dead
	// letter.
	send(t, brokers, words, kv{"w4", "poison"})
	testbroker.WaitLag0(t, brokers, o.app.ID(), words)
	body = httpGet(t, "http://"+o.addr+"/metrics")
	wantSample(t, body, 2, "runnel_records_retried_total", "topic="+words, "agent=fwd")
	wantSample(t, body, 4, "runnel_dead_letters_total", "topic="+words, "agent=fwd")
	wantSample(t, body, 39, "runnel_records_sent_total", "topic="+o.out.Name(), "agent=fwd")
	if w.Retried() != 2 || w.DeadLettered() != 4 {
		t.Errorf("Retried, DeadLettered = %d, %d; want 2, 4", w.Retried(), w.DeadLettered())
	}
}
