package app_test

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// documentedCounters returns the counters of docs/http-api.md's metrics
// table with their labels.
func documentedCounters(t *testing.T) map[string][]string {
	t.Helper()
	doc, err := os.ReadFile("../docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| (`runnel_[^|]*) \\| counter \\| ([^|]*) \\|")
	name := regexp.MustCompile("`(runnel_[a-z_]+)`")
	out := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		var labels []string
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
		for _, n := range name.FindAllStringSubmatch(m[1], -1) {
			out[n[1]] = labels
		}
	}
	if len(out) < 15 {
		t.Fatalf("found %d counters in docs/http-api.md's metrics table; the table's format changed?", len(out))
	}
	return out
}

// TestMetricsCountersFromTheStart scrapes a fresh worker that joined its
// group and processed nothing: every counter of docs/http-api.md has a
// series for the app's label values, at 0 (except the rebalance and the
// task transitions its start made), among them the five an alert watches
// for rare events.
func TestMetricsCountersFromTheStart(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	o := newOpsApp(t, id)
	agent.New(o.app, "tick", o.out, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for range s.Events() {
		}
		return s.Err()
	}, agent.Every(time.Hour, agent.StreamTime, func(ctx context.Context, tk *agent.Tick) error { return nil }))
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
	var body string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if w.Assignment().Generation > 0 {
			body = httpGet(t, "http://"+o.addr+"/metrics")
			if n, _ := sample(body, "runnel_rebalances_total"); n >= 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker got no assignment within 60 s")
		}
	}

	words, out := o.words.Name(), o.out.Name()
	moved := map[string]bool{"runnel_rebalances_total": true, "runnel_task_transitions_total": true}
	for name, labels := range documentedCounters(t) {
		found := 0
		for _, line := range strings.Split(body, "\n") {
			rest, ok := strings.CutPrefix(line, name)
			if !ok || !(strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
				continue
			}
			found++
			if !moved[name] && !strings.HasSuffix(rest, " 0") {
				t.Errorf("%s: want 0 on a worker that processed nothing", line)
			}
			for _, l := range labels {
				if !strings.Contains(rest, l+`="`) {
					t.Errorf("%s: no label %s", line, l)
				}
			}
		}
		if found == 0 {
			t.Errorf("documented counter %s has no series on a fresh worker", name)
		}
	}
	for _, a := range []struct{ topic, agent string }{{words, "count"}, {words, "fwd"}, {out, "tick"}} {
		for _, name := range []string{"runnel_records_processed_total", "runnel_records_retried_total", "runnel_ack_timeouts_total", "runnel_dead_letters_total"} {
			wantSample(t, body, 0, name, "topic="+a.topic, "agent="+a.agent)
		}
		wantSample(t, body, 0, "runnel_partition_restarts_total", "topic="+a.topic)
		wantSample(t, body, 0, "runnel_records_advanced_total", "topic="+a.topic)
	}
	wantSample(t, body, 0, "runnel_records_sent_total", "topic="+out, "agent=fwd")
	wantSample(t, body, 0, "runnel_timer_firings_total", "agent=tick", "clock=stream-time")
	for _, name := range []string{"runnel_claim_start_mismatches_total", "runnel_cache_flushes_total", "runnel_restore_records_total"} {
		wantSample(t, body, 0, name, "table=counts")
	}
	for _, state := range []string{app.TaskRestoring, app.TaskRunning, app.TaskRestarting, app.TaskSuspending, app.TaskStandby, app.TaskAbandoned, app.TaskClosed} {
		if _, ok := sample(body, "runnel_task_transitions_total", "to="+state); !ok {
			t.Errorf("no series runnel_task_transitions_total{to=%q}", state)
		}
	}
	for _, reason := range []string{"fenced", "timeout", "failed"} {
		wantSample(t, body, 0, "runnel_transactional_producer_renewals_total", "reason="+reason)
	}
}
