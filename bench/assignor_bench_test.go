package bench

import (
	"fmt"
	"slices"
	"testing"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
)

// assignSim drives one assignor through membership changes on one topic of
// p partitions: owner maps partition -> member after each converged
// rebalance (cooperative strategies take a follow-up rebalance).
type assignSim struct {
	kind    string // "runnel", "runnel-r1", "runnel-r2", "sticky", "cooperative-sticky"
	p       int32
	members []string
	owner   map[int32]string
	gen     int32
	// runnel: each member's last plan share; sarama: per-member strategy
	// instances (their user data carries the previous assignment).
	prev  map[string]assignor.MemberPlan
	strat map[string]sarama.BalanceStrategy
	udata map[string][]byte
}

func newSim(kind string, p int32) *assignSim {
	return &assignSim{kind: kind, p: p, owner: map[int32]string{}, prev: map[string]assignor.MemberPlan{},
		strat: map[string]sarama.BalanceStrategy{}, udata: map[string][]byte{}}
}

func (s *assignSim) owned(id string) map[string][]int32 {
	var ps []int32
	for q := range s.p {
		if s.owner[q] == id {
			ps = append(ps, q)
		}
	}
	return map[string][]int32{"a": ps}
}

// rebalance runs one JoinGroup/SyncGroup round and returns the new owners
// (a withheld partition has no owner).
func (s *assignSim) rebalance() (map[int32]string, error) {
	s.gen++
	next := map[int32]string{}
	switch s.kind {
	case "runnel", "runnel-r1", "runnel-r2":
		c := assignor.Cluster{Topics: map[string]int32{"a": s.p}, Cooperative: true}
		switch s.kind {
		case "runnel-r1":
			c.Changelogs, c.Replicas = map[string]int32{"cl": s.p}, 1
		case "runnel-r2":
			c.Changelogs, c.Replicas = map[string]int32{"cl": s.p}, 2
		}
		for _, id := range s.members {
			mp := s.prev[id]
			act := map[string][]int32{}
			for _, m := range []map[string][]int32{mp.Actives, mp.Pending} {
				for t, ps := range m {
					act[t] = append(act[t], ps...)
				}
			}
			c.Members = append(c.Members, assignor.Member{ID: id, Topics: []string{"a"}, Generation: s.gen - 1,
				PrevActives: act, PrevStandbys: mp.Standbys, Owned: s.owned(id)})
		}
		plan, err := assignor.PlanAssignment(c)
		if err != nil {
			return nil, err
		}
		for id, mp := range plan.Members {
			s.prev[id] = mp
			for _, q := range mp.Actives["a"] {
				next[q] = id
			}
		}
	default:
		members := map[string]sarama.ConsumerGroupMemberMetadata{}
		for _, id := range s.members {
			st := s.strat[id]
			if st == nil {
				if s.kind == "sticky" {
					st = sarama.NewBalanceStrategySticky()
				} else {
					st = sarama.NewBalanceStrategyCooperativeSticky()
				}
				s.strat[id] = st
			}
			ud := s.udata[id]
			if sub, ok := st.(sarama.SubscriptionUserDataBalanceStrategy); ok {
				var err error
				if ud, err = sub.SubscriptionUserData([]string{"a"}); err != nil {
					return nil, err
				}
			}
			var owned []*sarama.OwnedPartition
			if ps := s.owned(id)["a"]; len(ps) > 0 {
				owned = []*sarama.OwnedPartition{{Topic: "a", Partitions: ps}}
			}
			members[id] = sarama.ConsumerGroupMemberMetadata{Version: 1, Topics: []string{"a"}, UserData: ud, OwnedPartitions: owned}
		}
		all := make([]int32, s.p)
		for q := range all {
			all[q] = int32(q)
		}
		// The leader's instance plans (sticky strategies keep no leader state).
		plan, err := s.strat[s.members[0]].Plan(members, map[string][]int32{"a": all})
		if err != nil {
			return nil, err
		}
		for _, id := range s.members {
			topics := plan[id]
			data, err := s.strat[s.members[0]].AssignmentData(id, topics, s.gen)
			if err != nil {
				return nil, err
			}
			s.udata[id] = data
			if oa, ok := s.strat[id].(sarama.OnAssignmentBalanceStrategy); ok {
				oa.OnAssignment(&sarama.ConsumerGroupMemberAssignment{Topics: topics, UserData: data}, s.gen)
			}
			for _, q := range topics["a"] {
				next[q] = id
			}
		}
	}
	return next, nil
}

// change applies a membership change and rebalances until every partition
// has an owner (at most 3 rounds); it returns how many partitions ended on a
// different member than before the change, and how many of those (runnel
// with replicas) went to a member that held no standby of the partition
// before the change (a full restore).
func (s *assignSim) change(add []string, remove []string) (moved, stateless int, err error) {
	hadStandby := map[string][]int32{}
	for id, mp := range s.prev {
		hadStandby[id] = slices.Clone(mp.Standbys["cl"])
	}
	s.members = slices.DeleteFunc(s.members, func(id string) bool { return slices.Contains(remove, id) })
	for _, id := range remove {
		delete(s.prev, id)
		delete(s.strat, id)
		delete(s.udata, id)
	}
	s.members = append(s.members, add...)
	slices.Sort(s.members)
	before := s.owner
	s.owner = map[int32]string{}
	for q, id := range before {
		if slices.Contains(s.members, id) {
			s.owner[q] = id
		}
	}
	for round := 0; round < 3; round++ {
		next, err := s.rebalance()
		if err != nil {
			return 0, 0, err
		}
		s.owner = next
		if len(next) == int(s.p) {
			for q := range s.p {
				if before[q] != next[q] {
					moved++
					if s.kind != "runnel" && !slices.Contains(hadStandby[next[q]], q) {
						stateless++
					}
				}
			}
			return moved, stateless, nil
		}
	}
	return 0, 0, fmt.Errorf("%s: not converged after 3 rounds", s.kind)
}

// minMoves is the least number of partitions a change can move: the
// partitions of the removed members, plus what the newcomers need to reach
// floor(P/N) (after the removed members' partitions filled them first).
func minMoves(p int32, before map[int32]string, removed []string, added, n int) int {
	orphans := 0
	for _, id := range before {
		if slices.Contains(removed, id) {
			orphans++
		}
	}
	need := added * (int(p) / n)
	return orphans + max(0, need-orphans)
}

type changeStep struct {
	add, remove int
}

var changeSteps = []changeStep{{add: 1}, {remove: 1}, {add: 2}, {remove: 2}, {add: 4}, {remove: 1}, {add: 1, remove: 1}}

// TestAssignorMoves compares partitions moved per membership change (after
// convergence) for Runnel's assignor and Sarama's sticky and
// cooperative-sticky strategies on one topic of P partitions, starting from N
// members. Runnel without replicas moves the minimum on every step
// (asserted); with replicas (R=1, 2) the total stays within the minimum + 5%
// and the moves to members without a standby (restores) within Sarama
// sticky's total moves (asserted, issue #13): an orphan goes to a standby
// holder when the holder has room under the balanced load, else to a member
// with room (with lag known, KIP-441 keeps it on a caught-up holder and warms
// the target up instead; not simulated here).
func TestAssignorMoves(t *testing.T) {
	for _, sz := range []struct {
		p int32
		n int
	}{{64, 8}, {1024, 128}} {
		totals, restores := map[string]int{}, map[string]int{}
		lower := 0
		kinds := []string{"runnel", "runnel-r1", "runnel-r2", "sticky", "cooperative-sticky"}
		for _, kind := range kinds {
			s := newSim(kind, sz.p)
			var ids []string
			for i := range sz.n {
				ids = append(ids, fmt.Sprintf("m%04d", i))
			}
			if _, _, err := s.change(ids, nil); err != nil {
				t.Fatal(err)
			}
			next := sz.n
			for si, st := range changeSteps {
				var add, rm []string
				for range st.add {
					add = append(add, fmt.Sprintf("m%04d", next))
					next++
				}
				for i := range st.remove {
					rm = append(rm, s.members[(si*7+i*3)%len(s.members)])
				}
				before := map[int32]string{}
				for q, id := range s.owner {
					before[q] = id
				}
				moved, stateless, err := s.change(add, rm)
				if err != nil {
					t.Fatal(err)
				}
				least := minMoves(sz.p, before, rm, len(add), len(s.members))
				switch kind {
				case "runnel":
					lower += least
					if moved != least {
						t.Errorf("P=%d N=%d step %d (%+v): runnel moved %d, minimum %d", sz.p, sz.n, si, st, moved, least)
					}
				}
				totals[kind] += moved
				restores[kind] += stateless
				if testing.Verbose() {
					t.Logf("P=%d N=%d %s step %d %+v: moved %d (minimum %d, %d to a member without a standby)", sz.p, sz.n, kind, si, st, moved, least, stateless)
				}
			}
		}
		// Issue #13: with replicas, total moves <= minimum + 5%, and moves to a
		// member without the partition's standby (a restore) <= Sarama sticky's
		// total moves (for a stateful app every sticky move is a restore).
		for _, kind := range []string{"runnel-r1", "runnel-r2"} {
			if totals[kind]*100 > lower*105 {
				t.Errorf("P=%d N=%d: %s moved %d, more than the minimum %d + 5%%", sz.p, sz.n, kind, totals[kind], lower)
			}
			if restores[kind] > totals["sticky"] {
				t.Errorf("P=%d N=%d: %s moved %d partitions to members without their standby, sarama sticky moved %d in all", sz.p, sz.n, kind, restores[kind], totals["sticky"])
			}
		}
		t.Logf("P=%d N=%d, %d changes: minimum %d moves; runnel %d, runnel R=1 %d (%d without a standby), runnel R=2 %d (%d without a standby), sarama sticky %d, sarama cooperative-sticky %d",
			sz.p, sz.n, len(changeSteps), lower, totals["runnel"], totals["runnel-r1"], restores["runnel-r1"], totals["runnel-r2"], restores["runnel-r2"], totals["sticky"], totals["cooperative-sticky"])
	}
}

// BenchmarkAssignorPlan times one plan at P=1024, N=128 (steady state, one
// member removed) for Runnel (R=0 and R=1) and Sarama's sticky strategies.
func BenchmarkAssignorPlan(b *testing.B) {
	const p, n = 1024, 128
	for _, kind := range []string{"runnel", "runnel-r1", "runnel-r2", "sticky", "cooperative-sticky"} {
		b.Run(kind, func(b *testing.B) {
			s := newSim(kind, p)
			var ids []string
			for i := range n {
				ids = append(ids, fmt.Sprintf("m%04d", i))
			}
			if _, _, err := s.change(ids, nil); err != nil {
				b.Fatal(err)
			}
			s.members = s.members[1:]
			for b.Loop() {
				if _, err := s.rebalance(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
