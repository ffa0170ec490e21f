package main

import (
	"strings"
	"testing"
)

// The percentiles are nearest-rank over the samples; a record's output must
// be the upper-cased stamp of its level, or the run counts it as wrong.
func TestLatencyPercentilesAndStamps(t *testing.T) {
	ms := make([]float64, 1000)
	for i := range ms {
		ms[i] = float64(1000 - i) // 1000 … 1
	}
	var res result
	res.percentiles(ms)
	if res.Samples != 1000 || res.P50 != 500 || res.P99 != 990 || res.P999 != 999 || res.MaxMS != 1000 {
		t.Errorf("percentiles of 1…1000: n %d p50 %v p99 %v p99.9 %v max %v, want 1000 500 990 999 1000",
			res.Samples, res.P50, res.P99, res.P999, res.MaxMS)
	}
	level, stamp, seq, err := parseStamp([]byte(strings.ToUpper("lat-1-1733000000123456789-42")), 3)
	if err != nil || level != 1 || stamp != 1733000000123456789 || seq != 42 {
		t.Errorf("parseStamp: level %d stamp %d seq %d err %v", level, stamp, seq, err)
	}
	if level, _, _, err := parseStamp([]byte("LAT-W-1-0"), 3); err != nil || level != 3 {
		t.Errorf("warm-up stamp: level %d err %v, want 3 (the warm-up's)", level, err)
	}
	for _, v := range []string{"lat-1-1-1", "LAT-3-1-1", "LAT-1-x-1", "LAT-1-1", "abc"} {
		if _, _, _, err := parseStamp([]byte(v), 3); err == nil {
			t.Errorf("parseStamp(%q) took it", v)
		}
	}
}

// The latency table has one row per workload, system and level, with the
// medians of the rounds' percentiles and the largest max.
func TestLatencyTable(t *testing.T) {
	h := &harness{cfg: config{workloads: []string{"latency"}}}
	sel := []*system{{name: "runnel"}, {name: "goka"}}
	results := []result{
		{System: "runnel", Workload: "latency", Round: 1, Level: "50%", InRate: 1000, SentRate: 1000, CapFrac: 0.5, P50: 1, P99: 5, P999: 9, MaxMS: 20, Load: 2},
		{System: "runnel", Workload: "latency", Round: 2, Level: "50%", InRate: 1200, SentRate: 1000, CapFrac: 0.5, P50: 3, P99: 7, P999: 11, MaxMS: 12, Load: 4},
		{System: "goka", Workload: "latency", Round: 1, Level: "50%", Failure: "lost"},
	}
	rep := newReport(h, sel, results, nil, 0)
	lt := rep.latencyTable()
	for _, want := range []string{
		"| latency | runnel | 50% | 1100 (**1000**) | 50% | 2 | 2.0 | 6.0 | 10.0 | 20.0 | 0 | 0 | 2.0–4.0 |",
		"| latency | goka | 50% | | | 1 | **FAILURE** (1 of 1) |",
	} {
		if !strings.Contains(lt, want) {
			t.Errorf("latency table lacks %q:\n%s", want, lt)
		}
	}
	if strings.Contains(rep.table(), "| latency |") {
		t.Errorf("the latency rows belong in their own table:\n%s", rep.table())
	}
}
