package meticulous

import (
	"fmt"
	"slices"
	"testing"

	"github.com/runnel-dev/runnel/assignor"
)

// regressWorld builds one stateful group (source "st" with changelog
// "st-changelog") and one stateless group (source "sl") over n members.
func regressWorld(stateful, stateless int32, replicas, n int) *world {
	w := &world{
		groups:     [][]string{{"st", "st-changelog"}, {"sl"}},
		reps:       []string{"st", "sl"},
		changelog:  []string{"st-changelog", ""},
		topics:     map[string]int32{"st": stateful, "sl": stateless},
		changelogs: map[string]int32{"st-changelog": stateful},
		replicas:   replicas,
	}
	w.add(n)
	return w
}

func mustPlanT(t *testing.T, c assignor.Cluster) assignor.Plan {
	t.Helper()
	p, err := assignor.PlanAssignment(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func checkBalanced(t *testing.T, w *world, p assignor.Plan, step string) {
	t.Helper()
	if lo, hi := spread(w.statefulLoad(p)); hi-lo > 1 {
		t.Errorf("%s: stateful actives %d..%d per member", step, lo, hi)
	}
	if lo, hi := spread(w.load(p)); hi-lo > 1 {
		t.Errorf("%s: actives %d..%d per member", step, lo, hi)
	}
}

// Issue #13's smallest case: stateful P=4, stateless P=12, N=2; one member
// leaves, two join. Balancing only the total left one member with all 4
// stateful tasks and the newcomers with stateless ones (stateful 0..4).
func TestStatefulBalancedSmallestCase(t *testing.T) {
	for _, r := range []int{0, 1} {
		t.Run(fmt.Sprintf("R=%d", r), func(t *testing.T) {
			w := regressWorld(4, 12, r, 2)
			p := mustPlanT(t, w.cluster())
			checkBalanced(t, w, p, "fresh")
			w.apply(p)
			w.members = w.members[1:]
			p = mustPlanT(t, w.cluster())
			checkBalanced(t, w, p, "-1")
			w.apply(p)
			w.add(2)
			p = mustPlanT(t, w.cluster())
			checkBalanced(t, w, p, "+2")
			if got := w.statefulLoad(p); !slices.Equal(sortedValues(got), []int{1, 1, 2}) {
				t.Errorf("+2: stateful per member %v, want 1, 1, 2", got)
			}
		})
	}
}

func sortedValues(m map[string]int) []int {
	var vs []int
	for _, v := range m {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	return vs
}

// A member claiming generation MaxInt32 (foreign or corrupt user data that
// passed decoding) does not win a conflicting claim: the leader bounds claims
// by the group's generation (issue #13).
func TestForgedGenerationLoses(t *testing.T) {
	w := regressWorld(8, 0, 1, 4)
	p := mustPlanT(t, w.cluster())
	w.apply(p)
	owner := w.owners(p)[0]
	victim := owner[0]
	forger := w.members[slices.IndexFunc(w.members, func(m assignor.Member) bool { return m.ID != victim })]
	for i := range w.members {
		if w.members[i].ID == forger.ID {
			w.members[i].Generation = 1<<31 - 1
			w.members[i].PrevActives = map[string][]int32{"st": {0}, "st-changelog": {0}}
		}
	}
	c := w.cluster()
	c.Generation = w.gen
	p2 := mustPlanT(t, c)
	if got := w.owners(p2)[0][0]; got != victim {
		t.Errorf("partition 0 went to %s (forged generation), want the owner %s", got, victim)
	}
	if !slices.Equal(p2.Untrusted, []string{forger.ID}) {
		t.Errorf("Untrusted %v, want [%s]", p2.Untrusted, forger.ID)
	}
	// Without the leader's own generation the claim is still outvoted: the
	// other members all report the same (corroborated) generation.
	c.Generation = 0
	if got := w.owners(mustPlanT(t, c))[0][0]; got != victim {
		t.Errorf("without Cluster.Generation: partition 0 went to %s, want %s", got, victim)
	}
}

// A member rejoining with its stale previous assignment gets its fair share
// and nothing else moves: only partitions going to it move, and old members
// never gain (issue #13). Its share is its earlier one when that is within
// the balance (issue #26): it held 5 of the 18 tasks (ceil(18/4)), and gets
// those 5 back, one more move than the smallest fair share (4) would take.
// The planner cannot tell this rejoin from the last batch of a whole-group
// restart (the same subscriptions), where giving less leaves a partition
// away from its member for good (TestRestartCeilShareRejoinsLast).
func TestStaleRejoinMovesOnlyItsShare(t *testing.T) {
	w := regressWorld(12, 6, 1, 4)
	p := mustPlanT(t, w.cluster())
	w.apply(p)
	gone := w.members[0]
	earlier := w.owners(p)
	w.members = w.members[1:]
	p = mustPlanT(t, w.cluster())
	w.apply(p)
	prev := w.owners(p)
	w.members = append(w.members, gone) // generation of two plans ago
	p2 := mustPlanT(t, w.cluster())
	checkBalanced(t, w, p2, "rejoin")
	moved, had := 0, 0
	now := w.owners(p2)
	for g := range w.groups {
		for q, o := range now[g] {
			if prev[g][q] != o {
				moved++
				if o != gone.ID {
					t.Errorf("group %d partition %d moved %s -> %s: an old member gained", g, q, prev[g][q], o)
				}
			}
			if earlier[g][q] == gone.ID {
				had++
				if o != gone.ID {
					t.Errorf("group %d partition %d: the rejoiner's before, now on %s", g, q, o)
				}
			}
		}
	}
	if l := w.load(p2)[gone.ID]; moved != l || l != had || had != 5 {
		t.Errorf("rejoiner got %d actives, %d moved, it had %d; want 5", l, moved, had)
	}
}
