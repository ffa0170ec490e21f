package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
)

// DeliveryFunc receives the broker's answer for one record: its partition and
// offset on success, or the error after the producer's retries. It runs on the
// producer's delivery goroutine (without a transactional ID: the lean
// producer's reporter, one goroutine for every partition) and must not block
// for long, nor call the producer's Send, Flush or Close.
type DeliveryFunc func(partition int32, offset int64, err error)

// Producer sends records asynchronously and reports each record's delivery to
// the callback given with it. Delivery reports for one partition arrive in
// offset order (idempotent producer, one request in flight).
//
// Without a transactional ID the producer is a leanProducer (Runnel's own
// idempotent producer, see lean.go), and the fields below up to lean are
// unused except inFlight, waiters, mu and cond (Flush, Close).
//
// A transactional producer that can no longer go on (fenced, or its
// transaction aborted by the broker) is replaced in place by Renew: callers
// keep the same *Producer.
//
// Lock order: swap, then mu. Every write to the current Sarama producer's
// input happens under swap's read lock, so that Renew and Close (write lock)
// never close an input a sender is about to write to.
//
// The per-record path (admit, report) takes no mutex: ap and closed change
// only under swap's write lock, so a sender holding the read lock reads them
// unlocked, and inFlight is an atomic counter. A delivery report takes mu
// only when it brings inFlight to 0 while a Flush waits (waiters > 0).
// On the stateless benchmark (2M records, kfake, CPU profile of the worker)
// admit under mu was 2.7% of the worker's CPU (the lock contended between
// the agents and the delivery goroutine), 1.5% without it.
type Producer struct {
	client sarama.Client

	swap   sync.RWMutex
	ap     sarama.AsyncProducer // the current Sarama producer; guarded by swap
	done   chan struct{}        // closed when ap's delivery goroutines ended; guarded by swap
	closed bool                 // written under swap's write lock; read under either lock

	// inFlight counts records sent whose delivery report has not run yet.
	// Invariant: a record is counted (admit) before it reaches Sarama and
	// uncounted after its report ran, so 0 means every record sent so far
	// has its answer.
	inFlight atomic.Int64
	// waiters counts Flush calls between their registration and their
	// return; written under mu. A report that brings inFlight to 0 and
	// sees waiters > 0 broadcasts cond under mu; both sides write their
	// own atomic before they read the other's, so one of them always
	// sees the other (no lost wake-up).
	waiters atomic.Int32
	mu      sync.Mutex
	cond    *sync.Cond // signalled under mu when inFlight reaches 0 and Flush waits

	// lean, when not nil, is the producer of a client without a
	// transactional ID (see leanProducer); ap is then nil and swap unused.
	// Set once by NewProducer.
	lean *leanProducer
}

// NewProducer starts a producer on client. The client must be configured with
// Producer.Return.Successes and Return.Errors (NewConfig does). With a
// transactional ID (Producer.Transaction.ID) it initializes the ID first
// (InitProducerId: fences any older producer with the ID and aborts its open
// transaction).
//
// Without a transactional ID (and with a protocol version of at least 0.11)
// the producer is Runnel's own idempotent producer (leanProducer), which
// obtains a producer ID (InitProducerId) first; it honours Producer.Timeout,
// Compression, Flush.Frequency, Flush.Bytes, MaxMessageBytes, Retry.Max and
// Retry.Backoff, always with acks=all.
func NewProducer(client sarama.Client) (*Producer, error) {
	p := &Producer{client: client}
	p.cond = sync.NewCond(&p.mu)
	if conf := client.Config(); conf.Producer.Transaction.ID == "" && conf.Version.IsAtLeast(sarama.V0_11_0_0) {
		l, err := newLeanProducer(p, client)
		if err != nil {
			return nil, err
		}
		p.lean = l
		return p, nil
	}
	ap, done, err := p.start()
	if err != nil {
		return nil, err
	}
	p.ap, p.done = ap, done
	return p, nil
}

// start builds a Sarama producer on p.client and its delivery goroutines;
// done closes when both ended (after the producer closed).
func (p *Producer) start() (sarama.AsyncProducer, chan struct{}, error) {
	ap, err := sarama.NewAsyncProducerFromClient(p.client)
	if err != nil {
		return nil, nil, fmt.Errorf("new producer: %w", err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for m := range ap.Successes() {
			p.report(m, nil)
		}
	}()
	go func() {
		defer wg.Done()
		for e := range ap.Errors() {
			p.report(e.Msg, e.Err)
		}
	}()
	go func() { wg.Wait(); close(done) }()
	return ap, done, nil
}

func (p *Producer) report(m *sarama.ProducerMessage, err error) {
	switch md := m.Metadata.(type) {
	case DeliveryFunc:
		if md != nil {
			if err != nil {
				err = fmt.Errorf("produce %s[%d]: %w", m.Topic, m.Partition, err)
			}
			md(m.Partition, m.Offset, err)
		}
	case *pooledMsg:
		if err != nil {
			err = fmt.Errorf("produce %s[%d]: %w", m.Topic, m.Partition, err)
		}
		ack := md.ack
		off := m.Offset
		// Sarama is done with a message it returned: the next record
		// reuses it.
		*md = pooledMsg{}
		msgPool.Put(md)
		ack.Acked(off, err)
	}
	p.reported()
}

// reported counts one delivery report run, waking Flush when it was the last.
func (p *Producer) reported() {
	if p.inFlight.Add(-1) == 0 && p.waiters.Load() > 0 {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	}
}

// ErrProducerClosed is returned by Send after Close.
var ErrProducerClosed = fmt.Errorf("kafka: producer is closed")

// Send queues msg for msg.Partition (the manual partitioner: callers choose the
// partition, with PartitionFor for keyed records); done (may be nil) gets its
// delivery report. Send returns ErrProducerClosed after Close; it blocks while
// Sarama's input buffer is full (transactional) or while 16 MiB of records
// wait for their answer (non-transactional). Without a transactional ID, a
// record over Producer.MaxMessageBytes is refused at once with an error
// wrapping a sarama.ConfigurationError (Sarama's producer reports that error
// in the record's delivery report instead).
func (p *Producer) Send(msg *sarama.ProducerMessage, done DeliveryFunc) error {
	if p.lean != nil {
		r := leanRecord{headers: msg.Headers, ts: msg.Timestamp, msg: msg, done: done}
		var err error
		if msg.Key != nil {
			if r.key, err = msg.Key.Encode(); err != nil {
				return fmt.Errorf("produce %s[%d]: encode key: %w", msg.Topic, msg.Partition, err)
			}
		}
		if msg.Value != nil {
			if r.value, err = msg.Value.Encode(); err != nil {
				return fmt.Errorf("produce %s[%d]: encode value: %w", msg.Topic, msg.Partition, err)
			}
		}
		return p.lean.send(msg.Topic, msg.Partition, r)
	}
	p.swap.RLock()
	defer p.swap.RUnlock()
	if err := p.admit(); err != nil {
		return err
	}
	msg.Metadata = done
	p.ap.Input() <- msg
	return nil
}

// admit counts one more record in flight, or says why none may be sent.
// The caller holds swap's read lock.
//
// A transactional producer takes a record only inside a transaction that
// is not in error: a record sent outside one, or into one that already
// failed (fenced, aborted by the broker), can never be committed, and Sarama
// would fail it anyway. Refused here, it never reaches Sarama, which keeps
// a failing producer's error storm small: Sarama 1.61 reads its last
// transaction error without the lock it writes it under
// (IBM/sarama#2913), so each record failed inside it is a chance of that
// data race.
func (p *Producer) admit() error {
	switch {
	case p.closed:
		return ErrProducerClosed
	case p.ap == nil:
		return ErrProducerNotReady
	}
	if p.ap.IsTransactional() {
		st := p.ap.TxnStatus()
		switch {
		case st&sarama.ProducerTxnFlagInError != 0:
			return fmt.Errorf("%w (%s)", ErrTransactionFailed, st)
		case st&sarama.ProducerTxnFlagInTransaction == 0:
			return fmt.Errorf("kafka: no transaction open (%s): %w", st, sarama.ErrTransactionNotReady)
		}
	}
	p.inFlight.Add(1)
	return nil
}

// ErrTransactionFailed is returned by Send when the producer's transaction
// failed (fenced, aborted by the broker after its timeout, a record or
// request the broker refused): it must be aborted, or the producer renewed
// (Fatal, Renew).
var ErrTransactionFailed = errors.New("kafka: transaction failed; record not sent")

// ErrProducerNotReady is returned by Send when the last Renew could not
// build a new producer.
var ErrProducerNotReady = fmt.Errorf("kafka: producer is not ready (renew failed)")

// Acker receives the broker's answer for one record sent with SendRecord:
// its offset, or the error after the producer's retries. It runs on the
// producer's delivery goroutine (without a transactional ID: the lean
// producer's reporter, one goroutine for every partition) and must not block
// for long, nor call the producer's Send, Flush or Close.
type Acker interface {
	Acked(offset int64, err error)
}

// pooledMsg is the message of one SendRecord, with the key and value
// encoders it points at and the receiver of its answer: one pooled value per
// record instead of a message, two boxed encoders and a closure.
type pooledMsg struct {
	msg        sarama.ProducerMessage
	key, value sarama.ByteEncoder
	ack        Acker
}

var msgPool = sync.Pool{New: func() any { return new(pooledMsg) }}

// SendRecord queues one record for partition p of topic (key or value nil:
// absent, a nil value is a tombstone) like Send; ack (not nil) gets its
// answer. key and value must not change until the answer.
func (p *Producer) SendRecord(topic string, partition int32, key, value []byte, ack Acker) error {
	return p.SendRecordAt(topic, partition, key, value, time.Time{}, ack)
}

// SendRecordAt is SendRecord with the record's timestamp ts (zero: the
// producer's clock).
func (p *Producer) SendRecordAt(topic string, partition int32, key, value []byte, ts time.Time, ack Acker) error {
	if p.lean != nil {
		return p.lean.send(topic, partition, leanRecord{key: key, value: value, ts: ts, ack: ack})
	}
	m := msgPool.Get().(*pooledMsg)
	m.msg.Topic, m.msg.Partition, m.msg.Timestamp = topic, partition, ts
	if key != nil {
		m.key = key
		m.msg.Key = &m.key
	}
	if value != nil {
		m.value = value
		m.msg.Value = &m.value
	}
	m.ack = ack
	p.swap.RLock()
	defer p.swap.RUnlock()
	if err := p.admit(); err != nil {
		*m = pooledMsg{}
		msgPool.Put(m)
		return err
	}
	m.msg.Metadata = m
	p.ap.Input() <- &m.msg
	return nil
}

// Flush waits until every record sent so far has its delivery report, or ctx ends.
func (p *Producer) Flush(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.waiters.Add(1)
	defer p.waiters.Add(-1)
	if p.lean != nil {
		p.lean.kick() // no lingering while Flush waits
	}
	for {
		n := p.inFlight.Load()
		if n == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("flush producer (%d records in flight): %w", n, err)
		}
		p.cond.Wait()
	}
}

// Close flushes what was queued (Sarama's AsyncClose drains the input) and
// waits for every delivery report.
func (p *Producer) Close() error {
	if p.lean != nil {
		p.lean.close()
		return nil
	}
	p.swap.Lock()
	defer p.swap.Unlock()
	if p.closed {
		return nil // the first Close waited for the delivery reports
	}
	p.closed = true
	if p.ap != nil {
		p.ap.AsyncClose()
		<-p.done
	}
	return nil
}

// errNotTransactional is returned by the transaction calls (and Renew) of a
// producer without a transactional ID.
var errNotTransactional = fmt.Errorf("kafka: producer is not transactional: %w", sarama.ErrNonTransactedProducer)

// ErrRenewClosed is returned by Renew after Close.
var ErrRenewClosed = fmt.Errorf("kafka: renew: %w", ErrProducerClosed)

// Renew replaces the Sarama producer with a new one on the same client, for
// a transactional producer that cannot go on (Fatal: fenced by a newer
// producer with its transactional ID, or its transaction aborted by the
// broker after transaction.timeout.ms), or whose abort failed. The old
// producer is closed first: records queued in it fail (their delivery
// reports run with the error), and Renew returns only once every one of its
// delivery reports ran, so nothing still uses it. The new producer
// initializes the same transactional ID (InitProducerId, KIP-98): the
// coordinator aborts the ID's open transaction, if any, and bumps the epoch,
// fencing every older producer of the ID. No transaction is open afterwards
// (Begin opens one).
//
// Senders blocked in Send while Renew waits go to the old producer and fail;
// senders after it go to the new one. Renew must not be called from a
// delivery callback. Errors: the producer is closed (ErrRenewClosed), or the
// new producer could not initialize the ID (the old one is closed all the
// same: a later Renew may try again).
func (p *Producer) Renew() error {
	if p.lean != nil {
		if p.lean.isClosed() {
			return ErrRenewClosed
		}
		return errNotTransactional
	}
	p.swap.Lock()
	defer p.swap.Unlock()
	if p.closed {
		return ErrRenewClosed
	}
	if p.ap != nil {
		p.ap.AsyncClose()
		<-p.done
		p.ap = nil
	}
	ap, done, err := p.start()
	if err != nil {
		// Keep a closed producer in place: Send then fails with
		// ErrProducerNotReady until a Renew succeeds.
		return fmt.Errorf("renew: %w", err)
	}
	p.ap, p.done = ap, done
	return nil
}

// Begin opens a transaction. Errors: the producer is not transactional, a
// transaction is already open, or the producer is in a fatal error state
// (fenced by a newer producer with the same transactional ID).
func (p *Producer) Begin() error {
	ap, err := p.current()
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if err := ap.BeginTxn(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	return nil
}

// Commit adds offsets (topic → partition → offset of the next record to
// read) to the open transaction as the consumer group's commit, fenced by the
// group's generation and member (KIP-447: a member that is no longer in that
// generation cannot commit), and commits the transaction: Sarama first flushes
// every record sent in it. The error of a fenced or failed commit wraps the
// broker's error (sarama.ErrIllegalGeneration, ErrUnknownMemberId,
// ErrFencedInstancedId, ErrProducerFenced, ...); the transaction must then
// be aborted (Abort), unless Fatal reports that the producer cannot go on.
func (p *Producer) Commit(offsets map[string]map[int32]int64, group *sarama.ConsumerGroupMetadata) error {
	ap, err := p.current()
	if err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	if len(offsets) > 0 {
		om := make(map[string][]*sarama.PartitionOffsetMetadata, len(offsets))
		for topic, parts := range offsets {
			for part, off := range parts {
				om[topic] = append(om[topic], &sarama.PartitionOffsetMetadata{Partition: part, Offset: off})
			}
		}
		if err := ap.AddOffsetsToTxnWithGroupMetadata(om, group); err != nil {
			return fmt.Errorf("add offsets to transaction: %w", err)
		}
	}
	if err := ap.CommitTxn(); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return nil
}

// Abort aborts the open transaction: read_committed consumers never see its
// records, and its offsets are not committed.
func (p *Producer) Abort() error {
	ap, err := p.current()
	if err != nil {
		return fmt.Errorf("abort transaction: %w", err)
	}
	if err := ap.AbortTxn(); err != nil {
		return fmt.Errorf("abort transaction: %w", err)
	}
	return nil
}

// Fatal reports whether the producer is in a fatal transactional state (for
// example fenced by another producer with its transactional ID): it can
// neither commit nor abort and must be closed.
// A producer whose last Renew failed reports true, a closed one false.
func (p *Producer) Fatal() bool {
	if p.lean != nil {
		return false
	}
	ap, err := p.current()
	if err != nil {
		return errors.Is(err, ErrProducerNotReady)
	}
	return ap.TxnStatus()&sarama.ProducerTxnFlagFatalError != 0
}

// current returns the current Sarama producer for a transaction call; the
// caller must not run it concurrently with Renew (the transaction's owner
// serializes both).
func (p *Producer) current() (sarama.AsyncProducer, error) {
	if p.lean != nil {
		if p.lean.isClosed() {
			return nil, ErrProducerClosed
		}
		return nil, errNotTransactional
	}
	p.swap.RLock()
	defer p.swap.RUnlock()
	switch {
	case p.closed:
		return nil, ErrProducerClosed
	case p.ap == nil:
		return nil, ErrProducerNotReady
	}
	return p.ap, nil
}
