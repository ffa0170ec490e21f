package procs

import (
	"fmt"
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

// rollingStats is what one worker's restart did to the group.
type rollingStats struct {
	moves       int           // partitions that ran on a worker that did not hold them before
	rebalances  int           // generations after the one before the restart
	ready       time.Duration // from SIGTERM to every worker ready on one generation again
	restartedUp time.Duration // from the new process's start to its first ready line
}

// restartOne stops c (SIGTERM), starts it again with its data dir and waits
// until the group settles; it measures the restart against before (the
// settled state it started from).
func (cl *cluster) restartOne(children []*child, i int, before map[string]line) ([]*child, map[string]line, rollingStats) {
	t := cl.t
	var st rollingStats
	t0 := time.Now()
	children[i].stop(t)
	started := time.Now()
	children[i] = cl.start(children[i].name)
	after := cl.settle(children)
	st.ready = time.Since(t0)
	gen0 := before[children[0].name].Generation
	gens := map[int32]bool{}
	moved := map[string]bool{}
	for _, c := range children {
		c.mu.Lock()
		for _, h := range c.history {
			if h.at.Before(t0) {
				continue
			}
			if h.Generation > gen0 {
				gens[h.Generation] = true
			}
			for _, p := range append(slices.Clone(h.Actives[cl.topic]), h.Claims[cl.topic]...) {
				if !slices.Contains(before[c.name].Actives[cl.topic], p) {
					moved[fmt.Sprint(c.name, p)] = true
				}
			}
			if c == children[i] && h.Ready && st.restartedUp == 0 {
				st.restartedUp = h.at.Sub(started)
			}
		}
		c.mu.Unlock()
	}
	st.moves, st.rebalances = len(moved), len(gens)
	return children, after, st
}

// runRollingRestart restarts three workers one after the other, each as
// soon as the group settled again, and checks that the group ends where it
// started: every partition on its worker. With static membership
// (KIP-345) nothing moves at any time: a stopped static member does not
// leave the group, and the restarted one reports its persisted assignment.
// Real Kafka does not rebalance at all then (a static member rejoining a
// stable group with the same protocol gets its assignment back); kfake
// rebalances once per restart because the member's subscription user data
// changed (a new process), which moves nothing either.
func runRollingRestart(t *testing.T, static bool) {
	cl := newCluster(t, "rolling")
	cl.static = static
	cs := []*child{cl.start("a"), cl.start("b"), cl.start("c")}
	first := cl.settle(cs)
	state := first
	var total rollingStats
	for i := range cs {
		var st rollingStats
		cs, state, st = cl.restartOne(cs, i, state)
		t.Logf("restart of %s: %d partitions moved meanwhile, %d rebalances, group ready %v after SIGTERM, restarted worker ready %v after its start",
			cs[i].name, st.moves, st.rebalances, st.ready.Round(time.Millisecond), st.restartedUp.Round(time.Millisecond))
		total.moves += st.moves
		total.rebalances += st.rebalances
		total.ready += st.ready
		if static && st.moves != 0 {
			t.Errorf("restart of %s with static membership moved %d partitions", cs[i].name, st.moves)
		}
		if static && testbroker.Real() && st.rebalances != 0 {
			t.Errorf("restart of %s with static membership caused %d rebalances on Kafka", cs[i].name, st.rebalances)
		}
	}
	n, what := moved(cl.topic, first, state)
	t.Logf("rolling restart (static %v): %d partitions moved meanwhile, %d rebalances, %v until ready over the three restarts; %d partitions on another worker at the end %v",
		static, total.moves, total.rebalances, total.ready.Round(time.Millisecond), n, what)
	if n != 0 {
		t.Errorf("a rolling restart left %d partitions on another worker (%v)", n, what)
	}
}

// TestRollingRestart: three workers with dynamic membership restart one
// after the other. Each stop hands the stopping worker's partitions to
// their standby holders for a moment (it leaves the group); its persisted
// assignment gives them back when it rejoins.
func TestRollingRestart(t *testing.T) { runRollingRestart(t, false) }

// TestRollingRestartStatic: the same with static membership: no partition
// moves at any time.
func TestRollingRestartStatic(t *testing.T) { runRollingRestart(t, true) }
