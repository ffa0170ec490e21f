package meticulous

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/runnel-dev/runnel/assignor"
	"pgregory.net/rapid"
)

// restartGroup simulates a restart of the whole group: every member of w
// stops and comes back with a new member ID (the coordinator's: member i
// of w gets restarted-ids[i], an order unrelated to the old IDs and to the
// join order) and the assignment it persisted (its previous actives and
// standbys at the last generation). The members join in the order join (a
// permutation of w.members' indexes), cut into batches at cuts, one
// rebalance per batch: the members already back report the assignment of
// the last plan, the batch its persisted one. It returns the final plan and
// the old ID of each new one.
func restartGroup(t interface {
	Fatalf(string, ...any)
}, w *world, ids, join []int, cuts []int) (assignor.Plan, map[string]string) {
	restarted := make([]assignor.Member, len(w.members))
	oldID := map[string]string{}
	for k, i := range join {
		m := w.members[i]
		m.ID = fmt.Sprintf("restarted-%03d", ids[i])
		oldID[m.ID] = w.members[i].ID
		restarted[k] = m
	}
	var joined []assignor.Member
	var p assignor.Plan
	from := 0
	for _, to := range append(slices.Clone(cuts), len(restarted)) {
		if to <= from {
			continue
		}
		joined = append(joined, restarted[from:to]...)
		from = to
		c := assignor.Cluster{Members: slices.Clone(joined), Topics: w.topics, Changelogs: w.changelogs, Replicas: w.replicas, Generation: w.gen}
		var err error
		if p, err = assignor.PlanAssignment(c); err != nil {
			t.Fatalf("plan: %v", err)
		}
		w.gen++
		for i := range joined {
			mp := p.Members[joined[i].ID]
			joined[i].Since = since(joined[i], mp.Actives, w.gen)
			joined[i].PrevActives = mp.Actives
			joined[i].PrevStandbys = union(mp.Standbys, mp.Warmups)
			joined[i].Generation = w.gen
		}
	}
	return p, oldID
}

// since returns Member.Since for a member that held m.PrevActives and now
// receives actives in generation gen, as assignor.Strategy keeps it.
func since(m assignor.Member, actives map[string][]int32, gen int32) map[string]map[int32]int32 {
	out := map[string]map[int32]int32{}
	for t, ps := range actives {
		out[t] = map[int32]int32{}
		for _, p := range ps {
			g := gen
			if slices.Contains(m.PrevActives[t], p) {
				g = m.Generation
				if v, ok := m.Since[t][p]; ok && v < g {
					g = v
				}
			}
			out[t][p] = g
		}
	}
	return out
}

// TestWholeGroupRestart (issues #13 and #26): after every member of a
// settled group of stateful apps restarts with its persisted assignment,
// the group settles with every active on the member that held it before,
// when the members rejoin in two batches (any group size, any join order)
// or in any batches (up to three members: a three-worker deployment). The
// members that join first hold the others' partitions meanwhile and hand
// them back as their earlier owners return (Member.Since, the older claims
// and the moves home of the last plan).
//
// What does not always hold (measured with TestRestartStats, the reasons in
// docs/assignment.md): with stateless and stateful groups mixed, or more
// than two batches of more than three members, some partitions may end on
// another member.
func TestWholeGroupRestart(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := genWorld(t)
		w.allStateful()
		p := plan(t, w.cluster())
		w.apply(p)
		p = churn(t, w, p, 1, 128, func(label string, lo, hi int) int { return rapid.IntRange(lo, hi).Draw(t, label) })
		before := w.owners(p)
		n := len(w.members)
		// New member IDs and the join order are drawn independently of each
		// other and of the old IDs: the members holding the ceil(T/N)
		// shares (the lowest old IDs after a fresh plan) may rejoin first,
		// last, or split across the batches.
		ids := rapid.Permutation(identity(n)).Draw(t, "ids")
		join := rapid.Permutation(identity(n)).Draw(t, "join")
		maxCuts := 1
		if n <= 3 {
			maxCuts = 3
		}
		cuts := rapid.SliceOfN(rapid.IntRange(0, n), 0, maxCuts).Draw(t, "cuts")
		slices.Sort(cuts)
		got, oldID := restartGroup(t, w, ids, join, cuts)
		checkBack(t, w, before, got, oldID)
	})
}

// churn runs up to two membership changes (some members leave, some join)
// on w, whose members hold p, so that the assignment before a restart is not
// always a fresh plan: which members hold the ceil(T/N) shares then follows
// the history, not the ID order. At least keep members (and one) stay,
// and joins stop at most members; draw returns a number in [lo, hi]. It
// returns the last plan (applied to w).
func churn(t interface{ Fatalf(string, ...any) }, w *world, p assignor.Plan, keep, most int, draw func(label string, lo, hi int) int) assignor.Plan {
	for step := range draw("history", 0, 2) {
		gone := map[string]bool{}
		for range draw(fmt.Sprintf("leaving%d", step), 0, max(0, len(w.members)-keep)) {
			var left []string
			for _, m := range w.members {
				if !gone[m.ID] {
					left = append(left, m.ID)
				}
			}
			gone[left[draw(fmt.Sprintf("leave%d", step), 0, len(left)-1)]] = true
		}
		w.members = slices.DeleteFunc(w.members, func(m assignor.Member) bool { return gone[m.ID] })
		w.add(draw(fmt.Sprintf("join%d", step), 0, max(0, min(3, most-len(w.members)))))
		p = plan(t, w.cluster())
		w.apply(p)
	}
	return p
}

// identity returns 0, 1, ..., n-1.
func identity(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// allStateful gives every stateless group of w a changelog.
func (w *world) allStateful() {
	for g, cl := range w.changelog {
		if cl == "" {
			cl = fmt.Sprintf("t%d-changelog", g)
			w.changelog[g] = cl
			w.changelogs[cl] = w.topics[w.reps[g]]
			w.groups[g] = append(w.groups[g], cl)
		}
	}
}

// checkBack fails when an active of got is not on the member (by old ID)
// that held it in before.
func checkBack(t interface{ Fatalf(string, ...any) }, w *world, before []map[int32]string, got assignor.Plan, oldID map[string]string) {
	for g := range w.groups {
		for id, mp := range got.Members {
			for _, q := range mp.Actives[w.reps[g]] {
				if was := before[g][q]; was != oldID[id] {
					t.Fatalf("group %d partition %d: %s before the restart, %s (was %s) after", g, q, was, id, oldID[id])
				}
			}
		}
	}
}

// TestRestartStats logs how often a whole-group restart does not give
// every partition back, over RUNNEL_RESTART_CASES (default 500) seeded
// cases per setting: groups of up to 3 or up to 21 members, stateful only
// or mixed with stateless groups, rejoining in exactly 2, 3 or 4 non-empty
// batches, the join order, the batch sizes and the new member IDs drawn at
// random, after up to two membership changes. It asserts what
// TestWholeGroupRestart asserts.
func TestRestartStats(t *testing.T) {
	if testing.Short() {
		t.Skip("statistics only; TestWholeGroupRestart asserts the laws")
	}
	cases := 500
	if v, err := strconv.Atoi(os.Getenv("RUNNEL_RESTART_CASES")); err == nil && v > 0 {
		cases = v
	}
	for _, nMax := range []int{3, 21} {
		for batches := 2; batches <= min(4, nMax); batches++ {
			for _, mixed := range []bool{false, true} {
				fails := 0
				for seed := range cases {
					r := rand.New(rand.NewPCG(uint64(seed), uint64(7+batches)))
					w := &world{topics: map[string]int32{}, changelogs: map[string]int32{}, replicas: r.IntN(3)}
					for g := range 1 + r.IntN(3) {
						n := int32(1 + r.IntN(100))
						name := fmt.Sprintf("s%d", g)
						w.topics[name] = n
						ts, cl := []string{name}, ""
						if !mixed || r.IntN(2) == 0 {
							cl = fmt.Sprintf("t%d-changelog", g)
							w.changelogs[cl] = n
							ts = append(ts, cl)
						}
						w.reps = append(w.reps, name)
						w.changelog = append(w.changelog, cl)
						w.groups = append(w.groups, ts)
					}
					w.add(batches + r.IntN(nMax-batches+1))
					p := plan(t, w.cluster())
					w.apply(p)
					p = churn(t, w, p, batches, nMax, func(_ string, lo, hi int) int { return lo + r.IntN(hi-lo+1) })
					n := len(w.members)
					before := w.owners(p)
					// batches-1 distinct cuts in 1..n-1: every batch non-empty.
					cuts := r.Perm(n - 1)[:batches-1]
					for i := range cuts {
						cuts[i]++
					}
					slices.Sort(cuts)
					got, oldID := restartGroup(t, w, r.Perm(n), r.Perm(n), cuts)
					var f failed
					checkBack(&f, w, before, got, oldID)
					if f {
						fails++
						if !mixed && (batches == 2 || nMax <= 3) {
							t.Errorf("seed %d: %d members, %d batches, stateful only: a partition moved", seed, n, batches)
						}
					}
				}
				t.Logf("2..%d members (then churn), %d batches, mixed %v: %d of %d restarts left a partition elsewhere", nMax, batches, mixed, fails, cases)
			}
		}
	}
}

// failed records a Fatalf call.
type failed bool

func (f *failed) Fatalf(string, ...any) { *f = true }

// Issue #26's smallest case: one stateful group of 13 partitions, no
// replicas, three members; member-000 holds 5 (the ceil(13/3) share),
// member-001 and member-002 hold 4. The two holding 4 rejoin first (with
// two members each may take up to 7, so they share member-000's five), then
// member-000. Before the fix member-000's claims lost to the newer ones at
// the ceiling: one of its partitions stayed on a member that kept 5 and
// member-000 ended with 4 (a restart moved state for nothing).
func TestRestartCeilShareRejoinsLast(t *testing.T) {
	w := &world{
		groups:     [][]string{{"st", "st-changelog"}},
		reps:       []string{"st"},
		changelog:  []string{"st-changelog"},
		topics:     map[string]int32{"st": 13},
		changelogs: map[string]int32{"st-changelog": 13},
	}
	w.add(3)
	p := mustPlanT(t, w.cluster())
	if got := w.load(p); got["member-000"] != 5 || got["member-001"] != 4 || got["member-002"] != 4 {
		t.Fatalf("fresh plan loads %v, want member-000 5, the others 4", got)
	}
	w.apply(p)
	before := w.owners(p)
	// New IDs in the old order; member-001 and member-002 join first.
	got, oldID := restartGroup(t, w, []int{0, 1, 2}, []int{1, 2, 0}, []int{2})
	checkBack(t, w, before, got, oldID)
}
