package app

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// ReadTable reads a table's whole state from its changelog topic (the latest
// value of every key, tombstones removed, records of stale writers fenced off
// as a restore does: changelog.Stamp), from the log start to the highwater
// captured when the read starts. It needs no worker, so it works from any
// machine that reaches the brokers. Values are decoded with the table's codec.
// Effects of records whose source offsets are not committed yet are included.
func ReadTable(ctx context.Context, client sarama.Client, d table.Def) (map[string]any, error) {
	topic := d.Changelog()
	parts, err := client.Partitions(topic)
	if err != nil {
		return nil, fmt.Errorf("table %s: partitions of %s: %w", d.Name(), topic, err)
	}
	// The records are fetched through a client of their own: an offset
	// lookup on client would otherwise wait behind a fetch long-poll.
	var addrs []string
	for _, b := range client.Brokers() {
		addrs = append(addrs, b.Addr())
	}
	// A short fetch wait: closing a partition consumer waits for the fetch
	// in flight, once per partition read.
	cfg := *client.Config()
	cfg.Consumer.MaxWaitTime = 20 * time.Millisecond
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
	r := &changelog.Restorer{Client: client, Consumer: consumer, Logger: slog.New(slog.DiscardHandler), ProgressInterval: time.Hour}
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
