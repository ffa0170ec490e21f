package kafka

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

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
	if p.k != nil {
		if p.k.closed.Load() {
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
	if p.k != nil {
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
	if p.k != nil {
		if p.k.closed.Load() {
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
