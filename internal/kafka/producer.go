package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DeliveryFunc receives the broker's answer for one record: its partition and
// offset on success, or the error after the producer's retries. It runs on
// kgo's promise goroutine (one for every partition of the producer) and must
// not block for long, nor call the producer's Send, Flush, Close or its
// transaction calls.
type DeliveryFunc func(partition int32, offset int64, err error)

// Acker receives the broker's answer for one record sent with SendRecord:
// its offset, or the error after the producer's retries. It runs where a
// DeliveryFunc runs, under the same rules.
type Acker interface {
	Acked(offset int64, err error)
}

// Producer sends records asynchronously through a producer-only kgo client
// and reports each record's delivery to the callback given with it. Delivery
// reports for one partition arrive in offset order (idempotent producer,
// KIP-98). NewProducer makes an idempotent producer (at-least-once),
// NewTxnProducer a transactional one (exactly-once: Begin, Commit, Abort;
// Renew replaces a producer that can no longer go on in place, so callers
// keep the same *Producer).
type Producer struct {
	k *kgoProducer
	// txn is the transactional state; nil for NewProducer's producers.
	txn *txnState
}

// ErrProducerClosed is returned by Send after Close, and is in the report of
// a record that Close or Renew left unanswered.
var ErrProducerClosed = errors.New("kafka: producer is closed")

// ErrTransactionFailed is returned by Send when the producer's transaction
// failed (fenced, aborted by the broker after its timeout, a record or
// request the broker refused): it must be aborted, or the producer renewed
// (Fatal, Renew).
var ErrTransactionFailed = errors.New("kafka: transaction failed; record not sent")

// ErrNoTransaction is returned by Send on a transactional producer with no
// transaction open (Begin opens one).
var ErrNoTransaction = errors.New("kafka: no transaction open; record not sent")

// ErrProducerNotReady is returned by Send and the transaction calls when the
// last Renew could not initialize the transactional ID.
var ErrProducerNotReady = errors.New("kafka: producer is not ready (renew failed)")

// ErrRenewClosed is returned by Renew after Close.
var ErrRenewClosed = fmt.Errorf("kafka: renew: %w", ErrProducerClosed)

// errNotTransactional is returned by the transaction calls (and Renew) of a
// producer without a transactional ID.
var errNotTransactional = errors.New("kafka: producer is not transactional")

// admit says whether a record may be sent now: the producer is open and,
// when transactional, a transaction is open and not failed.
func (p *Producer) admit() error {
	if p.k.closed.Load() {
		return ErrProducerClosed
	}
	if p.txn != nil {
		return p.txn.admit()
	}
	return nil
}

// Send queues msg for msg.Partition (callers choose the partition, with
// PartitionFor for keyed records); done (may be nil) gets its delivery report
// and msg.Offset is set on success. Send returns ErrProducerClosed after
// Close, ErrNoTransaction or ErrTransactionFailed when a transactional
// producer may not take records now, or an error when msg's key or value does
// not encode; it blocks while kgoMaxBuffered bytes of records wait for their
// answer. A record larger than its topic allows fails in its delivery report
// (kerr.MessageTooLarge; Permanent says so).
func (p *Producer) Send(msg *sarama.ProducerMessage, done DeliveryFunc) error {
	if err := p.admit(); err != nil {
		return err
	}
	return p.k.sendMessage(msg, done)
}

// SendRecord queues one record for partition p of topic (key or value nil:
// absent, a nil value is a tombstone) like Send; ack (not nil) gets its
// answer. key and value must not change until the answer.
func (p *Producer) SendRecord(topic string, partition int32, key, value []byte, ack Acker) error {
	return p.SendRecordAt(topic, partition, key, value, time.Time{}, ack)
}

// SendRecordAt is SendRecord with the record's timestamp ts (zero: the
// producer's clock).
func (p *Producer) SendRecordAt(topic string, partition int32, key, value []byte, ts time.Time, ack Acker) error {
	if err := p.admit(); err != nil {
		return err
	}
	return p.k.send(topic, partition, key, value, nil, ts, ack, nil, nil)
}

// SendRecordHeader is SendRecordAt with one record header (hkey, hval); hval
// must not change until the answer.
func (p *Producer) SendRecordHeader(topic string, partition int32, key, value []byte, ts time.Time, hkey string, hval []byte, ack Acker) error {
	if err := p.admit(); err != nil {
		return err
	}
	return p.k.send(topic, partition, key, value, []kgo.RecordHeader{{Key: hkey, Value: hval}}, ts, ack, nil, nil)
}

// Flush waits until every record sent so far has its delivery report, or ctx
// ends (its error then says how many records are still in flight).
func (p *Producer) Flush(ctx context.Context) error {
	return p.k.flush(ctx)
}

// Close waits up to the delivery timeout for the answers of the records
// sent, fails those still unanswered (ErrProducerClosed in their reports) and
// closes the client. A transactional producer's open transaction is left to
// the broker, which aborts it at the transaction timeout or when the next
// producer of the transactional ID initializes it. Close is idempotent.
func (p *Producer) Close() error {
	p.k.close()
	return nil
}
