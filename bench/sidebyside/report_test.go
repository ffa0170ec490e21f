package main

import (
	"strings"
	"testing"
)

// A run's time splits into its start-up (start → first output) and its
// steady span (first → last output); the speed-up is given over both, the
// whole time and the steady rate, against Runnel's row of the same workload.
func TestTableSplitsStartupFromSteady(t *testing.T) {
	h := &harness{cfg: config{workloads: []string{"stateful-distinct", "restore-distinct"}}}
	sel := []*system{{name: "runnel"}, {name: "goka"}}
	results := []result{
		{System: "runnel", Workload: "stateful-distinct", Round: 1, Seconds: 2.5, FirstOut: 0.5, Rate: 100_000, Span: 210_000},
		{System: "goka", Workload: "stateful-distinct", Round: 1, Seconds: 4.5, FirstOut: 2.5, Rate: 80_000, Span: 200_000},
		{System: "runnel", Workload: "restore-distinct", Round: 1, Seconds: 1.0, FirstOut: 0.25, Records: 126_000, Span: 126_000},
		{System: "goka", Workload: "restore-distinct", Round: 1, Seconds: 3.0, FirstOut: 2.0, Records: 200_000, Span: 200_000},
	}
	table := newReport(h, sel, results, nil, 0).table()
	for _, want := range []string{
		"| stateful-distinct | runnel | 1 | 2.50 | 0.50 | 2.00 | 100000 | 1.00× | 1.00× |",
		"| stateful-distinct | goka | 1 | 4.50 | 2.50 | 2.00 | 80000 | 1.80× | 1.25× |",
		"200000 changelog records written",
		"| restore-distinct | runnel | 1 | 1.00 | 0.25 | 0.75 |  | 1.00× |  |",
		"| restore-distinct | goka | 1 | 3.00 | 2.00 | 1.00 |  | 3.00× |  |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// A restore workload is measured inside its stateful run, and a system runs
// the distinct-key variant of every workload it runs.
func TestDistinctWorkloads(t *testing.T) {
	for rs, st := range map[string]string{"restore": "stateful", "restore-distinct": "stateful-distinct", "stateful": ""} {
		if got := statefulOf(rs); got != st {
			t.Errorf("statefulOf(%q) = %q, want %q", rs, got, st)
		}
	}
	s := &system{workloads: []string{"stateless", "stateful"}}
	if !s.runs("stateful-distinct") || s.runs("restore-distinct") {
		t.Errorf("a system that runs stateful but not restore: runs stateful-distinct %v, restore-distinct %v",
			s.runs("stateful-distinct"), s.runs("restore-distinct"))
	}
}
