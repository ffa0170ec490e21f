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
// producer's delivery goroutine (without a transactional ID: kgo's promise
// goroutine, one for every partition) and must not block for long, nor call
// the producer's Send, Flush or Close.
type DeliveryFunc func(partition int32, offset int64, err error)

// Producer sends records asynchronously and reports each record's delivery to
// the callback given with it. Delivery reports for one partition arrive in
// offset order (idempotent producer, one request in flight).
//
// A Producer from NewProducer sends through a producer-only kgo client
// (kgoProducer, kgo.go), and the fields below up to k are unused. A
// Producer from NewTxnProducer is transactional and sends through Sarama's
// transactional producer (until exactly-once moves to kgo too).
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

	// k, when not nil, is the kgo producer of NewProducer; ap is then nil
	// and swap unused. Set once by the constructor.
	k *kgoProducer
}

// NewTxnProducer starts a transactional producer on client, whose
// configuration names the transactional ID (Producer.Transaction.ID) and
// returns successes and errors (NewConfig does). It initializes the ID first
// (InitProducerId: fences any older producer with the ID and aborts its open
// transaction). Records go through Sarama's transactional producer.
func NewTxnProducer(client sarama.Client) (*Producer, error) {
	if client.Config().Producer.Transaction.ID == "" {
		return nil, fmt.Errorf("kafka: transactional producer without a transactional ID")
	}
	p := &Producer{client: client}
	p.cond = sync.NewCond(&p.mu)
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
// delivery report. Send returns ErrProducerClosed after Close, or an error
// when msg's key or value does not encode; it blocks while Sarama's input
// buffer is full (transactional) or while kgoMaxBuffered bytes of records
// wait for their answer (NewProducer). A record larger than its topic allows
// fails in its delivery report (kerr.MessageTooLarge; Permanent says so).
func (p *Producer) Send(msg *sarama.ProducerMessage, done DeliveryFunc) error {
	if p.k != nil {
		return p.k.sendMessage(msg, done)
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
// producer's delivery goroutine (without a transactional ID: kgo's promise
// goroutine, one for every partition) and must not block for long, nor call
// the producer's Send, Flush or Close.
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
	if p.k != nil {
		return p.k.send(topic, partition, key, value, nil, ts, ack, nil, nil)
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

// Flush waits until every record sent so far has its delivery report, or ctx
// ends (its error then says how many records are still in flight).
func (p *Producer) Flush(ctx context.Context) error {
	if p.k != nil {
		return p.k.flush(ctx)
	}
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

// Close flushes what was queued (Sarama's AsyncClose drains the input; the
// kgo producer flushes within its delivery timeout) and waits for every
// delivery report. Records still unanswered after that fail with
// ErrProducerClosed in their reports. Close is idempotent.
func (p *Producer) Close() error {
	if p.k != nil {
		p.k.close()
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
