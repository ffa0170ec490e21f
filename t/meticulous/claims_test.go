package meticulous

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
	"pgregory.net/rapid"
)

// TestForgedGenerationGainsNothing (issue #13): a member that claims a
// generation above the group's (corrupt or foreign state, a restored data
// dir of another group incarnation) is planned exactly as if its claims were
// from generation -1, the lowest rank: forging gains no partition. It is
// listed in Plan.Untrusted; honest members never are.
func TestForgedGenerationGainsNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		w := genWorld(t)
		p := plan(t, w.cluster())
		w.apply(p)
		if len(w.members) < 2 {
			t.Skip("needs two members")
		}
		i := rapid.IntRange(0, len(w.members)-1).Draw(t, "forger")
		forged := rapid.Int32Range(w.gen+1, math.MaxInt32).Draw(t, "generation")
		// The forger claims partitions of other members too.
		claims := map[string][]int32{}
		for g, ts := range w.groups {
			n := w.topics[w.reps[g]]
			if n == 0 {
				continue
			}
			qs := rapid.SliceOfDistinct(rapid.Int32Range(0, n-1), rapid.ID[int32]).Draw(t, fmt.Sprintf("claims%d", g))
			for _, topic := range ts {
				claims[topic] = qs
			}
		}
		w.members[i].PrevActives = claims
		honest := w.cluster()
		honest.Generation = w.gen
		honest.Members[i].Generation = -1
		w.members[i].Generation = forged
		c := w.cluster()
		c.Generation = w.gen
		got, want := plan(t, c), plan(t, honest)
		if !reflect.DeepEqual(got.Members, want.Members) {
			t.Fatalf("forged generation %d changed the plan", forged)
		}
		if !slices.Equal(got.Untrusted, []string{w.members[i].ID}) || len(want.Untrusted) != 0 {
			t.Fatalf("Untrusted %v (honest plan: %v), want [%s]", got.Untrusted, want.Untrusted, w.members[i].ID)
		}
	})
}

// TestMutatedUserDataNeverTrusted (issue #13): a member's subscription user
// data with any mutation (flipped bits, overwritten, truncated or appended
// bytes) is planned as a member without state, exactly as if it sent none:
// the checksum rejects it before any field is read.
func TestMutatedUserDataNeverTrusted(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rapid.Check(t, func(t *rapid.T) {
		changelogs := map[string]int32{"t-changelog": 8}
		leader := assignor.NewStrategy(assignor.Config{Changelogs: changelogs, Replicas: 1, Logger: quiet})
		ms := []*assignor.Strategy{leader}
		for range 2 {
			ms = append(ms, assignor.NewStrategy(assignor.Config{Changelogs: changelogs, Replicas: 1, Logger: quiet, URL: "http://x"}))
		}
		topics := map[string][]int32{"s": {0, 1, 2, 3, 4, 5, 6, 7}}
		meta := map[string]sarama.ConsumerGroupMemberMetadata{}
		round := func(gen int32) sarama.BalanceStrategyPlan {
			for i, s := range ms {
				ud, err := s.SubscriptionUserData([]string{"s"})
				if err != nil {
					t.Fatal(err)
				}
				meta[fmt.Sprint("m", i)] = sarama.ConsumerGroupMemberMetadata{Topics: []string{"s"}, UserData: ud}
			}
			p, err := leader.Plan(meta, topics)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range ms {
				id := fmt.Sprint("m", i)
				data, err := leader.AssignmentData(id, p[id], gen)
				if err != nil {
					t.Fatal(err)
				}
				s.OnAssignment(&sarama.ConsumerGroupMemberAssignment{Topics: p[id], UserData: data}, gen)
			}
			return p
		}
		round(1)
		round(2)
		for i, s := range ms {
			ud, _ := s.SubscriptionUserData([]string{"s"})
			meta[fmt.Sprint("m", i)] = sarama.ConsumerGroupMemberMetadata{Topics: []string{"s"}, UserData: ud}
		}
		victim := fmt.Sprint("m", rapid.IntRange(1, 2).Draw(t, "victim"))
		good := meta[victim].UserData
		bad := slices.Clone(good)
		switch rapid.IntRange(0, 3).Draw(t, "mutation") {
		case 0:
			for _, bit := range rapid.SliceOfNDistinct(rapid.IntRange(0, len(bad)*8-1), 1, 8, rapid.ID[int]).Draw(t, "bits") {
				bad[bit/8] ^= 1 << (bit % 8)
			}
		case 1:
			at := rapid.IntRange(0, len(bad)-1).Draw(t, "at")
			bad[at] = rapid.Byte().Filter(func(b byte) bool { return b != good[at] }).Draw(t, "byte")
		case 2:
			bad = bad[:rapid.IntRange(0, len(bad)-1).Draw(t, "length")]
		default:
			bad = append(bad, rapid.SliceOfN(rapid.Byte(), 1, 8).Draw(t, "tail")...)
		}
		withBad := map[string]sarama.ConsumerGroupMemberMetadata{}
		without := map[string]sarama.ConsumerGroupMemberMetadata{}
		for id, m := range meta {
			withBad[id], without[id] = m, m
		}
		withBad[victim] = sarama.ConsumerGroupMemberMetadata{Topics: []string{"s"}, UserData: bad}
		without[victim] = sarama.ConsumerGroupMemberMetadata{Topics: []string{"s"}}
		p1, err1 := leader.Plan(withBad, topics)
		p2, err2 := leader.Plan(without, topics)
		if err1 != nil || err2 != nil || !reflect.DeepEqual(p1, p2) {
			t.Fatalf("mutated user data changed the plan: %v vs %v (%v, %v)", p1, p2, err1, err2)
		}
	})
}
