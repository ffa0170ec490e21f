package kafka

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/IBM/sarama"
)

// leanMaxBuffered bounds the memory of records sent but not yet answered
// (success or error; their bytes and their bookkeeping, leanRecordMem):
// Send blocks while the buffer is over it. Every such record also keeps its
// source record unresolved upstream, so the bound is kept small: on the
// stateless benchmark (kfake, 1M records) 8, 16, 32 and 64 MiB ran at the
// same speed. (The Java producer's buffer.memory is 32 MiB.)
const leanMaxBuffered = 16 << 20

// leanRecordMem is the memory of one buffered record besides its bytes (its
// leanRecord), counted against leanMaxBuffered.
const leanRecordMem = int(unsafe.Sizeof(leanRecord{}))

// leanMaxBatch caps one partition's record batch (before
// Producer.MaxMessageBytes, which caps it further when smaller).
const leanMaxBatch = 1 << 20

// leanRecordOverhead is the most a record adds to a batch besides its key,
// value and headers: Sarama's maximumRecordOverhead (five 32-bit varints, a
// 64-bit varint and the attributes byte).
const leanRecordOverhead = 5*5 + 10 + 1

// leanBatchOverhead is a record batch's header size (Sarama's
// recordBatchOverhead).
const leanBatchOverhead = 49

// leanProducer is the idempotent, non-transactional producer behind a
// Producer whose client has no transactional ID. Senders append records to
// their partition's pending list; one sender goroutine (run) cuts pending
// records into a record batch and sends, per broker, one ProduceRequest at a
// time carrying the ready batches of every partition that broker leads; the
// broker's response goroutine (Sarama's, through AsyncProduce's callback)
// handles the answer and queues the delivery reports for the reporter
// goroutine.
//
// Invariants:
//   - every field below mu is guarded by mu, and so are the fields of every
//     leanPartition and leanBatch reachable from parts (except the records of
//     a batch while it is sent: see leanBatch);
//   - a partition has at most one batch (leanPartition.batch) between its cut
//     and the end of its delivery reports, so its reports come in offset order
//     and a retry resends the same batch with the same sequence;
//   - a broker has at most one request of ours in flight (busy);
//   - mu is never held while calling Sarama's broker or client, nor while
//     running a delivery report (a report takes locks of its own).
//
// Lock order: Producer.mu is never taken under mu (reports run unlocked).
type leanProducer struct {
	p      *Producer // the owner, whose inFlight and Flush this producer serves
	client sarama.Client
	conf   *sarama.Config
	// reqVersion is the ProduceRequest version for conf.Version.
	reqVersion int16
	// maxBatch is the most bytes (estimated, see recordSize) of one batch.
	maxBatch int
	// maxRequest is the most bytes of one ProduceRequest.
	maxRequest int

	// wake tells run that something changed (a partition got its first
	// pending record or enough bytes, an answer came, Flush or Close waits).
	wake chan struct{}
	// stopped is closed when run returned.
	stopped chan struct{}
	// The delivery reports run on one goroutine of their own (reporter), in
	// the order their jobs were queued: a broker's response goroutine, and
	// run, only queue them, so neither waits for a report (a report may
	// take locks a sender holds while it waits in Send for buffer space,
	// and Sarama's next AsyncProduce to a broker waits for the broker's
	// response goroutine). A partition's next batch is cut only after its
	// job ran (finish), so its reports stay in offset order. rmu guards
	// rq and rstop; rcond is signalled on both; reported is closed when
	// the reporter returned.
	rmu      sync.Mutex
	rcond    *sync.Cond
	rq       []leanJob
	rstop    bool
	reported chan struct{}
	// closeOnce guards close; closeDone is closed once close finished.
	closeOnce sync.Once
	closeDone chan struct{}

	mu sync.Mutex
	// space is signalled under mu when buffered went down or closed was set.
	space *sync.Cond
	// parts maps a topic and partition to its state; entries are never removed.
	parts map[topicPartition]*leanPartition
	// active lists the partitions that may have pending records or a batch;
	// run drops the idle ones.
	active []*leanPartition
	// buffered is the estimated memory of the records sent and not yet
	// answered: their batch bytes plus their leanRecord (leanRecordMem).
	buffered int
	// busy holds the brokers with one of our requests in flight.
	busy map[*sarama.Broker]bool
	// toClose lists brokers whose connection failed; run closes them
	// (outside mu: Broker.Close waits for the response goroutine, which may
	// be waiting for mu in answer).
	toClose []*sarama.Broker
	// pid and epoch are the producer ID and epoch new batches carry; pidGen
	// counts the IDs obtained (a partition whose pidGen differs restarts its
	// sequence at 0 under the current ID).
	pid    int64
	epoch  int16
	pidGen uint64
	// needPID is set when a batch failed: no batch is cut until a new
	// producer ID replaced the current one. pidRetryAt is when run may try
	// InitProducerID again after a failure.
	needPID    bool
	pidRetryAt time.Time
	// closed is set by close: Send refuses records, and run no longer lingers.
	closed bool
	// stopping tells run to return.
	stopping bool
}

// topicPartition keys leanProducer.parts.
type topicPartition struct {
	topic     string
	partition int32
}

// leanRecord is one record sent and not yet answered.
type leanRecord struct {
	key, value []byte
	headers    []sarama.RecordHeader
	ts         time.Time // truncated to the millisecond, never zero
	size       int       // the record's estimated bytes in a batch (recordSize)
	// Exactly one of ack and msg is set: msg for Send (done may be nil).
	ack  Acker
	msg  *sarama.ProducerMessage
	done DeliveryFunc
}

// leanPartition is one partition's state, guarded by leanProducer.mu.
type leanPartition struct {
	topic string
	id    int32
	// pending are the records not yet in a batch, in send order;
	// pendingBytes their size, since when the first of them came.
	pending      []leanRecord
	pendingBytes int
	since        time.Time
	// spare is a record slice of an answered batch, reused by the next cut.
	spare []leanRecord
	// batch is the partition's batch from its cut to the end of its
	// delivery reports, nil when none.
	batch *leanBatch
	// seq is the sequence of the next batch cut, under the producer ID of
	// generation pidGen (advanced only when the broker acknowledged a batch).
	seq    int32
	pidGen uint64
	// leader is the broker leading the partition, nil until resolved (or
	// after an error); refresh asks for a metadata refresh before resolving.
	leader  *sarama.Broker
	refresh bool
	// isActive says whether the partition is in leanProducer.active.
	isActive bool
}

// leanBatch is a partition's record batch. Its fields are guarded by
// leanProducer.mu; recs is read without mu by the goroutine that reports
// the batch (nothing else touches a batch while sent is true).
type leanBatch struct {
	recs  []leanRecord
	bytes int
	rb    *sarama.RecordBatch
	// tries counts the failed attempts to send it; notBefore is when the
	// next may start (retry backoff).
	tries     int
	notBefore time.Time
	// sent is true while a request carrying the batch is in flight or its
	// answer is being handled.
	sent bool
}

// newLeanProducer obtains a producer ID for client and starts the sender.
func newLeanProducer(p *Producer, client sarama.Client) (*leanProducer, error) {
	conf := client.Config()
	l := &leanProducer{
		p:          p,
		client:     client,
		conf:       conf,
		reqVersion: produceRequestVersion(conf.Version),
		maxBatch:   min(leanMaxBatch, conf.Producer.MaxMessageBytes),
		maxRequest: int(sarama.MaxRequestSize) - 10<<10,
		wake:       make(chan struct{}, 1),
		stopped:    make(chan struct{}),
		reported:   make(chan struct{}),
		closeDone:  make(chan struct{}),
		parts:      make(map[topicPartition]*leanPartition),
		busy:       make(map[*sarama.Broker]bool),
	}
	l.space = sync.NewCond(&l.mu)
	l.rcond = sync.NewCond(&l.rmu)
	// A broker that just started may not answer InitProducerId yet
	// (COORDINATOR_LOAD_IN_PROGRESS, a connection refused): try as often as
	// a record would be.
	pid, epoch, err := l.initProducerID()
	for try := 0; err != nil && try < conf.Producer.Retry.Max; try++ {
		time.Sleep(max(conf.Producer.Retry.Backoff, 10*time.Millisecond))
		pid, epoch, err = l.initProducerID()
	}
	if err != nil {
		return nil, fmt.Errorf("new producer: %w", err)
	}
	l.pid, l.epoch, l.pidGen = pid, epoch, 1
	go l.run()
	go l.reporter()
	return l, nil
}

// produceRequestVersion is the ProduceRequest version Sarama's own producer
// uses for version v (v is at least 0.11: record batches).
func produceRequestVersion(v sarama.KafkaVersion) int16 {
	switch {
	case v.IsAtLeast(sarama.V3_7_0_0):
		return 10
	case v.IsAtLeast(sarama.V2_8_0_0):
		return 9
	case v.IsAtLeast(sarama.V2_4_0_0):
		return 8
	case v.IsAtLeast(sarama.V2_1_0_0):
		return 7
	case v.IsAtLeast(sarama.V2_0_0_0):
		return 6
	case v.IsAtLeast(sarama.V1_0_0_0):
		return 5
	default:
		return 3
	}
}

// initProducerID asks the cluster for a new producer ID and epoch.
func (l *leanProducer) initProducerID() (int64, int16, error) {
	resp, err := l.client.InitProducerID()
	if err != nil {
		return 0, 0, fmt.Errorf("init producer id: %w", err)
	}
	if resp.Err != sarama.ErrNoError {
		return 0, 0, fmt.Errorf("init producer id: %w", resp.Err)
	}
	return resp.ProducerID, resp.ProducerEpoch, nil
}

// recordSize is a record's estimated bytes in a batch, as Sarama estimates
// it: key, value, headers and the most a record's framing takes.
func recordSize(key, value []byte, headers []sarama.RecordHeader) int {
	n := leanRecordOverhead + len(key) + len(value)
	for _, h := range headers {
		n += len(h.Key) + len(h.Value) + 2*5
	}
	return n
}

// errRecordTooLarge is wrapped by Send's error for a record over
// Producer.MaxMessageBytes: a sarama.ConfigurationError, as Sarama's own
// producer reports it (callers classify it as permanent).
var errRecordTooLarge = sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes")

// send queues r for topic[partition]: it blocks while the buffered bytes are
// over leanMaxBuffered, and counts r in the owner's inFlight.
func (l *leanProducer) send(topic string, partition int32, r leanRecord) error {
	r.size = recordSize(r.key, r.value, r.headers)
	if r.size+leanBatchOverhead > l.conf.Producer.MaxMessageBytes {
		return fmt.Errorf("produce %s[%d]: record of about %d bytes is over Producer.MaxMessageBytes (%d): %w",
			topic, partition, r.size+leanBatchOverhead, l.conf.Producer.MaxMessageBytes, errRecordTooLarge)
	}
	if partition < 0 {
		return fmt.Errorf("produce %s[%d]: invalid partition: %w", topic, partition, sarama.ErrInvalidPartition)
	}
	now := time.Now()
	if r.ts.IsZero() {
		r.ts = now
	}
	r.ts = r.ts.Truncate(time.Millisecond)
	l.mu.Lock()
	// A record larger than the whole bound goes once nothing else is
	// buffered, so that it cannot wait forever.
	for !l.closed && l.buffered > 0 && l.buffered+r.size+leanRecordMem > leanMaxBuffered {
		l.space.Wait()
	}
	if l.closed {
		l.mu.Unlock()
		return ErrProducerClosed
	}
	key := topicPartition{topic, partition}
	pt := l.parts[key]
	if pt == nil {
		pt = &leanPartition{topic: topic, id: partition}
		l.parts[key] = pt
	}
	kick := false
	if len(pt.pending) == 0 {
		pt.since = now
		kick = true
		if pt.pending == nil && pt.spare != nil {
			pt.pending, pt.spare = pt.spare, nil
		}
	}
	pt.pending = append(pt.pending, r)
	before := pt.pendingBytes
	pt.pendingBytes += r.size
	if flush := l.conf.Producer.Flush.Bytes; flush > 0 && before < flush && pt.pendingBytes >= flush {
		kick = true
	}
	if !pt.isActive {
		pt.isActive = true
		l.active = append(l.active, pt)
	}
	l.buffered += r.size + leanRecordMem
	l.p.inFlight.Add(1)
	l.mu.Unlock()
	if kick {
		l.kick()
	}
	return nil
}

// kick wakes run without blocking.
func (l *leanProducer) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// leanRequest is one ProduceRequest run is about to send.
type leanRequest struct {
	broker  *sarama.Broker
	req     *sarama.ProduceRequest
	bytes   int
	parts   []*leanPartition
	batches []*leanBatch
}

// run is the sender goroutine: it closes failed broker connections,
// renews the producer ID after a failed batch, resolves partition leaders,
// cuts batches and sends requests, then sleeps until kicked or until the
// earliest linger or backoff ends.
func (l *leanProducer) run() {
	defer close(l.stopped)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		l.mu.Lock()
		if l.stopping {
			l.mu.Unlock()
			return
		}
		closing := l.toClose
		l.toClose = nil
		now := time.Now()
		renew := l.needPID && !now.Before(l.pidRetryAt) && l.anyPendingLocked()
		var reqs []*leanRequest
		var resolve []*leanPartition
		var next time.Time
		if !renew {
			reqs, resolve, next = l.collectLocked(now)
		}
		l.mu.Unlock()

		for _, b := range closing {
			_ = b.Close()
		}
		if renew {
			l.renewPID()
			continue
		}
		for _, r := range reqs {
			l.sendRequest(r)
		}
		if len(resolve) > 0 {
			l.resolve(resolve)
		}
		if len(reqs) > 0 || len(resolve) > 0 || len(closing) > 0 {
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-l.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		case <-timer.C:
		}
	}
}

// anyPendingLocked reports whether a partition has records waiting for a batch.
func (l *leanProducer) anyPendingLocked() bool {
	for _, pt := range l.active {
		if len(pt.pending) > 0 {
			return true
		}
	}
	return false
}

// collectLocked cuts the batches that are ready and whose leader is free,
// and groups the batches to (re)send into one request per free broker. It
// returns those requests (their brokers marked busy, their batches sent),
// the partitions whose leader must be resolved first, and the earliest time
// a lingering or backing-off partition becomes ready (zero: none).
func (l *leanProducer) collectLocked(now time.Time) ([]*leanRequest, []*leanPartition, time.Time) {
	var reqs []*leanRequest
	var byBroker map[*sarama.Broker]*leanRequest
	var resolve []*leanPartition
	var next time.Time
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	noLinger := l.closed || l.p.waiters.Load() > 0 || l.conf.Producer.Flush.Frequency <= 0
	flushBytes := l.conf.Producer.Flush.Bytes
	kept := l.active[:0]
	for _, pt := range l.active {
		if pt.batch == nil && len(pt.pending) == 0 {
			pt.isActive = false
			continue
		}
		kept = append(kept, pt)
		b := pt.batch
		if b == nil {
			if l.needPID {
				// A batch failed: the next one waits for a new producer
				// ID, which run asks for from pidRetryAt on (at once when
				// that has passed: run checks before collecting).
				if now.Before(l.pidRetryAt) {
					later(l.pidRetryAt)
				}
				continue
			}
			if !noLinger && (flushBytes <= 0 || pt.pendingBytes < flushBytes) {
				if until := pt.since.Add(l.conf.Producer.Flush.Frequency); now.Before(until) {
					later(until)
					continue
				}
			}
			if pt.leader != nil && l.busy[pt.leader] {
				continue // the broker's answer kicks run
			}
			b = l.cutLocked(pt)
		}
		if b.sent {
			continue
		}
		if now.Before(b.notBefore) {
			later(b.notBefore)
			continue
		}
		if pt.leader == nil {
			resolve = append(resolve, pt)
			continue
		}
		if l.busy[pt.leader] {
			continue
		}
		r := byBroker[pt.leader]
		if r == nil {
			r = &leanRequest{broker: pt.leader, req: &sarama.ProduceRequest{
				RequiredAcks: sarama.WaitForAll,
				Timeout:      int32(l.conf.Producer.Timeout / time.Millisecond),
				Version:      l.reqVersion,
			}}
			if byBroker == nil {
				byBroker = make(map[*sarama.Broker]*leanRequest)
			}
			byBroker[pt.leader] = r
			reqs = append(reqs, r)
		} else if r.bytes+b.bytes > l.maxRequest {
			continue // next request
		}
		r.bytes += b.bytes
		r.req.AddBatch(pt.topic, pt.id, b.rb)
		r.parts = append(r.parts, pt)
		r.batches = append(r.batches, b)
		b.sent = true
	}
	clear(l.active[len(kept):])
	l.active = kept
	for _, r := range reqs {
		l.busy[r.broker] = true
	}
	return reqs, resolve, next
}

// cutLocked moves pt's pending records (up to maxBatch bytes, at least one)
// into a new batch under the current producer ID and pt's next sequence.
func (l *leanProducer) cutLocked(pt *leanPartition) *leanBatch {
	if pt.pidGen != l.pidGen {
		pt.pidGen, pt.seq = l.pidGen, 0
	}
	n, bytes := 0, leanBatchOverhead
	for n < len(pt.pending) && (n == 0 || bytes+pt.pending[n].size <= l.maxBatch) {
		bytes += pt.pending[n].size
		n++
	}
	recs := pt.pending[:n:n]
	if n == len(pt.pending) {
		pt.pending, pt.pendingBytes = nil, 0
	} else {
		pt.pending = pt.pending[n:]
		pt.pendingBytes -= bytes - leanBatchOverhead
		pt.since = time.Time{} // the rest has lingered already
	}
	first := recs[0].ts
	rb := &sarama.RecordBatch{
		Version:          2,
		Codec:            l.conf.Producer.Compression,
		CompressionLevel: l.conf.Producer.CompressionLevel,
		FirstTimestamp:   first,
		ProducerID:       l.pid,
		ProducerEpoch:    l.epoch,
		FirstSequence:    pt.seq,
		LastOffsetDelta:  int32(n - 1),
		Records:          make([]*sarama.Record, n),
	}
	srecs := make([]sarama.Record, n)
	var maxDelta time.Duration
	for i := range recs {
		r := &recs[i]
		sr := &srecs[i]
		sr.Key, sr.Value = r.key, r.value
		sr.TimestampDelta = r.ts.Sub(first)
		sr.OffsetDelta = int64(i)
		maxDelta = max(maxDelta, sr.TimestampDelta)
		if len(r.headers) > 0 {
			sr.Headers = make([]*sarama.RecordHeader, len(r.headers))
			for j := range r.headers {
				sr.Headers[j] = &r.headers[j]
			}
		}
		rb.Records[i] = sr
	}
	rb.MaxTimestamp = first.Add(maxDelta)
	pt.batch = &leanBatch{recs: recs, bytes: bytes, rb: rb}
	return pt.batch
}

// sendRequest sends r with AsyncProduce; its answer goes to answer.
func (l *leanProducer) sendRequest(r *leanRequest) {
	err := r.broker.AsyncProduce(r.req, func(resp *sarama.ProduceResponse, err error) {
		l.answer(r, resp, err)
	})
	if err != nil {
		l.answer(r, nil, err)
	}
}

// resolve refreshes metadata where asked and looks up the leaders of parts.
// A partition without a leader counts a failed attempt of its batch.
func (l *leanProducer) resolve(parts []*leanPartition) {
	l.mu.Lock()
	type job struct {
		pt      *leanPartition
		topic   string
		id      int32
		refresh bool
	}
	jobs := make([]job, len(parts))
	for i, pt := range parts {
		jobs[i] = job{pt, pt.topic, pt.id, pt.refresh}
		pt.refresh = false
	}
	l.mu.Unlock()
	refreshed := map[string]bool{}
	leaders := make([]*sarama.Broker, len(jobs))
	errs := make([]error, len(jobs))
	for i, j := range jobs {
		if j.refresh && !refreshed[j.topic] {
			refreshed[j.topic] = true
			_ = l.client.RefreshMetadata(j.topic) // Leader below reports what is still wrong
		}
		leaders[i], errs[i] = l.client.Leader(j.topic, j.id)
	}
	var failed []*leanPartition
	l.mu.Lock()
	now := time.Now()
	for i, j := range jobs {
		pt := j.pt
		if errs[i] == nil {
			pt.leader = leaders[i]
			continue
		}
		b := pt.batch
		if b == nil || b.sent {
			continue // cannot happen: only run sends, and it asked
		}
		pt.refresh = true
		if l.retryLocked(b, now) {
			continue
		}
		b.sent = true // being failed
		failed = append(failed, pt)
		errs[i] = fmt.Errorf("no leader after %d attempts: %w", b.tries, errs[i])
	}
	l.mu.Unlock()
	k := 0
	for i := range jobs {
		if k < len(failed) && jobs[i].pt == failed[k] {
			l.fail(failed[k], errs[i])
			k++
		}
	}
}

// retryLocked counts a failed attempt of b and says whether it may be sent
// again (then not before the retry backoff).
func (l *leanProducer) retryLocked(b *leanBatch, now time.Time) bool {
	b.tries++
	if b.tries > l.conf.Producer.Retry.Max {
		return false
	}
	backoff := l.conf.Producer.Retry.Backoff
	if f := l.conf.Producer.Retry.BackoffFunc; f != nil {
		backoff = f(b.tries, l.conf.Producer.Retry.Max)
	}
	b.notBefore = now.Add(backoff)
	b.sent = false
	return true
}

// retriable reports whether a produce error may go away on a retry of the
// same batch (to the partition's current leader).
func retriable(err error) bool {
	var kerr sarama.KError
	if !errors.As(err, &kerr) {
		return true // network, connection, decoding: the outcome is unknown, the same sequence is safe
	}
	switch kerr {
	case sarama.ErrNotLeaderForPartition, sarama.ErrLeaderNotAvailable, sarama.ErrRequestTimedOut,
		sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend,
		sarama.ErrUnknownTopicOrPartition, sarama.ErrNetworkException, sarama.ErrKafkaStorageError,
		sarama.ErrUnknownLeaderEpoch, sarama.ErrBrokerNotAvailable, sarama.ErrReplicaNotAvailable:
		return true
	}
	return false
}

// leanAcked is one batch the broker acknowledged, to report.
type leanAcked struct {
	pt   *leanPartition
	b    *leanBatch
	base int64
}

// answer handles the broker's answer to r (resp, or the error err of the
// request): acknowledged batches are reported, retriable failures wait for
// their retry, other failures fail their partition. It runs on the broker's
// response goroutine (or run's, when AsyncProduce failed).
func (l *leanProducer) answer(r *leanRequest, resp *sarama.ProduceResponse, err error) {
	var acked []leanAcked
	type failure struct {
		pt  *leanPartition
		err error
	}
	var failed []failure
	l.mu.Lock()
	delete(l.busy, r.broker)
	now := time.Now()
	// notSent: the broker was not connected (closed by a connection error
	// of ours, or by Sarama's client after one of its own requests failed),
	// so nothing was written: the batches go to the leader looked up again
	// (client.Leader reopens the broker) without counting an attempt.
	notSent := errors.Is(err, sarama.ErrNotConnected)
	if err != nil {
		// The connection is in an unknown state: close it (run does) so
		// that the next use reconnects, and resolve every leader on it
		// again, also of partitions idle now.
		var kerr sarama.KError
		if !errors.As(err, &kerr) && !notSent {
			l.toClose = append(l.toClose, r.broker)
		}
		for _, pt := range l.parts {
			if pt.leader == r.broker {
				pt.leader = nil
			}
		}
	}
	released := 0
	for i, pt := range r.parts {
		b := r.batches[i]
		berr := err
		if berr == nil {
			if blk := resp.GetBlock(pt.topic, pt.id); blk == nil {
				berr = sarama.ErrIncompleteResponse
			} else if blk.Err != sarama.ErrNoError && blk.Err != sarama.ErrDuplicateSequenceNumber {
				berr = blk.Err
			} else {
				base := blk.Offset
				if blk.Err == sarama.ErrDuplicateSequenceNumber && base < 0 {
					base = -1
				}
				pt.seq = nextSequence(pt.seq, len(b.recs))
				released += b.bytes - leanBatchOverhead + len(b.recs)*leanRecordMem
				acked = append(acked, leanAcked{pt, b, base})
				continue
			}
		}
		if notSent {
			b.sent = false // pt.leader was cleared above
			continue
		}
		if retriable(berr) {
			pt.leader, pt.refresh = nil, true
			if l.retryLocked(b, now) {
				continue
			}
			berr = fmt.Errorf("giving up after %d attempts: %w", b.tries, berr)
		}
		failed = append(failed, failure{pt, berr})
	}
	if released > 0 {
		l.buffered -= released
		l.space.Broadcast()
	}
	l.mu.Unlock()

	for _, a := range acked {
		l.enqueue(leanJob{pt: a.pt, recs: a.b.recs, base: a.base})
	}
	for _, f := range failed {
		l.fail(f.pt, f.err)
	}
	l.kick()
}

// leanJob is the delivery reports of one partition's batch, run by the
// reporter: recs succeeded at base+index (base -1: offsets unknown) when
// err is nil; with err, recs and then pending failed with it. After the
// reports the partition's batch ends (finishLocked).
type leanJob struct {
	pt      *leanPartition
	recs    []leanRecord
	pending []leanRecord
	base    int64
	err     error
}

// enqueue hands j to the reporter.
func (l *leanProducer) enqueue(j leanJob) {
	l.rmu.Lock()
	l.rq = append(l.rq, j)
	l.rmu.Unlock()
	l.rcond.Signal()
}

// reporter runs the queued jobs in order until close stops it with the
// queue empty.
func (l *leanProducer) reporter() {
	defer close(l.reported)
	var jobs []leanJob
	for {
		l.rmu.Lock()
		for len(l.rq) == 0 && !l.rstop {
			l.rcond.Wait()
		}
		if len(l.rq) == 0 {
			l.rmu.Unlock()
			return
		}
		jobs, l.rq = l.rq, jobs[:0]
		l.rmu.Unlock()
		for i := range jobs {
			l.runJob(&jobs[i])
			jobs[i] = leanJob{}
		}
	}
}

// runJob runs j's delivery reports, then ends its partition's batch.
func (l *leanProducer) runJob(j *leanJob) {
	for i := range j.recs {
		off := int64(-1)
		if j.err == nil && j.base >= 0 {
			off = j.base + int64(i)
		}
		l.report(j.pt, &j.recs[i], off, j.err)
	}
	for i := range j.pending {
		l.report(j.pt, &j.pending[i], -1, j.err)
	}
	l.mu.Lock()
	l.finishLocked(j.pt)
	l.mu.Unlock()
	l.kick()
}

// fail queues the reports of err for pt's batch (sent: true, owned by the
// caller) and for every record pending behind it, in order, and asks for a
// new producer ID:
// the broker may or may not have written the batch, so its sequence is out
// of step.
func (l *leanProducer) fail(pt *leanPartition, err error) {
	l.mu.Lock()
	b := pt.batch
	pending := pt.pending
	pt.pending, pt.pendingBytes = nil, 0
	l.buffered -= b.bytes - leanBatchOverhead + len(b.recs)*leanRecordMem
	for i := range pending {
		l.buffered -= pending[i].size + leanRecordMem
	}
	l.space.Broadcast()
	l.needPID = true
	pt.pidGen = 0
	l.mu.Unlock()
	l.enqueue(leanJob{pt: pt, recs: b.recs, pending: pending, err: err})
}

// finishLocked ends pt's batch after its reports: the next batch may be cut,
// and the batch's record slice is kept for reuse.
func (l *leanProducer) finishLocked(pt *leanPartition) {
	b := pt.batch
	pt.batch = nil
	if pt.spare == nil {
		clear(b.recs)
		pt.spare = b.recs[:0]
	}
}

// renewPID obtains a new producer ID after a failed batch; on failure the
// records waiting for a batch fail with the error, and run tries again after
// the retry backoff.
func (l *leanProducer) renewPID() {
	pid, epoch, err := l.initProducerID()
	l.mu.Lock()
	if err == nil {
		l.pid, l.epoch = pid, epoch
		l.pidGen++
		l.needPID = false
		l.mu.Unlock()
		return
	}
	l.pidRetryAt = time.Now().Add(max(l.conf.Producer.Retry.Backoff, 10*time.Millisecond))
	var drop []leanJob
	for _, pt := range l.active {
		if pt.batch == nil && len(pt.pending) > 0 {
			drop = append(drop, leanJob{pt: pt, pending: pt.pending, err: err})
			for i := range pt.pending {
				l.buffered -= pt.pending[i].size + leanRecordMem
			}
			pt.pending, pt.pendingBytes = nil, 0
			// Later records wait behind these reports (the job's
			// finishLocked ends this empty batch).
			pt.batch = &leanBatch{sent: true}
		}
	}
	l.space.Broadcast()
	l.mu.Unlock()
	for _, j := range drop {
		l.enqueue(j)
	}
}

// report runs r's delivery report and counts it answered.
func (l *leanProducer) report(pt *leanPartition, r *leanRecord, offset int64, err error) {
	if err != nil {
		err = fmt.Errorf("produce %s[%d]: %w", pt.topic, pt.id, err)
	}
	switch {
	case r.ack != nil:
		r.ack.Acked(offset, err)
	case r.msg != nil:
		if err == nil {
			r.msg.Offset = offset
		}
		if r.done != nil {
			r.done(pt.id, offset, err)
		}
	}
	l.p.reported()
}

// nextSequence is seq advanced by n records, wrapping past math.MaxInt32 to
// 0 as Kafka does (DefaultRecordBatch.incrementSequence).
func nextSequence(seq int32, n int) int32 {
	if int64(seq) > math.MaxInt32-int64(n) {
		return int32(int64(n) - (math.MaxInt32 - int64(seq)) - 1)
	}
	return seq + int32(n)
}

// close refuses new records, sends what is buffered without lingering,
// waits until every record has its report and stops the sender. Every call
// returns once the first one finished.
func (l *leanProducer) close() {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		l.space.Broadcast()
		l.mu.Unlock()
		l.kick()
		_ = l.p.Flush(context.Background()) // fails only when its ctx ends
		l.mu.Lock()
		l.stopping = true
		l.mu.Unlock()
		l.kick()
		<-l.stopped
		l.rmu.Lock()
		l.rstop = true
		l.rmu.Unlock()
		l.rcond.Broadcast()
		<-l.reported
		close(l.closeDone)
	})
	<-l.closeDone
}

// isClosed reports whether close was called.
func (l *leanProducer) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
