package meticulous

import (
	"slices"
	"testing"

	"github.com/runnel-dev/runnel/assignor"
	"pgregory.net/rapid"
)

// TestScaleOutConverges (KIP-441, issue #13): members join a group whose
// members are caught up, with no state of their own; every plan keeps
// stateful actives on caught-up members and warms the balanced targets up.
// When the warm-ups (and standbys) have caught up, the members report it
// (assignor.CaughtUpWarmups qualifies them, Strategy.CheckWarmups asks for
// the rebalance) and the follow-up plan moves the actives. After a bounded
// number of follow-ups no probe is needed and stateful and total actives are
// balanced; every intermediate plan is valid.
func TestScaleOutConverges(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := genWorld(t)
		p := plan(t, w.cluster())
		w.apply(p)
		const end = 1_000_000
		endOffsets := map[string]map[int32]int64{}
		for cl, n := range w.changelogs {
			endOffsets[cl] = map[int32]int64{}
			for q := range n {
				endOffsets[cl][q] = end
			}
		}
		caughtUp := func(m *assignor.Member, mp assignor.MemberPlan) {
			if m.Offsets == nil {
				m.Offsets = map[string]map[int32]int64{}
			}
			for _, tp := range []map[string][]int32{mp.Actives, mp.Standbys, mp.Warmups} {
				for cl := range w.changelogs {
					if m.Offsets[cl] == nil {
						m.Offsets[cl] = map[int32]int64{}
					}
					for _, q := range tp[cl] {
						m.Offsets[cl][q] = end - 1
					}
				}
			}
		}
		for i := range w.members {
			caughtUp(&w.members[i], p.Members[w.members[i].ID])
		}
		w.add(rapid.IntRange(1, 8).Draw(t, "joiners"))
		maxWarm := rapid.IntRange(1, 4).Draw(t, "maxWarmups")
		ts := 0
		for _, n := range w.changelogs {
			ts += int(n)
		}
		limit := ts/maxWarm + 3
		for round := 0; ; round++ {
			c := w.cluster()
			c.EndOffsets, c.MaxWarmupReplicas = endOffsets, maxWarm
			p = plan(t, c)
			if !p.NeedsProbe {
				if lo, hi := spread(w.statefulLoad(p)); hi-lo > 1 {
					t.Fatalf("converged after %d rounds with stateful actives %d..%d", round, lo, hi)
				}
				if lo, hi := spread(w.load(p)); hi-lo > 1 {
					t.Fatalf("converged after %d rounds with actives %d..%d", round, lo, hi)
				}
				break
			}
			if round == limit {
				t.Fatalf("no convergence after %d follow-up rebalances (%d stateful tasks, %d warm-ups per plan)", round, ts, maxWarm)
			}
			w.apply(p)
			for i := range w.members {
				mp := p.Members[w.members[i].ID]
				warm := assignor.CaughtUpWarmups(mp.Warmups, w.members[i].Offsets, endOffsets, 0)
				caughtUp(&w.members[i], mp)
				if len(mp.Warmups) > 0 && len(assignor.CaughtUpWarmups(mp.Warmups, w.members[i].Offsets, endOffsets, 0)) == 0 {
					t.Fatalf("%s: warm-ups %v restored but not qualified (before: %v)", w.members[i].ID, mp.Warmups, warm)
				}
			}
		}
	})
}

// TestScaleOutOfOneGetsWarmups (found by bench/sidebyside -workloads
// scaleout): a second worker joins one that runs every stateful task, with
// one standby replica and every changelog far past the acceptable lag. The
// newcomer must get warm-ups (whose catching up triggers the follow-up
// rebalance), not only standbys: with no third member, the warm-ups used to
// become the standbys and the group waited for the probing rebalance.
func TestScaleOutOfOneGetsWarmups(t *testing.T) {
	w := regressWorld(8, 0, 1, 1)
	p := mustPlanT(t, w.cluster())
	w.apply(p)
	w.add(1)
	end := map[string]map[int32]int64{"st-changelog": {}}
	for q := range int32(8) {
		end["st-changelog"][q] = 50_000
	}
	c := w.cluster()
	c.EndOffsets = end
	p = mustPlanT(t, c)
	newcomer := w.members[1].ID
	got := p.Members[newcomer]
	if len(got.Warmups["st-changelog"]) != assignor.DefaultMaxWarmupReplicas || !p.NeedsProbe {
		t.Fatalf("newcomer: warm-ups %v, standbys %v, probe %v; want %d warm-ups and a probe",
			got.Warmups, got.Standbys, p.NeedsProbe, assignor.DefaultMaxWarmupReplicas)
	}
	// Every task keeps one replica besides its active: a standby, or the
	// warm-up standing in for it.
	for q := range int32(8) {
		if !slices.Contains(got.Standbys["st-changelog"], q) && !slices.Contains(got.Warmups["st-changelog"], q) {
			t.Errorf("st-changelog[%d] has no replica on the newcomer", q)
		}
	}
}
