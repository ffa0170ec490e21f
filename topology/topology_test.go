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
