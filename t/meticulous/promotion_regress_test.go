package meticulous

import (
	"fmt"
	"slices"
	"testing"

	"github.com/runnel-dev/runnel/assignor"
)

// Found by TestAssignmentProperties (seed 605367156586382394): 20 members, 3
// partitions, 5 standby replicas; remove 8 members, then 8 more. Every active
// is orphaned and member-012 is the only surviving standby holder of both
// partitions 1 and 2. Balance (3 actives on 4 members: one each) lets it take
// only one of them, so the other goes to a member without state; partition 0,
// whose holders survive, is promoted.
func TestPromotionWhenOneSurvivorHoldsTwoOrphans(t *testing.T) {
	topics := map[string]int32{"s0a": 3}
	cls := map[string]int32{"t0-changelog": 3}
	var ms []assignor.Member
	for i := range 20 {
		ms = append(ms, assignor.Member{ID: fmt.Sprintf("member-%03d", i), Topics: []string{"s0a"}, Generation: -1})
	}
	planAndApply := func() assignor.Plan {
		p, err := assignor.PlanAssignment(assignor.Cluster{Members: slices.Clone(ms), Topics: topics, Changelogs: cls, Replicas: 5})
		if err != nil {
			t.Fatal(err)
		}
		for i := range ms {
			mp := p.Members[ms[i].ID]
			ms[i].PrevActives, ms[i].PrevStandbys = mp.Actives, mp.Standbys
			ms[i].Generation++
		}
		return p
	}
	planAndApply()
	ms = ms[8:]
	before := planAndApply()
	var keep []assignor.Member
	for i, m := range ms {
		if !slices.Contains([]int{0, 1, 2, 3, 5, 6, 7, 11}, i) {
			keep = append(keep, m)
		}
	}
	ms = keep // member-012, 016, 017, 018 survive
	after := planAndApply()

	holders := func(q int32) []string {
		var out []string
		for _, m := range ms {
			if slices.Contains(before.Members[m.ID].Standbys["t0-changelog"], q) {
				out = append(out, m.ID)
			}
		}
		return out
	}
	if h1, h2 := holders(1), holders(2); !slices.Equal(h1, []string{"member-012"}) || !slices.Equal(h2, []string{"member-012"}) {
		t.Fatalf("scenario changed: surviving holders of 1 and 2 are %v and %v, want only member-012", h1, h2)
	}
	owner := map[int32]string{}
	for _, m := range ms {
		acts := after.Members[m.ID].Actives["t0-changelog"]
		if len(acts) > 1 {
			t.Fatalf("%s has %d actives, balance allows 1", m.ID, len(acts))
		}
		for _, q := range acts {
			owner[q] = m.ID
		}
	}
	if len(owner) != 3 {
		t.Fatalf("actives %v, want all 3 partitions", owner)
	}
	if owner[1] != "member-012" && owner[2] != "member-012" {
		t.Errorf("neither orphan 1 nor 2 promoted to their only holder member-012: %v", owner)
	}
	if !slices.Contains(holders(0), owner[0]) {
		t.Errorf("partition 0 went to %s, not to one of its holders %v", owner[0], holders(0))
	}
}
