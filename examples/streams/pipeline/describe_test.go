package pipeline_test

import (
	"slices"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/examples/streams/pipeline"
)

// TestDescribeListsEveryEdge: describe (the app's topology) shows every
// table each agent writes and every topic it sends to, the framework's own
// agents included (GroupBy's re-keying agent sends to its repartition topic),
// because the worker refuses a write or a send an agent did not declare.
// The edges below are read from the code of pipeline.go.
func TestDescribeListsEveryEdge(t *testing.T) {
	p := pipeline.Build("describe-streams", time.Minute)
	g, err := p.App.Topology()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ sinks, tables []string }{
		"count-by-actor":     {sinks: []string{p.TopActors.Name()}, tables: []string{"commits-per-actor", "lines-per-actor"}},
		"split-by-dir":       {sinks: []string{p.ByDir.Name()}, tables: []string{}},
		"count-by-dir":       {sinks: []string{}, tables: []string{"events-per-dir"}},
		"by-committer":       {sinks: []string{p.ByCommitter.Name()}, tables: []string{}},
		"count-by-committer": {sinks: []string{}, tables: []string{"commits-per-committer"}},
	}
	if len(g.Agents) != len(want) {
		t.Errorf("%d agents, want %d: %+v", len(g.Agents), len(want), g.Agents)
	}
	for _, a := range g.Agents {
		w, ok := want[a.Name]
		if !ok {
			t.Errorf("unexpected agent %s", a.Name)
			continue
		}
		if !slices.Equal(a.Sinks, w.sinks) || !slices.Equal(a.Tables, w.tables) {
			t.Errorf("agent %s: sends to %v and writes %v, want %v and %v", a.Name, a.Sinks, a.Tables, w.sinks, w.tables)
		}
	}
	// Every table is written by an agent or by a join of tables that are.
	written := map[string]bool{}
	for _, a := range g.Agents {
		for _, tb := range a.Tables {
			written[tb] = true
		}
	}
	for _, tb := range g.Tables {
		if !written[tb.Name] && !(len(tb.JoinOf) == 2 && written[tb.JoinOf[0]] && written[tb.JoinOf[1]]) {
			t.Errorf("table %s: no agent declares writing it", tb.Name)
		}
	}
}
