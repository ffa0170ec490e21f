package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/internal/kafka"
)

// producer is the shared-source producer of one replayed partition: it reads
// [from, stop) with direct fetches, checks that offsets only move forward,
// counts gaps, emits the records in the time range to the agent, and counts
// the records the agent resolved (Advance).
type producer struct {
	client sarama.Client
	plan   *Plan
	p      *part
	opts   *Options
	fail   func(error)
}

// Open implements source.Producer.
func (pr *producer) Open(ctx context.Context, emit func(*source.Record, any) error) error {
	err := pr.read(ctx, emit)
	if err != nil && ctx.Err() == nil {
		pr.fail(err)
		return err
	}
	if err == nil {
		pr.p.fetchDone.Store(true)
		pr.p.checkComplete()
	}
	// A producer returning early ends the group: wait for the stop.
	<-ctx.Done()
	return ctx.Err()
}

func (pr *producer) read(ctx context.Context, emit func(*source.Record, any) error) error {
	p, topic := pr.p, pr.plan.Topic
	part, stop := p.pp.Partition, p.pp.Stop
	pos := p.from
	lastProgress := time.Now()
	retries := 0
	for pos < stop {
		if err := ctx.Err(); err != nil {
			return err
		}
		res, err := kafka.FetchAt(ctx, pr.client, topic, part, pos, pr.opts.FetchMaxWait, pr.opts.isolation())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if retriable(err) && retries < 20 {
				retries++
				_ = pr.client.RefreshMetadata(topic)
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Duration(retries) * 50 * time.Millisecond):
				}
				continue
			}
			if errors.Is(err, sarama.ErrOffsetOutOfRange) {
				return fmt.Errorf("replay %s[%d] at %d: %w (%w)", topic, part, pos, err, ErrBelowLogStart)
			}
			return fmt.Errorf("replay %s[%d] at %d: %w", topic, part, pos, err)
		}
		retries = 0
		fetchOffset := pos
		prev := int64(-1)
		for _, r := range res.Records {
			if r.Offset <= prev {
				return fmt.Errorf("replay %s[%d]: record at %d after %d in one fetch: %w", topic, part, r.Offset, prev, ErrBackwards)
			}
			prev = r.Offset
			if r.Offset < fetchOffset && pos == fetchOffset {
				// The head of a batch that starts before the fetch offset:
				// Kafka returns whole batches.
				continue
			}
			if r.Offset < pos {
				return fmt.Errorf("replay %s[%d]: record at %d, expected %d or later: %w", topic, part, r.Offset, pos, ErrBackwards)
			}
			if r.Offset >= stop {
				break
			}
			p.gaps.Add(r.Offset - pos)
			p.records.Add(1)
			pos = r.Offset + 1
			if pr.plan.TimeRange() && (r.Timestamp.Before(pr.plan.From) || !r.Timestamp.Before(pr.plan.To)) {
				p.outOfRange.Add(1)
				p.position.Store(pos)
				continue
			}
			rec := &source.Record{Topic: topic, Partition: part, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
			for _, h := range r.Headers {
				rec.Headers = append(rec.Headers, source.Header{Key: h.Key, Value: h.Value})
			}
			p.emitted.Add(1)
			p.delivered.Add(1)
			if err := emit(rec, rec); err != nil {
				p.emitted.Add(-1)
				p.delivered.Add(-1)
				return err
			}
			p.position.Store(pos)
		}
		// Offsets after the last data record up to the end of the last batch
		// returned are control records (transaction markers), aborted or
		// compacted records.
		if next := min(res.Next, stop); next > pos {
			p.gaps.Add(next - pos)
			pos = next
			p.position.Store(pos)
		}
		if pos > fetchOffset {
			lastProgress = time.Now()
			continue
		}
		if res.Batches == 0 && res.Highwater >= stop && res.Highwater > pos {
			// Nothing is left to read below the highwater at pos (the rest of
			// the range was removed): under read_uncommitted the fetch would
			// have returned it.
			if pr.opts.isolation() != sarama.ReadCommitted {
				p.gaps.Add(stop - pos)
				pos = stop
				p.position.Store(pos)
				continue
			}
		}
		if time.Since(lastProgress) >= pr.opts.IdleTimeout {
			return fmt.Errorf("replay %s[%d]: at %d of [%d, %d) for %s: %w", topic, part, pos, p.pp.Start, stop, pr.opts.IdleTimeout, errIdle)
		}
	}
	return nil
}

// Lane implements source.Producer: one lane, the partition.
func (pr *producer) Lane(any) (any, error) { return pr.p.pp.Partition, nil }

// Advance implements source.Producer: the records the agent moved past, with
// every bound effect done. A failed record fails the replay (its offset and
// the ones after it stay uncommitted); a rejected record is counted and
// passed (a replay writes no dead letters).
func (pr *producer) Advance(_ context.Context, batch []source.AdvanceItem) error {
	p := pr.p
	for _, it := range batch {
		if it.Outcome.Failed > 0 || it.Outcome.Acked+it.Outcome.Rejected == 0 {
			err := fmt.Errorf("replay %s[%d]: record at %d failed: %w", pr.plan.Topic, p.pp.Partition, it.Record.Offset, errors.Join(it.Causes...))
			pr.fail(err)
			return err
		}
		if it.Outcome.Rejected > 0 {
			// A rejection caused by the live effect's error is a failure:
			// with no dead letter in a replay, the effect would be lost.
			for _, c := range it.Causes {
				var fe *agent.EffectError
				if errors.As(c, &fe) {
					err := fmt.Errorf("replay %s[%d]: record at %d rejected after its effect failed: %w", pr.plan.Topic, p.pp.Partition, it.Record.Offset, c)
					pr.fail(err)
					return err
				}
			}
			p.rejected.Add(1)
			pr.opts.Logger.Warn("replay: record rejected (no dead letter is written in a replay)",
				"topic", pr.plan.Topic, "partition", p.pp.Partition, "offset", it.Record.Offset, "reason", errors.Join(it.Causes...))
		}
		p.acked.Store(it.Record.Offset + 1)
		p.advanced.Add(1)
	}
	p.checkComplete()
	return nil
}

// Close implements source.Producer.
func (pr *producer) Close() error { return nil }

// committer commits the replay group's offsets: per partition the offset
// after the last record whose effect is done, or the stop offset once the
// partition is complete.
type committer struct {
	client       sarama.Client
	topic, group string
	parts        []*part
}

func (c *committer) commit() error {
	req := sarama.NewOffsetCommitRequest(c.client.Config(), c.group)
	want := map[int32]int64{}
	for _, p := range c.parts {
		target := p.acked.Load()
		select {
		case <-p.complete:
			target = p.pp.Stop
		default:
		}
		if target > p.committed.Load() {
			want[p.pp.Partition] = target
			req.AddBlock(c.topic, p.pp.Partition, target, 0, "runnel-replay")
		}
	}
	if len(want) == 0 {
		return nil
	}
	var lastErr error
	for attempt := 0; attempt < 10; attempt++ {
		if attempt > 0 {
			_ = c.client.RefreshCoordinator(c.group)
			time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
		}
		b, err := c.client.Coordinator(c.group)
		if err != nil {
			lastErr = err
			continue
		}
		resp, err := b.CommitOffset(req)
		if err != nil {
			lastErr = err
			continue
		}
		lastErr = nil
		for p, off := range want {
			kerr := sarama.ErrNoError
			if m := resp.Errors[c.topic]; m != nil {
				kerr = m[p]
			}
			if kerr != sarama.ErrNoError {
				lastErr = fmt.Errorf("%s[%d]: %w", c.topic, p, kerr)
				continue
			}
			for _, pt := range c.parts {
				if pt.pp.Partition == p {
					pt.committed.Store(off)
				}
			}
		}
		if lastErr == nil || !retriable(lastErr) {
			break
		}
	}
	if lastErr != nil {
		return fmt.Errorf("replay: commit in group %s: %w", c.group, lastErr)
	}
	return nil
}

// fetchCommitted returns the replay group's committed offsets of the plan's
// partitions (absent: nothing committed).
func fetchCommitted(client sarama.Client, plan *Plan) (map[int32]int64, error) {
	parts := map[string][]int32{}
	for _, pp := range plan.Partitions {
		parts[plan.Topic] = append(parts[plan.Topic], pp.Partition)
	}
	req := sarama.NewOffsetFetchRequest(client.Config().Version, plan.Group, parts)
	var lastErr error
	for attempt := 0; attempt < 10; attempt++ {
		if attempt > 0 {
			_ = client.RefreshCoordinator(plan.Group)
			time.Sleep(time.Duration(attempt) * 50 * time.Millisecond)
		}
		b, err := client.Coordinator(plan.Group)
		if err != nil {
			lastErr = err
			continue
		}
		resp, err := b.FetchOffset(req)
		if err != nil {
			lastErr = err
			continue
		}
		out := map[int32]int64{}
		lastErr = nil
		gerr := resp.Err
		if resp.Version >= 8 && len(resp.Groups) > 0 {
			gerr = resp.Groups[0].Err
		}
		if gerr == sarama.ErrGroupIDNotFound {
			return out, nil // a group that never committed
		}
		if gerr != sarama.ErrNoError {
			lastErr = gerr
			continue
		}
		for _, pp := range plan.Partitions {
			blk := resp.GetBlock(plan.Topic, pp.Partition)
			switch {
			case blk == nil:
			case blk.Err != sarama.ErrNoError:
				lastErr = fmt.Errorf("%s[%d]: %w", plan.Topic, pp.Partition, blk.Err)
			case blk.Offset >= 0:
				out[pp.Partition] = blk.Offset
			}
		}
		if lastErr == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("replay: committed offsets of group %s: %w", plan.Group, lastErr)
}
