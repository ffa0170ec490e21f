package meticulous

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
	"pgregory.net/rapid"
)

// This file checks whole-group restarts end to end through
// assignor.Strategy, as workers run it, independently of restart_test.go's
// simulation (which builds the planner's Member values itself): every
// process has its own Strategy; the member state travels as subscription
// and assignment user data (SubscriptionUserData, Plan, AssignmentData,
// OnAssignment); a restarted process gets a fresh Strategy seeded with its
// last Assignment after a JSON round trip (what app.Worker persists in
// assignment.json and hands to Restore). The coordinator is modelled as
// Kafka's: the generation keeps counting across the restart, the first
// member to join an empty group leads, and member IDs are random strings
// (sarama's are client ID + UUID), unrelated to the join order and to the
// IDs before the restart.

// e2eProc is one worker process: its name survives restarts, its Strategy
// and member ID do not.
type e2eProc struct {
	name  string
	id    string
	strat *assignor.Strategy
	// local maps changelog topic -> partition -> the last offset applied
	// to the process's store (its data dir: it survives restarts).
	local map[string]map[int32]int64
}

// e2eGroup is a consumer group of e2eProcs on one coordinator.
type e2eGroup struct {
	sources    map[string]int32 // subscribed source topics
	changelogs map[string]int32
	replicas   int
	coop       bool
	gen        int32
	members    []*e2eProc // join order: members[0] leads
	draw       func(lo, hi int) int
	used       map[string]bool
	procs      int
	// end maps changelog topic -> partition -> highwater; nil: the lag is
	// unknown (no Config.Offsets, Config.EndOffsets).
	end map[string]map[int32]int64
	// trace, when set, logs every generation's assignments.
	trace func(string, ...any)
}

var e2eLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// strategy returns a new Strategy for a process whose store offsets are
// local.
func (g *e2eGroup) strategy(local map[string]map[int32]int64) *assignor.Strategy {
	cfg := assignor.Config{Changelogs: g.changelogs, Replicas: g.replicas, Logger: e2eLog}
	if g.coop {
		cfg.Protocol = sarama.RebalanceProtocolCooperative
	}
	if g.end != nil {
		cfg.Offsets = func() map[string]map[int32]int64 { return cloneOffsets(local) }
		cfg.EndOffsets = func(map[string]int32) map[string]map[int32]int64 { return cloneOffsets(g.end) }
	}
	return assignor.NewStrategy(cfg)
}

// cloneOffsets deep-copies a topic -> partition -> offset map.
func cloneOffsets(m map[string]map[int32]int64) map[string]map[int32]int64 {
	out := make(map[string]map[int32]int64, len(m))
	for t, ps := range m {
		out[t] = maps.Clone(ps)
	}
	return out
}

// follow brings the stores of every member up to the highwaters for its
// actives and standbys (it runs or follows them), and for its warm-ups
// when warm (their restore has had time to finish).
func (g *e2eGroup) follow(warm bool) {
	if g.end == nil {
		return
	}
	for _, m := range g.members {
		a := m.strat.Current()
		tpss := []map[string][]int32{a.Actives, a.Standbys}
		if warm {
			tpss = append(tpss, a.Warmups)
		}
		for _, tps := range tpss {
			for t, qs := range tps {
				if _, ok := g.end[t]; !ok {
					continue
				}
				if m.local[t] == nil {
					m.local[t] = map[int32]int64{}
				}
				for _, q := range qs {
					m.local[t][q] = g.end[t][q] - 1
				}
			}
		}
	}
}

// memberID returns a fresh random member ID.
func (g *e2eGroup) memberID() string {
	for {
		id := fmt.Sprintf("runnel-%06x", g.draw(0, 1<<24-1))
		if !g.used[id] {
			g.used[id] = true
			return id
		}
	}
}

// newProc starts a process that has never run (no persisted assignment).
func (g *e2eGroup) newProc() *e2eProc {
	g.procs++
	local := map[string]map[int32]int64{}
	return &e2eProc{name: fmt.Sprintf("proc-%d", g.procs), id: g.memberID(), strat: g.strategy(local), local: local}
}

// restart stops p and starts it again from what it persisted: a fresh
// Strategy, Restore'd with its last Assignment read back from JSON, and a
// new member ID.
func (g *e2eGroup) restart(t interface{ Fatalf(string, ...any) }, p *e2eProc) *e2eProc {
	b, err := json.Marshal(p.strat.Current())
	if err != nil {
		t.Fatalf("persist: %v", err)
	}
	var a assignor.Assignment
	if err := json.Unmarshal(b, &a); err != nil {
		t.Fatalf("load: %v", err)
	}
	s := g.strategy(p.local)
	if !s.Restore(a) {
		t.Fatalf("%s: Restore refused generation %d", p.name, a.Generation)
	}
	return &e2eProc{name: p.name, id: g.memberID(), strat: s, local: p.local}
}

// rebalance runs one generation: every member joins with its subscription
// user data (cooperative: and the partitions it owns), the leader plans,
// every member receives its assignment. It reports whether a member lost a
// partition it owned (cooperative: it revokes and rejoins at once) or a
// Strategy asked for a follow-up rebalance.
func (g *e2eGroup) rebalance(t interface{ Fatalf(string, ...any) }) bool {
	g.gen++
	topics := slices.Sorted(maps.Keys(g.sources))
	parts := map[string][]int32{}
	for _, tp := range topics {
		for q := range g.sources[tp] {
			parts[tp] = append(parts[tp], q)
		}
	}
	metas := map[string]sarama.ConsumerGroupMemberMetadata{}
	owned := map[string]map[string][]int32{}
	for _, m := range g.members {
		ud, err := m.strat.SubscriptionUserData(topics)
		if err != nil {
			t.Fatalf("user data: %v", err)
		}
		meta := sarama.ConsumerGroupMemberMetadata{Version: 1, Topics: topics, UserData: ud}
		if cur := m.strat.Current(); g.coop && cur.Generation >= 0 {
			owned[m.id] = map[string][]int32{}
			for _, tp := range topics {
				if ps := cur.Actives[tp]; len(ps) > 0 {
					meta.OwnedPartitions = append(meta.OwnedPartitions, &sarama.OwnedPartition{Topic: tp, Partitions: slices.Clone(ps)})
					owned[m.id][tp] = ps
				}
			}
		}
		metas[m.id] = meta
	}
	leader := g.members[0]
	plan, err := leader.strat.Plan(metas, parts)
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	again := false
	for _, m := range g.members {
		data, err := leader.strat.AssignmentData(m.id, plan[m.id], g.gen)
		if err != nil {
			t.Fatalf("assignment data: %v", err)
		}
		m.strat.OnAssignment(&sarama.ConsumerGroupMemberAssignment{Version: 1, Topics: plan[m.id], UserData: data}, g.gen)
		for tp, ps := range owned[m.id] {
			for _, q := range ps {
				if !slices.Contains(plan[m.id][tp], q) {
					again = true
				}
			}
		}
	}
	if g.trace != nil {
		g.trace("generation %d, leader %s", g.gen, leader.name)
		for _, m := range g.members {
			a := m.strat.Current()
			g.trace("  %s (%s): actives %v standbys %v warmups %v pending %v earlier %v local %v", m.name, m.id, a.Actives, a.Standbys, a.Warmups, a.Pending, a.Earlier, m.local)
		}
	}
	for _, m := range g.members {
		select {
		case <-m.strat.ProbeRequested():
			again = true
		default:
		}
	}
	return again
}

// settle rebalances until no member revokes or asks for a follow-up. With
// the lag known, the group runs after each generation until every warm-up
// caught up, and a member whose warm-up did asks for the follow-up
// (Strategy.CheckWarmups, as WatchWarmups does every second in a worker).
// It returns the number of generations.
func (g *e2eGroup) settle(t interface{ Fatalf(string, ...any) }) int {
	for round := 1; ; round++ {
		again := g.rebalance(t)
		g.follow(true)
		for _, m := range g.members {
			if g.end != nil && m.strat.CheckWarmups() {
				<-m.strat.ProbeRequested()
				again = true
			}
		}
		if !again {
			return round
		}
		if round == 4*assignor.EarlierClaimGenerations {
			t.Fatalf("no settled generation after %d rebalances", round)
		}
	}
}

// owners returns source topic -> partition -> process name.
func (g *e2eGroup) owners() map[string]map[int32]string {
	out := map[string]map[int32]string{}
	for tp := range g.sources {
		out[tp] = map[int32]string{}
	}
	for _, m := range g.members {
		for tp, ps := range m.strat.Current().Actives {
			if _, ok := g.sources[tp]; !ok {
				continue
			}
			for _, q := range ps {
				out[tp][q] = m.name
			}
		}
	}
	return out
}

// e2eCase is one restart: the group's shape and history, then the restart.
type e2eCase struct {
	batches int // non-empty rejoin batches
	mixed   bool
	coop    bool
	nMax    int
	// lag: the members report their store offsets and the leader knows the
	// highwaters (KIP-441 lag rule, warm-ups, follow-ups); between the
	// batches every partition gets 0, 5 000, 20 000 or 30 000 writes on the
	// member running it (AcceptableRecoveryLag is 10 000).
	lag bool
	// trace: see e2eGroup.trace.
	trace func(string, ...any)
}

// run builds a group with draw, lets it live through joins and departures,
// restarts every process, rejoins them in c.batches random batches in a
// random order, and returns the partitions that did not end on the process
// that ran them before (as "topic[p] a -> b"), and the group size.
func (c e2eCase) run(t interface{ Fatalf(string, ...any) }, draw func(lo, hi int) int) ([]string, int) {
	g := &e2eGroup{sources: map[string]int32{}, changelogs: map[string]int32{}, replicas: draw(0, 2), coop: c.coop,
		draw: draw, used: map[string]bool{}, gen: int32(draw(0, 50)), trace: c.trace}
	if c.lag {
		g.end = map[string]map[int32]int64{}
	}
	for k := range draw(1, 3) {
		n := int32(draw(1, 60))
		src := fmt.Sprintf("src%d", k)
		g.sources[src] = n
		if !c.mixed || draw(0, 1) == 0 {
			g.changelogs[src+"-changelog"] = n
			if g.end != nil {
				g.end[src+"-changelog"] = map[int32]int64{}
				for q := range n {
					g.end[src+"-changelog"][q] = 1000
				}
			}
		}
	}
	// History: the first processes join in one to three rebalances, then
	// up to two changes (some leave, some join).
	n := draw(c.batches, c.nMax)
	for joined := 0; joined < n; {
		k := draw(1, n-joined)
		for range k {
			g.members = append(g.members, g.newProc())
		}
		joined += k
		g.settle(t)
	}
	for range draw(0, 2) {
		for range draw(0, len(g.members)-c.batches) {
			i := draw(0, len(g.members)-1)
			g.members = slices.Delete(g.members, i, i+1)
		}
		for range draw(0, min(3, c.nMax-len(g.members))) {
			g.members = append(g.members, g.newProc())
		}
		g.settle(t)
	}
	before := g.owners()
	// The restart: every process stops (the group empties), then they come
	// back in a random order, cut into c.batches non-empty batches.
	n = len(g.members)
	back := make([]*e2eProc, n)
	for i, p := range g.members {
		back[i] = g.restart(t, p)
	}
	for i := n - 1; i > 0; i-- {
		j := draw(0, i)
		back[i], back[j] = back[j], back[i]
	}
	cuts := map[int]bool{}
	for len(cuts) < c.batches-1 {
		cuts[draw(1, n-1)] = true
	}
	g.members = nil
	for i, p := range back {
		g.members = append(g.members, p)
		if i < n-1 && !cuts[i+1] {
			continue
		}
		g.settle(t)
		if g.end != nil && i < n-1 {
			// The group runs until the next batch.
			writes := []int64{0, 5000, 20000, 30000}[draw(0, 3)]
			for _, ps := range g.end {
				for q := range ps {
					ps[q] += writes
				}
			}
			g.follow(false)
		}
	}
	after := g.owners()
	var moved []string
	for _, tp := range slices.Sorted(maps.Keys(before)) {
		for q := range g.sources[tp] {
			if before[tp][q] != after[tp][q] {
				moved = append(moved, fmt.Sprintf("%s[%d] %s -> %s", tp, q, before[tp][q], after[tp][q]))
			}
		}
	}
	return moved, n
}

// TestRestartThroughStrategies (issue #26): a whole-group restart, driven
// through assignor.Strategy and its wire format as workers run it, ends
// with every partition on the process that ran it before, in any join
// order, any split into up to four batches, any new member IDs, stateful
// or mixed with stateless groups, eager or cooperative, with the lag known
// (KIP-441 warm-ups and their follow-ups) or not.
func TestRestartThroughStrategies(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := e2eCase{
			batches: rapid.IntRange(2, 4).Draw(t, "batches"),
			mixed:   rapid.Bool().Draw(t, "mixed"),
			coop:    rapid.Bool().Draw(t, "cooperative"),
			nMax:    rapid.SampledFrom([]int{4, 12}).Draw(t, "nMax"),
			lag:     rapid.Bool().Draw(t, "lag"),
		}
		k := 0
		if os.Getenv("RUNNEL_E2E_TRACE") != "" {
			c.trace = t.Logf
		}
		moved, n := c.run(t, func(lo, hi int) int {
			k++
			return rapid.IntRange(lo, hi).Draw(t, strconv.Itoa(k))
		})
		if len(moved) > 0 {
			t.Fatalf("%d members, %+v: %d partitions elsewhere after the restart: %v", n, c, len(moved), moved)
		}
	})
}

// TestRestartThroughStrategiesStats counts, over RUNNEL_E2E_RESTART_CASES
// (default 25) seeded cases per cell, the restarts that left a partition
// elsewhere, and fails on any. With the lag known, a restart may take many
// warm-up follow-ups (MaxWarmupReplicas partitions given back per
// follow-up); before they stopped counting towards EarlierClaimGenerations
// the claims naming the homes expired midway in 0-13 % of a cell's cases
// (500 each; docs/assignment.md).
func TestRestartThroughStrategiesStats(t *testing.T) {
	if testing.Short() {
		t.Skip("statistics")
	}
	cases := 25
	if v, err := strconv.Atoi(os.Getenv("RUNNEL_E2E_RESTART_CASES")); err == nil && v > 0 {
		cases = v
	}
	for _, o := range []struct{ coop, lag bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		coop, lag := o.coop, o.lag
		for _, nMax := range []int{3, 21} {
			for batches := 2; batches <= min(4, nMax); batches++ {
				for _, mixed := range []bool{false, true} {
					c := e2eCase{batches: batches, mixed: mixed, coop: coop, nMax: nMax, lag: lag}
					fails := 0
					for seed := range cases {
						r := rand.New(rand.NewPCG(uint64(seed), uint64(100*batches+nMax)))
						moved, n := c.run(t, func(lo, hi int) int { return lo + r.IntN(hi-lo+1) })
						if len(moved) > 0 {
							fails++
							if fails <= 3 {
								t.Errorf("seed %d, %d members, %+v: %v", seed, n, c, moved)
							}
						}
					}
					t.Logf("cooperative %v, lag %v, 2..%d members, %d batches, mixed %v: %d of %d restarts left a partition elsewhere", coop, lag, nMax, batches, mixed, fails, cases)
				}
			}
		}
	}
}

// Issue #26's smallest case end to end: one stateful group of 13
// partitions, no replicas, three processes; the one holding 5 (the
// ceil(13/3) share) rejoins last, after the two holding 4. Before the fix
// it ended with 4 and one of its partitions stayed on a process that kept 5.
func TestRestartCeilShareRejoinsLastThroughStrategies(t *testing.T) {
	for _, coop := range []bool{false, true} {
		r := rand.New(rand.NewPCG(26, 13))
		g := &e2eGroup{sources: map[string]int32{"st": 13}, changelogs: map[string]int32{"st-changelog": 13}, coop: coop,
			draw: func(lo, hi int) int { return lo + r.IntN(hi-lo+1) }, used: map[string]bool{}, gen: 7}
		for range 3 {
			g.members = append(g.members, g.newProc())
		}
		g.settle(t)
		before := g.owners()
		var ceil *e2eProc
		var back []*e2eProc
		for _, p := range g.members {
			if len(p.strat.Current().Actives["st"]) == 5 {
				ceil = g.restart(t, p)
			} else {
				back = append(back, g.restart(t, p))
			}
		}
		if ceil == nil || len(back) != 2 {
			t.Fatalf("no single process holds 5 of 13: %v", before)
		}
		g.members = back
		g.settle(t)
		g.members = append(g.members, ceil)
		g.settle(t)
		if after := g.owners(); !maps.Equal(after["st"], before["st"]) {
			t.Errorf("cooperative %v: before the restart %v, after %v", coop, before["st"], after["st"])
		}
	}
}
