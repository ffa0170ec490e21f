package assignor

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// Default values applied by PlanAssignment when a Cluster field is zero.
const (
	// DefaultAcceptableRecoveryLag is KIP-441's acceptable.recovery.lag default:
	// a member whose changelog lag is at most this many offsets is "caught up".
	DefaultAcceptableRecoveryLag int64 = 10000
	// DefaultMaxWarmupReplicas is KIP-441's max.warmup.replicas default: at most
	// this many warm-up replicas exist in one plan.
	DefaultMaxWarmupReplicas = 2
)

// Member is one consumer-group member as the leader sees it in the JoinGroup
// metadata: its subscription and the state it holds from its last assignment.
type Member struct {
	// ID is the group member ID assigned by the coordinator.
	ID string
	// ProcessID identifies the process (several members may share one).
	ProcessID string
	// URL is the member's interactive-query URL, published in Plan.URLs.
	URL string
	// Generation is the generation of the member's last assignment (-1 none);
	// when two members claim the same previous active (a zombie), the higher
	// generation wins, then the lower ID.
	Generation int32
	// Topics are the subscribed source topics.
	Topics []string
	// PrevActives and PrevStandbys map topic -> partitions of the member's last
	// assignment; changelog topics are included. Warm-ups count as standbys.
	PrevActives, PrevStandbys map[string][]int32
	// Offsets maps changelog topic -> partition -> the offset of the last record
	// applied to the local store (-1 or absent: none).
	Offsets map[string]map[int32]int64
	// Since maps topic -> partition -> the generation since which the
	// member has held that previous active without a break (absent:
	// Generation). When a member must give up actives, it gives the most
	// recently acquired first: after a whole-group restart the members that
	// rejoined first keep their own partitions and hand back those they only
	// held while the others were away.
	Since map[string]map[int32]int32
	// Earlier maps topic -> partition -> generation: actives the member
	// held at that generation, below Generation, and does not hold now
	// (after a restart: those of its persisted assignment,
	// Assignment.Earlier). They are claims of that generation: they lose
	// to every later one, and decide where a task goes back to (its home).
	Earlier map[string]map[int32]int32
	// Owned maps topic -> partitions the member consumes right now (the
	// OwnedPartitions of its JoinGroup subscription, KIP-429). Only read when
	// Cluster.Cooperative is set; nil means PrevActives.
	Owned map[string][]int32
}

// Cluster is the input of PlanAssignment.
type Cluster struct {
	// Members of the group; their order does not matter (they are sorted by ID).
	Members []Member
	// Topics maps each subscribed source topic to its partition count. Topics
	// with no subscriber or no partitions are ignored.
	Topics map[string]int32
	// Changelogs maps each table changelog topic to its partition count. They are
	// not subscribed through the group; each joins the co-partitioned group of
	// source topics with the same partition count.
	Changelogs map[string]int32
	// Globals maps global-table changelog topics to their partition counts;
	// every member gets every partition (MemberPlan.Globals).
	Globals map[string]int32
	// EndOffsets maps changelog topic -> partition -> highwater. Nil (or a
	// missing entry) means the lag is unknown and taken as 0.
	EndOffsets map[string]map[int32]int64
	// Replicas is the number of standby replicas per changelog partition; it is
	// clamped to (subscribers of the group - 1).
	Replicas int
	// AcceptableRecoveryLag (offsets) is KIP-441's acceptable.recovery.lag;
	// 0 means DefaultAcceptableRecoveryLag, a negative value means 0.
	AcceptableRecoveryLag int64
	// MaxWarmupReplicas is KIP-441's max.warmup.replicas; 0 means
	// DefaultMaxWarmupReplicas.
	MaxWarmupReplicas int
	// Generation is the latest group generation the leader knows of (the
	// generation of its own last assignment; 0 or less: unknown). A member's
	// claimed Generation above the bound (the larger of this value and the
	// highest generation at least two members report) is not trusted: its
	// previous actives lose every conflicting claim, as from generation -1,
	// and the member is listed in Plan.Untrusted. A legitimate claim never
	// exceeds the bound: every member of the last generation reports it.
	Generation int32
	// Cooperative plans for the incremental rebalance protocol (KIP-429): a
	// task whose planned member differs from a member that owns it now is
	// withheld (MemberPlan.Pending of the planned member, nobody's active) so
	// that the owner revokes it in this generation and the planned member gets
	// it in the next one. Tasks that do not move are never withheld.
	Cooperative bool
}

// MemberPlan is one member's share of a Plan. Every map is topic -> sorted
// partitions; a topic with no partitions is absent.
type MemberPlan struct {
	// Actives are the partitions the member processes: source topics and the
	// changelog partitions co-partitioned with them.
	Actives map[string][]int32
	// Standbys are changelog partitions the member replicates for failover.
	Standbys map[string][]int32
	// Warmups are changelog partitions the member restores because it is the
	// balanced target of an active that is, for now, kept on a caught-up member
	// (KIP-441). They are standbys that count against MaxWarmupReplicas.
	Warmups map[string][]int32
	// Globals are all partitions of every global-table changelog.
	Globals map[string][]int32
	// Pending (Cluster.Cooperative only) are the actives planned for this
	// member but withheld in this generation because another member still
	// owns them; the member reports them as previous actives in its next
	// subscription, which makes the follow-up plan give them to it.
	Pending map[string][]int32
}

// Plan is the output of PlanAssignment.
type Plan struct {
	// Members maps member ID -> plan; every input member is present.
	Members map[string]MemberPlan
	// URLs maps topic -> partition -> URL of the member holding the active, for
	// source and co-partitioned changelog topics.
	URLs map[string]map[int32]string
	// Withheld (Cluster.Cooperative only) is the number of tasks (co-partitioned
	// partitions) revoked from their owner and withheld in this plan; a
	// follow-up rebalance assigns them.
	Withheld int
	// NeedsProbe reports that some active was kept away from its balanced target
	// because the target is not caught up (KIP-441): the group should rebalance
	// again after the probing interval.
	NeedsProbe bool
	// Untrusted lists, sorted, the members whose claimed generation exceeded
	// the group's (Cluster.Generation); their claims were ranked lowest.
	Untrusted []string
}

// group is a co-partitioned group: topics with the same partition count and
// the same subscribers, plus the changelog topics attached to them.
type group struct {
	sources    []string // sorted
	changelogs []string // sorted
	parts      int32
	eligible   []int // member indexes (sorted by ID) that subscribe to sources
	firstTask  int
	replicas   int // standbys per task, clamped
}

// claimRec is one member's claim on a task as its earlier active: the
// generation it held the task at (-1 untrusted), since when without a
// break, and whether it is an earlier claim (Member.Earlier: the member
// does not run the task now, so its state is not known to be current).
type claimRec struct {
	m          int
	gen, since int32
	earlier    bool
}

// planner holds the working state of one PlanAssignment call. Members are
// indexed by their position in ID order; tasks by (group, partition) in group
// order. Invariants kept by every phase: active[t] is -1 or a member eligible
// for t's group; load[m] == number of t with active[t] == m.
type planner struct {
	c       Cluster
	members []Member
	groups  []group
	taskG   []int   // task -> group index
	taskP   []int32 // task -> partition
	topicG  map[string]int
	active  []int
	load    []int
	holders [][]int // task -> members with local state (prev standby, warm-up or displaced active), ID order
	prevOwn []int   // task -> previous active owner kept as the claim (-1 none)
	// older: task -> the other members that claimed it as a previous active
	// and lost to prevOwn (an older generation, or the same one and a higher
	// ID), most recent claim first. After a restart of the whole group the
	// members joining last claim their partitions at the generation before
	// the restart, below what the members that joined first took meanwhile:
	// these claims decide which surplus tasks go back to whom.
	older [][]int
	// since: task -> the generation since which prevOwn has held it
	// (Member.Since, bounded by its claimed generation); 0 without prevOwn.
	since []int32
	// claims: task -> every claim on it, the winner (prevOwn) first, then
	// p.older's order.
	claims   [][]claimRec
	standby  [][]int
	sload    []int
	warm     [][]int
	withheld []bool
	caughtUp func(m, t int) bool
	gen      []int32 // member -> claimed generation, -1 when above the group's bound
	untrust  []string
}

// PlanAssignment computes a deterministic, sticky, balanced assignment.
//
// Algorithm (docs/design.md §7, docs/assignment.md; shape after Faust's CopartitionedAssignor, fixed
// where Faust fails; lag handling after Kafka Streams' KIP-441
// HighAvailabilityTaskAssignor):
//  1. Group topics: same partition count and same subscriber set form a
//     co-partitioned group; a changelog joins the first group (by smallest
//     topic name) with its partition count, or forms its own group over all
//     members. Each (group, partition) is a task.
//  2. Actives in two phases, as Kafka Streams balances stateful and
//     stateless tasks separately: the stateful tasks alone (floor/ceil of
//     Ts/N per member), then the stateless ones on top (total floor/ceil of
//     T/N). In each phase every member keeps its previous actives up to its
//     ceiling (claims above the group's generation rank lowest).
//  3. Orphaned tasks go to a member holding local state (standby) with room
//     (floor, then ceil); the others to the least-loaded eligible member.
//  4. While max-min load > 1, one task moves from a most-loaded to a
//     least-loaded member, preferring one the receiver holds state for.
//     Nothing else moves: total moves are the minimum (bench
//     TestAssignorMoves; step 5 adds moves only towards members that
//     rejoin with older claims), and with lag known step 7 keeps an orphan
//     on a caught-up standby holder instead of restoring it.
//  5. Tasks go back to their earlier owners (a member that rejoined with an
//     older claim, else the previous owner) wherever that keeps both
//     balances (returnHome): after a whole-group restart the last plan
//     restores the assignment from before it (issue #26).
//  6. Standbys per stateful task: keep previous holders (the displaced active
//     first), fill from the members with fewest standbys, then balance to
//     the narrowest spread the actives allow (again after step 7).
//  7. KIP-441: an active whose target member lags by more than
//     AcceptableRecoveryLag stays on (or moves to) a caught-up member, and the
//     target gets a warm-up (at most MaxWarmupReplicas); NeedsProbe is set.
//  8. Cooperative (KIP-429): a task moving away from a member that owns it
//     now is withheld (MemberPlan.Pending) until the owner revoked it.
//
// Errors: duplicate or empty member IDs, negative partition counts.
func PlanAssignment(c Cluster) (Plan, error) {
	if c.AcceptableRecoveryLag == 0 {
		c.AcceptableRecoveryLag = DefaultAcceptableRecoveryLag
	} else if c.AcceptableRecoveryLag < 0 {
		c.AcceptableRecoveryLag = 0
	}
	if c.MaxWarmupReplicas <= 0 {
		c.MaxWarmupReplicas = DefaultMaxWarmupReplicas
	}
	if c.Replicas < 0 {
		c.Replicas = 0
	}
	members := slices.Clone(c.Members)
	sort.Slice(members, func(i, j int) bool { return members[i].ID < members[j].ID })
	for i, m := range members {
		if m.ID == "" {
			return Plan{}, fmt.Errorf("plan assignment: member %d has an empty ID", i)
		}
		if i > 0 && members[i-1].ID == m.ID {
			return Plan{}, fmt.Errorf("plan assignment: duplicate member ID %q", m.ID)
		}
	}
	for _, tm := range []map[string]int32{c.Topics, c.Changelogs, c.Globals} {
		for t, n := range tm {
			if n < 0 {
				return Plan{}, fmt.Errorf("plan assignment: topic %q has %d partitions", t, n)
			}
		}
	}
	p := &planner{c: c, members: members}
	p.buildGroups()
	p.claim()
	p.assignActives()
	p.assignStandbys()
	needsProbe := p.lagAware()
	if c.Cooperative {
		p.withhold()
	}
	return p.output(needsProbe), nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func (p *planner) buildGroups() {
	type key struct {
		parts int32
		subs  string
	}
	byKey := map[key]*group{}
	var order []key
	for _, topic := range sortedKeys(p.c.Topics) {
		n := p.c.Topics[topic]
		if n <= 0 {
			continue
		}
		if _, global := p.c.Globals[topic]; global {
			continue
		}
		var subs []int
		var ids []string
		for i, m := range p.members {
			if slices.Contains(m.Topics, topic) {
				subs = append(subs, i)
				ids = append(ids, m.ID)
			}
		}
		if len(subs) == 0 {
			continue
		}
		k := key{n, strings.Join(ids, "\x00")}
		g := byKey[k]
		if g == nil {
			g = &group{parts: n, eligible: subs}
			byKey[k] = g
			order = append(order, k) // topics are visited sorted: groups ordered by smallest topic
		}
		g.sources = append(g.sources, topic)
	}
	for _, k := range order {
		p.groups = append(p.groups, *byKey[k])
	}
	all := make([]int, len(p.members))
	for i := range all {
		all[i] = i
	}
	for _, cl := range sortedKeys(p.c.Changelogs) {
		n := p.c.Changelogs[cl]
		if n <= 0 {
			continue
		}
		if _, global := p.c.Globals[cl]; global {
			continue
		}
		attached := false
		for gi := range p.groups {
			if p.groups[gi].parts == n {
				if !slices.Contains(p.groups[gi].changelogs, cl) {
					p.groups[gi].changelogs = append(p.groups[gi].changelogs, cl)
				}
				attached = true
				break
			}
		}
		if !attached && len(p.members) > 0 {
			// A changelog with no co-partitioned source: its own group over all
			// members (a table fed from outside the group's subscription).
			p.groups = append(p.groups, group{parts: n, eligible: all, changelogs: []string{cl}})
		}
	}
	p.topicG = map[string]int{}
	for gi := range p.groups {
		g := &p.groups[gi]
		g.firstTask = len(p.taskG)
		if len(g.changelogs) > 0 {
			g.replicas = min(p.c.Replicas, len(g.eligible)-1)
		}
		for _, t := range g.sources {
			p.topicG[t] = gi
		}
		for _, t := range g.changelogs {
			if _, ok := p.topicG[t]; !ok {
				p.topicG[t] = gi
			}
		}
		for q := int32(0); q < g.parts; q++ {
			p.taskG = append(p.taskG, gi)
			p.taskP = append(p.taskP, q)
		}
	}
	nt := len(p.taskG)
	p.active = make([]int, nt)
	p.prevOwn = make([]int, nt)
	for t := range p.active {
		p.active[t] = -1
		p.prevOwn[t] = -1
	}
	p.load = make([]int, len(p.members))
	p.sload = make([]int, len(p.members))
	p.holders = make([][]int, nt)
	p.standby = make([][]int, nt)
	p.warm = make([][]int, nt)
}

func (p *planner) eligible(m, t int) bool {
	_, ok := slices.BinarySearch(p.groups[p.taskG[t]].eligible, m)
	return ok
}

// tasksOf returns the tasks a topic->partitions map names, deduplicated and sorted.
func (p *planner) tasksOf(tp map[string][]int32) []int {
	var ts []int
	for _, topic := range sortedKeys(tp) {
		gi, ok := p.topicG[topic]
		if !ok {
			continue
		}
		g := p.groups[gi]
		for _, q := range tp[topic] {
			if q >= 0 && q < g.parts {
				ts = append(ts, g.firstTask+int(q))
			}
		}
	}
	slices.Sort(ts)
	return slices.Compact(ts)
}

// taskGen is a task and a generation.
type taskGen struct {
	t   int
	gen int32
}

// earlierOf returns the tasks a Member.Earlier map names with their
// generation (the highest over the task's topics), sorted by task.
func (p *planner) earlierOf(m map[string]map[int32]int32) []taskGen {
	byTask := map[int]int32{}
	for _, topic := range sortedKeys(m) {
		gi, ok := p.topicG[topic]
		if !ok {
			continue
		}
		g := p.groups[gi]
		for q, e := range m[topic] {
			if q < 0 || q >= g.parts {
				continue
			}
			t := g.firstTask + int(q)
			if v, ok := byTask[t]; !ok || e > v {
				byTask[t] = e
			}
		}
	}
	out := make([]taskGen, 0, len(byTask))
	for t, e := range byTask {
		out = append(out, taskGen{t, e})
	}
	slices.SortFunc(out, func(a, b taskGen) int { return a.t - b.t })
	return out
}

// bound returns the highest generation a member may legitimately claim: the
// larger of Cluster.Generation and the highest generation reported by at
// least two members (every member of the last generation reports it, so a
// single higher claim is a foreign, corrupt or restored-from-elsewhere
// record). With neither, there is no bound.
func (p *planner) bound() int32 {
	count := map[int32]int{}
	b := p.c.Generation
	for _, m := range p.members {
		if count[m.Generation]++; count[m.Generation] == 2 && m.Generation > b {
			b = m.Generation
		}
	}
	if b <= 0 {
		return math.MaxInt32
	}
	return b
}

// claim records previous owners (zombie claims resolved by generation, then
// ID; a generation above the group's bound ranks as -1) and state holders.
func (p *planner) claim() {
	b := p.bound()
	p.gen = make([]int32, len(p.members))
	for m, mem := range p.members {
		p.gen[m] = mem.Generation
		if mem.Generation > b {
			p.gen[m] = -1
			p.untrust = append(p.untrust, mem.ID)
		}
	}
	// Every claim on a task: a previous active (the member's generation),
	// or an earlier one (Member.Earlier: the generation it last held it,
	// at most the member's own).
	p.claims = make([][]claimRec, len(p.taskG))
	for m := range p.members {
		mem := p.members[m]
		prev := p.tasksOf(mem.PrevActives)
		for _, t := range prev {
			if p.eligible(m, t) {
				p.claims[t] = append(p.claims[t], claimRec{m: m, gen: p.gen[m], since: p.claimSince(m, t)})
			}
		}
		for _, te := range p.earlierOf(mem.Earlier) {
			if t := te.t; p.eligible(m, t) && !slices.Contains(prev, t) {
				g := min(te.gen, p.gen[m])
				if p.gen[m] < 0 || g < 0 {
					g = -1
				}
				p.claims[t] = append(p.claims[t], claimRec{m: m, gen: g, since: g, earlier: true})
			}
		}
		for _, t := range p.tasksOf(mem.PrevStandbys) {
			if p.eligible(m, t) {
				p.holders[t] = append(p.holders[t], m)
			}
		}
	}
	// The most recent claim wins (the same generation: the lower ID, as
	// members are indexed in ID order); the others are p.older, most recent
	// first, and state holders.
	p.older = make([][]int, len(p.taskG))
	p.since = make([]int32, len(p.taskG))
	for t, cs := range p.claims {
		if len(cs) == 0 {
			continue
		}
		slices.SortFunc(cs, func(a, b claimRec) int {
			if a.gen != b.gen {
				return int(b.gen) - int(a.gen)
			}
			return a.m - b.m
		})
		p.prevOwn[t], p.since[t] = cs[0].m, cs[0].since
		for _, c := range cs[1:] {
			p.older[t] = append(p.older[t], c.m)
			p.holders[t] = append(p.holders[t], c.m)
		}
	}
	for t := range p.holders {
		h := p.holders[t]
		slices.Sort(h)
		h = slices.Compact(h)
		if o := p.prevOwn[t]; o >= 0 {
			h = slices.DeleteFunc(h, func(x int) bool { return x == o })
		}
		p.holders[t] = h
	}
	// Lag is measured once: caught up = running the active (a previous
	// active, not an earlier claim), or lag within the acceptable recovery
	// lag (KIP-441). Unknown highwater means lag 0.
	p.caughtUp = func(m, t int) bool {
		if p.prevOwn[t] == m && !p.claims[t][0].earlier {
			return true
		}
		return p.lag(m, t) <= p.c.AcceptableRecoveryLag
	}
}

// claimSince returns the generation since which member m, which claims
// task t as a previous active, has held it without a break: its
// Member.Since for any of the task's topics, bounded by its claimed
// generation (-1 when untrusted).
func (p *planner) claimSince(m, t int) int32 {
	s := p.gen[m]
	g := p.groups[p.taskG[t]]
	for _, topic := range append(slices.Clone(g.sources), g.changelogs...) {
		if v, ok := p.members[m].Since[topic][p.taskP[t]]; ok && v < s {
			s = v
		}
	}
	return s
}

// heldSince returns the generation since which member m has held task t,
// for a member that holds it in the plan being built: p.since for the
// previous owner, its claim's for an earlier owner that got it back
// (p.older), and MaxInt32 (now) for a task it receives in this plan.
func (p *planner) heldSince(m, t int) int32 {
	for _, c := range p.claims[t] {
		if c.m == m {
			return c.since
		}
	}
	return math.MaxInt32
}

// lagging is 1 when the changelog lag is known and member m is not caught up
// for stateful task t, else 0. Balancing and orphan placement prefer a
// receiver that is caught up: KIP-441 (lagAware) would keep the active away
// from a lagging one, and a balanced target that changes from plan to plan
// never lets the follow-up rebalances converge.
func (p *planner) lagging(m, t int) int {
	if p.c.EndOffsets == nil || !p.stateful(t) || p.caughtUp(m, t) {
		return 0
	}
	return 1
}

// lag is the largest lag of member m over the changelog partitions of task t.
func (p *planner) lag(m, t int) int64 {
	g := p.groups[p.taskG[t]]
	q := p.taskP[t]
	var worst int64
	for _, cl := range g.changelogs {
		end, ok := p.c.EndOffsets[cl][q]
		if !ok {
			continue
		}
		applied := int64(-1)
		if o, ok := p.members[m].Offsets[cl][q]; ok {
			applied = o
		}
		if l := end - (applied + 1); l > worst {
			worst = l
		}
	}
	return worst
}

func (p *planner) isHolder(m, t int) bool {
	_, ok := slices.BinarySearch(p.holders[t], m)
	return ok
}

// stateful reports whether task t belongs to a group with a changelog (its
// move costs a restore unless the receiver holds a standby).
func (p *planner) stateful(t int) bool { return len(p.groups[p.taskG[t]].changelogs) > 0 }

// assignActives places the actives in two phases, as Kafka Streams' assignor
// balances stateful and stateless tasks separately: first the stateful tasks
// alone (so every member holds floor or ceil of Ts/N of them, which is what
// makes a within-one standby spread possible, docs/assignment.md), then the
// stateless tasks on top of them so that the total per member is within
// floor/ceil of T/N too. Phase 2 never moves a stateful task. Then tasks go
// back to their earlier owners where the balance allows it (returnHome).
func (p *planner) assignActives() {
	p.assignPhase(true)
	p.assignPhase(false)
	p.returnHome()
}

// assignPhase places the tasks whose stateful() equals stateful. p.load holds
// the tasks placed by earlier phases (the base); the targets are floor/ceil
// of (base + phase tasks) / N.
func (p *planner) assignPhase(stateful bool) {
	n := len(p.members)
	inPhase := make([]bool, len(p.taskG))
	nt := 0
	for t := range p.taskG {
		if p.stateful(t) == stateful {
			inPhase[t] = true
			nt++
		}
	}
	if n == 0 || nt == 0 {
		return
	}
	total := nt
	for _, l := range p.load {
		total += l
	}
	capacity := (total + n - 1) / n
	// 2. Keep previous actives up to capacity. When trimming, drop first the
	// tasks another member claimed as an active of an earlier generation
	// (after a whole-group restart: the partitions of a member that joined
	// later, which it gets back in step 3), then the most recently acquired
	// (Member.Since: it keeps what it held before the restart), then the
	// tasks another member holds state for, then the highest task numbers.
	owned := make([][]int, n)
	for t, o := range p.prevOwn {
		if o >= 0 && inPhase[t] {
			owned[o] = append(owned[o], t)
		}
	}
	for m, ts := range owned {
		room := max(0, capacity-p.load[m])
		if len(ts) > room {
			slices.SortStableFunc(ts, func(a, b int) int {
				if oa, ob := len(p.older[a]) > 0, len(p.older[b]) > 0; oa != ob {
					if ob {
						return -1
					}
					return 1
				}
				if p.since[a] != p.since[b] {
					return int(p.since[a]) - int(p.since[b]) // the longest held first
				}
				ha, hb := len(p.holders[a]) > 0, len(p.holders[b]) > 0
				if ha != hb {
					if hb {
						return -1
					}
					return 1
				}
				return a - b
			})
			ts = ts[:room]
		}
		for _, t := range ts {
			p.active[t] = m
			p.load[m]++
		}
	}
	// 3. Promote standbys by augmenting paths (Kuhn's matching with capacities).
	var orphans []int
	for t := range p.taskG {
		if inPhase[t] && p.active[t] < 0 {
			orphans = append(orphans, t)
		}
	}
	// Passes: first up to floor(T/N) per member, then up to ceil(T/N) for at
	// most T mod N members (so the result is balanced without moving a
	// promoted task again). Kept tasks do not move here: augmenting paths
	// through them moved many partitions (bench TestAssignorMoves). An orphan
	// whose holders are all full goes to the least loaded member (step 4):
	// one move and a restore, where promoting it above capacity and shedding
	// another task costs two moves (issue #13: total moves within 5% of the
	// minimum; restores stay below Sarama sticky's moves, bench
	// TestAssignorMoves).
	//
	// An orphan goes to the member with the most recent earlier claim on it
	// first (p.older: the member it belonged to before a whole-group restart
	// gets it back), then to any state holder.
	floor, extra := total/n, total%n
	placedHere := make([]bool, len(p.taskG)) // placed in this pass: free to move again
	for _, pass := range []struct{ ceil, older bool }{{false, true}, {true, true}, {false, false}, {true, false}} {
		ceil := pass.ceil
		for _, t := range orphans {
			if p.active[t] >= 0 || len(p.holders[t]) == 0 {
				continue
			}
			cands := p.holders[t]
			if pass.older {
				cands = p.older[t]
			}
			above := 0
			for _, l := range p.load {
				if l > floor {
					above++
				}
			}
			room := func(h int) bool {
				return p.load[h] < floor || (ceil && p.load[h] == floor && above < extra)
			}
			visited := make([]bool, n)
			for _, h := range cands {
				if visited[h] {
					continue
				}
				visited[h] = true
				if pass.older && !room(h) {
					continue // no chains that would move a claimant's task away
				}
				if p.freeSlot(h, room, visited, placedHere) {
					p.active[t] = h
					p.load[h]++
					// A task back with its earlier owner stays there,
					// as a kept one does: moved on to another holder,
					// the earlier owner's claim would be lost with the
					// next plan (the new holder reports it then).
					placedHere[t] = !pass.older
					break
				}
			}
		}
	}
	// pref ranks members as receivers (low first) and donors (high first):
	// in the stateful phase, members that owned stateless tasks before take
	// stateful tasks last and give them first, so that the stateless phase
	// can leave them their stateless tasks (old members never gain on an
	// addition, t/meticulous checkAdded).
	pref := make([]int, n)
	kept := make([]int, n)
	for t, o := range p.prevOwn {
		if o < 0 {
			continue
		}
		if stateful && !p.stateful(t) {
			pref[o]++
		}
		if p.active[t] == o {
			kept[o]++
		}
	}
	// 4. Remaining orphans to the least-loaded eligible member, then the
	// one that keeps the fewest previous actives (a newcomer), then the
	// fewest tasks of the same group (per-group spread).
	gcount := make([][]int, len(p.groups))
	for gi := range gcount {
		gcount[gi] = make([]int, n)
	}
	for t, m := range p.active {
		if m >= 0 {
			gcount[p.taskG[t]][m]++
		}
	}
	for _, t := range orphans {
		if p.active[t] >= 0 {
			continue
		}
		gi := p.taskG[t]
		best := -1
		var bestKey [5]int
		for _, m := range p.groups[gi].eligible {
			key := [5]int{p.load[m], p.lagging(m, t), pref[m], kept[m], gcount[gi][m]}
			if best < 0 || slices.Compare(key[:], bestKey[:]) < 0 {
				best, bestKey = m, key
			}
		}
		p.active[t] = best
		p.load[best]++
		gcount[gi][best]++
	}
	// 5. Balance: move from most- to least-loaded while the gap exceeds one.
	p.balanceActives(gcount, inPhase, pref)
}

// home returns the member task t goes back to when the balance allows it
// (-1 when nobody claims t): its most recent earlier owner (p.older[t][0])
// when that claim shows it ran t before the current claimant took t over,
// else the current claimant (p.prevOwn). An earlier owner's claim counts
// with a trusted generation (>= 0) below the generation since which the
// current claimant has held t without a break (p.since): a claim at or
// above it overlaps that unbroken hold (a zombie), and a claim ranked -1
// (untrusted, or no generation) proves nothing.
func (p *planner) home(t int) int {
	o := p.prevOwn[t]
	if o < 0 || len(p.older[t]) == 0 {
		return o
	}
	if r := p.claims[t][1]; r.gen >= 0 && r.gen < p.since[t] {
		return r.m
	}
	return o
}

// returnHome moves tasks back to their home (p.home: the earlier owner that
// rejoined with an older claim, else the previous owner) without widening
// either balance: the stateful actives per member and all actives per
// member each keep their spread (at most 1 where the phases reached 1).
//
// Why: the phases keep every previous owner's tasks up to the ceiling
// ceil(T/N) and settle as soon as the loads are within one, so which
// members end at the ceiling follows from who claimed what, not from who
// held the ceiling shares before. After a whole-group restart (issue #26:
// P=13, N=3; the two members holding 4 rejoin first and share the third's
// 5, then it returns) both members that joined first keep one of its tasks
// at the ceiling (5 is the ceiling for each), the rejoiner gets the other
// 3 and one by balancing, and ends at 4: a restart moved state for nothing.
// No balancing move repairs that (the loads are already within one); a
// move of a ceiling share does, from a member at the ceiling to the
// member at the floor whose task it is. Likewise the stateless phase may
// have moved a task away from its previous owner that a later swap can
// give back.
//
// Cost: a move home that turns the rejoiner's floor share into its earlier
// ceiling share is one move beyond the minimum (a member back from an
// absence gets its earlier share, not the smallest fair one: the planner
// cannot tell it from the last batch of a restart); a move to the previous
// owner undoes a move. With the lag known, a home member that is not caught
// up on a stateful task is its target all the same: lagAware keeps the task
// on a caught-up member and warms the home member up, and a follow-up
// rebalance moves it once it is caught up (KIP-441; the earlier claim that
// makes it the home lasts for the follow-ups, Member.Earlier).
//
// First all homes at once: when that keeps both spreads (the whole group is
// back and every task's earlier owner is known: the assignment before the
// restart) it is taken. Otherwise one path or cycle of home moves at a
// time, of one kind of task (stateful or stateless): a cycle changes no
// count; a path d -> x1 -> ... -> r (d's task goes to its home x1, one of
// x1's to its home x2, ..., into r) only lowers d and raises r, taken when
// d is above r in every count it changes. Each step puts at least one more
// task home and never moves one that is home, so it ends after at most T
// steps. A member only ever receives a task it held before (its claim):
// the members of the current generation never gain (t/meticulous
// checkAdded).
func (p *planner) returnHome() {
	n := len(p.members)
	home := make([]int, len(p.taskG))
	st := make([]int, n) // stateful actives per member
	pending := false
	for t, m := range p.active {
		home[t] = -1
		if m < 0 {
			continue
		}
		if p.stateful(t) {
			st[m]++
		}
		if h := p.home(t); h >= 0 && h != m {
			home[t] = h
			pending = true
		}
	}
	if !pending {
		return
	}
	stBound, ldBound := max(1, spreadOf(st)), max(1, spreadOf(p.load))
	st2, ld2 := slices.Clone(st), slices.Clone(p.load)
	for t, h := range home {
		if h >= 0 {
			m := p.active[t]
			ld2[m]--
			ld2[h]++
			if p.stateful(t) {
				st2[m]--
				st2[h]++
			}
		}
	}
	if spreadOf(st2) <= stBound && spreadOf(ld2) <= ldBound {
		for t, h := range home {
			if h >= 0 {
				p.active[t] = h
			}
		}
		copy(p.load, ld2)
		return
	}
	for p.homeCycle(home, st) || p.homePath(home, st) {
	}
}

// spreadOf returns max - min of xs (0 when empty).
func spreadOf(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs) - slices.Min(xs)
}

// homeEdges returns member -> the tasks of one kind (stateful or not) it
// holds that have a home elsewhere (home[t] >= 0, p.active[t] != home[t]),
// in task order.
func (p *planner) homeEdges(home []int, stateful bool) [][]int {
	out := make([][]int, len(p.members))
	for t, h := range home {
		if h >= 0 && h != p.active[t] && p.stateful(t) == stateful {
			out[p.active[t]] = append(out[p.active[t]], t)
		}
	}
	return out
}

// sendHome moves task t from its member to home[t], keeping p.load and st.
func (p *planner) sendHome(t int, home, st []int) {
	from, to := p.active[t], home[t]
	p.active[t] = to
	p.load[from]--
	p.load[to]++
	if p.stateful(t) {
		st[from]--
		st[to]++
	}
}

// homeCycle finds one cycle of home moves of one kind of task (each member
// on it gives one task home and receives one of its own: no count changes)
// and applies it. It reports whether it moved anything.
func (p *planner) homeCycle(home, st []int) bool {
	n := len(p.members)
	for _, stateful := range []bool{true, false} {
		out := p.homeEdges(home, stateful)
		state := make([]int8, n) // 0 unvisited, 1 on the DFS stack, 2 done
		via := make([]int, n)    // member -> the task that led to it on the stack
		var cycle []int
		var dfs func(x int) int // returns a member on a cycle found, or -1
		dfs = func(x int) int {
			state[x] = 1
			for _, t := range out[x] {
				y := home[t]
				if state[y] == 1 {
					// Cycle y -> ... -> x -> y: collect its tasks.
					cycle = append(cycle, t)
					for z := x; z != y; z = p.active[via[z]] {
						cycle = append(cycle, via[z])
					}
					return y
				}
				if state[y] == 0 {
					via[y] = t
					if c := dfs(y); c >= 0 {
						return c
					}
				}
			}
			state[x] = 2
			return -1
		}
		for x := range n {
			if state[x] == 0 && dfs(x) >= 0 {
				for _, t := range cycle {
					p.sendHome(t, home, st)
				}
				return true
			}
		}
	}
	return false
}

// homePath finds one shortest path of home moves of one kind of task, from
// a member d to a member r below d in every count the path changes (the
// stateful actives for stateful tasks, and all actives), and applies it. It
// reports whether it moved anything. Roots with the same counts are
// searched together (the acceptance depends only on them).
func (p *planner) homePath(home, st []int) bool {
	n := len(p.members)
	for _, stateful := range []bool{true, false} {
		out := p.homeEdges(home, stateful)
		below := func(d, r int) bool {
			return p.load[d] > p.load[r] && (!stateful || st[d] > st[r])
		}
		done := make([]bool, n)
		for d0 := range n {
			if done[d0] || len(out[d0]) == 0 {
				continue
			}
			via := make([]int, n) // member -> the task moved into it (-1 root, -2 unvisited)
			for i := range via {
				via[i] = -2
			}
			var queue []int
			for d := d0; d < n; d++ {
				if p.load[d] == p.load[d0] && st[d] == st[d0] {
					done[d] = true
					if len(out[d]) > 0 {
						via[d] = -1
						queue = append(queue, d)
					}
				}
			}
			end := -1
			for len(queue) > 0 && end < 0 {
				x := queue[0]
				queue = queue[1:]
				for _, t := range out[x] {
					y := home[t]
					if via[y] != -2 {
						continue
					}
					via[y] = t
					if below(d0, y) {
						end = y
						break
					}
					queue = append(queue, y)
				}
			}
			if end < 0 {
				continue
			}
			var path []int
			for y := end; via[y] != -1; y = p.active[via[y]] {
				path = append(path, via[y])
			}
			// Every edge was read before any move; the members on the path
			// are distinct, so the moves apply in any order.
			for _, t := range path {
				p.sendHome(t, home, st)
			}
			return true
		}
	}
	return false
}

// freeSlot reports whether member h can take one more task, possibly after
// moving one of its tasks to that task's own state holder (recursively).
// Only tasks placed in this pass (movable) may move.
func (p *planner) freeSlot(h int, room func(int) bool, visited, movable []bool) bool {
	if room(h) {
		return true
	}
	for x, m := range p.active {
		if m != h || !movable[x] {
			continue
		}
		for _, h2 := range p.holders[x] {
			if visited[h2] {
				continue
			}
			visited[h2] = true
			if p.freeSlot(h2, room, visited, movable) {
				p.active[x] = h2
				p.load[h2]++
				p.load[h]--
				movable[x] = true
				return true
			}
		}
	}
	return false
}

// balanceActives moves tasks of the current phase (inPhase) until max-min
// load <= 1, one task per step, always from a most-loaded member (a donor
// below the maximum would open a hole that another move must fill: two moves
// for one) to a least-loaded one (the member keeping the fewest previous
// actives first, so that a newcomer receives before an old member). Among
// the candidate tasks it prefers, in order: a donor with many previous
// stateless tasks (pref, stateful phase: it must shed stateful tasks so that
// it keeps its stateless ones), a task the receiver holds state for (no
// restore), a task the donor did not own (cost class 0), then its own or a
// state-backed one (1), a promoted orphan last (2), and the group where the
// donor's surplus over the receiver is largest.
//
// Earlier versions searched chains of state-backed moves (r <- x1 <- d):
// each link saves a restore but pauses one more task; with chains of 2 the
// sequence of bench TestAssignorMoves at P=1024 N=128 R=1 moved 120
// partitions where 88 is the minimum (issue #13 asks for the minimum + 5%).
func (p *planner) balanceActives(gcount [][]int, inPhase []bool, pref []int) {
	n := len(p.members)
	kept := make([]int, n) // member -> previous actives it still holds
	for t, m := range p.active {
		if m >= 0 && p.prevOwn[t] == m {
			kept[m]++
		}
	}
	var lows []int
	for {
		lo, hi := p.load[0], p.load[0]
		for m := range n {
			lo, hi = min(lo, p.load[m]), max(hi, p.load[m])
		}
		if hi-lo <= 1 {
			return
		}
		lows = lows[:0]
		for m := range n {
			if p.load[m] == lo {
				lows = append(lows, m)
			}
		}
		slices.SortStableFunc(lows, func(a, b int) int {
			if kept[a] != kept[b] {
				return kept[a] - kept[b]
			}
			return pref[a] - pref[b]
		})
		moved := false
		for _, r := range lows {
			bestD, bestT := -1, -1
			var bestKey [9]int
			for t, d := range p.active {
				if d < 0 || !inPhase[t] || p.load[d]-p.load[r] <= 1 || !p.eligible(r, t) {
					continue
				}
				gi := p.taskG[t]
				owned := 0
				if p.prevOwn[t] < 0 && p.isHolder(d, t) {
					owned = 2
				} else if p.prevOwn[t] == d || p.isHolder(d, t) {
					owned = 1
				}
				// The receiver's claim: it ran the task before (an earlier
				// generation: it rejoined, or the whole group restarted and
				// d took the task while r was away), it holds state, or
				// nothing. A task going back to its earlier owner comes
				// first: with it the group settles where it was before a
				// whole-group restart (t/meticulous TestWholeGroupRestart).
				back, noState := 1, 1
				if slices.Contains(p.older[t], r) {
					back, noState = 0, 0
				} else if p.prevOwn[t] == r || p.isHolder(r, t) {
					noState = 0
				}
				// The donor gives its most recently acquired task first: a
				// task an earlier owner got back in this plan (p.older) is
				// as old to it as its claim, not a task to pass on (after
				// a restart that would lose the last record of where the
				// task belongs: the receiver reports it from then on).
				key := [9]int{-p.load[d], p.lagging(r, t), -pref[d], back, -int(p.heldSince(d, t)), noState, owned, gcount[gi][r] - gcount[gi][d], t}
				if bestD < 0 || slices.Compare(key[:], bestKey[:]) < 0 {
					bestD, bestT, bestKey = d, t, key
				}
			}
			if bestD >= 0 {
				p.moveActive(bestT, bestD, r, gcount, kept)
				moved = true
				break
			}
		}
		if !moved {
			return // restricted subscriptions: no eligible move
		}
	}
}

func (p *planner) moveActive(t, from, to int, gcount [][]int, kept []int) {
	if p.prevOwn[t] == from {
		kept[from]--
	}
	if p.prevOwn[t] == to {
		kept[to]++
	}
	p.active[t] = to
	p.load[from]--
	p.load[to]++
	gi := p.taskG[t]
	gcount[gi][from]--
	gcount[gi][to]++
}

func (p *planner) isStandby(m, t int) bool { return slices.Contains(p.standby[t], m) }

func (p *planner) assignStandbys() {
	n := len(p.members)
	if n == 0 {
		return
	}
	total := 0
	for t := range p.taskG {
		total += p.groups[p.taskG[t]].replicas
	}
	if total == 0 {
		return
	}
	// Keep: the displaced previous active first (it has the freshest state),
	// then previous standby holders in ID order.
	for t := range p.taskG {
		r := p.groups[p.taskG[t]].replicas
		if r == 0 {
			continue
		}
		var cands []int
		if o := p.prevOwn[t]; o >= 0 && p.active[t] != o {
			cands = append(cands, o)
		}
		cands = append(cands, p.holders[t]...)
		for _, m := range cands {
			if len(p.standby[t]) == r {
				break
			}
			if m == p.active[t] || p.isStandby(m, t) {
				continue
			}
			p.standby[t] = append(p.standby[t], m)
			p.sload[m]++
		}
	}
	// Fill: fewest standbys, then fewest standbys shared with this task's
	// active member (spreads a member's replicas so that its failure is
	// absorbed evenly), then ID rotated by task.
	pair := p.pairs()
	for t := range p.taskG {
		g := p.groups[p.taskG[t]]
		a := p.active[t]
		for len(p.standby[t]) < g.replicas {
			best := -1
			for i := range g.eligible {
				m := g.eligible[(i+t)%len(g.eligible)]
				if m == a || p.isStandby(m, t) {
					continue
				}
				if best < 0 || p.sload[m] < p.sload[best] ||
					(p.sload[m] == p.sload[best] && pair[a][m] < pair[a][best]) {
					best = m
				}
			}
			if best < 0 {
				break
			}
			p.standby[t] = append(p.standby[t], best)
			p.sload[best]++
			pair[a][best]++
		}
	}
	p.balanceStandbys(pair)
	for t := range p.standby {
		slices.Sort(p.standby[t])
	}
}

// pairs returns active member -> standby member -> number of tasks.
func (p *planner) pairs() [][]int {
	pair := make([][]int, len(p.members))
	for i := range pair {
		pair[i] = make([]int, len(p.members))
	}
	for t, ss := range p.standby {
		for _, s := range ss {
			pair[p.active[t]][s]++
		}
	}
	return pair
}

// balanceStandbys brings the standby counts per member to the narrowest
// spread the constraints allow (max-min <= 1 whenever possible, see
// docs/assignment.md). First direct moves from a member two above another
// (preferring a receiver that holds state for the task, then one that spreads
// the active member's replicas); when none is left, augmenting paths: a
// standby moves d -> x1, one of x1's moves x1 -> x2, ..., into r, so that
// only d loses and only r gains. Phase 1 searches from the members with the
// most standbys for one at least two below (lowers the maximum), phase 2
// backwards from those with the fewest for one at least two above (raises
// the minimum). The member counts of standby assignments form the bases of a
// polymatroid (Fujishige, "Submodular Functions and Optimization", on
// lexicographically optimal bases): when neither search finds a path, the
// maximum is the least and the minimum the largest any assignment reaches, so
// the spread is minimal. Paths are shortest (breadth-first), so few standbys
// move.
func (p *planner) balanceStandbys(pair [][]int) {
	n := len(p.members)
	mst := make([][]int, n) // member -> tasks it is a standby of
	for t, ss := range p.standby {
		for _, s := range ss {
			mst[s] = append(mst[s], t)
		}
	}
	move := func(t, d, r int) {
		ss := p.standby[t]
		ss[slices.Index(ss, d)] = r
		p.sload[d]--
		p.sload[r]++
		a := p.active[t]
		pair[a][d]--
		pair[a][r]++
		mst[d] = slices.DeleteFunc(mst[d], func(x int) bool { return x == t })
		mst[r] = append(mst[r], t)
	}
	// canTake: member y may become a standby of t.
	canTake := func(y, t int) bool {
		return y != p.active[t] && !slices.Contains(p.standby[t], y) && !slices.Contains(p.warm[t], y) && p.eligible(y, t)
	}
	order := make([]int, n)
	for {
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(i, j int) bool { return p.sload[order[i]] < p.sload[order[j]] })
		moved := false
	receivers:
		for _, r := range order {
			for k := n - 1; k >= 0; k-- {
				d := order[k]
				if p.sload[d]-p.sload[r] <= 1 {
					break
				}
				bestT, bestScore := -1, 0
				for _, t := range mst[d] {
					if !canTake(r, t) {
						continue
					}
					a := p.active[t]
					score := pair[a][r] - pair[a][d]
					if p.isHolder(r, t) {
						score -= 1 << 30
					}
					if bestT < 0 || score < bestScore || (score == bestScore && t < bestT) {
						bestT, bestScore = t, score
					}
				}
				if bestT < 0 {
					continue
				}
				move(bestT, d, r)
				moved = true
				break receivers
			}
		}
		if moved {
			continue
		}
		if !p.augmentStandbys(mst, canTake, move, false) && !p.augmentStandbys(mst, canTake, move, true) {
			return
		}
	}
}

// augmentStandbys runs one breadth-first search for an augmenting path of
// standby moves and applies it. Forward (raise=false) it starts at the
// members with the most standbys and ends at one at least two below; with
// raise it starts at the members with the fewest and walks backwards to one
// at least two above. It reports whether it moved anything.
func (p *planner) augmentStandbys(mst [][]int, canTake func(y, t int) bool, move func(t, d, r int), raise bool) bool {
	n := len(p.members)
	lo, hi := p.sload[0], p.sload[0]
	for _, l := range p.sload {
		lo, hi = min(lo, l), max(hi, l)
	}
	if hi-lo <= 1 {
		return false
	}
	via := make([]int, n)  // member -> task moved along the edge that reached it (-1 root, -2 unvisited)
	prev := make([]int, n) // member -> the member it was reached from
	for i := range via {
		via[i] = -2
	}
	var queue []int
	for m := range n {
		if (!raise && p.sload[m] == hi) || (raise && p.sload[m] == lo) {
			via[m] = -1
			queue = append(queue, m)
		}
	}
	end := -1
	for len(queue) > 0 && end < 0 {
		x := queue[0]
		queue = queue[1:]
		if !raise {
			// Edge x -> y: x hands one of its standbys t to y.
			for _, t := range mst[x] {
				for _, y := range p.groups[p.taskG[t]].eligible {
					if via[y] != -2 || !canTake(y, t) {
						continue
					}
					via[y], prev[y] = t, x
					if hi-p.sload[y] >= 2 {
						end = y
						break
					}
					queue = append(queue, y)
				}
				if end >= 0 {
					break
				}
			}
			continue
		}
		// Backwards: edge y -> x, y hands one of its standbys t to x.
		for y := range n {
			if via[y] != -2 {
				continue
			}
			for _, t := range mst[y] {
				if canTake(x, t) {
					via[y], prev[y] = t, x
					break
				}
			}
			if via[y] == -2 {
				continue
			}
			if p.sload[y]-lo >= 2 {
				end = y
				break
			}
			queue = append(queue, y)
		}
	}
	if end < 0 {
		return false
	}
	// Every edge was checked on the state before the path; the members on the
	// path are distinct, so the moves are valid in any order. Forward, y
	// receives via[y] from prev[y]; backwards, y gives via[y] to prev[y].
	for y := end; via[y] != -1; y = prev[y] {
		if raise {
			move(via[y], y, prev[y])
		} else {
			move(via[y], prev[y], y)
		}
	}
	return true
}

// lagAware applies KIP-441: an active placed on a member that is not caught up
// goes to a caught-up member instead (the previous owner, then a standby
// holder, then the least lagging); the target gets a warm-up while the budget
// (MaxWarmupReplicas) lasts, else, when the caught-up member was a standby
// holder, the two swap roles. Then the standbys are rebalanced (warm-ups
// stay where they are).
func (p *planner) lagAware() bool {
	if p.c.EndOffsets == nil {
		return false
	}
	budget := p.c.MaxWarmupReplicas
	probe := false
	var refill []int // tasks whose standby holder took the active
	for t := range p.taskG {
		g := p.groups[p.taskG[t]]
		if len(g.changelogs) == 0 {
			continue
		}
		target := p.active[t]
		if p.caughtUp(target, t) {
			continue
		}
		// Preference: the previous owner, then a standby holder, then any
		// caught-up member; ties by smaller lag, then ID.
		best, bestRank := -1, 0
		var bestLag int64
		for _, m := range g.eligible {
			if m == target || !p.caughtUp(m, t) {
				continue
			}
			rank := 2
			if p.prevOwn[t] == m {
				rank = 0
			} else if p.isStandby(m, t) {
				rank = 1
			}
			l := p.lag(m, t)
			if best < 0 || rank < bestRank || (rank == bestRank && l < bestLag) {
				best, bestRank, bestLag = m, rank, l
			}
		}
		if best < 0 {
			continue
		}
		probe = true
		p.active[t] = best
		p.load[target]--
		p.load[best]++
		i := slices.Index(p.standby[t], best)
		switch {
		case budget > 0:
			// The target warms up. A warm-up is not a standby, so that the
			// standby rebalance below cannot move it away: a target that
			// never restores never catches up, and the follow-up plans
			// would keep the active away from it forever.
			p.warm[t] = append(p.warm[t], target)
			budget--
			if i >= 0 {
				p.standby[t] = slices.Delete(p.standby[t], i, i+1)
				p.sload[best]--
				refill = append(refill, t)
			}
		case i >= 0:
			// No warm-up budget left: swap roles (the target restores as a
			// standby, which the rebalance may move; the budgeted tasks
			// make the progress).
			p.standby[t][i] = target
			p.sload[best]--
			p.sload[target]++
		}
	}
	// A caught-up standby holder that took the active leaves its standby
	// slot: the least-loaded member that holds no role for the task takes
	// it. Without one (R' = N-1) the target's warm-up is the task's other
	// replica (it follows the changelog as a standby does, and a removal
	// promotes it the same way) and stays a warm-up: turned into a standby,
	// nothing asked for the follow-up when it caught up, and a worker
	// joining a busy one waited for the probing rebalance (10 min; measured
	// with bench/sidebyside -workloads scaleout).
	for _, t := range refill {
		g := p.groups[p.taskG[t]]
		best := -1
		for k := range g.eligible {
			m := g.eligible[(k+t)%len(g.eligible)]
			if m == p.active[t] || p.isStandby(m, t) || slices.Contains(p.warm[t], m) {
				continue
			}
			if best < 0 || p.sload[m] < p.sload[best] {
				best = m
			}
		}
		if best < 0 {
			continue
		}
		p.standby[t] = append(p.standby[t], best)
		p.sload[best]++
	}
	if probe {
		// Role swaps and moved actives change what each member can hold:
		// bring the standbys back to the narrowest spread these actives allow.
		p.balanceStandbys(p.pairs())
		for t := range p.standby {
			slices.Sort(p.standby[t])
		}
	}
	return probe
}

// withhold marks the tasks that move away from a member owning them now
// (KIP-429 two-phase move: revoke in this generation, assign in the next).
func (p *planner) withhold() {
	p.withheld = make([]bool, len(p.taskG))
	for m, mem := range p.members {
		owned := mem.Owned
		if owned == nil {
			owned = mem.PrevActives
		}
		for _, t := range p.tasksOf(owned) {
			if p.active[t] >= 0 && p.active[t] != m {
				p.withheld[t] = true
			}
		}
	}
}

func addTP(m map[string][]int32, topic string, q int32) {
	m[topic] = append(m[topic], q)
}

func (p *planner) output(needsProbe bool) Plan {
	plan := Plan{Members: make(map[string]MemberPlan, len(p.members)), URLs: map[string]map[int32]string{}, NeedsProbe: needsProbe, Untrusted: p.untrust}
	mps := make([]MemberPlan, len(p.members))
	for i := range mps {
		mps[i] = MemberPlan{Actives: map[string][]int32{}, Standbys: map[string][]int32{}, Warmups: map[string][]int32{}, Globals: map[string][]int32{}, Pending: map[string][]int32{}}
	}
	// Tasks are visited in (group, partition) order, so every slice is sorted.
	for t := range p.taskG {
		g := p.groups[p.taskG[t]]
		q := p.taskP[t]
		a := p.active[t]
		actives := mps[a].Actives
		if p.withheld != nil && p.withheld[t] {
			actives = mps[a].Pending
			plan.Withheld++
		}
		for _, topic := range g.sources {
			addTP(actives, topic, q)
		}
		for _, topic := range g.changelogs {
			if !slices.Contains(g.sources, topic) {
				addTP(actives, topic, q)
			}
			for _, s := range p.standby[t] {
				addTP(mps[s].Standbys, topic, q)
			}
			for _, w := range p.warm[t] {
				addTP(mps[w].Warmups, topic, q)
			}
		}
		for _, topic := range append(slices.Clone(g.sources), g.changelogs...) {
			if plan.URLs[topic] == nil {
				plan.URLs[topic] = map[int32]string{}
			}
			plan.URLs[topic][q] = p.members[a].URL
		}
	}
	for _, topic := range sortedKeys(p.c.Globals) {
		n := p.c.Globals[topic]
		if n <= 0 {
			continue
		}
		all := make([]int32, n)
		for q := range all {
			all[q] = int32(q)
		}
		for i := range mps {
			mps[i].Globals[topic] = slices.Clone(all)
		}
	}
	for i, m := range p.members {
		plan.Members[m.ID] = mps[i]
	}
	return plan
}
