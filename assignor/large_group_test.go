package assignor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// TestLargeGroup (opt-in: RUNNEL_LARGE_GROUP=1; issue #13) runs 64 sarama
// members in one process over one 4096-partition topic with 3 co-partitioned
// tables (R=2) and waits until every member holds its share in one
// generation: the leader's plan, the assignments (URL map left out: 64
// copies exceed the default budget) and sarama's SyncGroup complete at this
// size. On kfake (default; ~5 s, ~20 s with -race) the group's record size is
// not limited; with RUNNEL_KAFKA_BROKERS set it runs on real Kafka, which
// stores the assignments in one __consumer_offsets record under
// message.max.bytes.
func TestLargeGroup(t *testing.T) {
	if os.Getenv("RUNNEL_LARGE_GROUP") == "" {
		t.Skip("set RUNNEL_LARGE_GROUP=1 (64 members, 4096 partitions, about a minute)")
	}
	const members, parts = 64, 4096
	addrs := testbroker.Brokers(t)
	admin, err := sarama.NewClusterAdmin(addrs, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	events := testbroker.Topic(t, "events")
	changelogs := map[string]int32{}
	topics := map[string]int32{events: parts}
	for i := range 3 {
		cl := testbroker.Topic(t, fmt.Sprintf("t%d-changelog", i))
		changelogs[cl] = parts
		topics[cl] = parts
	}
	group := testbroker.Topic(t, "group")
	for name, n := range topics {
		if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: n, ReplicationFactor: 1}, false); err != nil {
			t.Fatal(err)
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	type member struct {
		mu     sync.Mutex
		gen    int32
		claims int
		last   Assignment
	}
	ms := make([]*member, members)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for i := range ms {
		m := &member{}
		ms[i] = m
		st := NewStrategy(Config{Changelogs: changelogs, Replicas: 2, Logger: quiet,
			URL: fmt.Sprintf("http://worker-%02d.runnel.example.com:6066", i),
			OnAssignment: func(a Assignment) {
				m.mu.Lock()
				m.last = a
				m.mu.Unlock()
			}})
		cfg := testConfig()
		cfg.Consumer.Group.Session.Timeout = 30 * time.Second
		cfg.Consumer.Group.Heartbeat.Interval = time.Second
		cfg.Consumer.Group.Rebalance.Timeout = 60 * time.Second
		cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{st}
		g, err := sarama.NewConsumerGroup(addrs, group, cfg)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer g.Close()
			h := largeHandler{setup: func(s sarama.ConsumerGroupSession) {
				n := 0
				for _, ps := range s.Claims() {
					n += len(ps)
				}
				m.mu.Lock()
				m.gen, m.claims = s.GenerationID(), n
				m.mu.Unlock()
			}}
			for ctx.Err() == nil {
				if err := g.Consume(ctx, []string{events}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	start := time.Now()
	deadline := start.Add(3 * time.Minute)
	for {
		time.Sleep(500 * time.Millisecond)
		gen, ok, total := int32(-1), true, 0
		for _, m := range ms {
			m.mu.Lock()
			if gen == -1 {
				gen = m.gen
			}
			if m.gen != gen || m.last.Generation != gen || len(m.last.Actives[events]) != m.claims || m.claims != parts/members {
				ok = false
			}
			total += m.claims
			m.mu.Unlock()
		}
		if ok && total == parts {
			t.Logf("%d members settled on %d partitions in generation %d after %v", members, parts, gen, time.Since(start).Round(time.Millisecond))
			if !ms[0].last.URLsOmitted {
				t.Error("URL map sent to 64 members of 4096 partitions and 4 topics")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("group did not settle in 3 minutes (generation %d, %d partitions claimed)", gen, total)
		}
	}
}

type largeHandler struct {
	setup func(sarama.ConsumerGroupSession)
}

func (h largeHandler) Setup(s sarama.ConsumerGroupSession) error { h.setup(s); return nil }
func (largeHandler) Cleanup(sarama.ConsumerGroupSession) error   { return nil }
func (largeHandler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	<-s.Context().Done()
	return nil
}
