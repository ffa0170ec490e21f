package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// NewTxnProducer starts a transactional producer (KIP-98) on a producer-only
// kgo client configured by c, whose TransactionalID names the transactional
// ID. It initializes the ID before it returns (InitProducerId: fences every
// older producer of the ID and aborts its open transaction), retrying what
// Kafka calls retriable (a coordinator loading or moving) within the
// delivery timeout. Records are taken only inside a transaction (Begin).
//
// The consumer group is not kgo's (Runnel's group is Sarama's): Commit adds
// the group's offsets to the transaction itself, with AddOffsetsToTxn and a
// TxnOffsetCommit carrying the group member's generation and member ID, so a
// member that is no longer in that generation cannot commit (KIP-447).
func NewTxnProducer(c ProducerConfig) (*Producer, error) {
	if c.TransactionalID == "" {
		return nil, errors.New("kafka: NewTxnProducer without a transactional ID")
	}
	t := &txnState{id: c.TransactionalID}
	k, err := newKgoProducer(c, kgo.MaxVersions(txnVersions()), kgo.WithHooks(t))
	if err != nil {
		return nil, err
	}
	t.k = k
	k.onFail = t.recordFailed
	if err := t.initID(k.cl.Load()); err != nil {
		k.close()
		return nil, fmt.Errorf("init transactional ID %s: %w", c.TransactionalID, err)
	}
	return &Producer{k: k, txn: t}, nil
}

// txnVersions caps the request versions that would opt the client into
// KIP-890 part 2 (transaction version 2): there, TxnOffsetCommit v5 adds the
// group to the transaction implicitly and every EndTxn v5 bumps the
// producer's epoch in its answer. A transaction that commits offsets but
// produced nothing must then be ended by kgo for the new epoch to be known,
// and kgo ends only transactions it produced in or committed offsets to
// through its own group consumer. Below those versions (transaction version
// 1, as Sarama and Kafka Streams before 4.0 speak) the epoch changes only at
// InitProducerId, so this package can end such a transaction itself.
func txnVersions() *kversion.Versions {
	v := kversion.Stable()
	v.SetMaxKeyVersion(int16(kmsg.Produce), 11)
	v.SetMaxKeyVersion(int16(kmsg.EndTxn), 4)
	v.SetMaxKeyVersion(int16(kmsg.TxnOffsetCommit), 4)
	return v
}

// txnState is a transactional Producer's transaction state. The transaction
// calls (Begin, Commit, Abort, Renew) are serialized by the caller (the
// worker's transaction owner); Send reads the atomics.
type txnState struct {
	id string
	k  *kgoProducer
	// open is set from Begin to the end of Commit or Abort: Send admits
	// records only then.
	open atomic.Bool
	// failed is set when a record or call of the open transaction failed:
	// the transaction can only be aborted, and Send refuses records.
	failed atomic.Bool
	// fatal is set when the producer cannot go on (fenced by a newer
	// producer of the ID, its epoch or ID refused, an abort that failed):
	// only Renew helps.
	fatal atomic.Bool
	// fatalErr is the error that set fatal (nil: none).
	fatalErr atomic.Pointer[error]
	// notReady is set when the last Renew could not initialize the ID.
	notReady atomic.Bool
	// offsetsAdded is set when AddOffsetsToTxn succeeded in the open
	// transaction. Written by the transaction calls only.
	offsetsAdded bool
	// endTxns counts the EndTxn requests the client wrote (OnBrokerWrite):
	// a kgo EndTransaction that wrote none ended nothing on the broker.
	endTxns atomic.Int64
}

// OnBrokerWrite implements kgo.HookBrokerWrite: it counts written EndTxn
// requests.
func (t *txnState) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.EndTxn) && err == nil {
		t.endTxns.Add(1)
	}
}

// recordFailed marks the open transaction failed after a record's error
// (from its report; see kgoProducer.onFail).
func (t *txnState) recordFailed(err error) {
	if errors.Is(err, ErrProducerClosed) {
		return // Renew or Close ended it
	}
	t.failed.Store(true)
	t.noteErr(err)
}

// noteErr marks the producer fatal for an error no transaction of this
// producer can get past.
func (t *txnState) noteErr(err error) {
	if Fenced(err) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) ||
		errors.Is(err, kerr.InvalidProducerIDMapping) || errors.Is(err, kerr.ClusterAuthorizationFailed) {
		t.setFatal(err)
	}
}

// setFatal marks the producer fatal with err; the first error is kept (a
// fence is what explains the errors after it).
func (t *txnState) setFatal(err error) {
	t.fatalErr.CompareAndSwap(nil, &err)
	t.fatal.Store(true)
}

// admit says whether Send may take a record now.
func (t *txnState) admit() error {
	switch {
	case t.notReady.Load():
		return ErrProducerNotReady
	case t.fatal.Load() || t.failed.Load():
		return ErrTransactionFailed
	case !t.open.Load():
		return ErrNoTransaction
	}
	return nil
}

// budget is the context of one transaction call: the delivery timeout.
func (t *txnState) budget() (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.k.ctx, t.k.timeout)
}

// initID initializes the transactional ID on cl (InitProducerId), retrying
// retriable errors with backoff within the budget.
func (t *txnState) initID(cl *kgo.Client) error {
	ctx, cancel := t.budget()
	defer cancel()
	return retry(ctx, func() error {
		_, _, err := cl.ProducerID(ctx)
		return err
	})
}

// retry runs fn until it succeeds, returns an error Kafka does not call
// retriable, or ctx ends (then the last error is returned), waiting 20 ms
// doubling up to 1 s between tries.
func retry(ctx context.Context, fn func() error) error {
	wait := 20 * time.Millisecond
	for {
		err := fn()
		if err == nil || !retriable(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// retriable reports whether a transaction request's error may go away on
// its own: what Kafka marks retriable (a coordinator loading or moving,
// CONCURRENT_TRANSACTIONS while the previous transaction's markers are
// written, a request timeout), and a broker that cannot be reached (a
// connection refused or lost: a broker stopped or restarting). kgo retries a
// refused dial only briefly (its own request retries, about 2 s) and then
// returns it, e.g. wrapped in "unable to initialize a producer ID due to
// request failures": without this a renewal failed 1.8 s into a 20 s broker
// stop and stopped the worker (TestRenewWaitsForBrokerDown).
func retriable(err error) bool {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Retriable || ke == kerr.ConcurrentTransactions
	}
	var ne *net.OpError
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		kgo.IsRetryableBrokerErr(err)
}

// Begin opens a transaction. Errors: the producer is not transactional, a
// transaction is already open, or the producer cannot go on (Fatal: renew
// it).
func (p *Producer) Begin() error {
	t, err := p.transactional()
	if err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	if t.fatal.Load() {
		return fmt.Errorf("begin transaction: %w", ErrTransactionFailed)
	}
	if err := p.k.cl.Load().BeginTransaction(); err != nil {
		t.noteErr(err)
		return fmt.Errorf("begin transaction: %w", err)
	}
	t.failed.Store(false)
	t.offsetsAdded = false
	t.open.Store(true)
	return nil
}

// Rejoined is asked when the group coordinator refused a transaction's
// offset commit for generation refused (ILLEGAL_GENERATION or
// REBALANCE_IN_PROGRESS: the group rebalanced since the metadata was
// taken). It returns the member's metadata in a later generation once the
// member has it (the member ID must stay the one refused: a member that
// rejoined under another ID is refused again), and false when there is none
// to wait for (the member left the group) or it gave up. A refused TxnOffsetCommit wrote nothing, so the
// same transaction commits the offsets again under the new generation.
type Rejoined func(ctx context.Context, refused int32) (*sarama.ConsumerGroupMetadata, bool)

// Commit flushes the open transaction's records, adds offsets (topic →
// partition → offset of the next record to read) to it as the consumer
// group's commit, fenced by the group's generation and member (KIP-447: a
// member that is no longer in that generation cannot commit), and commits
// the transaction. Retriable errors are retried within the delivery timeout;
// an offset commit refused for a stale generation is sent again under the
// generation rejoined returns (nil: never). The error of a fenced or failed
// commit wraps the broker's error (kerr.IllegalGeneration, UnknownMemberID,
// FencedInstanceID, ProducerFenced, ...); the transaction must then be
// aborted (Abort), unless Fatal reports that the producer cannot go on.
func (p *Producer) Commit(offsets map[string]map[int32]int64, group *sarama.ConsumerGroupMetadata, rejoined Rejoined) error {
	t, err := p.transactional()
	if err != nil {
		return fmt.Errorf("commit transaction: %w", err)
	}
	if !t.open.Load() {
		return fmt.Errorf("commit transaction: %w", ErrNoTransaction)
	}
	cl := p.k.cl.Load()
	ctx, cancel := t.budget()
	defer cancel()
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("commit transaction: flush: %w", err)
	}
	if t.failed.Load() {
		return fmt.Errorf("commit transaction: %w", ErrTransactionFailed)
	}
	if len(offsets) > 0 {
		if group == nil {
			return errors.New("commit transaction: offsets without a group")
		}
		if err := t.addOffsets(ctx, cl, offsets, group, rejoined); err != nil {
			t.failed.Store(true)
			t.noteErr(err)
			return fmt.Errorf("add offsets to transaction: %w", err)
		}
	}
	if err := t.end(ctx, cl, kgo.TryCommit); err != nil {
		t.failed.Store(true)
		t.noteErr(err)
		return fmt.Errorf("commit transaction: %w", err)
	}
	t.open.Store(false)
	return nil
}

// Abort aborts the open transaction: its records not sent yet fail
// (kgo.ErrAborting), read_committed consumers never see those sent, and its
// offsets are not committed. An error means the abort may not have reached
// the broker: renew the producer (its InitProducerId aborts the
// transaction).
func (p *Producer) Abort() error {
	t, err := p.transactional()
	if err != nil {
		return fmt.Errorf("abort transaction: %w", err)
	}
	cl := p.k.cl.Load()
	ctx, cancel := t.budget()
	defer cancel()
	t.open.Store(false)
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		t.setFatal(err)
		return fmt.Errorf("abort transaction: %w", err)
	}
	if err := t.end(ctx, cl, kgo.TryAbort); err != nil {
		t.setFatal(err)
		return fmt.Errorf("abort transaction: %w", err)
	}
	return nil
}

// end ends the open transaction with kgo's EndTransaction and, when that
// wrote no EndTxn (kgo had produced nothing in it) while offsets were added,
// with an EndTxn of its own.
func (t *txnState) end(ctx context.Context, cl *kgo.Client, how kgo.TransactionEndTry) error {
	before := t.endTxns.Load()
	if err := cl.EndTransaction(ctx, how); err != nil {
		return err
	}
	if t.offsetsAdded && t.endTxns.Load() == before {
		if err := t.endTxn(ctx, cl, bool(how)); err != nil {
			return err
		}
	}
	t.offsetsAdded = false
	return nil
}

// addOffsets adds the group to the open transaction (AddOffsetsToTxn, once
// per transaction) and commits offsets in it (TxnOffsetCommit, to the
// group's coordinator), retrying retriable errors within ctx, and a refusal
// for a stale generation under the one rejoined returns.
func (t *txnState) addOffsets(ctx context.Context, cl *kgo.Client, offsets map[string]map[int32]int64, group *sarama.ConsumerGroupMetadata, rejoined Rejoined) error {
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return err
	}
	if !t.offsetsAdded {
		err := retry(ctx, func() error {
			req := kmsg.NewPtrAddOffsetsToTxnRequest()
			req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Group = t.id, pid, epoch, group.GroupID
			resp, err := req.RequestWith(ctx, cl)
			if err != nil {
				return err
			}
			return kerr.ErrorForCode(resp.ErrorCode)
		})
		if err != nil {
			return err
		}
		t.offsetsAdded = true
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = t.id, group.GroupID, pid, epoch
	req.Generation, req.MemberID, req.InstanceID = group.GenerationID, group.MemberID, group.GroupInstanceID
	topics := make([]string, 0, len(offsets))
	for topic := range offsets {
		topics = append(topics, topic)
	}
	sort.Strings(topics)
	for _, topic := range topics {
		rt := kmsg.NewTxnOffsetCommitRequestTopic()
		rt.Topic = topic
		for part, off := range offsets[topic] {
			rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
			rp.Partition, rp.Offset, rp.LeaderEpoch = part, off, -1
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	for {
		err := retry(ctx, func() error {
			resp, err := req.RequestWith(ctx, cl)
			if err != nil {
				return err
			}
			for _, rt := range resp.Topics {
				for _, rp := range rt.Partitions {
					if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
						return fmt.Errorf("%s[%d] (generation %d): %w", rt.Topic, rp.Partition, req.Generation, err)
					}
				}
			}
			return nil
		})
		if rejoined == nil || !(errors.Is(err, kerr.IllegalGeneration) || errors.Is(err, kerr.RebalanceInProgress)) {
			return err
		}
		next, ok := rejoined(ctx, req.Generation)
		if !ok || next.GenerationID <= req.Generation {
			return err
		}
		req.Generation, req.MemberID, req.InstanceID = next.GenerationID, next.MemberID, next.GroupInstanceID
	}
}

// endTxn ends the open transaction on the broker (EndTxn, below v5: the
// epoch stays; see txnVersions).
func (t *txnState) endTxn(ctx context.Context, cl *kgo.Client, commit bool) error {
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		return err
	}
	return retry(ctx, func() error {
		req := kmsg.NewPtrEndTxnRequest()
		req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = t.id, pid, epoch, commit
		resp, err := req.RequestWith(ctx, cl)
		if err != nil {
			return err
		}
		return kerr.ErrorForCode(resp.ErrorCode)
	})
}

// Renew replaces the kgo client with a new one of the same transactional
// ID, for a transactional producer that cannot go on (Fatal: fenced by a
// newer producer of the ID, its transaction aborted by the broker after
// transaction.timeout.ms), or whose abort failed. The old client's records
// not answered yet fail (ErrProducerClosed in their reports), and Renew
// returns only once every one of its reports ran. The new client initializes
// the ID (InitProducerId, KIP-98): the coordinator aborts the ID's open
// transaction, if any, and bumps the epoch, fencing every older producer of
// the ID. No transaction is open afterwards (Begin opens one).
//
// Senders racing Renew either are refused (no transaction) or send to the
// old client and fail. Renew must not be called from a delivery report.
// Errors: the producer is closed (ErrRenewClosed), or the new client could
// not initialize the ID within the delivery timeout (Send then fails with
// ErrProducerNotReady until a Renew succeeds).
func (p *Producer) Renew() error {
	if p.k.closed.Load() {
		return ErrRenewClosed
	}
	// Not p.transactional(): it refuses a producer whose last renewal
	// failed (ErrProducerNotReady), and renewing is what brings that one
	// back (TestRenewAfterFailedRenew).
	t := p.txn
	if t == nil {
		return errNotTransactional
	}
	t.open.Store(false)
	old := p.k.cl.Load()
	ctx, cancel := t.budget()
	defer cancel()
	_ = old.AbortBufferedRecords(ctx) // every report of old runs
	old.Close()
	t.offsetsAdded = false
	cl, err := kgo.NewClient(p.k.opts...)
	if err != nil {
		t.notReady.Store(true)
		return fmt.Errorf("renew: %w", err)
	}
	p.k.cl.Store(cl)
	if err := t.initID(cl); err != nil {
		t.notReady.Store(true)
		return fmt.Errorf("renew: init transactional ID %s: %w", t.id, err)
	}
	t.notReady.Store(false)
	t.fatal.Store(false)
	t.fatalErr.Store(nil)
	t.failed.Store(false)
	return nil
}

// Fatal reports whether the producer cannot go on (fenced by another
// producer of its transactional ID, its ID or epoch refused, an abort that
// failed, its last Renew failed): it must be renewed. A producer without a
// transactional ID reports false.
func (p *Producer) Fatal() bool {
	if p.txn == nil {
		return false
	}
	return p.txn.fatal.Load() || p.txn.notReady.Load()
}

// FatalErr returns the error that made the producer fatal (Fatal), nil when
// it is not, or when its last Renew failed to initialize the ID.
func (p *Producer) FatalErr() error {
	if p.txn == nil {
		return nil
	}
	if e := p.txn.fatalErr.Load(); e != nil && p.txn.fatal.Load() {
		return *e
	}
	return nil
}

// transactional returns the transaction state, or why there is none.
func (p *Producer) transactional() (*txnState, error) {
	switch {
	case p.txn == nil:
		return nil, errNotTransactional
	case p.k.closed.Load():
		return nil, ErrProducerClosed
	case p.txn.notReady.Load():
		return nil, ErrProducerNotReady
	}
	return p.txn, nil
}

// Fenced reports whether err says another producer of the transactional ID
// took over (PRODUCER_FENCED) or the producer's epoch is stale
// (INVALID_PRODUCER_EPOCH), in either client's vocabulary.
func Fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, sarama.ErrProducerFenced) || errors.Is(err, sarama.ErrInvalidProducerEpoch)
}
