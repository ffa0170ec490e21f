package app

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
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

// SendStats counts what SendLines produced.
type SendStats struct {
	Records int64
	Bytes   int64
}

// OpenInput opens a JSONL file, decompressing it when its name ends in .gz;
// "-" is standard input.
func OpenInput(path string) (io.ReadCloser, error) {
	if path == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(path, ".gz") {
		return f, nil
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{z, multiCloser{z, f}}, nil
}

type multiCloser []io.Closer

func (m multiCloser) Close() error {
	var errs []error
	for _, c := range m {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// SendLines produces every line of r (one JSON object a line) to topic, keyed
// by the string field keyField of each object (no key when keyField is empty)
// and partitioned like Runnel's own sends (murmur2 of the key). A line that is
// not a JSON object, or lacks the key field, stops the send with an error naming
// its line number; the lines before it were produced. progress, if not nil, is
// called with the bytes read so far.
func SendLines(ctx context.Context, client sarama.Client, topic string, partitions int32, keyField string, r io.Reader, progress func(n int64)) (SendStats, error) {
	var st SendStats
	p, err := kafka.NewProducer(client)
	if err != nil {
		return st, err
	}
	var (
		failMu  sync.Mutex
		failure error
		sent    atomic.Int64
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	line := 0
	var ferr error
	for sc.Scan() {
		line++
		if ctx.Err() != nil {
			ferr = ctx.Err()
			break
		}
		b := sc.Bytes()
		st.Bytes += int64(len(b)) + 1
		if progress != nil {
			progress(st.Bytes)
		}
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var key []byte
		if keyField != "" {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(b, &obj); err != nil {
				ferr = fmt.Errorf("line %d: not a JSON object: %w", line, err)
				break
			}
			var k string
			if err := json.Unmarshal(obj[keyField], &k); err != nil || obj[keyField] == nil {
				ferr = fmt.Errorf("line %d: field %q is missing or not a string", line, keyField)
				break
			}
			key = []byte(k)
		}
		part := int32(line % int(partitions))
		if key != nil {
			part = kafka.PartitionFor(key, partitions)
		}
		val := append([]byte(nil), b...)
		if err := p.Send(&sarama.ProducerMessage{Topic: topic, Partition: part, Key: bytesOrNil(key), Value: sarama.ByteEncoder(val)},
			func(_ int32, _ int64, err error) {
				if err != nil {
					failMu.Lock()
					failure = errors.Join(failure, err)
					failMu.Unlock()
					return
				}
				sent.Add(1)
			}); err != nil {
			ferr = err
			break
		}
	}
	if err := sc.Err(); err != nil && ferr == nil {
		ferr = fmt.Errorf("read input: %w", err)
	}
	cerr := p.Close()
	st.Records = sent.Load()
	return st, errors.Join(ferr, failure, cerr)
}
