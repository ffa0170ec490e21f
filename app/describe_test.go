package app_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/topology"
)

// TestDescribeSinksTablesDeadLetters checks that describe --json and --dot
// show what the agents declared: fwd sends to out, count writes counts, and
// each agent's dead-letter topic.
func TestDescribeSinksTablesDeadLetters(t *testing.T) {
	o := newOpsApp(t, "describe-app")
	var g topology.Graph
	out := runCLI(t, o.app, []string{"unused:1"}, "describe", "--json")
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	checkSnake(t, "describe", raw)
	want := map[string]topology.Agent{
		"count": {Name: "count", Source: o.words.Name(), Sinks: []string{}, Tables: []string{"counts"}, DeadLetterTopic: "describe-app-count-dlq"},
		"fwd":   {Name: "fwd", Source: o.words.Name(), Sinks: []string{o.out.Name()}, Tables: []string{}, DeadLetterTopic: "describe-app-fwd-dlq"},
	}
	for _, a := range g.Agents {
		w := want[a.Name]
		if a.Source != w.Source || !slices.Equal(a.Sinks, w.Sinks) || !slices.Equal(a.Tables, w.Tables) || a.DeadLetterTopic != w.DeadLetterTopic {
			t.Errorf("agent %+v, want %+v", a, w)
		}
	}
	dot := runCLI(t, o.app, []string{"unused:1"}, "describe", "--dot")
	for _, e := range []string{`"agent:fwd" -> "topic:` + o.out.Name() + `";`, `"agent:count" -> "table:counts";`,
		`"agent:fwd" -> "topic:describe-app-fwd-dlq" [style=dashed];`} {
		if !strings.Contains(dot, e) {
			t.Errorf("describe --dot lacks %s:\n%s", e, dot)
		}
	}
	text := runCLI(t, o.app, []string{"unused:1"}, "describe")
	if !strings.Contains(text, "sends to "+o.out.Name()) || !strings.Contains(text, "writes counts") {
		t.Errorf("describe:\n%s", text)
	}
}

// describe marks a windowed table with its windows, grace and retention.
func TestDescribeMarksWindowedTables(t *testing.T) {
	a := newJoinApp(t, "describe-windowed")
	text := runCLI(t, a, []string{"unused:1"}, "describe")
	if !strings.Contains(text, "(windowed: tumbling 24h0m0s, grace 72h0m0s, retention 720h0m0s)") {
		t.Errorf("describe does not mark daily-orders as windowed:\n%s", text)
	}
	if strings.Count(text, "windowed:") != 1 {
		t.Errorf("describe marks %d tables as windowed, want 1:\n%s", strings.Count(text, "windowed:"), text)
	}
	var g topology.Graph
	if err := json.Unmarshal([]byte(runCLI(t, a, []string{"unused:1"}, "describe", "--json")), &g); err != nil {
		t.Fatal(err)
	}
	for _, tb := range g.Tables {
		if (tb.Windows != "") != (tb.Name == "daily-orders") {
			t.Errorf("table %s: windows %q", tb.Name, tb.Windows)
		}
	}
	if dot := runCLI(t, a, []string{"unused:1"}, "describe", "--dot"); !strings.Contains(dot, `"windowed table daily-orders`) {
		t.Errorf("describe --dot does not mark the windowed table:\n%s", dot)
	}
}
