package testbroker_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/internal/testbroker"
)

func TestTopicNames(t *testing.T) {
	a := testbroker.Topic(t, "in.put_x")
	b := testbroker.Topic(t, "in.put_x")
	if a == b {
		t.Fatalf("two calls gave the same name %q", a)
	}
	valid := regexp.MustCompile(`^[a-zA-Z0-9-]+$`)
	for _, n := range []string{a, b} {
		if !valid.MatchString(n) {
			t.Errorf("%q has characters outside [a-zA-Z0-9-]", n)
		}
		if !strings.HasPrefix(n, "in-put-x-TestTopicNames-") {
			t.Errorf("%q does not start with base and test name", n)
		}
	}
	t.Run("sub/test with spaces and a very long name "+strings.Repeat("x", 200), func(t *testing.T) {
		n := testbroker.Topic(t, "base")
		if len(n) > 160 || !valid.MatchString(n) {
			t.Fatalf("subtest topic %q (%d chars) invalid", n, len(n))
		}
	})
}

func TestSaramaConfig(t *testing.T) {
	c := testbroker.SaramaConfig(t)
	if c.Consumer.Group.Session.Timeout != 3*time.Second ||
		c.Consumer.Group.Heartbeat.Interval != 100*time.Millisecond ||
		c.Consumer.Group.Rebalance.Timeout != 5*time.Second ||
		c.Consumer.MaxWaitTime != 100*time.Millisecond {
		t.Fatalf("timeouts: session %s heartbeat %s rebalance %s maxwait %s",
			c.Consumer.Group.Session.Timeout, c.Consumer.Group.Heartbeat.Interval,
			c.Consumer.Group.Rebalance.Timeout, c.Consumer.MaxWaitTime)
	}
	// Both tiers speak at least Kafka 4.0's client APIs (kfake: 4.1; Kafka 4.4: sarama's max).
	if !c.Version.IsAtLeast(sarama.V4_0_0_0) {
		t.Fatalf("detected version %s, want ≥ 4.0", c.Version)
	}
	t.Logf("real=%v version=%s", testbroker.Real(), c.Version)
}

// collector is a ConsumerGroupHandler that records every message and marks it consumed.
type collector struct {
	mu   sync.Mutex
	got  map[int32][]*sarama.ConsumerMessage
	n    int
	want int
	done chan struct{}
}

func (c *collector) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (c *collector) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (c *collector) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		s.MarkMessage(m, "")
		c.mu.Lock()
		c.got[m.Partition] = append(c.got[m.Partition], m)
		c.n++
		if c.n == c.want {
			close(c.done)
		}
		c.mu.Unlock()
	}
	return nil
}

// TestGroupRoundTrip proves the tier: create a topic, produce keyed records, consume them
// with a consumer group, and read the group's committed offsets back. It runs on kfake by
// default and on real Kafka with RUNNEL_KAFKA_BROKERS.
func TestGroupRoundTrip(t *testing.T) {
	start := time.Now()
	addrs := testbroker.Brokers(t)
	conf := testbroker.SaramaConfig(t)
	conf.Consumer.Offsets.AutoCommit.Interval = 100 * time.Millisecond
	topic := testbroker.Topic(t, "roundtrip")
	group := testbroker.Topic(t, "group")
	const partitions, records = 4, 200

	admin, err := sarama.NewClusterAdmin(addrs, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() { _ = admin.DeleteTopic(topic) })
	ready := time.Now()

	prod, err := sarama.NewSyncProducer(addrs, conf)
	if err != nil {
		t.Fatal(err)
	}
	wantByKey := map[string][]string{}
	keyPart := map[string]int32{}
	for i := range records {
		k, v := fmt.Sprintf("k%d", i%10), fmt.Sprintf("v%03d", i)
		// A freshly created topic may briefly have no leader on real Kafka; the
		// producer's retries (3 × 100 ms) cover it.
		p, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(v)})
		if err != nil {
			t.Fatalf("produce %d: %v", i, err)
		}
		if old, ok := keyPart[k]; ok && old != p {
			t.Fatalf("key %s went to partitions %d and %d", k, old, p)
		}
		keyPart[k] = p
		wantByKey[k] = append(wantByKey[k], v)
	}
	if err := prod.Close(); err != nil {
		t.Fatal(err)
	}
	produced := time.Now()

	cg, err := sarama.NewConsumerGroup(addrs, group, conf)
	if err != nil {
		t.Fatal(err)
	}
	h := &collector{got: map[int32][]*sarama.ConsumerMessage{}, want: records, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	consumed := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if err := cg.Consume(ctx, []string{topic}, h); err != nil {
				consumed <- err
				return
			}
		}
		consumed <- nil
	}()
	select {
	case <-h.done:
	case err := <-consumed:
		cancel()
		t.Fatalf("consume: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("consumed %d of %d records in 30 s", h.n, records)
	}
	got := time.Now()
	cancel()
	if err := <-consumed; err != nil {
		t.Fatalf("consume: %v", err)
	}
	if err := cg.Close(); err != nil { // commits the marked offsets
		t.Fatalf("close group: %v", err)
	}

	// Every key's values arrive in produce order, from the partition the producer saw.
	gotByKey := map[string][]string{}
	for p, ms := range h.got {
		for i, m := range ms {
			if m.Offset != int64(i) {
				t.Fatalf("partition %d: record %d has offset %d", p, i, m.Offset)
			}
			if keyPart[string(m.Key)] != p {
				t.Fatalf("key %s read from partition %d, produced to %d", m.Key, p, keyPart[string(m.Key)])
			}
			gotByKey[string(m.Key)] = append(gotByKey[string(m.Key)], string(m.Value))
		}
	}
	for k, want := range wantByKey {
		if strings.Join(gotByKey[k], ",") != strings.Join(want, ",") {
			t.Fatalf("key %s: got %v, want %v", k, gotByKey[k], want)
		}
	}

	// The group's committed offset of each partition is its record count (next to read).
	offs, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0, 1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	for p := int32(0); p < partitions; p++ {
		b := offs.GetBlock(topic, p)
		if b == nil || b.Err != sarama.ErrNoError {
			t.Fatalf("committed offset of %s[%d]: %+v", topic, p, b)
		}
		if b.Offset != int64(len(h.got[p])) {
			t.Fatalf("committed offset of %s[%d] = %d, want %d", topic, p, b.Offset, len(h.got[p]))
		}
	}
	t.Logf("real=%v version=%s: setup %s, produce %d %s, group consume %s, total %s",
		testbroker.Real(), conf.Version, ready.Sub(start).Round(time.Millisecond), records,
		produced.Sub(ready).Round(time.Millisecond), got.Sub(produced).Round(time.Millisecond),
		time.Since(start).Round(time.Millisecond))
}
