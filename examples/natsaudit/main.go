// Command natsaudit copies a NATS JetStream stream into a Kafka topic in ack
// mode: a JetStream message is acked only once the broker acknowledged its
// audit record (acks=all); an empty message is rejected (JetStream Term); a
// record the broker refused fails the message (Nak, redelivered later).
//
//	nats-server -js &                      # Debian package nats-server
//	go run ./examples/natsaudit -nats nats://127.0.0.1:4222 -brokers localhost:9092
//	nats pub audit.login '{"user":"ada"}'   # or any JetStream publisher
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

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/runnel-dev/runnel/agent/source"
	natssource "github.com/runnel-dev/runnel/sources/nats"
	"github.com/twmb/franz-go/pkg/kgo"
)

func main() {
	natsURL := flag.String("nats", natsgo.DefaultURL, "NATS server URL")
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap brokers (comma-separated)")
	stream := flag.String("stream", "AUDIT", "JetStream stream (created over subjects audit.> if missing)")
	topic := flag.String("topic", "audit-log", "Kafka topic receiving the audit records (must exist)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *natsURL, strings.Split(*brokers, ","), *stream, *topic); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "natsaudit:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, natsURL string, brokers []string, stream, topic string) error {
	nc, err := natsgo.Connect(natsURL)
	if err != nil {
		return fmt.Errorf("connect to NATS: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"audit.>"}}); err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "natsaudit", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 10})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}

	// The producer: franz-go's kgo client, idempotent with acks=all by
	// default; records with a key go to the partition Kafka's Java client
	// would choose (murmur2).
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("natsaudit"))
	if err != nil {
		return fmt.Errorf("connect to Kafka: %w", err)
	}
	defer func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = prod.Flush(flushCtx) // results in flight still confirm their items
		prod.Close()
	}()

	m, err := source.NewManager(source.Config{})
	if err != nil {
		return err
	}
	defer m.StopAll()
	sub, err := m.Subscribe("nats:"+stream, "audit", natssource.Factory(natssource.Config{Consumer: cons}))
	if err != nil {
		return err
	}
	for {
		d, err := sub.Next(ctx) // closes the previous message's window
		if err != nil {
			return err
		}
		rec := d.Record
		if len(rec.Value) == 0 {
			d.Reject(errors.New("empty audit message"))
			continue
		}
		tok, ok := d.Bind() // the message is acked only after this record is durable
		if !ok {
			continue
		}
		prod.Produce(ctx, &kgo.Record{Topic: topic, Key: []byte(rec.Topic), Value: rec.Value}, func(_ *kgo.Record, err error) {
			if err != nil {
				tok.Fail(err)
				return
			}
			tok.Confirm()
		})
		slog.Debug("audited", "subject", rec.Topic, "sequence", rec.Offset)
	}
}
