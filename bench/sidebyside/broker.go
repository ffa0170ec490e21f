package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/twmb/franz-go/pkg/kgo"
)

// broker is the Kafka cluster one run uses: a fresh kfake per run (so memory
// does not grow over the rounds), or an external broker (real Kafka) shared
// by every run, whose topics are named per run and deleted after it.
type broker struct {
	addrs []string
	kfake *embedded.Broker
	admin sarama.ClusterAdmin
	sc    sarama.Client
}

// openBroker starts kfake when bootstrap is empty, else connects to it.
func openBroker(bootstrap string) (*broker, error) {
	b := &broker{}
	if bootstrap == "" {
		// No compaction: kfake compacts every batch but the last on each
		// cleaner tick whatever min.compaction.lag.ms says and then moves
		// the log start past what it emptied, so a restore from the log
		// start (Goka's) finds nothing (docs/kafka-compat.md, items 10, 15
		// and 16). Every system restores the whole changelog instead.
		k, err := embedded.Start(embedded.Options{CleanerBackoff: 24 * time.Hour})
		if err != nil {
			return nil, err
		}
		b.kfake, b.addrs = k, k.Addrs()
	} else {
		b.addrs = strings.Split(bootstrap, ",")
	}
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_0_0_0
	cfg.ClientID = "sidebyside"
	// Outputs and changelogs are read as a downstream consumer would:
	// records of aborted transactions (exactly-once systems) do not count.
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	var err error
	if b.sc, err = sarama.NewClient(b.addrs, cfg); err != nil {
		b.Close()
		return nil, fmt.Errorf("connect to %v: %w", b.addrs, err)
	}
	if b.admin, err = sarama.NewClusterAdminFromClient(b.sc); err != nil {
		b.Close()
		return nil, fmt.Errorf("admin of %v: %w", b.addrs, err)
	}
	return b, nil
}

// Close stops kfake (when it was started here) and the clients.
func (b *broker) Close() {
	if b.admin != nil {
		_ = b.admin.Close() // closes sc too
	} else if b.sc != nil {
		_ = b.sc.Close()
	}
	if b.kfake != nil {
		b.kfake.Close()
	}
}

// awaitTopics waits until the broker's metadata lists every topic with its
// partitions' leaders, polling every 50 ms, for at most timeout.
func (b *broker) awaitTopics(timeout time.Duration, topics ...string) error {
	deadline := time.Now().Add(timeout)
	for {
		err := b.sc.RefreshMetadata(topics...)
		if err == nil {
			for _, t := range topics {
				ps, perr := b.sc.Partitions(t)
				if perr != nil || len(ps) == 0 {
					err = fmt.Errorf("topic %s: %d partitions (%v)", t, len(ps), perr)
					break
				}
				for _, p := range ps {
					if _, lerr := b.sc.Leader(t, p); lerr != nil {
						err = fmt.Errorf("topic %s partition %d: no leader: %w", t, p, lerr)
						break
					}
				}
				if err != nil {
					break
				}
			}
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topics %v not in the broker's metadata after %s: %w", topics, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createTopic creates a topic of partitions partitions (replication 1).
func (b *broker) createTopic(name string, partitions int) error {
	err := b.admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: int32(partitions), ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", name, err)
	}
	return nil
}

// deleteTopicsWithPrefix deletes every topic whose name holds prefix (a
// run's topics on a shared broker; Quix Streams puts "changelog__" first).
func (b *broker) deleteTopicsWithPrefix(prefix string) error {
	topics, err := b.admin.ListTopics()
	if err != nil {
		return fmt.Errorf("list topics: %w", err)
	}
	for t := range topics {
		if strings.Contains(t, prefix) {
			if err := b.admin.DeleteTopic(t); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
				return fmt.Errorf("delete topic %s: %w", t, err)
			}
		}
	}
	return nil
}

// countRecords reads topic from its start to its current end and returns
// how many records it holds (after compaction: what a restore reads).
func (b *broker) countRecords(topic string) (int64, error) {
	ends, err := b.endOffsets(topic)
	if err != nil {
		return 0, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...), kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return 0, fmt.Errorf("count %s: %w", topic, err)
	}
	defer cl.Close()
	left := map[int32]bool{}
	for p, end := range ends {
		if end[1] > end[0] {
			left[p] = true
		}
	}
	var n int64
	quiet := time.Now()
	next := map[int32]int64{} // offset after the last record read
	for p, end := range ends {
		next[p] = end[0]
	}
	// A transactional writer's log ends with a commit marker no reader is
	// given: a partition is done when only control records (or aborted
	// ones) are left below its end.
	rs := &changelog.Restorer{Client: b.sc}
	for len(left) > 0 {
		if time.Since(quiet) > time.Second {
			for p := range left {
				if to, err := rs.SkipControl(topic, p, next[p]); err == nil && to >= ends[p][1] {
					delete(left, p)
				}
			}
			if len(left) == 0 {
				break
			}
		}
		if time.Since(quiet) > 5*time.Second {
			return n, fmt.Errorf("count %s: no records for 5 s with %d partitions short of their end", topic, len(left))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			n++
			quiet = time.Now()
			next[r.Partition] = r.Offset + 1
			if r.Offset >= ends[r.Partition][1]-1 {
				delete(left, r.Partition)
			}
		})
	}
	return n, nil
}

// endOffsets returns the oldest and the newest offset of every partition.
func (b *broker) endOffsets(topic string) (map[int32][2]int64, error) {
	if err := b.sc.RefreshMetadata(topic); err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	parts, err := b.sc.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	out := map[int32][2]int64{}
	for _, p := range parts {
		hi, err := b.sc.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("newest offset of %s[%d]: %w", topic, p, err)
		}
		lo, err := b.sc.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("oldest offset of %s[%d]: %w", topic, p, err)
		}
		out[p] = [2]int64{lo, hi}
	}
	return out, nil
}

// topicSize returns the span of offsets in topic (newest minus oldest,
// summed over partitions).
func (b *broker) topicSize(topic string) (int64, error) {
	if err := b.sc.RefreshMetadata(topic); err != nil {
		return 0, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	parts, err := b.sc.Partitions(topic)
	if err != nil {
		return 0, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	var n int64
	for _, p := range parts {
		hi, err := b.sc.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, fmt.Errorf("newest offset of %s[%d]: %w", topic, p, err)
		}
		lo, err := b.sc.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return 0, fmt.Errorf("oldest offset of %s[%d]: %w", topic, p, err)
		}
		n += hi - lo
	}
	return n, nil
}

// describeAssignment lists each member's assigned topic partitions (for
// failure messages).
func (b *broker) describeAssignment(group string) string {
	ds, err := b.admin.DescribeConsumerGroups([]string{group})
	if err != nil || len(ds) == 0 {
		return fmt.Sprintf("describe group %s: %v", group, err)
	}
	var out []string
	for id, m := range ds[0].Members {
		a, err := m.GetMemberAssignment()
		if err != nil || a == nil {
			out = append(out, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		out = append(out, fmt.Sprintf("%s (%s): %v", m.ClientId, m.ClientHost, a.Topics))
	}
	return strings.Join(out, "; ")
}

// groupMembers returns the members of a consumer group, whether it is
// Stable (no rebalance in progress) and whether every member is assigned
// at least one partition of topic (an active: standbys and warm-up replicas
// of Runnel, Kafka Streams and Faust are not partitions of the input topic).
func (b *broker) groupMembers(group, topic string) (n int, stable, allActive bool, err error) {
	ds, err := b.admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return 0, false, false, fmt.Errorf("describe group %s: %w", group, err)
	}
	if len(ds) == 0 {
		return 0, false, false, nil
	}
	allActive = len(ds[0].Members) > 0
	for _, m := range ds[0].Members {
		a, err := m.GetMemberAssignment()
		if err != nil || a == nil || len(a.Topics[topic]) == 0 {
			allActive = false
		}
	}
	return len(ds[0].Members), ds[0].State == "Stable", allActive, nil
}

// memberPartitions returns each member's partitions of topic in group.
func (b *broker) memberPartitions(group, topic string) (map[string][]int32, error) {
	ds, err := b.admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return nil, fmt.Errorf("describe group %s: %w", group, err)
	}
	out := map[string][]int32{}
	if len(ds) == 0 {
		return out, nil
	}
	for _, m := range ds[0].Members {
		a, err := m.GetMemberAssignment()
		if err != nil || a == nil {
			out[m.MemberId] = nil
			continue
		}
		out[m.MemberId] = a.Topics[topic]
	}
	return out, nil
}

// producer writes records to the broker with Kafka's default partitioning
// (the harness picks each record's partition: murmur2 of the key).
type producer struct{ cl *kgo.Client }

func newProducer(addrs []string) (*producer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(5*time.Millisecond), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DisableIdempotentWrite(),
		kgo.MaxBufferedRecords(100_000))
	if err != nil {
		return nil, fmt.Errorf("producer client: %w", err)
	}
	return &producer{cl: cl}, nil
}

// produce sends records and waits until the broker acknowledged all of them.
func (p *producer) produce(ctx context.Context, recs func(yield func(*kgo.Record) bool)) error {
	var firstErr error
	errs := make(chan error, 1)
	for r := range recs {
		p.cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	if err := p.cl.Flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	select {
	case firstErr = <-errs:
	default:
	}
	if firstErr != nil {
		return fmt.Errorf("produce: %w", firstErr)
	}
	return nil
}

func (p *producer) Close() { p.cl.Close() }
