package changelog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
)

// logLines returns a ProgressLog writing JSON lines into a buffer, and a
// function decoding the lines written so far.
func logLines(t *testing.T) (*changelog.ProgressLog, func() []map[string]any) {
	var buf bytes.Buffer
	l := &changelog.ProgressLog{Logger: slog.New(slog.NewJSONHandler(&buf, nil)),
		TableOf: func(topic string) string { return strings.TrimSuffix(strings.TrimPrefix(topic, "app-"), "-changelog") }}
	return l, func() []map[string]any {
		var out []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			out = append(out, m)
		}
		buf.Reset()
		return out
	}
}

func wantAttrs(t *testing.T, line map[string]any, want map[string]any) {
	t.Helper()
	for k, v := range want {
		if fmt.Sprint(line[k]) != fmt.Sprint(v) {
			t.Errorf("%s = %v, want %v (line %v)", k, line[k], v, line)
		}
	}
}

// TestProgressLogOneLine: three partitions of two tables under way give one
// line with the tables, partitions done of all, offsets covered of the total
// (each from where its restore started), a rate and an ETA; when the last is
// done, one "restore done" line, and nothing after it until a new round.
func TestProgressLogOneLine(t *testing.T) {
	l, lines := logLines(t)
	l.Log()
	if got := lines(); len(got) != 0 {
		t.Fatalf("lines before any restore: %v", got)
	}
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 0, From: 100, Position: 100, Target: 1100})
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 1, From: 0, Position: 0, Target: 2000})
	l.Observe(changelog.Progress{Topic: "app-totals-changelog", Partition: 0, From: 50, Position: 50, Target: 50, Done: true})
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 0, From: 100, Position: 600, Target: 1100})
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 1, From: 0, Position: 1000, Target: 2000})
	l.Log()
	got := lines()
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(got), got)
	}
	wantAttrs(t, got[0], map[string]any{"msg": "restore progress", "tables": []string{"counts", "totals"}, "partitions_done": 1, "partitions": 3,
		"records": 1500, "records_total": 3000})
	if r, ok := got[0]["records_per_s"].(float64); !ok || r <= 0 {
		t.Errorf("records_per_s = %v", got[0]["records_per_s"])
	}
	if _, ok := got[0]["eta"]; !ok {
		t.Errorf("no eta in %v", got[0])
	}

	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 0, From: 100, Position: 1100, Target: 1100, Done: true})
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 1, From: 0, Position: 2000, Target: 2000, Done: true})
	l.Log()
	got = lines()
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(got), got)
	}
	wantAttrs(t, got[0], map[string]any{"msg": "restore done", "tables": []string{"counts", "totals"}, "partitions_done": 3, "partitions": 3,
		"records": 3000, "records_total": 3000})
	if _, ok := got[0]["elapsed"]; !ok {
		t.Errorf("no elapsed in %v", got[0])
	}
	l.Log()
	if got := lines(); len(got) != 0 {
		t.Fatalf("lines after the round ended: %v", got)
	}
	// A restore stopped early (a revoke) leaves the round: the round ends
	// when the others are done.
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 5, From: 0, Position: 0, Target: 100})
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 6, From: 0, Position: 0, Target: 10})
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 5, From: 0, Position: 0, Target: 100, Stopped: true})
	l.Observe(changelog.Progress{Topic: "app-counts-changelog", Partition: 6, From: 0, Position: 10, Target: 10, Done: true})
	l.Log()
	got = lines()
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(got), got)
	}
	wantAttrs(t, got[0], map[string]any{"msg": "restore done", "partitions_done": 1, "partitions": 1, "records": 10, "records_total": 10})

	// A new round (a rebalance) counts from its own first report.
	l.Observe(changelog.Progress{Topic: "app-totals-changelog", Partition: 3, From: 10, Position: 15, Target: 20})
	l.Log()
	got = lines()
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(got), got)
	}
	wantAttrs(t, got[0], map[string]any{"msg": "restore progress", "tables": []string{"totals"}, "partitions_done": 0, "partitions": 1, "records": 5, "records_total": 10})
}

// TestProgressLogFromRestores: two real restores on the broker fed into one
// ProgressLog (as a worker does) give one "restore done" line with their
// exact totals, and the restorer itself writes no line at info level.
func TestProgressLogFromRestores(t *testing.T) {
	e := newEnv(t)
	var restorerLog bytes.Buffer
	e.restorer.Logger = slog.New(slog.NewTextHandler(&restorerLog, nil))
	l, lines := logLines(t)
	e.restorer.OnProgress = l.Observe
	for i, n := range []int{30, 45} {
		topic := e.topic(fmt.Sprintf("cl%d", i), nil)
		var recs []rec
		for j := range n {
			recs = append(recs, rec{key: fmt.Sprintf("k%d", j), value: "v"})
		}
		e.produce(topic, recs...)
		restore(t, e, topic, stores.NewMemory())
	}
	l.Log()
	got := lines()
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(got), got)
	}
	wantAttrs(t, got[0], map[string]any{"msg": "restore done", "partitions_done": 2, "partitions": 2, "records": 75, "records_total": 75})
	if restorerLog.Len() != 0 {
		t.Errorf("the restorer logged at info level: %s", restorerLog.String())
	}
}

// TestRestoreStoppedReport: a restore cancelled before its target makes one
// last report, Stopped, so that the summary does not wait for it.
func TestRestoreStoppedReport(t *testing.T) {
	e := newEnv(t)
	topic := e.topic("cl", nil)
	var recs []rec
	for i := range 20 {
		recs = append(recs, rec{key: fmt.Sprintf("k%d", i), value: "v"})
	}
	e.produce(topic, recs...)
	var got []changelog.Progress
	e.restorer.OnProgress = func(p changelog.Progress) { got = append(got, p) }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.restorer.Restore(ctx, topic, 0, stores.NewMemory()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Restore with a cancelled context: %v", err)
	}
	if len(got) == 0 || !got[len(got)-1].Stopped || got[len(got)-1].Done {
		t.Fatalf("reports %+v, want the last one Stopped", got)
	}
	l, lines := logLines(t)
	for _, p := range got {
		l.Observe(p)
	}
	l.Log()
	if got := lines(); len(got) != 0 {
		t.Errorf("lines for a round whose only restore stopped: %v", got)
	}
}
