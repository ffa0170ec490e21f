package changelog

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"
)

// ProgressLog folds the Progress reports of a worker's concurrent restores
// into one log line every Interval, instead of a line per partition: a
// worker restoring 16 partitions of 3 tables logs
//
//	msg="restore progress" tables=a,b,c partitions_done=5 partitions=16 records=120000 records_total=400000 records_per_s=52000 eta=5.4s
//
// while any restore is under way, and one "restore done" line with the
// totals and the elapsed time when the last one of a round finished (a round
// starts with the first report after the previous round ended, e.g. at a
// rebalance). records counts the changelog offsets covered since each
// restore started (Position - From), records_total the offsets to cover
// (Target - From): compaction may have removed some records in between, so
// the records applied can be fewer. The rate is offsets per second over the
// round; eta the offsets left at that rate (absent while unknown).
//
// Feed it with Observe (Restorer.OnProgress) and call Run; Log emits a line
// at once. Safe for concurrent use.
type ProgressLog struct {
	// Logger receives the lines (Info); required.
	Logger *slog.Logger
	// Interval is how often Run logs while a restore is under way; default 5 s.
	Interval time.Duration
	// TableOf maps a changelog topic to its table name; default: the topic.
	TableOf func(topic string) string

	mu      sync.Mutex                 // guards the fields below
	parts   map[topicPartition]partLog // the round's restores
	started time.Time                  // the round's first report
}

type topicPartition struct {
	topic string
	p     int32
}

// partLog is one restore of the round: its first and latest report.
type partLog struct {
	from int64 // the position of its first report
	last Progress
}

// Summary is the state of a round of restores (ProgressLog.Summary).
type Summary struct {
	// Tables are the tables restored in the round, sorted.
	Tables []string
	// Partitions restores in the round, PartitionsDone of them finished.
	Partitions, PartitionsDone int
	// Records and RecordsTotal are the changelog offsets covered so far and
	// to cover in all (see ProgressLog).
	Records, RecordsTotal int64
	// Elapsed since the round's first report; Rate offsets per second over
	// it; ETA the offsets left at that rate (0 when unknown or done).
	Elapsed time.Duration
	Rate    float64
	ETA     time.Duration
}

// Observe records one report (Restorer.OnProgress); Restore makes one as it
// starts, so the round knows every partition and its target at once.
func (l *ProgressLog) Observe(pr Progress) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.parts == nil {
		l.parts = map[topicPartition]partLog{}
	}
	if len(l.parts) == 0 {
		l.started = time.Now()
	}
	k := topicPartition{pr.Topic, pr.Partition}
	if pr.Stopped { // cancelled (a revoke) or failed: not part of the round any more
		delete(l.parts, k)
		return
	}
	pl, ok := l.parts[k]
	if !ok || pl.last.Done && !pr.Done { // a new restore of a partition restored before in the round
		pl = partLog{from: min(pr.From, pr.Position)}
	}
	pl.last = pr
	l.parts[k] = pl
}

// Summary returns the round's state; ok is false when no restore was
// reported since the last round ended.
func (l *ProgressLog) Summary() (s Summary, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.summary()
}

func (l *ProgressLog) summary() (s Summary, ok bool) {
	if len(l.parts) == 0 {
		return s, false
	}
	tables := map[string]bool{}
	for k, pl := range l.parts {
		name := k.topic
		if l.TableOf != nil {
			if t := l.TableOf(k.topic); t != "" {
				name = t
			}
		}
		tables[name] = true
		s.Partitions++
		if pl.last.Done {
			s.PartitionsDone++
		}
		s.Records += max(pl.last.Position-pl.from, 0)
		s.RecordsTotal += max(pl.last.Target-pl.from, 0)
	}
	for t := range tables {
		s.Tables = append(s.Tables, t)
	}
	sort.Strings(s.Tables)
	s.Elapsed = time.Since(l.started)
	if sec := s.Elapsed.Seconds(); sec > 0 {
		s.Rate = float64(s.Records) / sec
	}
	if left := s.RecordsTotal - s.Records; left > 0 && s.Rate > 0 && s.PartitionsDone < s.Partitions {
		s.ETA = time.Duration(float64(left) / s.Rate * float64(time.Second))
	}
	return s, true
}

// Log writes the round's line now: "restore progress" while a restore is
// under way, or "restore done" when all of the round's restores finished,
// which ends the round. Nothing when no restore was reported.
func (l *ProgressLog) Log() {
	l.mu.Lock()
	s, ok := l.summary()
	done := ok && s.PartitionsDone == s.Partitions
	if done {
		l.parts = nil
	}
	l.mu.Unlock()
	if !ok {
		return
	}
	attrs := []any{"tables", slices.Clone(s.Tables), "partitions_done", s.PartitionsDone, "partitions", s.Partitions,
		"records", s.Records, "records_total", s.RecordsTotal}
	if done {
		l.Logger.Info("restore done", append(attrs, "elapsed", s.Elapsed.Round(time.Millisecond))...)
		return
	}
	attrs = append(attrs, "records_per_s", int64(s.Rate))
	if s.ETA > 0 {
		attrs = append(attrs, "eta", s.ETA.Round(100*time.Millisecond))
	}
	l.Logger.Info("restore progress", attrs...)
}

// Run logs every Interval until ctx ends: a progress line while restores
// are under way, the done line of a round as soon as its last restore
// finished (checked every 100 ms, so a short restore logs one line only).
func (l *ProgressLog) Run(ctx context.Context) {
	interval := l.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s, ok := l.Summary()
			if !ok {
				continue
			}
			if s.PartitionsDone == s.Partitions || now.Sub(last) >= interval && s.Elapsed >= interval {
				last = now
				l.Log()
			}
		}
	}
}
