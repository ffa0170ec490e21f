package procs

import (
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testbroker"
)

// newCluster builds the test app and returns a cluster of it on a fresh
// topic and app ID.
func newCluster(t *testing.T, base string) *cluster {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "testapp")
	if out, err := exec.Command("go", "build", "-o", bin, "./testapp").CombinedOutput(); err != nil {
		t.Fatalf("build testapp: %v\n%s", err, out)
	}
	appID := testbroker.Topic(t, base)
	return &cluster{t: t, bin: bin, app: appID, topic: testbroker.Topic(t, "in"), changelog: appID + "-counts-changelog",
		brokers: testbroker.Brokers(t), root: dir}
}

// stopAll sends SIGTERM to every child at once and waits for clean exits.
func stopAll(t *testing.T, children []*child) {
	t.Helper()
	var wg sync.WaitGroup
	for _, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.stop(t)
		}()
	}
	wg.Wait()
}

// moved counts the source partitions whose active member differs between
// two settled states (by child name).
func moved(topic string, before, after map[string]line) (n int, what []string) {
	owner := map[int32]string{}
	for name, l := range before {
		for _, p := range l.Actives[topic] {
			owner[p] = name
		}
	}
	for name, l := range after {
		for _, p := range l.Actives[topic] {
			if owner[p] != name {
				n++
				what = append(what, owner[p]+"->"+name)
			}
		}
	}
	slices.Sort(what)
	return n, what
}

// TestWholeGroupRestart: three worker processes settle, all stop at once
// (SIGTERM) and all start again with their data dirs. Each reports the
// assignment it persisted (assignor.Strategy.Restore), so whatever order
// the restarted workers join in, the group settles with every partition on
// the worker that held it before (issue #13: restarts forget state).
func TestWholeGroupRestart(t *testing.T) {
	cl := newCluster(t, "restart")
	names := []string{"a", "b", "c"}
	start := func() []*child {
		var cs []*child
		for _, n := range names {
			cs = append(cs, cl.start(n))
		}
		return cs
	}
	cs := start()
	before := cl.settle(cs)
	for round := range 2 {
		stopAll(t, cs)
		t0 := time.Now()
		cs = start()
		after := cl.settle(cs)
		n, what := moved(cl.topic, before, after)
		t.Logf("round %d: settled %v after the restart; %d partitions moved %v", round, time.Since(t0).Round(time.Millisecond), n, what)
		if n != 0 {
			for _, name := range names {
				t.Logf("%s before %v after %v", name, before[name].Actives[cl.topic], after[name].Actives[cl.topic])
			}
			t.Fatalf("round %d: a whole-group restart moved %d partitions (%v)", round, n, what)
		}
	}
}
