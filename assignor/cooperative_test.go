package assignor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/embedded"
)

// claimTracker records which member runs ConsumeClaim for each partition,
// across all members of one test, and every overlap.
type claimTracker struct {
	mu       sync.Mutex
	running  map[string]string // "topic[p]" -> member
	starts   map[string]int    // "member topic[p]" -> ConsumeClaim calls
	overlaps []string
}

type coopHandler struct {
	id string
	tr *claimTracker
}

func (coopHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (coopHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h coopHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	tp := fmt.Sprintf("%s[%d]", c.Topic(), c.Partition())
	h.tr.mu.Lock()
	if o, ok := h.tr.running[tp]; ok {
		h.tr.overlaps = append(h.tr.overlaps, fmt.Sprintf("%s on %s and %s", tp, o, h.id))
	}
	h.tr.running[tp] = h.id
	h.tr.starts[h.id+" "+tp]++
	h.tr.mu.Unlock()
	defer func() {
		h.tr.mu.Lock()
		if h.tr.running[tp] == h.id {
			delete(h.tr.running, tp)
		}
		h.tr.mu.Unlock()
	}()
	for {
		select {
		case <-s.Context().Done():
			return nil
		case _, ok := <-c.Messages():
			if !ok {
				return nil // revoked (cooperative) or session over
			}
		}
	}
}

func (tr *claimTracker) owners() map[string]string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := map[string]string{}
	for k, v := range tr.running {
		out[k] = v
	}
	return out
}

// TestCooperativeOnKfake: with the cooperative protocol, going from 2 to 3
// members and back to 2 never runs one partition on two members at once, the
// partitions that stay never stop, and moved partitions reach the planned
// member in the follow-up generation.
func TestCooperativeOnKfake(t *testing.T) {
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
	for name, n := range map[string]int32{"events": 6, "clicks": 6, "tbl-changelog": 6} {
		if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: n, ReplicationFactor: 1}, false); err != nil {
			t.Fatal(err)
		}
	}
	tr := &claimTracker{running: map[string]string{}, starts: map[string]int{}}
	type member struct {
		strat  *Strategy
		group  sarama.ConsumerGroup
		cancel context.CancelFunc
		done   chan struct{}
	}
	start := func(id string) *member {
		m := &member{done: make(chan struct{})}
		m.strat = NewStrategy(Config{Changelogs: map[string]int32{"tbl-changelog": 6}, Replicas: 1, Protocol: sarama.RebalanceProtocolCooperative, ProcessID: id})
		cfg := testConfig()
		cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{m.strat}
		g, err := sarama.NewConsumerGroup(b.Addrs(), "runnel-coop-test", cfg)
		if err != nil {
			t.Fatal(err)
		}
		m.group = g
		ctx, cancel := context.WithCancel(context.Background())
		m.cancel = cancel
		go func() {
			defer close(m.done)
			for ctx.Err() == nil {
				if err := g.Consume(ctx, []string{"events", "clicks"}, coopHandler{id, tr}); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
		return m
	}
	stop := func(m *member) {
		m.cancel()
		_ = m.group.Close()
		<-m.done
	}
	// settled waits until the running claims are exactly the source actives
	// of every member's current assignment, nothing pending, all 12 running.
	settled := func(ms map[string]*member) map[string]Assignment {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			run := tr.owners()
			as := map[string]Assignment{}
			ok := len(run) == 12
			gen := int32(-2)
			for id, m := range ms {
				a := m.strat.Current()
				as[id] = a
				if gen == -2 {
					gen = a.Generation
				}
				if len(a.Pending) > 0 || a.Generation < 0 || a.Generation != gen {
					ok = false
				}
				for _, topic := range []string{"events", "clicks"} {
					for _, p := range a.Actives[topic] {
						if run[fmt.Sprintf("%s[%d]", topic, p)] != id {
							ok = false
						}
					}
				}
			}
			if ok {
				return as
			}
		}
		t.Fatalf("group did not settle: running %v", tr.owners())
		return nil
	}
	ms := map[string]*member{"a": start("a"), "b": start("b")}
	defer func() {
		for _, m := range ms {
			stop(m)
		}
	}()
	two := settled(ms)
	ms["c"] = start("c")
	three := settled(ms)
	if n := len(three["c"].Actives["events"]); n != 2 {
		t.Errorf("newcomer c has %d partitions, want 2", n)
	}
	tr.mu.Lock()
	for _, id := range []string{"a", "b"} {
		for _, p := range three[id].Actives["events"] {
			if !slices.Contains(two[id].Actives["events"], p) {
				t.Errorf("%s gained events[%d] when c joined", id, p)
			}
			// A partition that stays on its member was never stopped.
			if n := tr.starts[fmt.Sprintf("%s events[%d]", id, p)]; n != 1 {
				t.Errorf("%s started events[%d] %d times, want 1", id, p, n)
			}
		}
	}
	tr.mu.Unlock()
	stop(ms["c"])
	delete(ms, "c")
	settled(ms)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.overlaps) > 0 {
		t.Errorf("partitions claimed by two members at once: %v", tr.overlaps)
	}
}
