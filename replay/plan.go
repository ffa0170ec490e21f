package replay

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
)

// Errors of NewPlan and Run. Every error returned wraps one of them, or an
// *IncompleteError, with context (topic, partition, offsets).
var (
	// ErrLiveGroup: the replay group is the live consumer group (or empty).
	// Replaying in the live group would move the live group's offsets.
	ErrLiveGroup = errors.New("replay group must differ from the live group")
	// ErrBeyondEnd: an explicit stop offset lies past the end offset
	// (highwater) captured when the plan was made.
	ErrBeyondEnd = errors.New("stop offset beyond the captured end offset")
	// ErrBelowLogStart: the range starts below the partition's log start
	// offset: retention or DeleteRecords removed part of it.
	ErrBelowLogStart = errors.New("start offset below the log start offset")
	// ErrBadRange: a range with start > stop, negative offsets, from >= to, a
	// partition the topic does not have, or neither a time range nor offsets.
	ErrBadRange = errors.New("invalid replay range")
	// ErrBackwards: the broker returned a record at or below one already
	// seen (a duplicate or a backwards move), which a replay never accepts.
	ErrBackwards = errors.New("offset did not move forward")
	// ErrGroupOutside: the replay group already has a committed offset
	// outside the plan's range for a partition: it belongs to another replay.
	ErrGroupOutside = errors.New("replay group has a committed offset outside the plan")
	// ErrEffectUnused: records were delivered but the agent never called the
	// named effect (a misspelt --effect would otherwise "succeed" applying
	// nothing).
	ErrEffectUnused = errors.New("the named effect was never called")
)

// Range is the half-open offset range [Start, Stop) of one partition.
type Range struct{ Start, Stop int64 }

// Spec is what to replay: a topic, either a time range [From, To) of record
// timestamps or explicit per-partition offset ranges, and the replay group.
type Spec struct {
	Topic string
	// From and To bound the record timestamps, half-open [From, To). Used when
	// Offsets is nil.
	From, To time.Time
	// Offsets, when non-nil, gives the range of each partition to replay
	// explicitly (partitions not listed are not replayed).
	Offsets map[int32]Range
	// Group is the replay consumer group, where the replay commits its
	// progress; LiveGroup is the app's live group. They must differ.
	Group, LiveGroup string
	// ReadCommitted captures each partition's last stable offset (KIP-98)
	// as its end instead of the highwater: what a read_committed replay
	// (Options.ReadCommitted) can read without waiting for an open
	// transaction to finish.
	ReadCommitted bool
}

// PartitionPlan is the range of one partition.
type PartitionPlan struct {
	Partition int32
	// Start and Stop are the half-open offset range [Start, Stop). Start ==
	// Stop is an empty partition (Empty is then true): nothing to replay.
	Start, Stop int64
	// LogStart and End are the partition's log start offset and end offset
	// (highwater) captured when the plan was made, before any read.
	LogStart, End int64
	Empty         bool
}

// Plan is a validated replay: per partition the offsets to read. Make it
// with NewPlan; Run executes it.
type Plan struct {
	Topic, Group, LiveGroup string
	// From and To are the time range (zero for an offset plan). In a time
	// plan, records inside [Start, Stop) whose timestamp lies outside
	// [From, To) (out-of-order timestamps) are read but not delivered.
	From, To time.Time
	// Partitions holds every planned partition in partition order, empty
	// ones included.
	Partitions []PartitionPlan
	// CapturedAt is when the end offsets were captured.
	CapturedAt time.Time
}

// Records is the number of offsets the plan spans (data records, plus any
// compaction gaps and transaction markers inside the ranges).
func (p *Plan) Records() int64 {
	var n int64
	for _, pp := range p.Partitions {
		n += pp.Stop - pp.Start
	}
	return n
}

// TimeRange reports whether the plan came from a time range.
func (p *Plan) TimeRange() bool { return !p.From.IsZero() || !p.To.IsZero() }

// String describes the plan, one line per partition.
func (p *Plan) String() string {
	s := fmt.Sprintf("replay %s into group %s", p.Topic, p.Group)
	if p.TimeRange() {
		s += fmt.Sprintf(" for [%s, %s)", p.From.UTC().Format(time.RFC3339), p.To.UTC().Format(time.RFC3339))
	}
	s += ": " + plural(p.Records(), "offset") + "\n"
	for _, pp := range p.Partitions {
		empty := ""
		if pp.Empty {
			empty = " (empty)"
		}
		s += fmt.Sprintf("  %s[%d] [%d, %d)%s, log [%d, %d)\n", p.Topic, pp.Partition, pp.Start, pp.Stop, empty, pp.LogStart, pp.End)
	}
	return s
}

// NewPlan validates spec and resolves it into offsets with client: for each
// partition of the topic it captures the log start and end offsets first,
// then (time range) asks ListOffsets for the first offset whose timestamp is
// at or after From (start) and at or after To (stop); no such record means
// the end offset. Offsets found past the captured end (records produced
// since) are clamped to it: a plan never grows while it runs.
//
// Errors: ErrLiveGroup, ErrBadRange, ErrBeyondEnd (explicit stop past the
// captured end), ErrBelowLogStart, and the broker's.
func NewPlan(c Cluster, spec Spec) (*Plan, error) {
	return newPlan(kafka.SaramaClient(c), spec)
}

// Cluster is the connection to the Kafka cluster a replay plans with and reads
// from: an *app.Client (app.Dial, App.Client). No type outside Runnel
// implements it.
type Cluster interface {
	carrier
}

// carrier is unexported so that Cluster's method is no part of its API.
type carrier = kafka.ClientCarrier

func newPlan(client sarama.Client, spec Spec) (*Plan, error) {
	if spec.Group == "" || spec.Group == spec.LiveGroup {
		return nil, fmt.Errorf("replay %s: group %q, live group %q: %w", spec.Topic, spec.Group, spec.LiveGroup, ErrLiveGroup)
	}
	if spec.Topic == "" {
		return nil, fmt.Errorf("replay: no topic: %w", ErrBadRange)
	}
	timed := spec.Offsets == nil
	if timed && (spec.From.IsZero() || spec.To.IsZero() || !spec.From.Before(spec.To)) {
		return nil, fmt.Errorf("replay %s: time range [%v, %v): %w", spec.Topic, spec.From, spec.To, ErrBadRange)
	}
	parts, err := client.Partitions(spec.Topic)
	if err != nil {
		return nil, fmt.Errorf("replay %s: partitions: %w", spec.Topic, err)
	}
	have := map[int32]bool{}
	for _, p := range parts {
		have[p] = true
	}
	var want []int32
	if timed {
		want = parts
	} else {
		for p, r := range spec.Offsets {
			if !have[p] {
				return nil, fmt.Errorf("replay %s: partition %d does not exist: %w", spec.Topic, p, ErrBadRange)
			}
			if r.Start < 0 || r.Stop < r.Start {
				return nil, fmt.Errorf("replay %s[%d]: [%d, %d): %w", spec.Topic, p, r.Start, r.Stop, ErrBadRange)
			}
			want = append(want, p)
		}
	}
	sort.Slice(want, func(i, j int) bool { return want[i] < want[j] })
	plan := &Plan{Topic: spec.Topic, Group: spec.Group, LiveGroup: spec.LiveGroup, CapturedAt: time.Now()}
	if timed {
		plan.From, plan.To = spec.From, spec.To
	}
	// Capture every end offset before anything else is asked: the plan's
	// upper bounds are fixed before the first read.
	ends := map[int32]int64{}
	for _, p := range want {
		end, err := endOffset(client, spec.Topic, p, spec.ReadCommitted)
		if err != nil {
			return nil, fmt.Errorf("replay %s[%d]: end offset: %w", spec.Topic, p, err)
		}
		ends[p] = end
	}
	for _, p := range want {
		end := ends[p]
		logStart, err := client.GetOffset(spec.Topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("replay %s[%d]: log start offset: %w", spec.Topic, p, err)
		}
		pp := PartitionPlan{Partition: p, LogStart: logStart, End: end}
		if timed {
			if pp.Start, err = offsetForTime(client, spec.Topic, p, spec.From, end); err != nil {
				return nil, err
			}
			if pp.Stop, err = offsetForTime(client, spec.Topic, p, spec.To, end); err != nil {
				return nil, err
			}
			// A start found below the log start cannot happen (ListOffsets
			// answers from the log), but a stop below the start can when the
			// timestamps are out of order: nothing of the range is here.
			pp.Stop = max(pp.Stop, pp.Start)
		} else {
			r := spec.Offsets[p]
			pp.Start, pp.Stop = r.Start, r.Stop
			if r.Stop > end {
				return nil, fmt.Errorf("replay %s[%d]: stop %d, captured end %d: %w", spec.Topic, p, r.Stop, end, ErrBeyondEnd)
			}
		}
		if pp.Start < logStart && pp.Stop > pp.Start {
			return nil, fmt.Errorf("replay %s[%d]: start %d, log start %d: %w", spec.Topic, p, pp.Start, logStart, ErrBelowLogStart)
		}
		pp.Empty = pp.Start == pp.Stop
		plan.Partitions = append(plan.Partitions, pp)
	}
	return plan, nil
}

// offsetForTime is ListOffsets by timestamp (KIP-79): the first offset whose
// timestamp is at or after t, or end when no record is (the broker answers
// -1), clamped to end.
func offsetForTime(client sarama.Client, topic string, p int32, t time.Time, end int64) (int64, error) {
	off, err := client.GetOffset(topic, p, t.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("replay %s[%d]: offset for time %s: %w", topic, p, t.UTC().Format(time.RFC3339Nano), err)
	}
	if off < 0 || off > end {
		return end, nil
	}
	return off, nil
}

// endOffset is ListOffsets(latest): the highwater, or under read_committed
// the last stable offset (sarama's GetOffset always asks read_uncommitted).
func endOffset(client sarama.Client, topic string, p int32, readCommitted bool) (int64, error) {
	if !readCommitted {
		return client.GetOffset(topic, p, sarama.OffsetNewest)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			_ = client.RefreshMetadata(topic)
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		b, err := client.Leader(topic, p)
		if err != nil {
			lastErr = err
			continue
		}
		req := sarama.NewOffsetRequest(client.Config().Version)
		if req.Version < 2 {
			return 0, fmt.Errorf("last stable offset needs ListOffsets v2 (Kafka 0.11), the client speaks v%d", req.Version)
		}
		req.IsolationLevel = sarama.ReadCommitted
		req.AddBlock(topic, p, sarama.OffsetNewest, 1)
		resp, err := b.GetAvailableOffsets(req)
		if err != nil {
			lastErr = err
			continue
		}
		blk := resp.GetBlock(topic, p)
		if blk == nil {
			lastErr = errors.New("no answer for the partition")
			continue
		}
		if blk.Err != sarama.ErrNoError {
			lastErr = blk.Err
			if retriable(blk.Err) {
				continue
			}
			break
		}
		return blk.Offset, nil
	}
	return 0, fmt.Errorf("last stable offset: %w", lastErr)
}

// plural renders n and noun, with an s unless n is 1: "1 offset", "2 offsets".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
