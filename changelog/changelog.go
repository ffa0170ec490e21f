package changelog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
)

// Topic returns the changelog topic of table in app: "<app>-<table>-changelog".
func Topic(app, table string) string { return app + "-" + table + "-changelog" }

// Spec returns the topic spec of a changelog: compacted (the latest value per
// key is the table), with the table's partition count.
func Spec(topic string, partitions int32) kafka.TopicSpec {
	return kafka.TopicSpec{Name: topic, Partitions: partitions, Config: map[string]string{
		"cleanup.policy": "compact",
	}}
}

// Restorer reads changelog partitions into stores.
type Restorer struct {
	Client   sarama.Client
	Consumer sarama.Consumer
	Logger   *slog.Logger
	// BatchSize is how many records one store batch holds at most; default 1000.
	BatchSize int
}

// Result describes one restore.
type Result struct {
	// Records is how many changelog records were applied.
	Records int64
	// From is the first offset read, To the end offset captured at start
	// (the highwater); From == To means nothing needed replaying.
	From, To int64
	// Start is the offset after the store's checkpoint (0 when it had none or
	// was rebuilt): To - Start is the span of offsets the restore advanced the
	// store over, whatever compaction removed inside it.
	Start int64
	// Rebuilt is set when the local checkpoint was unusable (ahead of the
	// broker's end, or below its log start) and the partition was wiped.
	Rebuilt bool
	Elapsed time.Duration
}

// Restore brings partition p of store up to the end of the changelog partition
// as it is when Restore starts: it reads from the offset after the store's
// checkpoint (or the earliest) up to the highwater captured before reading, and
// applies the records in batches whose last offset is written atomically with
// their data. Done is position >= target, so an empty partition or one whose
// checkpoint is already at the end returns at once.
//
// A checkpoint ahead of the highwater (the topic was recreated) or below the log
// start (retention removed what follows it) wipes the partition with a warning
// and rebuilds it from the earliest offset.
func (r *Restorer) Restore(ctx context.Context, topic string, p int32, st stores.Store) (Result, error) {
	start := time.Now()
	res, err := r.run(ctx, topic, p, st, false)
	res.Elapsed = time.Since(start)
	if err != nil {
		return res, fmt.Errorf("restore %s[%d]: %w", topic, p, err)
	}
	return res, nil
}

// Follow tails partition p of the changelog into store until ctx ends, as a
// standby replica does, checkpointing with every batch so that a promotion only
// replays what arrived after the last batch. It returns nil when ctx ends.
func (r *Restorer) Follow(ctx context.Context, topic string, p int32, st stores.Store) error {
	_, err := r.run(ctx, topic, p, st, true)
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("follow %s[%d]: %w", topic, p, err)
	}
	return nil
}

func (r *Restorer) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}

func (r *Restorer) run(ctx context.Context, topic string, p int32, st stores.Store, follow bool) (Result, error) {
	var res Result
	for attempt := 0; ; attempt++ {
		checkpoint, err := st.Offset(p)
		if err != nil {
			return res, err
		}
		oldest, err := r.Client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return res, fmt.Errorf("log start offset: %w", err)
		}
		end, err := r.Client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return res, fmt.Errorf("highwater: %w", err)
		}
		from := oldest
		res.Start = 0
		if checkpoint != stores.NoOffset {
			from = checkpoint + 1
			res.Start = from
		}
		if from > end || from < oldest {
			if attempt > 0 {
				return res, fmt.Errorf("checkpoint %d still outside [%d, %d] after a rebuild", checkpoint, oldest, end)
			}
			r.logger().Warn("changelog checkpoint outside the topic's offsets; wiping the partition and rebuilding it",
				"topic", topic, "partition", p, "checkpoint", checkpoint, "log_start", oldest, "highwater", end)
			if err := st.DropPartition(p); err != nil {
				return res, err
			}
			res.Rebuilt = true
			continue
		}
		res.From, res.To = from, end
		if from >= end && !follow {
			res.Start = min(res.Start, end)
			return res, nil
		}
		n, err := r.consume(ctx, topic, p, st, from, end, follow)
		res.Records += n
		if errors.Is(err, sarama.ErrOffsetOutOfRange) && attempt == 0 {
			r.logger().Warn("changelog offset out of range; wiping the partition and rebuilding it",
				"topic", topic, "partition", p, "offset", from)
			if err := st.DropPartition(p); err != nil {
				return res, err
			}
			res.Rebuilt = true
			continue
		}
		return res, err
	}
}

func (r *Restorer) consume(ctx context.Context, topic string, p int32, st stores.Store, from, end int64, follow bool) (int64, error) {
	pc, err := r.Consumer.ConsumePartition(topic, p, from)
	if err != nil {
		return 0, err
	}
	defer pc.AsyncClose()
	size := r.BatchSize
	if size <= 0 {
		size = 1000
	}
	var n int64
	b := &stores.Batch{}
	apply := func() error {
		if len(b.Ops) == 0 {
			return nil
		}
		if err := st.Apply(p, b); err != nil {
			return err
		}
		n += int64(len(b.Ops))
		b = &stores.Batch{Ops: b.Ops[:0:0]}
		return nil
	}
	for {
		var msg *sarama.ConsumerMessage
		select {
		case <-ctx.Done():
			return n, errors.Join(apply(), ctx.Err())
		case e := <-pc.Errors():
			if e == nil {
				return n, errors.New("partition consumer closed")
			}
			return n, e.Err
		case msg = <-pc.Messages():
		}
		if msg == nil {
			return n, errors.New("partition consumer closed")
		}
		for msg != nil {
			if msg.Value == nil {
				b.Delete(msg.Key)
			} else {
				b.Put(msg.Key, msg.Value)
			}
			b.Offset = msg.Offset
			if !follow && msg.Offset+1 >= end {
				return n, apply()
			}
			msg = nil
			if len(b.Ops) < size {
				select {
				case msg = <-pc.Messages():
				default:
				}
			}
		}
		if err := apply(); err != nil {
			return n, err
		}
	}
}
