package testbroker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// The fixtures below are what the tests of app, table, replay and the examples
// share: clients closed by t.Cleanup, topic creation that waits for partition
// leaders, highwater and committed offsets, a lag wait, and a runner for
// workers. They fail the test (t.Fatal) on a broker error or timeout, and
// never assert anything about the code under test.

// WaitTimeout bounds the fixtures' waits (topic leaders, lag 0, Eventually
// callers that pass it): long enough for a loaded 2-core machine running a
// real Kafka broker, short enough that a hung test fails with a message
// before go test's own timeout.
const WaitTimeout = 60 * time.Second

// pollInterval is how often the waits ask the broker again.
const pollInterval = 100 * time.Millisecond

// Client returns a sarama client on brokers with SaramaConfig, closed by
// t.Cleanup.
func Client(t testing.TB, brokers []string) sarama.Client {
	t.Helper()
	c, err := sarama.NewClient(brokers, SaramaConfig(t))
	if err != nil {
		t.Fatalf("testbroker: client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// SyncProducer returns a sarama sync producer on brokers with SaramaConfig
// and the manual partitioner (each message names its partition; 0 when
// unset). The caller closes it.
func SyncProducer(t testing.TB, brokers []string) sarama.SyncProducer {
	t.Helper()
	cfg := SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	prod, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatalf("testbroker: sync producer: %v", err)
	}
	return prod
}

// Admin returns a cluster admin on brokers with SaramaConfig, closed by
// t.Cleanup.
func Admin(t testing.TB, brokers []string) sarama.ClusterAdmin {
	t.Helper()
	a, err := sarama.NewClusterAdmin(brokers, SaramaConfig(t))
	if err != nil {
		t.Fatalf("testbroker: admin: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// CreateTopic creates topic with the given partition count, replication
// factor 1 and topic configs (nil: the broker's defaults), then waits until
// every partition has a leader (WaitTopic), so that a producer's first send
// does not fail with UNKNOWN_TOPIC_OR_PARTITION or LEADER_NOT_AVAILABLE.
func CreateTopic(t testing.TB, brokers []string, topic string, partitions int32, configs map[string]string) {
	t.Helper()
	entries := map[string]*string{}
	for k, v := range configs {
		entries[k] = &v
	}
	admin, err := sarama.NewClusterAdmin(brokers, SaramaConfig(t))
	if err != nil {
		t.Fatalf("testbroker: admin: %v", err)
	}
	defer func() { _ = admin.Close() }()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: entries}, false); err != nil {
		t.Fatalf("testbroker: create topic %s: %v", topic, err)
	}
	client, err := sarama.NewClient(brokers, SaramaConfig(t))
	if err != nil {
		t.Fatalf("testbroker: client: %v", err)
	}
	defer func() { _ = client.Close() }()
	WaitTopic(t, client, topic)
}

// WaitTopic waits until client's metadata lists topic with a leader for each
// of its partitions (a topic the worker creates, or one just created), and
// fails the test after WaitTimeout.
func WaitTopic(t testing.TB, client sarama.Client, topic string) {
	t.Helper()
	var last error
	for deadline := time.Now().Add(WaitTimeout); time.Now().Before(deadline); time.Sleep(pollInterval) {
		if last = client.RefreshMetadata(topic); last != nil {
			continue
		}
		ps, err := client.Partitions(topic)
		if err != nil || len(ps) == 0 {
			last = fmt.Errorf("no partitions: %v", err)
			continue
		}
		last = nil
		for _, p := range ps {
			if _, err := client.Leader(topic, p); err != nil {
				last = fmt.Errorf("partition %d: %w", p, err)
				break
			}
		}
		if last == nil {
			return
		}
	}
	t.Fatalf("testbroker: topic %s has no leader for every partition after %s: %v", topic, WaitTimeout, last)
}

// Highwaters returns the highwater (the offset the next record will get) of
// every partition of topic, after refreshing the metadata.
func Highwaters(t testing.TB, client sarama.Client, topic string) map[int32]int64 {
	t.Helper()
	out, err := highwaters(client, topic)
	if err != nil {
		t.Fatalf("testbroker: %v", err)
	}
	return out
}

func highwaters(client sarama.Client, topic string) (map[int32]int64, error) {
	if err := client.RefreshMetadata(topic); err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	ps, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	out := make(map[int32]int64, len(ps))
	for _, p := range ps {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("highwater of %s[%d]: %w", topic, p, err)
		}
		out[p] = hw
	}
	return out, nil
}

// Committed returns group's committed offset of every partition of topic
// (-1 where the group committed nothing, also when the group does not exist).
func Committed(t testing.TB, brokers []string, group, topic string) map[int32]int64 {
	t.Helper()
	client := Client(t, brokers)
	out, err := committed(client, Admin(t, brokers), group, topic)
	if err != nil {
		t.Fatalf("testbroker: %v", err)
	}
	return out
}

func committed(client sarama.Client, admin sarama.ClusterAdmin, group, topic string) (map[int32]int64, error) {
	ps, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %s: %w", topic, err)
	}
	out := make(map[int32]int64, len(ps))
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ps})
	if errors.Is(err, sarama.ErrGroupIDNotFound) || err == nil && resp.Err == sarama.ErrGroupIDNotFound {
		// Kafka 4 answers GROUP_ID_NOT_FOUND for a group that never committed.
		for _, p := range ps {
			out[p] = -1
		}
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("offsets of group %s: %w", group, err)
	}
	if resp.Err != sarama.ErrNoError {
		return nil, fmt.Errorf("offsets of group %s: %w", group, resp.Err)
	}
	for _, p := range ps {
		b := resp.GetBlock(topic, p)
		if b == nil {
			return nil, fmt.Errorf("offsets of group %s: no answer for %s[%d]", group, topic, p)
		}
		if b.Err != sarama.ErrNoError {
			return nil, fmt.Errorf("offset of group %s on %s[%d]: %w", group, topic, p, b.Err)
		}
		out[p] = b.Offset
	}
	return out, nil
}

// WaitLag0 waits until group's lag on every partition of topics is 0 in two
// checks in a row (pollInterval apart): the committed offset equals the
// highwater, a partition without a commit counting as committed at 0 (as
// app.GroupLag counts it). It fails the test after WaitTimeout with the last
// lag seen. It reads offsets on its own connections, independently of the
// code under test.
func WaitLag0(t testing.TB, brokers []string, group string, topics ...string) {
	t.Helper()
	client := Client(t, brokers)
	admin := Admin(t, brokers)
	zeros := 0
	var lag map[string]map[int32]int64
	var last error
	for deadline := time.Now().Add(WaitTimeout); ; time.Sleep(pollInterval) {
		lag, last = groupLag(client, admin, group, topics)
		if last == nil && total(lag) == 0 {
			if zeros++; zeros == 2 {
				return
			}
		} else {
			zeros = 0
		}
		if time.Now().After(deadline) {
			t.Fatalf("testbroker: group %s still lags after %s: %v (last error: %v)", group, WaitTimeout, lag, last)
		}
	}
}

func groupLag(client sarama.Client, admin sarama.ClusterAdmin, group string, topics []string) (map[string]map[int32]int64, error) {
	out := map[string]map[int32]int64{}
	for _, topic := range topics {
		hws, err := highwaters(client, topic)
		if err != nil {
			return nil, err
		}
		cs, err := committed(client, admin, group, topic)
		if err != nil {
			return nil, err
		}
		out[topic] = map[int32]int64{}
		for p, hw := range hws {
			out[topic][p] = hw - max(cs[p], 0)
		}
	}
	return out, nil
}

func total(lag map[string]map[int32]int64) int64 {
	n := int64(0)
	for _, m := range lag {
		for _, l := range m {
			n += l
		}
	}
	return n
}

// Runner is something that runs until its context is cancelled: an
// app.Worker (testbroker cannot import app, whose own tests import it).
type Runner interface {
	Run(ctx context.Context) error
}

// Start runs r in its own goroutine. stop cancels it and returns Run's error;
// calling stop again returns the same error. t.Cleanup stops r if the test
// did not, so a failing test never leaves a worker running.
func Start(t testing.TB, r Runner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// Eventually polls cond every pollInterval until it holds, and fails the test
// with what after timeout. It is a wait for the system to reach a state, not
// a timed assertion: timeout only bounds how long a broken test hangs.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(pollInterval) {
		if time.Now().After(deadline) {
			t.Fatalf("testbroker: %s: not reached after %s", what, timeout)
		}
	}
}
