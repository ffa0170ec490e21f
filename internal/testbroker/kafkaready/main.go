// Command kafkaready waits until a Kafka cluster serves clients, for scripts/kafka start.
//
// Ready means: ApiVersions answers (kafkaversion.Detect), Metadata lists at least -expect
// brokers with a controller, and FindCoordinator finds a coordinator for a probe group.
// The last step makes the broker create __consumer_offsets now, so the first test's group
// join does not pay for it. It prints the detected sarama version to stderr and exits 0,
// or exits 1 with the last error once -timeout has passed.
//
//	go run ./internal/testbroker/kafkaready -brokers 127.0.0.1:29092 -expect 1 -timeout 120s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/internal/kafkaversion"
)

func main() {
	brokers := flag.String("brokers", "127.0.0.1:29092", "comma-separated bootstrap addresses")
	expect := flag.Int("expect", 1, "number of brokers the metadata must list")
	timeout := flag.Duration("timeout", 120*time.Second, "give up after this long")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	addrs := strings.Split(*brokers, ",")
	var last error
	for {
		v, err := probe(ctx, addrs, *expect)
		if err == nil {
			fmt.Fprintf(os.Stderr, "kafkaready: %d broker(s) ready after %.1fs, sarama version %s\n",
				*expect, time.Since(start).Seconds(), v)
			return
		}
		if !errors.Is(err, context.DeadlineExceeded) || last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "kafkaready: not ready after %s: %v\n", *timeout, last)
			os.Exit(1)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// probe runs one readiness check, bounded by 5 s.
func probe(ctx context.Context, addrs []string, expect int) (sarama.KafkaVersion, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := kafkaversion.Detect(ctx, addrs, nil)
	if err != nil {
		return v, err
	}
	conf := sarama.NewConfig()
	conf.Version = v
	conf.ClientID = "runnel-kafkaready"
	conf.Net.DialTimeout = 2 * time.Second
	conf.Net.ReadTimeout = 3 * time.Second
	conf.Metadata.Retry.Max = 0
	client, err := sarama.NewClient(addrs, conf)
	if err != nil {
		return v, fmt.Errorf("metadata: %w", err)
	}
	defer client.Close()
	if n := len(client.Brokers()); n < expect {
		return v, fmt.Errorf("metadata lists %d of %d brokers", n, expect)
	}
	if _, err := client.Controller(); err != nil {
		return v, fmt.Errorf("controller: %w", err)
	}
	// COORDINATOR_NOT_AVAILABLE until __consumer_offsets has leaders.
	if _, err := client.Coordinator("runnel-kafkaready"); err != nil {
		return v, fmt.Errorf("find coordinator: %w", err)
	}
	return v, nil
}
