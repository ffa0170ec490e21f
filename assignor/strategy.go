package assignor

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// StrategyName is the group protocol name Runnel members announce.
const StrategyName = "runnel"

// DefaultProbingRebalanceInterval is KIP-441's probing.rebalance.interval.ms
// default (10 minutes).
const DefaultProbingRebalanceInterval = 10 * time.Minute

// EarlierClaimGenerations is for how many settled generations after its
// return a restarted member keeps claiming the actives of its persisted
// assignment that it has not been given back (Assignment.Earlier): the
// leader gives each back to it where the balance allows, so that a group
// restarted as a whole, whatever order its members rejoin in, ends where it
// was (docs/assignment.md, Restarts). A generation is settled when its plan
// needed no probe: the KIP-441 follow-ups, one per MaxWarmupReplicas
// partitions the members lag on, each giving partitions back once their
// warm-ups caught up, do not count, however many a large restart takes
// (with 32 generations counted from the one before the restart, a restart
// lagging on more than about 60 partitions lost the claims midway). A
// restart whose members rejoin in b batches takes b generations, 2b under
// the cooperative protocol (a moving partition is revoked in one and
// assigned in the next); 32 leaves room for that and bounds how long a
// claim that can no longer be honoured (the group came back with other
// members) may still pull a partition back when the balance allows. The
// generations before the member's return do not count either; a claim
// older than EarlierClaimMaxAge generations is dropped in any case.
const EarlierClaimGenerations = 32

// EarlierClaimMaxAge bounds Assignment.Earlier whatever the follow-ups: a
// claim of a partition held more than this many generations ago is dropped
// (32 × EarlierClaimGenerations: a restart giving back 2 partitions per
// follow-up, MaxWarmupReplicas' default, can return about 2000).
const EarlierClaimMaxAge = 32 * EarlierClaimGenerations

// DefaultMaxURLMapBytes is the default Config.MaxURLMapBytes: 256 KiB of URL
// maps over all members' assignments, a quarter of the broker's default
// message.max.bytes (1 MiB), leaving the rest to the assignments proper.
const DefaultMaxURLMapBytes = 256 << 10

// Config configures a Strategy. Changelogs, Globals and Replicas must be the
// same on every member (the leader's values are used).
type Config struct {
	// Changelogs maps table changelog topic -> partition count.
	Changelogs map[string]int32
	// Globals maps global-table changelog topic -> partition count.
	Globals map[string]int32
	// Replicas is the number of standby replicas per changelog partition.
	Replicas int
	// AcceptableRecoveryLag (offsets) is KIP-441's acceptable.recovery.lag:
	// a member whose changelog lag for a task is at most this is caught up
	// and may take its active; 0 means DefaultAcceptableRecoveryLag (10 000),
	// negative means 0. Used by the leader (Plan) and by CheckWarmups.
	AcceptableRecoveryLag int64
	// MaxWarmupReplicas is KIP-441's max.warmup.replicas: how many warm-up
	// replicas one plan may place at most (each a restore on the balanced
	// target of an active kept on a caught-up member); 0 means
	// DefaultMaxWarmupReplicas (2).
	MaxWarmupReplicas int
	// ProbingRebalanceInterval is KIP-441's probing.rebalance.interval.ms:
	// how long the leader waits after a plan with warm-ups before it asks for
	// a rebalance (ProbeRequested); 0 means 10 minutes. A warm-up that caught
	// up earlier triggers the rebalance at once (WarmupsCaughtUp).
	ProbingRebalanceInterval time.Duration
	// MaxURLMapBytes bounds what the partition -> URL map may add to the
	// group's assignments in total (its encoded size times the number of
	// members): Kafka stores a classic group's assignments in one record of
	// __consumer_offsets, which must stay below the broker's message.max.bytes
	// (1 MiB by default). Above the bound the leader leaves the map out
	// (Assignment.URLsOmitted) and members derive it with URLsFromGroup.
	// 0 means DefaultMaxURLMapBytes; negative means always leave it out.
	MaxURLMapBytes int
	// Protocol is the rebalance protocol the Strategy announces:
	// sarama.RebalanceProtocolCooperative (incremental, KIP-429: partitions
	// that do not move keep running; a moving partition is revoked in one
	// generation and assigned in the next) or sarama.RebalanceProtocolEager
	// (the zero value: every member revokes everything on each rebalance).
	// Every member of a group must use the same protocol.
	Protocol sarama.RebalanceProtocol
	// ProcessID and URL identify this member (URL serves interactive queries).
	ProcessID, URL string
	// Offsets returns changelog topic -> partition -> last locally applied
	// offset. Called from SubscriptionUserData, before every JoinGroup; may be nil.
	Offsets func() map[string]map[int32]int64
	// EndOffsets returns the highwaters of the given changelog topics
	// (topic -> partition count). Called on the leader inside Plan, and by
	// CheckWarmups on a member with warm-ups; may be nil (lag unknown, no
	// warm-ups).
	EndOffsets func(topics map[string]int32) map[string]map[int32]int64
	// OnAssignment is called from sarama's OnAssignment with this member's new
	// assignment; it must return promptly.
	OnAssignment func(Assignment)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
}

// Assignment is what a member received for one generation. Maps are topic ->
// sorted partitions.
type Assignment struct {
	Generation         int32
	MemberID, LeaderID string
	Leader             bool
	// Actives include the changelog partitions co-partitioned with the source
	// partitions; Standbys and Warmups are changelog partitions to replicate;
	// Globals are all partitions of the global-table changelogs.
	Actives, Standbys, Warmups, Globals map[string][]int32
	// Pending (cooperative protocol) are actives planned for this member but
	// withheld until their current owner revoked them; the next generation
	// assigns them.
	Pending map[string][]int32
	// URLs maps topic -> partition -> URL of the member holding the active.
	// Empty when URLsOmitted.
	URLs map[string]map[int32]string
	// URLsOmitted reports that the leader left the URL map out of the
	// assignments (it would have exceeded Config.MaxURLMapBytes): fill URLs
	// from a DescribeGroups response with URLsFromGroup.
	URLsOmitted bool
	// Since maps topic -> partition -> the generation since which this
	// member has held that active (or pending active) without a break
	// (kept by the Strategy across OnAssignment calls and restarts,
	// Restore; reported to the leader as Member.Since).
	Since map[string]map[int32]int32
	// Earlier maps topic -> partition -> generation: the actives of the
	// assignment this member persisted before a restart (Restore) that it
	// does not hold now, and the generation it held them at, for
	// EarlierClaimGenerations settled generations after its return (at
	// most EarlierClaimMaxAge after that one). It reports them
	// to the leader (subscription v4, Member.Earlier): a partition the
	// first plans after the restart gave to another member is then still
	// known to be this member's when the whole group is back.
	Earlier map[string]map[int32]int32
}

// Strategy is Runnel's sarama.BalanceStrategy (also SubscriptionUserData-,
// OnAssignment- and RebalanceProtocolBalanceStrategy). One Strategy serves one
// consumer group member; it is safe for concurrent use.
//
// Sarama v1.61.1 calls, on every member: SubscriptionUserData before each
// JoinGroup (twice on the first join, KIP-394); on the leader only: Plan, then
// AssignmentData once per member of the plan; on every member: OnAssignment
// after a SyncGroup response that carried an assignment.
type Strategy struct {
	cfg      Config
	log      *slog.Logger
	instance uint64
	probe    chan struct{}

	mu        sync.Mutex // guards the fields below
	cur       Assignment
	planned   map[string]assignmentData // leader: member -> data from the last Plan
	planProbe bool                      // leader: the last Plan needs a probing rebalance
	claimed   map[string]int32          // leader: member -> generation claimed in the last Plan's input
	groupGen  int32                     // highest generation seen from the coordinator (OnAssignment, AssignmentData); -1 none
	restored  *Assignment               // from Restore: reported by SubscriptionUserData until the first OnAssignment
	// home maps topic -> partition -> generation: the actives of the
	// restored assignment (and its Earlier ones), claimed back in
	// Assignment.Earlier while not held, until the member has been through
	// EarlierClaimGenerations settled generations (settled) or
	// EarlierClaimMaxAge have passed since the generation each was held at
	// (then dropped).
	home map[string]map[int32]int32
	// settled counts the generations since Restore whose plan needed no
	// probe (assignment data without the probe flag).
	settled int32
	// warmSignalled is the generation for which CheckWarmups last signalled
	// (-2 never): one follow-up rebalance per generation.
	warmSignalled int32
	probeTimer    *time.Timer
}

var (
	_ sarama.BalanceStrategy                     = (*Strategy)(nil)
	_ sarama.SubscriptionUserDataBalanceStrategy = (*Strategy)(nil)
	_ sarama.OnAssignmentBalanceStrategy         = (*Strategy)(nil)
	_ sarama.RebalanceProtocolBalanceStrategy    = (*Strategy)(nil)
)

// NewStrategy returns a Strategy for one member.
func NewStrategy(cfg Config) *Strategy {
	if cfg.ProbingRebalanceInterval <= 0 {
		cfg.ProbingRebalanceInterval = DefaultProbingRebalanceInterval
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Strategy{
		cfg:      cfg,
		log:      log,
		instance: binary.LittleEndian.Uint64(b[:]),
		probe:    make(chan struct{}, 1),
		cur:      Assignment{Generation: -1},
		groupGen: -1,

		warmSignalled: -2,
	}
}

// Name implements sarama.BalanceStrategy; it returns "runnel".
func (s *Strategy) Name() string { return StrategyName }

// SupportedProtocols implements sarama.RebalanceProtocolBalanceStrategy: the
// configured protocol only (Config.Protocol), so that sarama runs exactly it.
func (s *Strategy) SupportedProtocols() []sarama.RebalanceProtocol {
	if s.cfg.Protocol == sarama.RebalanceProtocolCooperative {
		return []sarama.RebalanceProtocol{sarama.RebalanceProtocolCooperative}
	}
	return []sarama.RebalanceProtocol{sarama.RebalanceProtocolEager}
}

// Current returns the last assignment received (Generation -1 before the first).
func (s *Strategy) Current() Assignment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneAssignment(s.cur)
}

// ProbeRequested delivers a value when the group should rebalance again: this
// member, as leader, planned warm-ups and the probing interval has passed
// (KIP-441 probing rebalance), or it found a member claiming a generation
// the coordinator has not reached (its claims were trusted in the plan; the
// follow-up plan bounds them). The caller should end the group session so
// that the member rejoins.
func (s *Strategy) ProbeRequested() <-chan struct{} { return s.probe }

func (s *Strategy) requestProbe() {
	select {
	case s.probe <- struct{}{}:
	default:
	}
}

// SubscriptionUserData implements sarama.SubscriptionUserDataBalanceStrategy:
// it reports the previous assignment (warm-ups as standbys) and the local
// changelog offsets.
func (s *Strategy) SubscriptionUserData(topics []string) ([]byte, error) {
	s.mu.Lock()
	cur := s.cur
	if cur.Generation == -1 && s.restored != nil {
		cur = *s.restored
	}
	s.mu.Unlock()
	// Pending actives are reported as actives: the leader keeps them on this
	// member (they were planned here; their old owner has revoked them).
	actives := cloneTP(cur.Actives)
	for t, ps := range cur.Pending {
		actives[t] = append(actives[t], ps...)
	}
	standbys := map[string][]int32{}
	for t, ps := range cur.Standbys {
		standbys[t] = append(standbys[t], ps...)
	}
	for t, ps := range cur.Warmups {
		standbys[t] = append(standbys[t], ps...)
	}
	var offsets map[string]map[int32]int64
	if s.cfg.Offsets != nil {
		offsets = s.cfg.Offsets()
	}
	return encodeSubscription(subscription{
		Instance:     s.instance,
		ProcessID:    s.cfg.ProcessID,
		URL:          s.cfg.URL,
		Generation:   cur.Generation,
		PrevActives:  actives,
		PrevStandbys: standbys,
		Offsets:      offsets,
		Since:        cur.Since,
		Earlier:      cur.Earlier,
	}), nil
}

// Plan implements sarama.BalanceStrategy (leader only). A member whose user
// data does not decode is planned as a member without state (and logged).
// The returned plan holds only subscribed source topics and every member.
func (s *Strategy) Plan(members map[string]sarama.ConsumerGroupMemberMetadata, topics map[string][]int32) (sarama.BalanceStrategyPlan, error) {
	c := Cluster{
		Topics:                map[string]int32{},
		Changelogs:            s.cfg.Changelogs,
		Globals:               s.cfg.Globals,
		Replicas:              s.cfg.Replicas,
		AcceptableRecoveryLag: s.cfg.AcceptableRecoveryLag,
		MaxWarmupReplicas:     s.cfg.MaxWarmupReplicas,
		Cooperative:           s.cfg.Protocol == sarama.RebalanceProtocolCooperative,
	}
	s.mu.Lock()
	c.Generation = s.groupGen
	s.mu.Unlock()
	claimed := map[string]int32{}
	for t, ps := range topics {
		c.Topics[t] = int32(len(ps))
	}
	leaderID := ""
	ids := slices.Sorted(maps.Keys(members))
	for _, id := range ids {
		meta := members[id]
		m := Member{ID: id, Topics: meta.Topics, Generation: -1}
		if c.Cooperative {
			// KIP-429: what the member consumes now, from the JoinGroup
			// subscription (sarama sends its held claims).
			m.Owned = map[string][]int32{}
			for _, op := range meta.OwnedPartitions {
				if op != nil {
					m.Owned[op.Topic] = append(m.Owned[op.Topic], op.Partitions...)
				}
			}
		}
		if len(meta.UserData) > 0 {
			sub, err := decodeSubscription(meta.UserData)
			if err != nil {
				// Foreign (another assignor's), corrupt (checksum) or
				// malformed: planned as a member without state, never half-read.
				s.log.Warn("runnel assignor: member state ignored", "member", id, "err", err,
					"foreign", errors.Is(err, ErrForeign), "corrupt", errors.Is(err, ErrChecksum))
			} else {
				claimed[id] = sub.Generation
				m.ProcessID, m.URL, m.Generation = sub.ProcessID, sub.URL, sub.Generation
				m.PrevActives, m.PrevStandbys, m.Offsets, m.Since = sub.PrevActives, sub.PrevStandbys, sub.Offsets, sub.Since
				m.Earlier = sub.Earlier
				if sub.Instance == s.instance {
					leaderID = id
				}
			}
		}
		c.Members = append(c.Members, m)
	}
	if s.cfg.EndOffsets != nil && len(s.cfg.Changelogs) > 0 {
		c.EndOffsets = s.cfg.EndOffsets(s.cfg.Changelogs)
	}
	plan, err := PlanAssignment(c)
	if err != nil {
		return nil, fmt.Errorf("runnel assignor plan: %w", err)
	}
	for _, id := range plan.Untrusted {
		s.log.Warn("runnel assignor: member claims a generation above the group's; its claims ranked lowest",
			"member", id, "claimed", claimed[id], "generation", c.Generation)
	}
	// The URL map goes to every member: leave it out when all copies would
	// exceed the budget (members derive it, URLsFromGroup).
	budget := s.cfg.MaxURLMapBytes
	if budget == 0 {
		budget = DefaultMaxURLMapBytes
	}
	ue := &encoder{}
	ue.urls(plan.URLs)
	omitURLs := budget < 0 || len(ue.b)*len(ids) > budget
	if omitURLs {
		s.log.Debug("runnel assignor: URL map left out of the assignments", "bytes", len(ue.b), "members", len(ids), "budget", budget)
	}
	out := make(sarama.BalanceStrategyPlan, len(ids))
	planned := make(map[string]assignmentData, len(ids))
	for _, id := range ids {
		mp := plan.Members[id]
		tps := map[string][]int32{}
		for t, ps := range mp.Actives {
			if _, subscribed := topics[t]; subscribed {
				tps[t] = slices.Clone(ps)
			}
		}
		out[id] = tps // every member, even with nothing (docs/kafka-compat.md #2)
		planned[id] = assignmentData{
			MemberID: id, LeaderID: leaderID, Probe: plan.NeedsProbe,
			Actives: mp.Actives, Standbys: mp.Standbys, Warmups: mp.Warmups, Globals: mp.Globals,
			URLs: plan.URLs, Pending: mp.Pending, URLsOmitted: omitURLs,
		}
		if omitURLs {
			d := planned[id]
			d.URLs = nil
			planned[id] = d
		}
	}
	s.mu.Lock()
	s.planned = planned
	s.planProbe = plan.NeedsProbe
	s.claimed = claimed
	s.mu.Unlock()
	s.log.Debug("runnel assignor planned", "members", len(ids), "probe", plan.NeedsProbe, "withheld", plan.Withheld)
	return out, nil
}

// AssignmentData implements sarama.BalanceStrategy (leader only): the encoded
// assignment of memberID from the last Plan.
func (s *Strategy) AssignmentData(memberID string, topics map[string][]int32, generationID int32) ([]byte, error) {
	s.mu.Lock()
	a, ok := s.planned[memberID]
	// Here the leader learns the generation the plan is for: a legitimate
	// claim is from an earlier one. A claim at or above it was trusted by
	// this plan (the leader knew no bound yet); ask for a follow-up plan,
	// which bounds it by generationID.
	bogus := ok && s.claimed[memberID] >= generationID
	s.groupGen = max(s.groupGen, generationID)
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("runnel assignor: no plan for member %s", memberID)
	}
	if bogus {
		s.log.Warn("runnel assignor: member claimed a generation the group has not reached; requesting a follow-up rebalance",
			"member", memberID, "generation", generationID)
		s.requestProbe()
	}
	a.Generation = generationID
	return encodeAssignment(a), nil
}

// OnAssignment implements sarama.OnAssignmentBalanceStrategy. Without
// decodable Runnel user data (an empty assignment, or a garbled one) the
// member takes the Kafka-level topics as its actives.
func (s *Strategy) OnAssignment(assignment *sarama.ConsumerGroupMemberAssignment, generationID int32) {
	var a Assignment
	data, err := decodeAssignment(assignment.UserData)
	settled := err != nil || !data.Probe
	if err != nil {
		if len(assignment.UserData) > 0 {
			s.log.Warn("runnel assignor: assignment user data ignored", "generation", generationID, "err", err)
		}
		a = Assignment{Generation: generationID, Actives: map[string][]int32{}}
		for t, ps := range assignment.Topics {
			ps = slices.Clone(ps)
			sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
			a.Actives[t] = ps
		}
	} else {
		a = Assignment{
			Generation: generationID, MemberID: data.MemberID, LeaderID: data.LeaderID,
			Leader:  data.LeaderID != "" && data.LeaderID == data.MemberID,
			Actives: data.Actives, Standbys: data.Standbys, Warmups: data.Warmups, Globals: data.Globals,
			URLs: data.URLs, Pending: data.Pending, URLsOmitted: data.URLsOmitted,
		}
	}
	if a.URLs == nil {
		a.URLs = map[string]map[int32]string{}
	}
	s.mu.Lock()
	prev := s.cur
	if prev.Generation == -1 && s.restored != nil {
		prev = *s.restored
	}
	a.Since = heldSince(prev, a, generationID)
	if settled && len(s.home) > 0 {
		s.settled++
	}
	a.Earlier = s.earlierClaims(a, generationID)
	s.cur = a
	s.groupGen = max(s.groupGen, generationID)
	if s.probeTimer != nil {
		s.probeTimer.Stop()
		s.probeTimer = nil
	}
	if a.Leader && s.planProbe {
		s.probeTimer = time.AfterFunc(s.cfg.ProbingRebalanceInterval, s.requestProbe)
	}
	s.mu.Unlock()
	if s.cfg.OnAssignment != nil {
		s.cfg.OnAssignment(cloneAssignment(a))
	}
}

// heldSince returns Assignment.Since for a, received in generation gen by a
// member whose previous assignment was prev: an active or pending active
// it already held (prev's actives or pending ones) keeps its generation
// (prev.Since, else prev.Generation), a new one gets gen. Pending actives
// count as held from the plan that gave them (cooperative: the member
// reports them as actives), so that a partition given back to a restarted
// member as pending keeps its tenure from before the restart.
func heldSince(prev, a Assignment, gen int32) map[string]map[int32]int32 {
	out := make(map[string]map[int32]int32, len(a.Actives))
	for _, tps := range []map[string][]int32{a.Actives, a.Pending} {
		for t, ps := range tps {
			if out[t] == nil {
				out[t] = make(map[int32]int32, len(ps))
			}
			for _, p := range ps {
				g := gen
				if (slices.Contains(prev.Actives[t], p) || slices.Contains(prev.Pending[t], p)) && prev.Generation >= 0 {
					g = prev.Generation
					if v, ok := prev.Since[t][p]; ok && v < g {
						g = v
					}
				}
				out[t][p] = g
			}
		}
	}
	return out
}

// earlierClaims returns Assignment.Earlier for a, received in generation
// gen: the partitions of s.home that a neither holds nor has pending. It
// first drops from s.home everything once the member has been through more
// than EarlierClaimGenerations settled generations since its return, and
// what was held more than EarlierClaimMaxAge generations ago or at or above
// gen (a data dir of an earlier incarnation of the group, whose generations
// started again). Called with s.mu held.
func (s *Strategy) earlierClaims(a Assignment, gen int32) map[string]map[int32]int32 {
	var out map[string]map[int32]int32
	for t, ps := range s.home {
		for p, g := range ps {
			if g >= gen || gen-g > EarlierClaimMaxAge || s.settled > EarlierClaimGenerations {
				delete(ps, p)
				continue
			}
			if slices.Contains(a.Actives[t], p) || slices.Contains(a.Pending[t], p) {
				continue
			}
			if out == nil {
				out = map[string]map[int32]int32{}
			}
			if out[t] == nil {
				out[t] = map[int32]int32{}
			}
			out[t][p] = g
		}
		if len(ps) == 0 {
			delete(s.home, t)
		}
	}
	return out
}

func cloneTP(m map[string][]int32) map[string][]int32 {
	out := make(map[string][]int32, len(m))
	for t, ps := range m {
		out[t] = slices.Clone(ps)
	}
	return out
}

func cloneAssignment(a Assignment) Assignment {
	a.Actives, a.Standbys, a.Warmups, a.Globals = cloneTP(a.Actives), cloneTP(a.Standbys), cloneTP(a.Warmups), cloneTP(a.Globals)
	a.Pending = cloneTP(a.Pending)
	urls := make(map[string]map[int32]string, len(a.URLs))
	for t, m := range a.URLs {
		urls[t] = maps.Clone(m)
	}
	a.URLs = urls
	a.Since = cloneGens(a.Since)
	if a.Earlier != nil {
		a.Earlier = cloneGens(a.Earlier)
	}
	return a
}

// cloneGens deep-copies a topic -> partition -> generation map.
func cloneGens(m map[string]map[int32]int32) map[string]map[int32]int32 {
	out := make(map[string]map[int32]int32, len(m))
	for t, ps := range m {
		out[t] = maps.Clone(ps)
	}
	return out
}

// Restore seeds the member's previous assignment before its first join, from
// state the worker persisted in its data dir (the Assignment of its last
// OnAssignment): SubscriptionUserData then reports its actives, pending
// actives, standbys and warm-ups with their generation, so that after a
// restart the member gets its partitions back instead of joining as a
// newcomer; from its first assignment on it reports the restored actives it
// does not hold (Assignment.Earlier), for EarlierClaimGenerations settled
// generations (those whose plan needed no probe), so that the leader still
// knows them once the whole group is back, however many warm-up follow-ups
// that takes. Current is not affected (the member holds
// nothing until the group assigns it). Only the first call before any
// OnAssignment has an effect; it
// reports whether the state was taken. The leader ranks the claims like any
// other: an older generation loses to the current owner, a generation above
// the group's (a data dir of an earlier incarnation of the group) is not
// trusted (Cluster.Generation).
func (s *Strategy) Restore(a Assignment) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur.Generation != -1 || a.Generation < 0 || s.restored != nil {
		return false
	}
	a = cloneAssignment(a)
	a.Leader, a.LeaderID, a.MemberID = false, "", ""
	s.restored = &a
	// Home: what the member held before the restart, claimed back from
	// the first assignment on (Assignment.Earlier); the restored Earlier
	// ones too (a restart during the last one's settling).
	s.home = cloneGens(a.Earlier)
	for _, m := range []map[string][]int32{a.Actives, a.Pending} {
		for t, ps := range m {
			if s.home[t] == nil {
				s.home[t] = map[int32]int32{}
			}
			for _, p := range ps {
				s.home[t][p] = a.Generation
			}
		}
	}
	return true
}
