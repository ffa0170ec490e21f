package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// ReadTable reads a table's whole state from its changelog topic (the latest
// value of every key, tombstones removed, records of stale writers fenced off
// as a restore does: changelog.Stamp), from the log start to the highwater
// captured when the read starts. It needs no worker, so it works from any
// machine that reaches the brokers. Values are decoded with the table's codec.
// Effects of records whose source offsets are not committed yet are included;
// records of aborted transactions (ExactlyOnce) are not: it reads
// read_committed.
func ReadTable(ctx context.Context, client *Client, d table.Def) (map[string]any, error) {
	return readTable(ctx, client.sc, d)
}

func readTable(ctx context.Context, client sarama.Client, d table.Def) (map[string]any, error) {
	topic := d.Changelog()
	parts, err := client.Partitions(topic)
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return nil, fmt.Errorf("table %s: its changelog topic %s does not exist yet: start a worker first (it creates the app's topics), or try the app with dev on the in-process broker: %w",
			d.Name(), topic, err)
	}
	if err != nil {
		return nil, fmt.Errorf("table %s: partitions of %s: %w", d.Name(), topic, err)
	}
	// The records are fetched through a client of their own: an offset
	// lookup on client would otherwise wait behind a fetch long-poll.
	var addrs []string
	for _, b := range client.Brokers() {
		addrs = append(addrs, b.Addr())
	}
	cfg := *client.Config()
	if cfg.Version.IsAtLeast(sarama.V0_11_0_0) {
		// As a restore under ExactlyOnce: only committed transactions. A
		// changelog record of an aborted cycle never was the table's state.
		// Records written outside transactions (AtLeastOnce) are all read.
		cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	// Offset lookups and the direct fetches that find a partition's end
	// (Restorer.Client) go through a client with the same isolation level,
	// but not the fetches' connections: a lookup would wait behind a fetch
	// long-poll.
	ocfg := cfg // a client keeps its config's address: one copy each
	oc, err := sarama.NewClient(addrs, &ocfg)
	if err != nil {
		return nil, fmt.Errorf("table %s: %w", d.Name(), err)
	}
	defer oc.Close()
	// A short fetch wait: closing a partition consumer waits for the fetch
	// in flight, once per partition read.
	cfg.Consumer.MaxWaitTime = 20 * time.Millisecond
	// The restore resumes at the new log start when compaction moved it past
	// the read position (kfake compacts the head of a partition), but only
	// if the partition consumer returns the OffsetOutOfRange error: without
	// Return.Errors it closes silently ("partition consumer closed").
	cfg.Consumer.Return.Errors = true
	fc, err := sarama.NewClient(addrs, &cfg)
	if err != nil {
		return nil, fmt.Errorf("table %s: %w", d.Name(), err)
	}
	defer fc.Close()
	consumer, err := sarama.NewConsumerFromClient(fc)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	r := &changelog.Restorer{Client: oc, Consumer: consumer, Logger: slog.New(slog.DiscardHandler), ProgressInterval: time.Hour}
	st := stores.NewMemory()
	defer st.Close()
	out := map[string]any{}
	for _, p := range parts {
		if _, err := r.Restore(ctx, topic, p, st); err != nil {
			return nil, fmt.Errorf("table %s: %w", d.Name(), err)
		}
		err := st.Iterate(p, func(k, v []byte) error {
			ks, val, err := d.Format(k, v)
			if err != nil {
				return fmt.Errorf("%s[%d]: %w", topic, p, err)
			}
			out[ks] = val
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}
