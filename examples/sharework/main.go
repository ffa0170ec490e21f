// Command sharework reads a Kafka topic of work items through a share group
// (KIP-932, sources/kafkashare) and writes one result record per item to
// another topic, in ack mode: an item is accepted only once the broker
// acknowledged its result (acks=all); an empty item is rejected (dead letter
// in <group>-worker-dlq, then REJECT); a result the broker refused fails the
// item (RELEASE, delivered again with its delivery count raised). Start it
// several times: every process joins the share group and the items of each
// partition are spread over all of them.
//
//	scripts/kafka start                       # Kafka 4.2+ with share groups (share.version >= 1)
//	go run ./examples/sharework -brokers 127.0.0.1:29092 -in work -out results
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/sources/kafkashare"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap brokers (comma-separated)")
	in := flag.String("in", "work", "topic of work items (must exist)")
	out := flag.String("out", "results", "topic receiving the results (must exist)")
	group := flag.String("group", "sharework", "share group")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, strings.Split(*brokers, ","), *group, *in, *out); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "sharework:", err)
		os.Exit(1)
	}
}

// run processes items until ctx is done or the source fails (a cluster
// without share groups fails here, naming the share.version feature).
func run(ctx context.Context, brokers []string, group, in, out string) error {
	// The producer: franz-go's kgo client, idempotent with acks=all by
	// default; records with a key go to the partition Kafka's Java client
	// would choose (murmur2).
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("sharework"))
	if err != nil {
		return fmt.Errorf("connect to Kafka: %w", err)
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = prod.Flush(flushCtx) // results in flight still confirm their items
		prod.Close()
	}()

	m, err := source.NewManager(source.Config{Overflow: source.Backpressure})
	if err != nil {
		return err
	}
	defer m.StopAll()
	sub, err := m.Subscribe("kafkashare:"+group, "worker", kafkashare.Factory(kafkashare.Config{
		Brokers: brokers, Group: group, Topics: []string{in}, AutoOffsetReset: "earliest",
	}))
	if err != nil {
		return err
	}
	for {
		d, err := sub.Next(ctx) // closes the previous item's window
		if err != nil {
			return err
		}
		rec := d.Record
		if len(rec.Value) == 0 {
			d.Reject(errors.New("empty work item"))
			continue
		}
		tok, ok := d.Bind() // the item is accepted only after its result is durable
		if !ok {
			continue
		}
		result := fmt.Sprintf("%s done (delivery %d)", strings.ToUpper(string(rec.Value)), kafkashare.DeliveryCount(rec))
		prod.Produce(ctx, &kgo.Record{Topic: out, Key: rec.Key, Value: []byte(result)}, func(_ *kgo.Record, err error) {
			if err != nil {
				tok.Fail(err)
				return
			}
			tok.Confirm()
		})
		slog.Debug("processed", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset)
	}
}
