package pipeline_test

import (
	"encoding/json"
	"testing"

	"github.com/runnel-dev/runnel/examples/changeaudit/pipeline"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/runneltest"
)

// TestWithRunneltest is the example's unit test as an app's author would
// write it (package runneltest, no Kafka to install): the first 500 changes
// of the real data through the whole pipeline, the three tables compared
// with counts made straight from the lines, and the re-keyed records of
// changes-by-dir checked one by one.
func TestWithRunneltest(t *testing.T) {
	lines := testbroker.GzipLines(t, dataFile, 500)
	want := countLines(t, lines)
	p := pipeline.Build("change-audit")
	d, err := runneltest.Start(p.App, runneltest.Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	}()
	wantByDir := map[string]int{} // event_id/dir -> records expected in changes-by-dir
	var in []runneltest.Record[string, pipeline.Change]
	for i, l := range lines {
		var c pipeline.Change
		if err := json.Unmarshal(l, &c); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		for _, dir := range c.Dirs {
			wantByDir[c.EventID+"/"+dir]++
		}
		in = append(in, runneltest.Record[string, pipeline.Change]{Key: c.Actor, Value: c})
	}
	if err := runneltest.SendAll(d, p.Events, in); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		got  func() (map[string]any, error)
		want map[string]int64
	}{
		{"commits-per-actor", func() (map[string]any, error) { return d.Table(p.CommitsPerActor) }, want.commits},
		{"lines-per-actor", func() (map[string]any, error) { return d.Table(p.LinesPerActor) }, want.lines},
		{"events-per-dir", func() (map[string]any, error) { return d.Table(p.EventsPerDir) }, want.dirs},
	} {
		got, err := tc.got()
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s: %d keys, want %d", tc.name, len(got), len(tc.want))
		}
		for k, n := range tc.want {
			if got[k] != n {
				t.Errorf("%s[%s] = %v, want %d", tc.name, k, got[k], n)
			}
		}
	}
	recs, err := runneltest.Records(d, p.ByDir)
	if err != nil {
		t.Fatal(err)
	}
	gotByDir := map[string]int{}
	for _, r := range recs {
		if r.Key != r.Value.Dir {
			t.Errorf("changes-by-dir record keyed %q for dir %q", r.Key, r.Value.Dir)
		}
		gotByDir[r.Value.EventID+"/"+r.Value.Dir]++
	}
	if len(gotByDir) != len(wantByDir) {
		t.Errorf("changes-by-dir: %d distinct (event, dir), want %d", len(gotByDir), len(wantByDir))
	}
	for k, n := range wantByDir {
		if gotByDir[k] != n {
			t.Errorf("changes-by-dir: %s %d times, want %d", k, gotByDir[k], n)
		}
	}
	if n, ok, err := runneltest.Get(d, p.CommitsPerActor, "no-such-actor"); err != nil || ok {
		t.Errorf("an actor never sent: %d, %v, %v", n, ok, err)
	}
}
