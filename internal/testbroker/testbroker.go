// Package testbroker gives tests a Kafka broker: the in-process kfake broker by default,
// or a real Apache Kafka cluster (the second test tier) when one is named.
//
// The real tier is selected by the environment variable RUNNEL_KAFKA_BROKERS
// (comma-separated host:port, e.g. 127.0.0.1:29092) or by the test flag
//
//	go test ./internal/testbroker -kafka=127.0.0.1:29092
//
// The flag is registered by this package, so it is only accepted by test binaries that
// import testbroker; use the environment variable for `go test ./...`. scripts/kafka
// starts a real broker and scripts/ci-kafka.sh wires it into CI; docs/kafka-compat.md
// lists how kfake and Kafka differ.
//
// A real cluster is shared by every test and every run, so tests must name their topics
// and groups with Topic, never with fixed names.
package testbroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafkaversion"
)

// EnvBrokers names the environment variable that selects the real tier.
const EnvBrokers = "RUNNEL_KAFKA_BROKERS"

// kafkaFlag is -kafka: comma-separated real broker addresses; it wins over EnvBrokers.
var kafkaFlag = flag.String("kafka", "", "comma-separated real Kafka broker addresses (default: $"+EnvBrokers+"; empty: in-process kfake)")

// realAddrs returns the real broker addresses, or nil for the kfake tier.
func realAddrs() []string {
	s := *kafkaFlag
	if s == "" {
		s = os.Getenv(EnvBrokers)
	}
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Real reports whether tests run against a real Kafka cluster (RUNNEL_KAFKA_BROKERS or
// -kafka set) rather than kfake.
func Real() bool { return len(realAddrs()) > 0 }

// Brokers returns bootstrap addresses for the test. On the real tier they are the
// configured addresses, shared with other tests. Otherwise a fresh kfake broker is started
// for this test (embedded.Start with default options: 1 node, 8 partitions per created
// topic, 100 ms minimum session timeout, 1 s cleaner tick) and closed by t.Cleanup.
func Brokers(t testing.TB) []string {
	t.Helper()
	return BrokersWith(t, embedded.Options{})
}

// BrokersWith is Brokers with options for the kfake tier (ignored on the real
// tier). Tests whose correctness relies on min.compaction.lag.ms, which kfake
// ignores (docs/kafka-compat.md #16), give a long CleanerBackoff so that kfake,
// like Kafka with Runnel's 10 min lag, does not compact during the test.
func BrokersWith(t testing.TB, o embedded.Options) []string {
	t.Helper()
	if addrs := realAddrs(); len(addrs) > 0 {
		return addrs
	}
	b, err := embedded.Start(o)
	if err != nil {
		t.Fatalf("testbroker: %v", err)
	}
	t.Cleanup(b.Close)
	return b.Addrs()
}

// maxTopicLen keeps names well under Kafka's 249-character limit, leaving room for the
// suffixes Runnel appends to derive changelog and repartition topics.
const maxTopicLen = 160

// Topic returns a topic (or group) name unique to this test and run:
// "<base>-<test name>-<8 hex chars>", with every character outside [a-zA-Z0-9-]
// replaced by '-'. '.' and '_' are replaced too, because Kafka refuses a topic whose name
// differs from an existing one only in '.' versus '_' (they collide in metric names).
func Topic(t testing.TB, base string) string {
	t.Helper()
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		t.Fatalf("testbroker: random topic suffix: %v", err)
	}
	name := sanitize(base + "-" + t.Name())
	if len(name) > maxTopicLen-9 {
		name = name[:maxTopicLen-9]
	}
	return name + "-" + hex.EncodeToString(suffix[:])
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-':
		default:
			b[i] = '-'
		}
	}
	return string(b)
}

// Test timeouts (docs/kafka-compat.md #1): a member's session must
// outlast heartbeat + fetch wait + claim teardown + commit, or kfake evicts members that
// wait in JoinGroup; a 100 ms heartbeat and fetch wait make joins and leaves take ~0.2 s.
const (
	SessionTimeout    = 3 * time.Second
	HeartbeatInterval = 100 * time.Millisecond
	RebalanceTimeout  = 5 * time.Second
	MaxWaitTime       = 100 * time.Millisecond
)

// detected caches the version per tier: kfake's is fixed by the module version, a real
// cluster's by its release, so one ApiVersions round trip per test binary is enough.
var (
	detectMu sync.Mutex
	detected = map[string]sarama.KafkaVersion{}
)

// Version returns the sarama version to configure for the current tier, detected with
// kafkaversion.Detect (10 s timeout) once per test binary. On the kfake tier it probes a
// throwaway kfake broker. It fails the test if detection fails.
func Version(t testing.TB) sarama.KafkaVersion {
	t.Helper()
	detectMu.Lock()
	defer detectMu.Unlock()
	addrs := realAddrs()
	key := strings.Join(addrs, ",")
	if v, ok := detected[key]; ok {
		return v
	}
	if len(addrs) == 0 {
		b, err := embedded.Start(embedded.Options{})
		if err != nil {
			t.Fatalf("testbroker: %v", err)
		}
		defer b.Close()
		addrs = b.Addrs()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := kafkaversion.Detect(ctx, addrs, nil)
	if err != nil {
		t.Fatalf("testbroker: %v", err)
	}
	detected[key] = v
	return v
}

// SaramaConfig returns a fresh sarama config for tests: Version from Version(t); consumer
// group Session 3 s, Heartbeat 100 ms, Rebalance 5 s; Consumer.MaxWaitTime 100 ms;
// Consumer.Offsets.Initial oldest (tests produce before they consume);
// Producer.Return.Successes true (as SyncProducer requires); ClientID "runnel-test".
// The real broker started by scripts/kafka allows the 3 s session
// (group.min.session.timeout.ms=100; Kafka's default minimum is 6 s).
func SaramaConfig(t testing.TB) *sarama.Config {
	t.Helper()
	c := sarama.NewConfig()
	c.Version = Version(t)
	c.ClientID = "runnel-test"
	c.Consumer.Group.Session.Timeout = SessionTimeout
	c.Consumer.Group.Heartbeat.Interval = HeartbeatInterval
	c.Consumer.Group.Rebalance.Timeout = RebalanceTimeout
	c.Consumer.MaxWaitTime = MaxWaitTime
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Producer.Return.Successes = true
	// As the workers' producers (internal/kafka.NewConfig): a loaded real broker
	// answers NOT_LEADER_OR_FOLLOWER for a while after a topic's creation, past
	// Sarama's default 3 retries of 100 ms (seen in CI at load 20).
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 250 * time.Millisecond
	if err := c.Validate(); err != nil {
		t.Fatalf("testbroker: sarama config: %v", fmt.Errorf("validate: %w", err))
	}
	return c
}
