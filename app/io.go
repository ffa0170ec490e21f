package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/table"
)

// ReadTable reads a table's whole state from its changelog topic (the latest
// value of every key, tombstones removed), from the log start to the highwater
// captured when the read starts. It needs no worker, so it works from any
// machine that reaches the brokers. Values are decoded with the table's codec.
func ReadTable(ctx context.Context, client sarama.Client, d table.Def) (map[string]any, error) {
	topic := d.Changelog()
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("table %s: partitions of %s: %w", d.Name(), topic, err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return nil, err
	}
	defer consumer.Close()
	out := map[string]any{}
	// Every offset is asked for before any partition is read: a ListOffsets
	// request would otherwise wait behind the previous partition's fetch
	// long-poll on the same broker connection.
	ends, starts := map[int32]int64{}, map[int32]int64{}
	for _, p := range parts {
		if ends[p], err = client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
			return nil, fmt.Errorf("highwater %s[%d]: %w", topic, p, err)
		}
		if starts[p], err = client.GetOffset(topic, p, sarama.OffsetOldest); err != nil {
			return nil, fmt.Errorf("log start %s[%d]: %w", topic, p, err)
		}
	}
	for _, p := range parts {
		end, start := ends[p], starts[p]
		if start >= end {
			continue
		}
		last := map[string][]byte{}
		pos := start
		for moved := 0; pos < end; moved++ {
			next, err := readRange(ctx, consumer, topic, p, pos, end, last)
			if err == nil {
				break
			}
			// kfake moves the log start when it compacts the head of a partition
			// (Kafka never does for compaction): what lies below the new start was
			// superseded by later records, so resume there.
			if !errors.Is(err, sarama.ErrOffsetOutOfRange) || moved >= 20 {
				return nil, fmt.Errorf("read %s[%d]: %w", topic, p, err)
			}
			oldest, oerr := client.GetOffset(topic, p, sarama.OffsetOldest)
			if oerr != nil {
				return nil, fmt.Errorf("log start %s[%d]: %w", topic, p, oerr)
			}
			pos = max(next, oldest)
		}
		for k, v := range last {
			ks, val, err := d.Format([]byte(k), v)
			if err != nil {
				return nil, fmt.Errorf("%s[%d]: %w", topic, p, err)
			}
			out[ks] = val
		}
	}
	return out, nil
}

// readRange reads [from, end) of one partition into last (latest value per
// key, tombstones delete). It returns the offset after the last record read
// and the error that stopped it, if any.
func readRange(ctx context.Context, consumer sarama.Consumer, topic string, p int32, from, end int64, last map[string][]byte) (int64, error) {
	pc, err := consumer.ConsumePartition(topic, p, from)
	if err != nil {
		return from, err
	}
	defer pc.AsyncClose()
	pos := from
	for pos < end {
		select {
		case <-ctx.Done():
			return pos, ctx.Err()
		case e, ok := <-pc.Errors():
			if ok && e != nil {
				return pos, e.Err
			}
		case m, ok := <-pc.Messages():
			if !ok {
				// Sarama closes Messages after an error (OffsetOutOfRange).
				for e := range pc.Errors() {
					if e != nil {
						return pos, e.Err
					}
				}
				return pos, errors.New("partition consumer closed")
			}
			if m.Value == nil {
				delete(last, string(m.Key))
			} else {
				last[string(m.Key)] = m.Value
			}
			pos = m.Offset + 1
		}
	}
	return pos, nil
}
