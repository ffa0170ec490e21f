package assignor

import (
	"io"
	"log/slog"
	"maps"
	"reflect"
	"sync"
	"testing"

	"github.com/IBM/sarama"
)

func TestCaughtUpWarmups(t *testing.T) {
	warm := map[string][]int32{"cl": {1, 4}, "cl2": {0}}
	end := map[string]map[int32]int64{"cl": {1: 20000, 4: 500}, "cl2": {}}
	offs := map[string]map[int32]int64{"cl": {1: 5000}}
	// cl[1]: lag 14 999 > 10 000; cl[4]: nothing applied, lag 500; cl2[0]: highwater unknown.
	if got := CaughtUpWarmups(warm, offs, end, 0); !reflect.DeepEqual(got, map[string][]int32{"cl": {4}}) {
		t.Fatalf("caught up %v, want cl[4]", got)
	}
	offs["cl"][1] = 9999
	if got := CaughtUpWarmups(warm, offs, end, 0); !reflect.DeepEqual(got, map[string][]int32{"cl": {1, 4}}) {
		t.Fatalf("caught up %v, want cl[1,4]", got)
	}
	if got := CaughtUpWarmups(warm, offs, end, -1); len(got) != 0 {
		t.Fatalf("acceptable lag 0: caught up %v", got)
	}
}

// A member whose warm-up caught up asks for the follow-up rebalance at once,
// once per generation.
func TestCheckWarmupsSignalsOnce(t *testing.T) {
	var mu sync.Mutex
	applied := int64(0)
	s := NewStrategy(Config{
		Changelogs: map[string]int32{"cl": 4},
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		Offsets: func() map[string]map[int32]int64 {
			mu.Lock()
			defer mu.Unlock()
			return map[string]map[int32]int64{"cl": {2: applied}}
		},
		EndOffsets: func(topics map[string]int32) map[string]map[int32]int64 {
			if !reflect.DeepEqual(topics, map[string]int32{"cl": 4}) {
				t.Errorf("EndOffsets(%v)", topics)
			}
			return map[string]map[int32]int64{"cl": {2: 50000}}
		},
	})
	s.mu.Lock()
	s.cur = Assignment{Generation: 3, Warmups: map[string][]int32{"cl": {2}}}
	s.mu.Unlock()
	if s.CheckWarmups() {
		t.Fatal("signalled while 49 999 behind")
	}
	mu.Lock()
	applied = 45000
	mu.Unlock()
	if !s.CheckWarmups() {
		t.Fatal("no signal once caught up")
	}
	select {
	case <-s.ProbeRequested():
	default:
		t.Fatal("ProbeRequested not signalled")
	}
	if s.CheckWarmups() {
		t.Fatal("signalled twice in one generation")
	}
}

// A restarted member reports its persisted assignment in its first join.
func TestRestoreReportsPersistedState(t *testing.T) {
	s := NewStrategy(Config{Changelogs: map[string]int32{"cl": 4}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	prev := Assignment{Generation: 9, Leader: true, MemberID: "old-id",
		Actives: map[string][]int32{"src": {1}, "cl": {1}}, Pending: map[string][]int32{"src": {2}, "cl": {2}},
		Standbys: map[string][]int32{"cl": {0}}, Warmups: map[string][]int32{"cl": {3}}}
	if !s.Restore(prev) || s.Restore(prev) {
		t.Fatal("Restore must take the first persisted assignment only")
	}
	ud, err := s.SubscriptionUserData([]string{"src"})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := decodeSubscription(ud)
	if err != nil {
		t.Fatal(err)
	}
	if sub.Generation != 9 || !reflect.DeepEqual(sub.PrevActives, map[string][]int32{"src": {1, 2}, "cl": {1, 2}}) ||
		!reflect.DeepEqual(sub.PrevStandbys, map[string][]int32{"cl": {0, 3}}) {
		t.Fatalf("subscription after Restore: %+v", sub)
	}
	if c := s.Current(); c.Generation != -1 || len(c.Actives) != 0 {
		t.Fatalf("Current after Restore: %+v, want nothing assigned yet", c)
	}
}

// Since survives a restart and counts only unbroken tenure: a restored
// member that receives its old active plus a new one reports the old one
// since its generation before the restart and the new one since the new
// generation; an active it lost and got back starts again.
func TestSinceTracksTenure(t *testing.T) {
	s := NewStrategy(Config{Changelogs: map[string]int32{"cl": 4}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	s.Restore(Assignment{Generation: 9, Actives: map[string][]int32{"src": {1}, "cl": {1}},
		Since: map[string]map[int32]int32{"src": {1: 4}, "cl": {1: 4}}})
	assign := func(gen int32, ps ...int32) {
		s.OnAssignment(&sarama.ConsumerGroupMemberAssignment{UserData: encodeAssignment(assignmentData{
			Generation: gen, MemberID: "m", Actives: map[string][]int32{"src": ps, "cl": ps}})}, gen)
	}
	assign(12, 1, 2)
	want := map[string]map[int32]int32{"src": {1: 4, 2: 12}, "cl": {1: 4, 2: 12}}
	if got := s.Current().Since; !reflect.DeepEqual(got, want) {
		t.Fatalf("since after the first assignment: %v, want %v", got, want)
	}
	ud, err := s.SubscriptionUserData([]string{"src"})
	if err != nil {
		t.Fatal(err)
	}
	// The subscription carries only what is older than its generation.
	if sub, err := decodeSubscription(ud); err != nil || !reflect.DeepEqual(sub.Since, map[string]map[int32]int32{"src": {1: 4}, "cl": {1: 4}}) {
		t.Fatalf("subscription since: %v %v", sub.Since, err)
	}
	assign(13, 2)
	assign(14, 1, 2)
	want = map[string]map[int32]int32{"src": {1: 14, 2: 12}, "cl": {1: 14, 2: 12}}
	if got := s.Current().Since; !reflect.DeepEqual(got, want) {
		t.Fatalf("since after losing and regaining partition 1: %v, want %v", got, want)
	}
}

// After a restart a member claims back, as Assignment.Earlier and in its
// subscription (v4), the restored actives (pending included) it does not
// hold, at the generation it held them, until it holds them again or it
// has been through EarlierClaimGenerations settled generations (follow-ups
// of plans that needed a probe do not count) or EarlierClaimMaxAge have
// passed; a restart in between keeps them.
func TestEarlierClaimsAfterRestore(t *testing.T) {
	newStrategy := func() *Strategy {
		return NewStrategy(Config{Changelogs: map[string]int32{"cl": 8}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	}
	s := newStrategy()
	s.Restore(Assignment{Generation: 9, Actives: map[string][]int32{"src": {1, 2, 3}, "cl": {1, 2, 3}},
		Pending: map[string][]int32{"src": {4}, "cl": {4}}})
	assign := func(s *Strategy, gen int32, ps ...int32) {
		s.OnAssignment(&sarama.ConsumerGroupMemberAssignment{UserData: encodeAssignment(assignmentData{
			Generation: gen, MemberID: "m", Actives: map[string][]int32{"src": ps, "cl": ps}})}, gen)
	}
	claims := func(g int32, ps ...int32) map[string]map[int32]int32 {
		if len(ps) == 0 {
			return nil
		}
		m := map[int32]int32{}
		for _, p := range ps {
			m[p] = g
		}
		return map[string]map[int32]int32{"src": m, "cl": maps.Clone(m)}
	}
	check := func(s *Strategy, step string, want map[string]map[int32]int32) {
		t.Helper()
		if got := s.Current().Earlier; !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: Earlier %v, want %v", step, got, want)
		}
		ud, err := s.SubscriptionUserData([]string{"src"})
		if err != nil {
			t.Fatal(err)
		}
		if sub, err := decodeSubscription(ud); err != nil || !reflect.DeepEqual(sub.Earlier, want) {
			t.Fatalf("%s: subscription Earlier %v (%v), want %v", step, sub.Earlier, err, want)
		}
	}
	assign(s, 12, 1)
	check(s, "first assignment", claims(9, 2, 3, 4))
	assign(s, 13, 1, 2)
	check(s, "2 given back", claims(9, 3, 4))
	assign(s, 14, 2)
	check(s, "1 taken away again", claims(9, 1, 3, 4))
	// Restarted again: the persisted Earlier ones stay claimed at 9, the
	// persisted actives are claimed at 14.
	s2 := newStrategy()
	s2.Restore(s.Current())
	assign(s2, 16, 3)
	want := claims(9, 1, 4)
	want["src"][2], want["cl"][2] = 14, 14
	check(s2, "after a second restart", want)
	// Generations whose plan needed a probe (KIP-441 follow-ups giving
	// partitions back as warm-ups catch up) do not count, however many.
	gen := int32(16)
	for range 3 * EarlierClaimGenerations {
		gen++
		s2.OnAssignment(&sarama.ConsumerGroupMemberAssignment{UserData: encodeAssignment(assignmentData{
			Generation: gen, MemberID: "m", Probe: true, Actives: map[string][]int32{"src": {3}, "cl": {3}}})}, gen)
	}
	check(s2, "after follow-ups", want)
	// Settled ones do: the first (gen 16) and EarlierClaimGenerations-1
	// more keep the claims, the next drops them all.
	for range EarlierClaimGenerations - 1 {
		gen++
		assign(s2, gen, 3)
	}
	check(s2, "after EarlierClaimGenerations settled generations", want)
	gen++
	assign(s2, gen, 3)
	check(s2, "all expired", nil)

	// A claim older than EarlierClaimMaxAge generations is dropped at once.
	s3 := newStrategy()
	s3.Restore(s.Current())
	assign(s3, 14+EarlierClaimMaxAge, 3)
	want = claims(9, 1, 4)
	want["src"][2], want["cl"][2] = 14, 14
	delete(want["src"], 1)
	delete(want["src"], 4)
	delete(want["cl"], 1)
	delete(want["cl"], 4)
	check(s3, "generation 9 older than EarlierClaimMaxAge", want)
}

// A pending active (cooperative) counts as held from the plan that gave it:
// a restored member that gets its old active back as pending first keeps
// its tenure from before the restart, and a new one dates from the plan
// that made it pending, not from the follow-up that assigns it.
func TestSinceCoversPending(t *testing.T) {
	s := NewStrategy(Config{Changelogs: map[string]int32{"cl": 4}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	s.Restore(Assignment{Generation: 9, Actives: map[string][]int32{"src": {1}, "cl": {1}},
		Since: map[string]map[int32]int32{"src": {1: 4}, "cl": {1: 4}}})
	s.OnAssignment(&sarama.ConsumerGroupMemberAssignment{UserData: encodeAssignment(assignmentData{
		Generation: 12, MemberID: "m", Pending: map[string][]int32{"src": {1, 2}, "cl": {1, 2}}})}, 12)
	want := map[string]map[int32]int32{"src": {1: 4, 2: 12}, "cl": {1: 4, 2: 12}}
	if got := s.Current().Since; !reflect.DeepEqual(got, want) {
		t.Fatalf("since with both pending: %v, want %v", got, want)
	}
	s.OnAssignment(&sarama.ConsumerGroupMemberAssignment{UserData: encodeAssignment(assignmentData{
		Generation: 13, MemberID: "m", Actives: map[string][]int32{"src": {1, 2}, "cl": {1, 2}}})}, 13)
	if got := s.Current().Since; !reflect.DeepEqual(got, want) {
		t.Fatalf("since once assigned: %v, want %v", got, want)
	}
}
