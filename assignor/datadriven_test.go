package assignor

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestSequences runs the assignment sequences kept in testdata/: a group
// that members join, leave and rejoin, with standbys, warm-ups and lag, one
// PlanAssignment per "plan" directive, each fed back to the members as the
// worker would report it in its next subscription. Rewrite the expected
// output with
//
//	go test ./assignor -run TestSequences -rewrite
//
// and read the diff: a changed line is a changed plan.
//
// Directives (a topic list is name:partitions; member IDs sort the output):
//
//	cluster topics=src:12[,b:6] [changelogs=cl:12] [globals=g:2] [replicas=N]
//	        [max-warmups=N] [acceptable-lag=N] [cooperative]
//	    start a new sequence: no members, no previous plan
//	join m00 m01 [topics=a,b]  fresh members (generation -1, URL http://<id>,
//	                           no state); default: every source topic
//	leave m00 m01              members leave (crash or shutdown)
//	end cl=100000              the highwater of every partition of changelog cl
//	offsets m00 m01 cl=99999   the members applied cl up to that offset on
//	                           every partition of cl they hold (previous
//	                           actives, standbys and warm-ups)
//	plan [summary] [show=m00,m01]
//	    plan the group; print every member's share (summary: the spread of
//	    actives and standbys per member, and the members named by show),
//	    whether a probe is needed, the tasks withheld (cooperative), and the
//	    moves: each source partition whose active changed member since the
//	    previous plan, marked "(standby)" when its new owner held a standby
//	    or warm-up of it, and how many standbys sit on a member that did not
//	    hold them in the previous plan. Then feed the plan back (previous actives,
//	    standbys and warm-ups; generation + 1).
func TestSequences(t *testing.T) {
	datadriven.Walk(t, "testdata/sequences", func(t *testing.T, path string) {
		s := &sequence{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out, err := s.run(d)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			return out
		})
	})
}

// sequence is the state of one testdata file.
type sequence struct {
	c       Cluster
	members []Member
	prev    *Plan
}

func (s *sequence) run(d *datadriven.TestData) (string, error) {
	switch d.Cmd {
	case "cluster":
		c := Cluster{Topics: map[string]int32{}, Changelogs: map[string]int32{}, Globals: map[string]int32{}}
		for _, a := range d.CmdArgs {
			var err error
			switch a.Key {
			case "topics":
				err = topicCounts(a.Vals, c.Topics)
			case "changelogs":
				err = topicCounts(a.Vals, c.Changelogs)
			case "globals":
				err = topicCounts(a.Vals, c.Globals)
			case "replicas":
				c.Replicas, err = strconv.Atoi(a.Vals[0])
			case "max-warmups":
				c.MaxWarmupReplicas, err = strconv.Atoi(a.Vals[0])
			case "acceptable-lag":
				c.AcceptableRecoveryLag, err = strconv.ParseInt(a.Vals[0], 10, 64)
			case "cooperative":
				c.Cooperative = true
			default:
				err = fmt.Errorf("unknown argument %q", a.Key)
			}
			if err != nil {
				return "", fmt.Errorf("cluster %s: %w", a.Key, err)
			}
		}
		*s = sequence{c: c}
		return "", nil
	case "join":
		topics := sortedKeys(s.c.Topics)
		var ids []string
		for _, a := range d.CmdArgs {
			switch {
			case a.Key == "topics":
				topics = list(a.Vals)
			case len(a.Vals) == 0:
				ids = append(ids, a.Key)
			default:
				return "", fmt.Errorf("join: unknown argument %q", a.Key)
			}
		}
		for _, id := range ids {
			s.members = append(s.members, Member{ID: id, URL: "http://" + id, Topics: topics, Generation: -1})
		}
		return "", nil
	case "leave":
		for _, a := range d.CmdArgs {
			i := s.index(a.Key)
			if i < 0 {
				return "", fmt.Errorf("leave: no member %s", a.Key)
			}
			s.members = slices.Delete(s.members, i, i+1)
		}
		return "", nil
	case "end":
		if s.c.EndOffsets == nil {
			s.c.EndOffsets = map[string]map[int32]int64{}
		}
		for _, a := range d.CmdArgs {
			n, ok := s.c.Changelogs[a.Key]
			if !ok || len(a.Vals) != 1 {
				return "", fmt.Errorf("end: %s is no changelog=offset", a.Key)
			}
			off, err := strconv.ParseInt(a.Vals[0], 10, 64)
			if err != nil {
				return "", fmt.Errorf("end %s: %w", a.Key, err)
			}
			s.c.EndOffsets[a.Key] = map[int32]int64{}
			for q := range n {
				s.c.EndOffsets[a.Key][q] = off
			}
		}
		return "", nil
	case "offsets":
		var ms []*Member
		type set struct {
			topic string
			off   int64
		}
		var sets []set
		for _, a := range d.CmdArgs {
			if len(a.Vals) == 0 {
				i := s.index(a.Key)
				if i < 0 {
					return "", fmt.Errorf("offsets: no member %s", a.Key)
				}
				ms = append(ms, &s.members[i])
				continue
			}
			off, err := strconv.ParseInt(a.Vals[0], 10, 64)
			if err != nil {
				return "", fmt.Errorf("offsets %s: %w", a.Key, err)
			}
			sets = append(sets, set{a.Key, off})
		}
		for _, m := range ms {
			if m.Offsets == nil {
				m.Offsets = map[string]map[int32]int64{}
			}
			for _, st := range sets {
				if m.Offsets[st.topic] == nil {
					m.Offsets[st.topic] = map[int32]int64{}
				}
				for _, q := range append(slices.Clone(m.PrevActives[st.topic]), m.PrevStandbys[st.topic]...) {
					m.Offsets[st.topic][q] = st.off
				}
			}
		}
		return "", nil
	case "plan":
		return s.plan(d)
	default:
		return "", fmt.Errorf("unknown directive %q", d.Cmd)
	}
}

func (s *sequence) index(id string) int {
	return slices.IndexFunc(s.members, func(m Member) bool { return m.ID == id })
}

// list returns an argument's values, split at commas too (datadriven
// splits only "(a, b)").
func list(vals []string) []string {
	var out []string
	for _, v := range vals {
		out = append(out, strings.Split(v, ",")...)
	}
	return out
}

func topicCounts(vals []string, into map[string]int32) error {
	for _, v := range list(vals) {
		name, n, ok := strings.Cut(v, ":")
		if !ok {
			return fmt.Errorf("%q is not topic:partitions", v)
		}
		k, err := strconv.ParseInt(n, 10, 32)
		if err != nil {
			return fmt.Errorf("%q: %w", v, err)
		}
		into[name] = int32(k)
	}
	return nil
}

func (s *sequence) plan(d *datadriven.TestData) (string, error) {
	summary := d.HasArg("summary")
	var show []string
	if a, ok := d.Arg("show"); ok {
		show = list(a.Vals)
	}
	c := s.c
	c.Members = s.members
	p, err := PlanAssignment(c)
	if err != nil {
		return fmt.Sprintf("error: %v\n", err), nil
	}
	var b strings.Builder
	ids := sortedKeys(p.Members)
	if summary {
		fmt.Fprintf(&b, "members: %d\n", len(ids))
		alo, ahi := spread(p, func(mp MemberPlan) map[string][]int32 { return mp.Actives }, sortedKeys(s.c.Topics))
		slo, shi := spread(p, func(mp MemberPlan) map[string][]int32 { return mp.Standbys }, nil)
		fmt.Fprintf(&b, "actives per member: %d..%d\nstandbys per member: %d..%d\n", alo, ahi, slo, shi)
		for _, id := range show {
			fmt.Fprintf(&b, "%s: %s\n", id, share(p.Members[id]))
		}
	} else {
		for _, id := range ids {
			fmt.Fprintf(&b, "%s: %s\n", id, share(p.Members[id]))
		}
		if bad := s.wrongURLs(p); bad != "" {
			fmt.Fprintf(&b, "urls: %s\n", bad)
		}
	}
	fmt.Fprintf(&b, "probe: %s\n", map[bool]string{false: "no", true: "yes"}[p.NeedsProbe])
	if s.c.Cooperative {
		fmt.Fprintf(&b, "withheld: %d\n", p.Withheld)
	}
	if len(p.Untrusted) > 0 {
		fmt.Fprintf(&b, "untrusted: %s\n", strings.Join(p.Untrusted, " "))
	}
	if s.prev != nil {
		b.WriteString(s.moves(p))
	}
	s.members = feedBack(s.members, p)
	s.prev = &p
	return b.String(), nil
}

// share renders one member's plan: each non-empty kind as topic:partitions.
func share(mp MemberPlan) string {
	var parts []string
	for _, k := range []struct {
		name string
		tp   map[string][]int32
	}{{"actives", mp.Actives}, {"pending", mp.Pending}, {"standbys", mp.Standbys}, {"warmups", mp.Warmups}, {"globals", mp.Globals}} {
		if len(k.tp) == 0 {
			continue
		}
		var ts []string
		for _, t := range sortedKeys(k.tp) {
			ts = append(ts, t+":"+ranges(k.tp[t]))
		}
		parts = append(parts, k.name+" "+strings.Join(ts, " "))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " | ")
}

// ranges renders sorted partitions as "0-3,7,9-10".
func ranges(ps []int32) string {
	ps = slices.Sorted(slices.Values(ps))
	var out []string
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if j == i {
			out = append(out, strconv.Itoa(int(ps[i])))
		} else {
			out = append(out, fmt.Sprintf("%d-%d", ps[i], ps[j]))
		}
		i = j + 1
	}
	return strings.Join(out, ",")
}

// spread returns the fewest and most partitions of the given topics (nil:
// all) per member.
func spread(p Plan, of func(MemberPlan) map[string][]int32, topics []string) (lo, hi int) {
	first := true
	for _, mp := range p.Members {
		n := 0
		for t, ps := range of(mp) {
			if topics == nil || slices.Contains(topics, t) {
				n += len(ps)
			}
		}
		if first || n < lo {
			lo = n
		}
		if first || n > hi {
			hi = n
		}
		first = false
	}
	return lo, hi
}

// wrongURLs lists the partitions whose URL is not their active owner's, or
// the actives without a URL ("" when every one is right).
func (s *sequence) wrongURLs(p Plan) string {
	var bad []string
	for id, mp := range p.Members {
		for t, ps := range mp.Actives {
			for _, q := range ps {
				if got := p.URLs[t][q]; got != "http://"+id {
					bad = append(bad, fmt.Sprintf("%s[%d]=%q want %q", t, q, got, "http://"+id))
				}
			}
		}
	}
	sort.Strings(bad)
	return strings.Join(bad, " ")
}

// moves lists the source partitions whose active member changed since the
// previous plan.
func (s *sequence) moves(p Plan) string {
	owner := func(p Plan) map[string]map[int32]string {
		o := map[string]map[int32]string{}
		for id, mp := range p.Members {
			for t, ps := range mp.Actives {
				if _, ok := s.c.Topics[t]; !ok {
					continue
				}
				if o[t] == nil {
					o[t] = map[int32]string{}
				}
				for _, q := range ps {
					o[t][q] = id
				}
			}
		}
		return o
	}
	before, after := owner(*s.prev), owner(p)
	var out []string
	for _, t := range sortedKeys(s.c.Topics) {
		for q := range s.c.Topics[t] {
			from, to := before[t][q], after[t][q]
			if from == to {
				continue
			}
			line := fmt.Sprintf("  %s[%d] %s -> %s", t, q, or(from, "none"), or(to, "none"))
			if i := s.index(to); i >= 0 && heldStandby(s.members[i], t, q, s.c) {
				line += " (standby)"
			}
			out = append(out, line)
		}
	}
	res := "moves: none\n"
	if len(out) > 0 {
		res = fmt.Sprintf("moves: %d\n%s\n", len(out), strings.Join(out, "\n"))
	}
	changed := 0
	for id, mp := range p.Members {
		old := s.prev.Members[id]
		for _, t := range sortedKeys(s.c.Changelogs) {
			for _, q := range mp.Standbys[t] {
				if !slices.Contains(old.Standbys[t], q) {
					changed++
				}
			}
		}
	}
	return res + fmt.Sprintf("standbys placed anew: %d\n", changed)
}

// heldStandby reports whether m (as it joined this plan) held a standby or
// warm-up of a changelog co-partitioned with topic t's partition q.
func heldStandby(m Member, t string, q int32, c Cluster) bool {
	for cl, n := range c.Changelogs {
		if n == c.Topics[t] && slices.Contains(m.PrevStandbys[cl], q) {
			return true
		}
	}
	return false
}

func or(s, dflt string) string {
	if s == "" {
		return dflt
	}
	return s
}
