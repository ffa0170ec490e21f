// Package embedded starts the in-process Kafka broker (kfake from franz-go) that
// backs `dev` mode and the default test tier.
//
// kfake speaks the Kafka wire protocol but is not Kafka; docs/kafka-compat.md
// lists the differences that matter to Runnel.
package embedded

import (
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Options configures an embedded broker. The zero value is ready to use.
type Options struct {
	// Brokers is the number of broker nodes; default 1.
	Brokers int
	// Ports fixes the loopback ports (one per broker); default: random free ports.
	Ports []int
	// DataDir persists the log to disk; default: in memory.
	DataDir string
	// CleanerBackoff is how often compaction and retention run; default 1 s
	// (kfake's own default is 1 h, which makes compaction invisible in tests).
	CleanerBackoff time.Duration
	// Retention is the broker's default time retention (log.retention.ms)
	// for topics that set none; 0 keeps records without time limit. The
	// embedded broker runs dev mode and tests, whose inputs often carry old
	// event times (`dev --timestamp-field`): under Kafka's default of seven
	// days, applied every CleanerBackoff here, such records were deleted
	// within a second of being sent, before any agent read them.
	Retention time.Duration
}

// Broker is a running embedded broker.
type Broker struct {
	c *kfake.Cluster
}

// Start starts an embedded broker listening on 127.0.0.1. The caller must Close it.
//
// The group minimum session timeout is lowered to 100 ms so that tests may use
// short sessions (kfake, like Kafka, defaults to 6 s). Topics are not created
// automatically: Runnel creates the topics it declares.
func Start(o Options) (*Broker, error) {
	if o.Brokers <= 0 {
		o.Brokers = 1
	}
	if len(o.Ports) == 0 {
		o.Ports = make([]int, o.Brokers)
	}
	if o.CleanerBackoff <= 0 {
		o.CleanerBackoff = time.Second
	}
	retention := int64(-1)
	if o.Retention > 0 {
		retention = o.Retention.Milliseconds()
	}
	opts := []kfake.Opt{
		kfake.Ports(o.Ports...),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
		kfake.DefaultNumPartitions(8),
		kfake.BrokerConfigs(map[string]string{
			"log.cleaner.backoff.ms": fmt.Sprint(o.CleanerBackoff.Milliseconds()),
			"log.retention.ms":       fmt.Sprint(retention),
		}),
	}
	if o.DataDir != "" {
		opts = append(opts, kfake.DataDir(o.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return nil, fmt.Errorf("start embedded broker: %w", err)
	}
	return &Broker{c: c}, nil
}

// Addrs returns the host:port of every broker.
func (b *Broker) Addrs() []string { return b.c.ListenAddrs() }

// Cluster exposes the kfake cluster for fault injection in tests.
func (b *Broker) Cluster() *kfake.Cluster { return b.c }

// Close stops the broker; clients then see connection refused.
func (b *Broker) Close() { b.c.Close() }
