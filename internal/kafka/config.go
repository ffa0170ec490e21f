package kafka

import (
	"time"

	"github.com/IBM/sarama"
)

// Timeouts are the consumer-group timing knobs. Zero fields take Sarama's
// defaults (session 10 s, heartbeat 3 s, rebalance 60 s, fetch max wait 500 ms).
type Timeouts struct {
	Session   time.Duration
	Heartbeat time.Duration
	Rebalance time.Duration
	MaxWait   time.Duration
}

// TestTimeouts keep groups from hanging on kfake, whose members waiting in
// JoinGroup are evicted after the session timeout (see docs/kafka-compat.md):
// the session must exceed heartbeat + fetch max wait + the slowest revoke. A
// revoke may take the drain budget twice (drain, then the in-flight wait:
// 2 × Rebalance/3, app's drainBudget) plus the final cycle; with a 3 s
// session, under CPU load, members of `dev` were evicted in the middle of
// their revokes and everything since the last commit was processed again
// (issue #24). With a 5 s rebalance timeout, a member under heavy load
// (load average ~10 on 2 cores) still took 7.6 s to end its claims and was
// expelled: the rebalance timeout is 15 s (drain budget 5 s) and the session
// 20 s. The session only bounds how long a crashed member keeps its
// partitions, which in-process workers (dev, runneltest) never are; a clean
// stop leaves the group at once.
var TestTimeouts = Timeouts{Session: 20 * time.Second, Heartbeat: 100 * time.Millisecond,
	Rebalance: 15 * time.Second, MaxWait: 100 * time.Millisecond}

// NewConfig returns the Sarama configuration Runnel uses for one worker:
//   - producer: idempotent, acks=all, one request in flight per broker (so
//     delivery reports arrive in offset order per partition), manual
//     partitioning (Runnel picks every record's partition itself, with
//     PartitionFor for keyed records), successes returned (every derived record
//     confirms its source);
//   - consumer: manual commits only (auto-commit off: an offset is committed only
//     once the record and everything derived from it is persisted), oldest offset
//     for a new group.
//
// version is the protocol version the cluster speaks (see kafkaversion.Detect);
// the zero value keeps Sarama's default. The connection is plaintext and
// unauthenticated; NewSecureConfig adds TLS and SASL.
func NewConfig(clientID string, version sarama.KafkaVersion, t Timeouts) *sarama.Config {
	return NewSecureConfig(clientID, version, t, Security{})
}

// NewSecureConfig is NewConfig over a connection secured by sec (TLS, SASL):
// Base(clientID, sec) with the worker's producer and consumer settings.
func NewSecureConfig(clientID string, version sarama.KafkaVersion, t Timeouts, sec Security) *sarama.Config {
	c := Base(clientID, sec)
	if version != (sarama.KafkaVersion{}) {
		c.Version = version
	}
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.Flush.Frequency = 2 * time.Millisecond
	c.Producer.Flush.Bytes = 256 << 10
	c.Producer.Retry.Max = 10
	c.Net.MaxOpenRequests = 1
	c.Consumer.Offsets.AutoCommit.Enable = false
	// Sarama's default fetch of 1 MiB per partition parses a whole response
	// into messages at once, all held until consumed; 512 KiB halves that
	// with no throughput cost measured (kgoMaxBufferedRecords has the numbers;
	// 128 KiB cost a third of the stateless rate on Kafka 4.4). The restore
	// client asks for more (app's worker).
	c.Consumer.Fetch.Default = 512 << 10
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Return.Errors = true
	c.Metadata.AllowAutoTopicCreation = false
	if t.Session > 0 {
		c.Consumer.Group.Session.Timeout = t.Session
	}
	if t.Heartbeat > 0 {
		c.Consumer.Group.Heartbeat.Interval = t.Heartbeat
	}
	if t.Rebalance > 0 {
		c.Consumer.Group.Rebalance.Timeout = t.Rebalance
	}
	if t.MaxWait > 0 {
		c.Consumer.MaxWaitTime = t.MaxWait
	}
	return c
}
