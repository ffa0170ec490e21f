package app_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/table"
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

// TestDeclarationsCheckedAtBuild: what an agent declares it writes and
// sends to must be declared on the same app (a table or topic of another
// app, even under the same name, is refused with the agent and the option
// named), a written table must be co-partitioned with the agent's topic, and
// a nil table (a variable never assigned) is an error, not a panic; all
// before any worker starts. The tables and topics the framework
// writes for an agent are declared by it: a Cron timer's table.
func TestDeclarationsCheckedAtBuild(t *testing.T) {
	other := app.New("other-app")
	foreignTable := table.New(other, "counts", codec.String(), codec.DecimalInt64())
	foreignTopic := app.Topic(other, "out", codec.String(), codec.String())

	a := app.New("declaring-app")
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(8))
	table.New(a, "counts", codec.String(), codec.DecimalInt64())
	app.Topic(a, "out", codec.String(), codec.String())
	narrow := table.New(a, "narrow", codec.String(), codec.DecimalInt64(), table.Partitions(4))
	noop := func(ctx context.Context, s *agent.Stream[string, string]) error {
		for range s.Events() {
		}
		return s.Err()
	}
	agent.New(a, "foreign", in, noop, agent.WritesTo(foreignTable), agent.SendsTo(foreignTopic))
	agent.New(a, "narrow-writer", in, noop, agent.WritesTo(narrow))
	agent.New(a, "reporter", in, noop, agent.Cron("0 9 * * *", func(context.Context, *agent.Tick) error { return nil }))
	var unassigned *table.Table[string, int64]
	agent.New(a, "nil-writer", in, noop, agent.WritesTo(unassigned))
	g, err := a.Topology()
	for _, want := range []string{
		`agent foreign: writes table "counts" (agent.WritesTo), which is not declared on app declaring-app`,
		`agent foreign: sends to topic "out" (agent.SendsTo), which is not declared on app declaring-app`,
		`agent narrow-writer: writes table narrow (4 partitions) from in (8 partitions): not co-partitioned`,
		`agent nil-writer: agent.WritesTo got a nil table`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Topology error = %v\nwant it to say: %s", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "reporter") {
		t.Errorf("Topology error names the cron agent: %v", err)
	}
	for _, ag := range g.Agents {
		if ag.Name == "reporter" && !slices.Equal(ag.Tables, []string{agent.CronTable("reporter")}) {
			t.Errorf("agent reporter writes %v, want its cron table %s declared", ag.Tables, agent.CronTable("reporter"))
		}
	}
}
