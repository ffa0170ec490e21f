package topology

import (
	"strings"
	"testing"
)

func TestResolveFillsTablePartitionsFromSources(t *testing.T) {
	g := &Graph{App: "a",
		Topics: []Topic{{Name: "in", Partitions: 8}, {Name: "by-dir", Partitions: 8}},
		Agents: []Agent{{Name: "x", Source: "in"}, {Name: "y", Source: "by-dir"}},
		Tables: []Table{{Name: "t", Changelog: "a-t-changelog"}, {Name: "u", Changelog: "a-u-changelog", Partitions: 4}}}
	if err := g.Resolve(); err != nil {
		t.Fatal(err)
	}
	if g.Tables[0].Partitions != 8 || g.Tables[1].Partitions != 4 {
		t.Fatalf("partitions = %d, %d; want 8, 4", g.Tables[0].Partitions, g.Tables[1].Partitions)
	}
	groups := g.CoPartitionGroups()
	if got := strings.Join(groups[8], ","); got != "a-t-changelog,by-dir,in" {
		t.Fatalf("group 8 = %s", got)
	}
}

func TestResolveReportsEveryProblem(t *testing.T) {
	g := &Graph{App: "a",
		Topics: []Topic{{Name: "in", Partitions: 8}, {Name: "other", Partitions: 3}, {Name: "bad", Partitions: 0}},
		Agents: []Agent{{Name: "x", Source: "in"}, {Name: "y", Source: "other"}, {Name: "z", Source: "missing"}},
		Tables: []Table{{Name: "t"}}}
	err := g.Resolve()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"topic bad: partitions must be > 0", "agent z: source topic missing is not declared", "table t: source topics have different partition counts"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// One problem reads as itself, with no "1 error occurred" around it.
func TestResolveReportsOneProblemAsItself(t *testing.T) {
	g := &Graph{App: "a", Topics: []Topic{{Name: "in", Partitions: 8}}, Agents: []Agent{{Name: "z", Source: "missing"}}}
	err := g.Resolve()
	if err == nil || err.Error() != "agent z: source topic missing is not declared" {
		t.Errorf("error %q, want only the problem", err)
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"change-events", "a.b_c", "X1"} {
		if ValidName(ok) != nil {
			t.Errorf("%q rejected", ok)
		}
	}
	for _, bad := range []string{"", "a b", "a/b", strings.Repeat("x", 201)} {
		if ValidName(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func describedGraph(t *testing.T) *Graph {
	t.Helper()
	g := &Graph{App: "a",
		Topics: []Topic{{Name: "in", Partitions: 2}, {Name: "out", Partitions: 2}},
		Agents: []Agent{{Name: "x", Source: "in", Sinks: []string{"out"}, Tables: []string{"t"}, DeadLetterTopic: "a-x-dlq"},
			{Name: "y", Source: "out", DeadLetterTopic: "a-x-dlq"}},
		Tables: []Table{{Name: "t", Changelog: "a-t-changelog"}}}
	if err := g.Resolve(); err != nil {
		t.Fatal(err)
	}
	return g
}

func TestWriteTextShowsSinksTablesDeadLetters(t *testing.T) {
	var b strings.Builder
	if err := describedGraph(t).WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sends to out\n", "writes t\n", "dead letters to a-x-dlq\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, b.String())
		}
	}
}

func TestWriteDOT(t *testing.T) {
	var b strings.Builder
	if err := describedGraph(t).WriteDOT(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		`"topic:in" -> "agent:x";`,
		`"agent:x" -> "topic:out";`,
		`"agent:x" -> "table:t";`,
		`"agent:x" -> "topic:a-x-dlq" [style=dashed];`,
		`"agent:y" -> "topic:a-x-dlq" [style=dashed];`,
		`"table:t" [shape=cylinder, label="table t\na-t-changelog"];`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("DOT lacks %s:\n%s", want, got)
		}
	}
	// A shared dead-letter topic is one node.
	if n := strings.Count(got, `"topic:a-x-dlq" [shape=ellipse, style=dashed`); n != 1 {
		t.Errorf("dead-letter topic declared %d times:\n%s", n, got)
	}
	if !strings.HasPrefix(got, `digraph "a" {`) || !strings.HasSuffix(got, "}\n") {
		t.Errorf("not a digraph:\n%s", got)
	}
}

func TestResolveChecksSinksAndTables(t *testing.T) {
	g := &Graph{App: "a", Topics: []Topic{{Name: "in", Partitions: 2}},
		Agents: []Agent{{Name: "x", Source: "in", Sinks: []string{"nowhere"}, Tables: []string{"nothing"}}}}
	err := g.Resolve()
	for _, want := range []string{"agent x: sink topic nowhere is not declared", "agent x: table nothing is not declared"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}
}

// TestResolveChecksWrittenTablePartitions: an agent may write only tables
// co-partitioned with its topic; one with another count is refused at start,
// naming both counts (at run time such a write is ErrNotCoPartitioned).
func TestResolveChecksWrittenTablePartitions(t *testing.T) {
	g := &Graph{App: "a", Topics: []Topic{{Name: "in", Partitions: 8}},
		Tables: []Table{{Name: "counts", Changelog: "a-counts-changelog", Partitions: 4}, {Name: "same", Changelog: "a-same-changelog", Partitions: 8}},
		Agents: []Agent{{Name: "x", Source: "in", Tables: []string{"counts", "same"}}}}
	err := g.Resolve()
	want := "agent x: writes table counts (4 partitions) from in (8 partitions): not co-partitioned"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v lacks %q", err, want)
	}
	if strings.Contains(err.Error(), "table same") {
		t.Fatalf("a co-partitioned table refused: %v", err)
	}
}
