package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writeLog(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A hand-over as Runnel's workers log it: the phases are the last event of
// each kind after the signal (the first for the assignment), events before
// the signal or after the end are ignored.
func TestTraceTakeover(t *testing.T) {
	w1 := writeLog(t, "w1.log", `time=2026-12-01T21:22:49.000Z level=INFO msg="task state" worker=a task=0/8 partition=0 from=suspending to=closed
time=2026-12-01T21:22:50.020Z level=INFO msg="task state" worker=a task=0/8 partition=0 from=running to=suspending
time=2026-12-01T21:22:50.040Z level=INFO msg="task state" worker=a task=0/8 partition=0 from=suspending to=closed
time=2026-12-01T21:22:50.070Z level=INFO msg="task state" worker=a task=1/8 partition=1 from=suspending to=closed
time=2026-12-01T21:22:50.072Z level=INFO msg="worker left group" worker=a group=g err=<nil>
`)
	w2 := writeLog(t, "w2.log", `time=2026-12-01T21:22:48.000Z level=INFO msg=assignment worker=b generation=3
sarama 2026/12/01 21:22:50.209972 client/metadata fetching metadata
time=2026-12-01T21:22:50.248Z level=INFO msg=assignment worker=b generation=8
time=2026-12-01T21:22:50.306Z level=DEBUG msg="claim started" worker=b topic=in partition=1 generation=8
time=2026-12-01T21:22:50.328Z level=DEBUG msg="claim started" worker=b topic=in partition=0 generation=8
time=2026-12-01T21:22:50.425Z level=INFO msg=restored worker=b table=counts partition=1 records=1225
time=2026-12-01T21:22:50.427Z level=INFO msg=restored worker=b table=counts partition=0 records=1226
time=2026-12-01T21:22:50.428Z level=INFO msg="task state" worker=b task=0/8 partition=0 from=created to=running
time=2026-12-01T21:22:58.000Z level=INFO msg=assignment worker=b generation=9
time=2026-12-01T21:22:58.100Z level=INFO msg="task state" worker=b task=3/8 partition=3 from=created to=running
`)
	sig := time.Date(2026, 12, 1, 21, 22, 50, 0, time.UTC)
	got := traceTakeover(w1, w2, sig, sig.Add(500*time.Millisecond))
	want := map[string]float64{"final_cycles": 0.070, "left": 0.072, "assignment": 0.248, "claims": 0.328,
		"restored": 0.427, "running": 0.428, "first_output": 0.5}
	for p, v := range want {
		if g, ok := got[p]; !ok || g < v-1e-9 || g > v+1e-9 {
			t.Errorf("%s = %v (present %v), want %v", p, g, ok, v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("phases %v, want %v", got, want)
	}
	if s := fmtPhases(got); s != "final_cycles 70, left 72, assignment 248, claims 328, restored 427, running 428, first_output 500" {
		t.Errorf("fmtPhases = %q", s)
	}
}

// The survivor lost its membership twice: once with an error line, once
// rejoining under a new member ID; sessions of the same member ID are not
// expulsions.
func TestExpelled(t *testing.T) {
	log := writeLog(t, "w1.log", `time=2026-12-01T21:00:00.000Z level=INFO msg="session started" worker=a generation=1 member=m-1 claims=""
time=2026-12-01T21:00:01.000Z level=INFO msg="session started" worker=a generation=2 member=m-1 claims=""
time=2026-12-01T21:00:02.000Z level=WARN msg="consumer group error" worker=a err="kafka server: The provided member is not known in the current generation"
time=2026-12-01T21:00:03.000Z level=INFO msg="session started" worker=a generation=4 member=m-2 claims=""
time=2026-12-01T21:00:04.000Z level=INFO msg="session started" worker=a generation=5 member=m-2 claims=""
`)
	n, why := expelled(log)
	if n != 2 {
		t.Errorf("expelled = %d, want 2", n)
	}
	if why == "" {
		t.Error("no reason given")
	}
	clean := writeLog(t, "w2.log", `time=2026-12-01T21:00:00.000Z level=INFO msg="session started" worker=a generation=1 member=m-1 claims=""
time=2026-12-01T21:00:01.000Z level=INFO msg="session started" worker=a generation=2 member=m-1 claims=""
`)
	if n, why := expelled(clean); n != 0 {
		t.Errorf("expelled = %d (%s), want 0", n, why)
	}
}
