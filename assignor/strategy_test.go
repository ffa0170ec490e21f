package assignor

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/embedded"
)

// groupMember is one sarama consumer-group member using a Strategy.
type groupMember struct {
	id     string
	strat  *Strategy
	group  sarama.ConsumerGroup
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	claims map[string][]int32 // from the last Setup
	gen    int32
	seen   []Assignment // every OnAssignment
}

type handler struct{ m *groupMember }

func (h handler) Setup(s sarama.ConsumerGroupSession) error {
	h.m.mu.Lock()
	h.m.claims = s.Claims()
	h.m.gen = s.GenerationID()
	h.m.mu.Unlock()
	return nil
}
func (h handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h handler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for {
		select {
		case <-s.Context().Done():
			return nil
		case _, ok := <-c.Messages():
			if !ok {
				return nil
			}
		}
	}
}

func testConfig() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_6_0_0
	cfg.Consumer.Group.Session.Timeout = 3 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 100 * time.Millisecond
	cfg.Consumer.Group.Rebalance.Timeout = 5 * time.Second
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	return cfg
}

func startMember(t *testing.T, addrs []string, id string, sc Config) *groupMember {
	t.Helper()
	m := &groupMember{id: id, done: make(chan struct{})}
	sc.URL = "http://" + id
	sc.ProcessID = id
	sc.OnAssignment = func(a Assignment) {
		m.mu.Lock()
		m.seen = append(m.seen, a)
		m.mu.Unlock()
	}
	m.strat = NewStrategy(sc)
	cfg := testConfig()
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{m.strat}
	g, err := sarama.NewConsumerGroup(addrs, "runnel-assignor-test", cfg)
	if err != nil {
		t.Fatal(err)
	}
	m.group = g
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{"events", "clicks"}, handler{m}); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
				t.Logf("%s consume: %v", id, err)
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	return m
}

func (m *groupMember) stop() {
	m.cancel()
	_ = m.group.Close()
	<-m.done
}

// TestStrategyOnKfake runs 3 then 2 sarama members in one process against the
// embedded broker: each member's OnAssignment carries exactly its share of the
// plan, the sarama claims are the plan's source partitions, standbys are
// reported, and after a member leaves its actives go to their standby holders.
func TestStrategyOnKfake(t *testing.T) {
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	admin, err := sarama.NewClusterAdmin(b.Addrs(), testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for name, n := range map[string]int32{"events": 6, "clicks": 6, "tbl-changelog": 6, "g-changelog": 2} {
		if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: n, ReplicationFactor: 1}, false); err != nil {
			t.Fatal(err)
		}
	}
	sc := Config{Changelogs: map[string]int32{"tbl-changelog": 6}, Globals: map[string]int32{"g-changelog": 2}, Replicas: 1}
	ms := []*groupMember{startMember(t, b.Addrs(), "a", sc), startMember(t, b.Addrs(), "b", sc), startMember(t, b.Addrs(), "c", sc)}
	defer func() {
		for _, m := range ms {
			m.stop()
		}
	}()

	// settled waits until every member is set up in one generation with
	// claims equal to the source topics of its last OnAssignment.
	settled := func(ms []*groupMember, after int32) map[string]Assignment {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			out := map[string]Assignment{}
			gen := int32(-2)
			ok := true
			for _, m := range ms {
				m.mu.Lock()
				if len(m.seen) == 0 {
					ok = false
					m.mu.Unlock()
					break
				}
				last := m.seen[len(m.seen)-1]
				if gen == -2 {
					gen = m.gen
				}
				src := map[string][]int32{}
				for _, tp := range []string{"events", "clicks"} {
					if ps := last.Actives[tp]; len(ps) > 0 {
						src[tp] = ps
					}
				}
				claims := map[string][]int32{}
				for tp, ps := range m.claims {
					if len(ps) > 0 {
						claims[tp] = ps
					}
				}
				if m.gen != gen || m.gen <= after || last.Generation != gen || !reflect.DeepEqual(claims, src) {
					ok = false
				}
				out[last.MemberID] = last
				m.mu.Unlock()
			}
			if ok && len(out) == len(ms) {
				return out
			}
		}
		t.Fatal("group did not settle")
		return nil
	}

	check := func(as map[string]Assignment, n int) {
		t.Helper()
		leaders := 0
		actives := map[int32]string{}
		standbys := map[int32]int{}
		for id, a := range as {
			if a.Leader {
				leaders++
			}
			if !reflect.DeepEqual(a.Actives["events"], a.Actives["clicks"]) || !reflect.DeepEqual(a.Actives["events"], a.Actives["tbl-changelog"]) {
				t.Errorf("%s not co-partitioned: %v", id, a.Actives)
			}
			if len(a.Actives["events"]) != 6/n {
				t.Errorf("%s has %v, want %d partitions", id, a.Actives["events"], 6/n)
			}
			if !reflect.DeepEqual(a.Globals["g-changelog"], []int32{0, 1}) {
				t.Errorf("%s globals %v", id, a.Globals)
			}
			for _, p := range a.Actives["events"] {
				if prev, dup := actives[p]; dup {
					t.Errorf("partition %d active on %s and %s", p, prev, id)
				}
				actives[p] = id
				if a.URLs["events"][p] == "" {
					t.Errorf("no URL for events[%d]", p)
				}
			}
			for _, p := range a.Standbys["tbl-changelog"] {
				if slices.Contains(a.Actives["tbl-changelog"], p) {
					t.Errorf("%s: active and standby of %d", id, p)
				}
				standbys[p]++
			}
		}
		if leaders != 1 {
			t.Errorf("%d leaders", leaders)
		}
		if len(actives) != 6 {
			t.Errorf("actives %v", actives)
		}
		for p := range int32(6) {
			if standbys[p] != 1 {
				t.Errorf("partition %d has %d standbys", p, standbys[p])
			}
		}
		// URLs agree with the actives everywhere.
		for _, a := range as {
			for p, owner := range actives {
				if a.URLs["events"][p] != as[owner].URLs["events"][p] {
					t.Errorf("URL maps differ for %d", p)
				}
			}
		}
	}

	three := settled(ms, -1)
	check(three, 3)
	byName := map[string]string{} // strategy member -> member ID
	for _, m := range ms {
		byName[m.id] = m.strat.Current().MemberID
	}
	// Stop c: its actives must go to their standby holders.
	gone := three[byName["c"]]
	ms[2].stop()
	ms = ms[:2]
	two := settled(ms, three[byName["a"]].Generation)
	check(two, 2)
	for _, p := range gone.Actives["events"] {
		for id, a := range two {
			if slices.Contains(a.Actives["events"], p) && !slices.Contains(three[id].Standbys["tbl-changelog"], p) {
				t.Errorf("partition %d went to %s, which had no standby", p, id)
			}
		}
	}
	for _, m := range ms {
		id := byName[m.id]
		for _, p := range three[id].Actives["events"] {
			if !slices.Contains(two[id].Actives["events"], p) {
				t.Errorf("%s lost partition %d", m.id, p)
			}
		}
	}
}
