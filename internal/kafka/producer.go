package kafka

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// DeliveryFunc receives the broker's answer for one record: its partition and
// offset on success, or the error after Sarama's retries. It runs on the
// producer's delivery goroutine and must not block for long.
type DeliveryFunc func(partition int32, offset int64, err error)

// Producer sends records asynchronously and reports each record's delivery to
// the callback given with it. Delivery reports for one partition arrive in
// offset order (idempotent producer, one request in flight).
type Producer struct {
	ap sarama.AsyncProducer

	mu       sync.Mutex
	cond     *sync.Cond
	inFlight int // records sent whose delivery report has not run yet; guarded by mu
	closed   bool

	done chan struct{}
}

// NewProducer starts a producer on client. The client must be configured with
// Producer.Return.Successes and Return.Errors (NewConfig does).
func NewProducer(client sarama.Client) (*Producer, error) {
	ap, err := sarama.NewAsyncProducerFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("new producer: %w", err)
	}
	p := &Producer{ap: ap, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
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
	go func() { wg.Wait(); close(p.done) }()
	return p, nil
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
	p.mu.Lock()
	p.inFlight--
	if p.inFlight == 0 {
		p.cond.Broadcast()
	}
	p.mu.Unlock()
}

// ErrProducerClosed is returned by Send after Close.
var ErrProducerClosed = fmt.Errorf("kafka: producer is closed")

// Send queues msg for msg.Partition (the manual partitioner: callers choose the
// partition, with PartitionFor for keyed records); done (may be nil) gets its
// delivery report. Send returns ErrProducerClosed after Close; it blocks while
// Sarama's input buffer is full.
func (p *Producer) Send(msg *sarama.ProducerMessage, done DeliveryFunc) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrProducerClosed
	}
	p.inFlight++
	p.mu.Unlock()
	msg.Metadata = done
	p.ap.Input() <- msg
	return nil
}

// Acker receives the broker's answer for one record sent with SendRecord:
// its offset, or the error after Sarama's retries. It runs on the producer's
// delivery goroutine and must not block for long.
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
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		*m = pooledMsg{}
		msgPool.Put(m)
		return ErrProducerClosed
	}
	p.inFlight++
	p.mu.Unlock()
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
	for p.inFlight > 0 {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("flush producer (%d records in flight): %w", p.inFlight, err)
		}
		p.cond.Wait()
	}
	return nil
}

// Close flushes what was queued (Sarama's AsyncClose drains the input) and
// waits for every delivery report.
func (p *Producer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		<-p.done
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.ap.AsyncClose()
	<-p.done
	return nil
}

// Begin opens a transaction. Errors: the producer is not transactional, a
// transaction is already open, or the producer is in a fatal error state
// (fenced by a newer producer with the same transactional ID).
func (p *Producer) Begin() error {
	if err := p.ap.BeginTxn(); err != nil {
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
	if len(offsets) > 0 {
		om := make(map[string][]*sarama.PartitionOffsetMetadata, len(offsets))
		for topic, parts := range offsets {
			for part, off := range parts {
				om[topic] = append(om[topic], &sarama.PartitionOffsetMetadata{Partition: part, Offset: off})
			}
		}
		if err := p.ap.AddOffsetsToTxnWithGroupMetadata(om, group); err != nil {
			return fmt.Errorf("add offsets to transaction: %w", err)
		}
	}
	if err := p.ap.CommitTxn(); err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	return nil
}

// Abort aborts the open transaction: read_committed consumers never see its
// records, and its offsets are not committed.
func (p *Producer) Abort() error {
	if err := p.ap.AbortTxn(); err != nil {
		return fmt.Errorf("abort transaction: %w", err)
	}
	return nil
}

// Fatal reports whether the producer is in a fatal transactional state (for
// example fenced by another producer with its transactional ID): it can
// neither commit nor abort and must be closed.
func (p *Producer) Fatal() bool {
	return p.ap.TxnStatus()&sarama.ProducerTxnFlagFatalError != 0
}
