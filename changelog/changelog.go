package changelog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
)

// Topic returns the changelog topic of table in app: "<app>-<table>-changelog".
func Topic(app, table string) string { return app + "-" + table + "-changelog" }

// Spec returns the topic spec of a changelog: compacted (the latest value per
// key is the table), with the table's partition count, and
// min.compaction.lag.ms = 10 minutes (KIP-58): a record stays uncompacted that
// long, so a changelog record whose source offset is not yet committed cannot
// make the cleaner drop the committed value it supersedes before a restore
// skips it (SkipUncommitted; docs/tables.md). extra overrides or adds
// topic configs (a windowed table sets "cleanup.policy" to "compact,delete" and
// "retention.ms").
func Spec(topic string, partitions int32, extra ...map[string]string) kafka.TopicSpec {
	cfg := map[string]string{"cleanup.policy": "compact", "min.compaction.lag.ms": "600000"}
	for _, e := range extra {
		maps.Copy(cfg, e)
	}
	return kafka.TopicSpec{Name: topic, Partitions: partitions, Config: cfg}
}

// Header keys stamped on every changelog record a table writes: the source
// record whose processing produced it (docs/design.md §6, after Quix Streams'
// state checkpointing; docs/tables.md). Restore uses them to leave out effects of source records whose
// offsets were never committed.
const (
	HeaderSourceTopic     = "runnel-src-topic"
	HeaderSourcePartition = "runnel-src-partition"
	HeaderSourceOffset    = "runnel-src-offset"
)

// Source identifies the source record a changelog record was derived from.
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
}

// Headers returns the changelog record headers that carry s (keys
// HeaderSourceTopic, HeaderSourcePartition, HeaderSourceOffset; decimal values).
func (s Source) Headers() [][2][]byte {
	return [][2][]byte{
		{[]byte(HeaderSourceTopic), []byte(s.Topic)},
		{[]byte(HeaderSourcePartition), strconv.AppendInt(nil, int64(s.Partition), 10)},
		{[]byte(HeaderSourceOffset), strconv.AppendInt(nil, s.Offset, 10)},
	}
}

// MarkKey returns the name of the store mark of s's source partition:
// "<topic>/<partition>" (Kafka topic names cannot contain '/'). See
// stores.Batch.Marks and docs/tables.md.
func (s Source) MarkKey() string {
	return s.Topic + "/" + strconv.FormatInt(int64(s.Partition), 10)
}

// ParseMarkKey splits a mark name made by Source.MarkKey; ok is false when it
// is not one.
func ParseMarkKey(k string) (topic string, partition int32, ok bool) {
	i := strings.LastIndexByte(k, '/')
	if i <= 0 {
		return "", 0, false
	}
	v, err := strconv.ParseInt(k[i+1:], 10, 32)
	if err != nil || v < 0 {
		return "", 0, false
	}
	return k[:i], int32(v), true
}

// SourceOf parses the source headers of a changelog record; ok is false when
// they are absent or malformed (the record is then always applied).
func SourceOf(hs []*sarama.RecordHeader) (s Source, ok bool) {
	var have int
	for _, h := range hs {
		if h == nil {
			continue
		}
		switch string(h.Key) {
		case HeaderSourceTopic:
			s.Topic = string(h.Value)
			have |= 1
		case HeaderSourcePartition:
			v, err := strconv.ParseInt(string(h.Value), 10, 32)
			if err != nil {
				return Source{}, false
			}
			s.Partition = int32(v)
			have |= 2
		case HeaderSourceOffset:
			v, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil {
				return Source{}, false
			}
			s.Offset = v
			have |= 4
		}
	}
	return s, have == 7
}

// CommittedFunc returns the committed offset of a source topic partition: the
// offset of the next record the group will process. ok false means the
// partition is not tracked (records derived from it are always applied); a
// tracked partition without a commit must return (0, true) when the group
// starts from the earliest offset.
type CommittedFunc func(topic string, partition int32) (offset int64, ok bool)

// Option configures one Restore or Follow.
type Option func(*runOpts)

type runOpts struct {
	committed CommittedFunc
	handoff   *Handoff // Follow: promote in place (WithHandoff)
}

// SkipUncommitted makes Restore and Follow leave out every changelog record
// derived from a source record at or after the committed offset of its source
// partition (a record whose effect the group will produce again when it
// reprocesses that source record). See docs/tables.md, "Consistency with
// committed offsets":
//
//   - Restore skips such records but advances the checkpoint past them.
//   - Before reading, Restore checks the store's source-offset marks (see
//     Restore); a mark at or after the committed offset of its source
//     partition means the store holds uncommitted effects, and the partition
//     is wiped and rebuilt.
//   - Follow holds such records back (in memory, in order) until the source
//     offset is committed, so a standby's store never holds uncommitted effects
//     and its promotion only replays the tail.
func SkipUncommitted(f CommittedFunc) Option { return func(o *runOpts) { o.committed = f } }

// Progress reports a restore under way (Kafka Streams' StateRestoreListener
// onBatchRestored, KIP-869).
type Progress struct {
	Topic     string
	Partition int32
	// Records applied (and skipped) so far; From is the offset the restore
	// started reading at, Position the offset after the last record read,
	// Target the highwater captured at start.
	Records, Skipped       int64
	From, Position, Target int64
	Elapsed                time.Duration
	// Rate is records read per second so far; ETA the remaining offsets at
	// that rate (0 when unknown or done).
	Rate float64
	ETA  time.Duration
	// Done is set on the final report of a restore that reached its target;
	// Stopped on the last report of one that ended early (cancelled by a
	// revoke, or failed): it will not report again.
	Done, Stopped bool
}

// Restorer reads changelog partitions into stores. Fields are read-only once
// a restore started; one Restorer serves concurrent restores.
type Restorer struct {
	Client   sarama.Client
	Consumer sarama.Consumer
	Logger   *slog.Logger
	// BatchSize is how many records one store batch holds at most; default
	// 5000 (restore of 100-byte values into Pebble: 362k records/s at 1000,
	// 442k at 5000 on 2 cores; docs/tables.md).
	BatchSize int
	// ProgressInterval is how often a restore reports Progress to OnProgress and
	// the debug log; default 5 s. A first and a final report are always made.
	ProgressInterval time.Duration
	// OnProgress, if set, receives every progress report (restores only, not Follow).
	OnProgress func(Progress)
	// IdleProbe is how long a restore waits without a record before it checks
	// with a direct fetch whether only control records (transaction markers)
	// remain below the target; default 200 ms. See Restore.
	IdleProbe time.Duration
}

// Result describes one restore.
type Result struct {
	// Records is how many changelog records were applied; Skipped how many were
	// left out as uncommitted (SkipUncommitted; a key's first uncommitted
	// record puts the key back to its before-image and counts here too);
	// Fenced how many were ignored as written by a stale owner (an epoch below
	// one already applied, Stamp).
	Records, Skipped, Fenced int64
	// From is the first offset read, To the end offset captured at start
	// (the highwater); From == To means nothing needed replaying.
	From, To int64
	// Start is the offset after the store's checkpoint (0 when it had none or
	// was rebuilt): To - Start is the span of offsets the restore advanced the
	// store over, whatever compaction removed inside it.
	Start int64
	// Rebuilt is set when the local checkpoint was unusable (ahead of the
	// broker's end, below its log start, or covering uncommitted effects) and
	// the partition was wiped.
	Rebuilt bool
	// Promoted is set when a standby's Follow did the restore in place
	// (Handoff.Promote): Records and Skipped count only what it applied and
	// skipped after the promotion, held-back records included.
	Promoted bool
	Elapsed  time.Duration
}

// Restore brings partition p of store up to the end of the changelog partition
// as it is when Restore starts: it reads from the offset after the store's
// checkpoint (or the earliest) up to the highwater captured before reading, and
// applies the records in batches whose last offset is written atomically with
// their data.
//
// Done is position >= target, where position is the offset after the last
// record read. An empty partition or one whose checkpoint is at the end
// returns at once. Compaction gaps need nothing special: the record after a gap
// has a higher offset. A trailing transaction marker (the highwater is one past
// the last data record after a commit) is never delivered by sarama, so when no
// record arrived for IdleProbe, Restore fetches [position, target) directly and
// finishes if it holds only control batches.
//
// A checkpoint ahead of the highwater (the topic was recreated) or below the log
// start (retention or DeleteRecords removed what follows it), or an
// OffsetOutOfRange while reading, wipes the partition with a warning and
// rebuilds it from the earliest offset.
//
// Every applied record that carries source headers (Source) raises the store
// mark Source.MarkKey() to its source offset, in the batch that applies it, so
// a restored store carries the same marks as one written by the table itself.
// With SkipUncommitted, a store holding a mark at or after the committed
// offset of its source partition is wiped and rebuilt, skipping.
func (r *Restorer) Restore(ctx context.Context, topic string, p int32, st stores.Store, opts ...Option) (Result, error) {
	start := time.Now()
	var o runOpts
	for _, f := range opts {
		f(&o)
	}
	res, err := r.run(ctx, topic, p, st, false, o)
	res.Elapsed = time.Since(start)
	if err != nil {
		// The restore ends without its final report: say so, so that a
		// summary (ProgressLog) does not wait for it.
		r.report(Progress{Topic: topic, Partition: p, Records: res.Records, Skipped: res.Skipped, From: res.From,
			Position: res.From, Target: res.To, Elapsed: res.Elapsed, Stopped: true})
		return res, fmt.Errorf("restore %s[%d]: %w", topic, p, err)
	}
	return res, nil
}

// Follow tails partition p of the changelog into store until ctx ends, as a
// standby replica does, checkpointing with every batch so that a promotion only
// replays what arrived after the last batch. It returns nil when ctx ends.
func (r *Restorer) Follow(ctx context.Context, topic string, p int32, st stores.Store, opts ...Option) error {
	var o runOpts
	for _, f := range opts {
		f(&o)
	}
	_, err := r.run(ctx, topic, p, st, true, o)
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

func (r *Restorer) run(ctx context.Context, topic string, p int32, st stores.Store, follow bool, o runOpts) (Result, error) {
	var res Result
	// moved counts reads that ran below a log start moved while reading: the
	// records skipped were removed by compaction (superseded by later records
	// of the same key, which the read still gets), so the read resumes at the
	// new log start instead of wiping. kfake moves the log start whenever it
	// compacts the head of a partition; Kafka never does for compaction, only
	// for retention and DeleteRecords (docs/kafka-compat.md).
	moved := 0
	// The topic's ID (KIP-516) against the one recorded with the checkpoint
	// (topicid.go); unknown on brokers or protocol versions without IDs.
	id, idOK, err := TopicID(r.Client, topic)
	if err != nil {
		r.logger().Debug("changelog topic ID unknown; the checkpoint is checked by offsets only", "topic", topic, "err", err)
	}
	for attempt := 0; ; attempt++ {
		checkpoint, err := st.Offset(p)
		if err != nil {
			return res, err
		}
		marks, err := st.Marks(p)
		if err != nil {
			return res, err
		}
		recorded, hasRecorded := storedTopicID(marks)
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
		// A checkpoint is the offset of a record that exists (or existed) in the
		// log, so checkpoint+1 <= end; more means the topic was deleted and
		// recreated under the store (Faust's E_PERSISTED_OFFSET, fs#158). Below
		// the log start, the records after the checkpoint are gone.
		wipe := ""
		switch {
		case checkpoint != stores.NoOffset && idOK && hasRecorded && recorded != id:
			wipe = fmt.Sprintf("changelog topic ID %s differs from the checkpoint's %s (topic deleted and recreated)", id, recorded)
		case from > end:
			wipe = "changelog checkpoint ahead of the highwater (topic recreated?)"
		case from < oldest && moved > 0:
			from = oldest
		case from < oldest:
			wipe = "changelog checkpoint below the log start offset"
		case o.committed != nil && !follow:
			why, err := dirtyMarks(st, p, o.committed)
			if err != nil {
				return res, err
			}
			if why != "" {
				wipe = "store holds effects of uncommitted source records (" + why + ")"
			}
		}
		if wipe != "" {
			if attempt > 0 {
				return res, fmt.Errorf("checkpoint %d still unusable in [%d, %d] after a rebuild: %s", checkpoint, oldest, end, wipe)
			}
			r.logger().Warn(wipe+"; wiping the partition and rebuilding it from the earliest offset",
				"topic", topic, "partition", p, "checkpoint", checkpoint, "log_start", oldest, "highwater", end)
			if err := st.DropPartition(p); err != nil {
				return res, err
			}
			res.Rebuilt = true
			continue
		}
		if idOK && (!hasRecorded || recorded != id) {
			if err := st.Apply(p, topicIDBatch(id)); err != nil {
				return res, err
			}
		}
		res.From, res.To = from, end
		if from >= end && !follow {
			res.Start = min(res.Start, end)
			r.report(Progress{Topic: topic, Partition: p, From: from, Position: from, Target: end, Done: true})
			return res, nil
		}
		n, skipped, err := r.consume(ctx, topic, p, st, from, end, follow, o, &res.Fenced)
		res.Records += n
		res.Skipped += skipped
		if follow && o.handoff != nil && o.handoff.served {
			return res, err // promoted (or declined): the follower ends
		}
		if follow && errors.Is(err, errHoldBackFull) {
			// The records held back are dropped; the checkpoint is still
			// before the first of them, so reading again from it gets them
			// back once the group committed further.
			r.logger().Info("standby held back more than its bound; reading again from its checkpoint",
				"topic", topic, "partition", p, "bytes", MaxHoldBack)
			attempt = 0
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(holdBackRetry):
			}
			continue
		}
		if errors.Is(err, sarama.ErrOffsetOutOfRange) && (follow || moved < 20) {
			moved++
			attempt = 0
			r.logger().Info("changelog log start moved past the read position (compaction); resuming at the new log start",
				"topic", topic, "partition", p, "offset", from)
			select {
			case <-ctx.Done():
				return res, ctx.Err()
			case <-time.After(time.Duration(min(moved, 10)) * 20 * time.Millisecond):
			}
			continue
		}
		return res, err
	}
}

// dirtyMarks reports whether partition p of st holds an effect of a source
// record the group has not committed: a mark (the highest source offset of a
// source partition whose effect the store holds, written with the data) at or
// after the committed offset of its source partition. It returns a
// description of the first such mark, or "" when the store is clean. Marks of
// untracked source partitions, and malformed mark names, are ignored.
func dirtyMarks(st stores.Store, p int32, f CommittedFunc) (string, error) {
	marks, err := st.Marks(p)
	if err != nil {
		return "", err
	}
	for _, k := range slices.Sorted(maps.Keys(marks)) {
		topic, sp, ok := ParseMarkKey(k)
		if !ok {
			continue
		}
		if c, tracked := f(topic, sp); tracked && marks[k] >= c {
			return fmt.Sprintf("mark %s at source offset %d, committed offset %d", k, marks[k], c), nil
		}
	}
	return "", nil
}

type fetched struct {
	offset int64
}

// fetchAt fetches from offset directly from the partition leader, with the
// reader's isolation level, and returns the data records of the response
// (control batches and, under read_committed, records of aborted
// transactions left out), the offset after the last batch returned, and
// whether the partition has nothing below end that a reader could still be
// given: the response held no batch and the highwater (read_uncommitted) or
// last stable offset (read_committed) is at or past end.
func (r *Restorer) fetchAt(topic string, p int32, offset, end int64) ([]fetched, int64, bool, error) {
	b, err := r.Client.Leader(topic, p)
	if err != nil {
		return nil, 0, false, err
	}
	iso := sarama.ReadUncommitted
	if r.Client.Config().Consumer.IsolationLevel == sarama.ReadCommitted {
		iso = sarama.ReadCommitted
	}
	// Fetch v4 is the oldest version Kafka 4 (and kfake) accept and the first
	// that returns record batches with the control attribute and the aborted
	// transactions (KIP-98).
	req := &sarama.FetchRequest{Version: 4, MaxWaitTime: 0, MinBytes: 1, MaxBytes: 1 << 20, Isolation: iso}
	req.AddBlock(topic, p, offset, 1<<20, -1)
	resp, err := b.Fetch(req)
	if err != nil {
		return nil, 0, false, err
	}
	blk := resp.GetBlock(topic, p)
	if blk == nil {
		return nil, 0, false, errors.New("fetch response without the partition")
	}
	if blk.Err != sarama.ErrNoError {
		return nil, 0, false, blk.Err
	}
	// Under read_committed a batch of a producer at or after the first
	// offset of one of its aborted transactions is aborted data, up to that
	// producer's next control batch (the abort marker). Each aborted
	// transaction is used up by the batch that reaches it: the producer's
	// later transactions may have committed (the Java consumer keeps the
	// same queue, ordered by first offset).
	abortedFrom := map[int64][]int64{}
	for _, at := range blk.AbortedTransactions {
		abortedFrom[at.ProducerID] = append(abortedFrom[at.ProducerID], at.FirstOffset)
	}
	for _, firsts := range abortedFrom {
		slices.Sort(firsts)
	}
	aborting := map[int64]bool{}
	var out []fetched
	next := offset
	batches := 0
	for _, rs := range blk.RecordsSet {
		if rs == nil || rs.RecordBatch == nil {
			continue
		}
		rb := rs.RecordBatch
		batches++
		if !rb.PartialTrailingRecord {
			next = max(next, rb.LastOffset()+1)
		}
		if iso == sarama.ReadCommitted && rb.IsTransactional {
			if firsts := abortedFrom[rb.ProducerID]; len(firsts) > 0 && rb.FirstOffset >= firsts[0] {
				aborting[rb.ProducerID] = true
				for len(firsts) > 0 && firsts[0] <= rb.FirstOffset {
					firsts = firsts[1:]
				}
				abortedFrom[rb.ProducerID] = firsts
			}
		}
		if rb.Control {
			delete(aborting, rb.ProducerID)
			continue
		}
		if aborting[rb.ProducerID] {
			continue
		}
		for _, rec := range rb.Records {
			out = append(out, fetched{offset: rb.FirstOffset + rec.OffsetDelta})
		}
	}
	limit := blk.HighWaterMarkOffset
	if iso == sarama.ReadCommitted && blk.LastStableOffset >= 0 {
		limit = blk.LastStableOffset
	}
	return out, next, batches == 0 && limit >= end, nil
}

// SkipControl returns the offset a reader at from may commit without missing
// a data record: from when a data record (or nothing readable yet) is there;
// otherwise past the transaction markers and, under read_committed, the
// aborted records that start at from, up to the next data record or the end
// of what one fetch returned. A consumer is never given those records, so a
// source that processed everything before them would otherwise commit an
// offset one marker short of the highwater for ever. One fetch; the reader's
// isolation level is the client's.
func (r *Restorer) SkipControl(topic string, p int32, from int64) (int64, error) {
	recs, next, _, err := r.fetchAt(topic, p, from, from+1)
	if err != nil {
		return from, fmt.Errorf("skip control records of %s[%d] at %d: %w", topic, p, from, err)
	}
	to := max(from, next)
	for _, rec := range recs {
		if rec.offset >= from && rec.offset < to {
			to = rec.offset
		}
	}
	return to, nil
}

// onlyControlBelow reports whether [from, end) holds no data record a reader
// is given: every batch there is a control batch (transaction markers) or,
// under read_committed, a batch of an aborted transaction; or nothing is left
// there at all (a trailing record removed by compaction).
func (r *Restorer) onlyControlBelow(topic string, p int32, from, end int64) (bool, error) {
	for from < end {
		recs, next, gone, err := r.fetchAt(topic, p, from, end)
		if err != nil {
			return false, err
		}
		if gone {
			return true, nil
		}
		for _, rec := range recs {
			if rec.offset >= from && rec.offset < end {
				return false, nil
			}
		}
		if next <= from {
			return false, nil // nothing returned yet; keep waiting
		}
		from = next
	}
	return true, nil
}

// report passes pr to OnProgress and logs it at debug level: the worker's
// log has one summary line for all its restores (ProgressLog), not one per
// partition.
func (r *Restorer) report(pr Progress) {
	if r.OnProgress != nil {
		r.OnProgress(pr)
	}
	r.logger().Debug("restore progress", "topic", pr.Topic, "partition", pr.Partition, "records", pr.Records,
		"skipped", pr.Skipped, "position", pr.Position, "target", pr.Target, "records_per_s", int64(pr.Rate),
		"eta", pr.ETA.Round(time.Millisecond), "done", pr.Done)
}

// pendingRec is a record a standby holds back until its source offset is committed.
type pendingRec struct {
	key, value []byte
	offset     int64
	stamp      *Stamp
	// fenced: a stale writer's record met behind held-back ones; it applies
	// nothing, and the checkpoint passes it only when they are released.
	fenced bool
}

// MaxHoldBack bounds the bytes (keys and values) a standby holds back while
// their source offsets are not committed: 64 MiB. A standby over it drops
// them and reads again from its checkpoint a second later (its store never
// holds them before their commit), and a promotion then reads them from the
// broker as a Restore does. A standby normally holds one or two commit
// intervals of its partition's changelog records.
const MaxHoldBack = 64 << 20

// holdBackRetry is how long a standby whose hold-back overflowed waits
// before it reads again.
const holdBackRetry = time.Second

// errHoldBackFull ends a Follow's read when its held-back records passed
// MaxHoldBack (run reads again from the checkpoint).
var errHoldBackFull = errors.New("standby hold-back over its bound")

// promoteIdleProbe is a promoted standby's IdleProbe: the tail it reads after
// the promotion is what was written in the last moments before it (the
// previous owner's final cycle), on a consumer that is already fetching, so a
// pause of more than a few ms means that only a transaction marker (Exactly-
// once) is left below the highwater.
const promoteIdleProbe = 20 * time.Millisecond

func (r *Restorer) consume(ctx context.Context, topic string, p int32, st stores.Store, from, end int64, follow bool, o runOpts, fencedN *int64) (n, skipped int64, err error) {
	// A promotion (Handoff) turns this Follow into a restore; its answer goes
	// out when the read ends, whichever way.
	var handoff chan handoffReq
	if follow && o.handoff != nil {
		handoff = o.handoff.req
	}
	var promoted *handoffReq
	var n0, skipped0, fenced0 int64
	defer func() {
		if promoted == nil {
			return
		}
		res := Result{Records: n - n0, Skipped: skipped - skipped0, Fenced: *fencedN - fenced0, From: from, To: end, Start: from, Promoted: true}
		if err != nil {
			err = fmt.Errorf("promote %s[%d]: %w", topic, p, err)
		}
		promoted.reply <- handoffReply{res: res, err: err}
	}()
	pc, err := r.Consumer.ConsumePartition(topic, p, from)
	if err != nil {
		return 0, 0, err
	}
	// Close (not AsyncClose) waits until the partition consumer is gone, so a
	// Restore right after a Follow of the same partition (promotion) can start.
	defer func() { _ = pc.Close() }()
	size := r.BatchSize
	if size <= 0 {
		size = 5000
	}
	interval := r.ProgressInterval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	idle := r.IdleProbe
	if idle <= 0 {
		idle = 200 * time.Millisecond
	}
	started := time.Now()
	lastReport := started
	pos := from // offset after the last record read
	if follow && o.handoff != nil {
		// From the checkpoint again (a first read, or after a hold-back
		// overflow dropped what was held).
		o.handoff.read.Store(from)
	}
	progress := func(done bool) {
		el := time.Since(started)
		pr := Progress{Topic: topic, Partition: p, Records: n, Skipped: skipped, From: from, Position: pos, Target: end, Elapsed: el, Done: done}
		if s := el.Seconds(); s > 0 {
			pr.Rate = float64(pos-from) / s
		}
		if !done && pr.Rate > 0 && end > pos {
			pr.ETA = time.Duration(float64(end-pos) / pr.Rate * float64(time.Second))
		}
		r.report(pr)
	}
	if !follow {
		progress(false) // the first report: the partition and its target
	}

	// Source-offset marks: the store keeps, per source partition, the highest
	// source offset whose effect it holds (docs/tables.md), and under EpochMark
	// the highest writer epoch applied. marks starts from the store's (empty
	// after a wipe); raised names go out with the next batch.
	marks, err := st.Marks(p)
	if err != nil {
		return 0, 0, err
	}
	raised := map[string]bool{}
	// reverted holds the keys a restore already put back to a before-image:
	// the first uncommitted record of a key carries the committed value, later
	// ones (of later uncommitted cycles) carry uncommitted values.
	reverted := map[string]bool{}

	// b accumulates ops; applied is the checkpoint last written. A batch with
	// no ops but a higher offset still moves the checkpoint (skipped records).
	b := &stores.Batch{Offset: stores.NoOffset}
	applied := stores.NoOffset
	flush := func() error {
		if len(b.Ops) == 0 && len(raised) == 0 && (b.Offset == stores.NoOffset || b.Offset == applied) {
			return nil
		}
		for _, k := range slices.Sorted(maps.Keys(raised)) {
			b.Mark(k, marks[k])
		}
		if err := st.Apply(p, b); err != nil {
			return err
		}
		n += int64(len(b.Ops))
		applied = b.Offset
		clear(raised)
		b = &stores.Batch{Ops: b.Ops[:0:0], Offset: stores.NoOffset}
		return nil
	}
	raise := func(k string, v int64) {
		if cur, ok := marks[k]; !ok || v > cur {
			marks[k] = v
			raised[k] = true
		}
	}
	put := func(key, value []byte, offset int64) {
		if value == nil {
			b.Delete(key)
		} else {
			b.Put(key, value)
		}
		b.Offset = offset
	}
	// passed raises the epoch mark to a record's writer epoch once the
	// checkpoint moves past the record (applied, or skipped by a restore).
	// Invariant: the stored epoch mark covers only records at or below the
	// stored checkpoint. A standby's held-back records must not raise it:
	// a later read from the checkpoint (the next standby, a restore) would
	// take the records between the checkpoint and them, of an older epoch,
	// for a stale writer's and fence them, although the group may have
	// committed them (a chaos run lost them so: TestHeldBackEpochDoesNotFenceCommittedRecords).
	passed := func(stamp *Stamp) {
		if stamp != nil && stamp.Epoch > 0 {
			raise(EpochMark, stamp.Epoch)
		}
	}
	add := func(key, value []byte, offset int64, stamp *Stamp) {
		put(key, value, offset)
		if stamp != nil {
			for _, src := range stamp.Sources {
				raise(src.MarkKey(), src.Offset)
			}
		}
		passed(stamp)
	}
	// seenEpoch is the highest writer epoch of the records read so far, in
	// offset order (held back or not), from the stored mark on.
	seenEpoch := marks[EpochMark]
	// fenced reports whether a record's writer epoch is below one read
	// before it (a stale owner's late write), and raises seenEpoch.
	fenced := func(stamp *Stamp) bool {
		if stamp == nil || stamp.Epoch == 0 {
			return false // written before epochs existed
		}
		if stamp.Epoch < seenEpoch {
			return true
		}
		seenEpoch = stamp.Epoch
		return false
	}
	stampOf := func(hs []*sarama.RecordHeader) *Stamp {
		if s, ok := StampOf(hs); ok {
			return &s
		}
		return nil
	}
	// Standby hold-back (SkipUncommitted in Follow): records are applied in
	// offset order, so once one is held back every later one queues behind it.
	var pending []pendingRec
	pendingBytes := 0
	release := func() {
		i := 0
		for ; i < len(pending) && (pending[i].fenced || pending[i].stamp == nil || pending[i].stamp.committed(o.committed)); i++ {
			if pending[i].fenced {
				b.Offset = pending[i].offset
				continue
			}
			add(pending[i].key, pending[i].value, pending[i].offset, pending[i].stamp)
			pendingBytes -= len(pending[i].key) + len(pending[i].value)
		}
		pending = pending[i:]
		if len(pending) == 0 {
			pending, pendingBytes = nil, 0
		}
	}
	// restoreRec applies a record as a restore does: skipped when its source
	// offset is not committed, the key put back to its before-image by its
	// first such record.
	restoreRec := func(key, value []byte, offset int64, stamp *Stamp) {
		if stamp == nil || o.committed == nil || stamp.committed(o.committed) {
			add(key, value, offset, stamp)
			return
		}
		skipped++
		b.Offset = offset
		passed(stamp)
		if stamp.HasBefore && !reverted[string(key)] {
			// Put the key back to its committed value: compaction may
			// have removed the record that wrote it.
			reverted[string(key)] = true
			put(key, stamp.Before, offset)
		}
	}
	handle := func(msg *sarama.ConsumerMessage) {
		pos = msg.Offset + 1
		if follow && o.handoff != nil {
			o.handoff.read.Store(pos)
		}
		stamp := stampOf(msg.Headers)
		if fenced(stamp) {
			*fencedN++
			if follow && len(pending) > 0 {
				// Behind held-back records the checkpoint stays before
				// them: it passes this one when they are released.
				pending = append(pending, pendingRec{offset: msg.Offset, fenced: true})
				return
			}
			b.Offset = msg.Offset
			return
		}
		uncommitted := stamp != nil && o.committed != nil && !stamp.committed(o.committed)
		switch {
		case follow && o.committed != nil:
			if len(pending) > 0 || uncommitted {
				pending = append(pending, pendingRec{key: msg.Key, value: msg.Value, offset: msg.Offset, stamp: stamp})
				pendingBytes += len(msg.Key) + len(msg.Value)
				return
			}
			add(msg.Key, msg.Value, msg.Offset, stamp)
		case !follow:
			restoreRec(msg.Key, msg.Value, msg.Offset, stamp)
		default:
			add(msg.Key, msg.Value, msg.Offset, stamp)
		}
	}
	// promote turns the Follow into a restore to the highwater under the
	// committed offsets of hr (Handoff.Promote): the held-back records are
	// applied or skipped as a restore would, and the read goes on from the
	// live partition consumer. It returns false when the follower declines
	// (it answered and must end).
	promote := func(hr handoffReq) (bool, error) {
		decline := func(err error) (bool, error) {
			hr.reply <- handoffReply{declined: true, err: err}
			return false, err
		}
		o.handoff.served = true
		if err := flush(); err != nil {
			return decline(err)
		}
		// The standby's store holds only records whose source offsets it
		// saw committed; offsets that went back since (a reset of the
		// group) make it dirty, and only a Restore's wipe rebuilds it.
		why, err := dirtyMarks(st, p, hr.committed)
		if err != nil {
			return decline(err)
		}
		if why != "" {
			return decline(errors.New("store holds effects of uncommitted source records (" + why + ")"))
		}
		hw, err := r.Client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return decline(fmt.Errorf("highwater: %w", err))
		}
		o.committed = hr.committed
		follow, handoff, promoted = false, nil, &hr
		n0, skipped0, fenced0 = n, skipped, *fencedN
		end = hw
		from = pos
		if len(pending) > 0 {
			from = pending[0].offset
		}
		started = time.Now()
		idle = min(idle, promoteIdleProbe)
		progress(false)
		held := pending
		pending, pendingBytes = nil, 0
		for _, rec := range held {
			if rec.fenced {
				b.Offset = rec.offset
				continue
			}
			restoreRec(rec.key, rec.value, rec.offset, rec.stamp)
		}
		return true, flush()
	}

	timer := time.NewTimer(idle)
	defer timer.Stop()
	for {
		if !follow && pos >= end {
			err := flush()
			progress(true)
			return n, skipped, err
		}
		if time.Since(lastReport) >= interval {
			lastReport = time.Now()
			if !follow {
				progress(false)
			}
		}
		timer.Reset(idle)
		var msg *sarama.ConsumerMessage
		select {
		case <-ctx.Done():
			return n, skipped, errors.Join(flush(), ctx.Err())
		case e := <-pc.Errors():
			if e == nil {
				return n, skipped, errors.Join(flush(), errors.New("partition consumer closed"))
			}
			return n, skipped, errors.Join(flush(), e.Err)
		case hr := <-handoff:
			ok, err := promote(hr)
			if !ok || err != nil {
				return n, skipped, err
			}
			continue
		case <-timer.C:
			if follow {
				if len(pending) > 0 {
					release()
				}
				if len(pending) == 0 && pc.HighWaterMarkOffset() > pos {
					// Caught up but short of the highwater: a transactional
					// writer's commit marker (never given to a reader) may
					// end the log. The checkpoint moves past it, so the
					// follower's lag reads 0.
					if to, err := r.SkipControl(topic, p, pos); err == nil && to > pos {
						pos = to
						b.Offset = to - 1
					}
				}
				if err := flush(); err != nil {
					return n, skipped, err
				}
				continue
			}
			if err := flush(); err != nil {
				return n, skipped, err
			}
			ok, err := r.onlyControlBelow(topic, p, pos, end)
			if err != nil {
				r.logger().Debug("restore idle probe failed", "topic", topic, "partition", p, "err", err)
				continue
			}
			if ok {
				pos = end
			}
			continue
		case msg = <-pc.Messages():
		}
		if msg == nil {
			// Sarama closes Messages after an error such as OffsetOutOfRange
			// (kfake moves the log start when it compacts): report that error,
			// which may still be waiting on Errors, rather than the close.
			for e := range pc.Errors() {
				if e != nil {
					return n, skipped, errors.Join(flush(), e.Err)
				}
			}
			return n, skipped, errors.Join(flush(), errors.New("partition consumer closed"))
		}
		for msg != nil {
			handle(msg)
			if !follow && pos >= end {
				break
			}
			msg = nil
			if len(b.Ops)+len(pending) < size {
				select {
				case msg = <-pc.Messages():
				default:
				}
			}
		}
		if len(pending) > 0 {
			release()
		}
		if err := flush(); err != nil {
			return n, skipped, err
		}
		if pendingBytes > MaxHoldBack {
			return n, skipped, errHoldBackFull
		}
	}
}
