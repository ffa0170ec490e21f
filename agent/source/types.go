package source

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Header is one record header (Kafka record headers, KIP-82).
type Header struct{ Key, Value []byte }

// Record is one fetched record as the producer emits it. For non-Kafka
// producers Topic/Partition/Offset may be zero; the manager never reads them.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Timestamp time.Time
}

// recordOverhead is what a record counts toward Config.MaxInFlightBytes
// beyond its key, value and headers: roughly the heap a small record keeps
// alive while it is in flight besides its bytes (the manager's entry, the
// Record, a Kafka producer's fetched message, a subscriber's event and
// decoded copy; about 500 bytes a record on the stateless benchmark).
const recordOverhead = 512

// recordSize is what rec counts toward Config.MaxInFlightBytes: its key,
// value and headers plus recordOverhead.
func recordSize(rec *Record) int64 {
	n := int64(recordOverhead + len(rec.Key) + len(rec.Value))
	for _, h := range rec.Headers {
		n += int64(len(h.Key) + len(h.Value))
	}
	return n
}

// Outcome counts how the members of a record's fan-out snapshot resolved it.
// For every advanced record Acked+Failed+Rejected equals the snapshot size.
type Outcome struct{ Acked, Failed, Rejected int }

// Clean reports whether every subscriber accepted the record: Failed==0,
// Rejected==0 and Acked>0. A record fanned out to zero subscribers (0,0,0) is
// not clean: nothing accepted it, so a producer must not commit past it
// (reference v3 is_clean; v2 said it was clean).
func (o Outcome) Clean() bool { return o.Failed == 0 && o.Rejected == 0 && o.Acked > 0 }

// AdvanceItem is one resolved record handed to Producer.Advance.
type AdvanceItem struct {
	Record  *Record
	Payload any // the broker payload given to emit
	Outcome Outcome
	// Causes holds the reject reasons and failure causes of this record's
	// subscribers (for dead-letter headers and logs), in resolution order.
	Causes []error
	// CauseIDs[i] is the id of the subscriber that gave Causes[i] (the
	// agent that rejected or failed the record), so a producer can route a
	// dead letter per subscriber. Same length as Causes.
	CauseIDs []string
}

// Producer is the upstream of one shared source (a Kafka partition's poll
// loop, a NATS consumer, ...). The manager calls Open once, Lane and Advance
// from its own goroutines, and Close once after Open returned and the advance
// pump stopped.
type Producer interface {
	// Open runs the poll loop: it calls emit for every record, in order, from
	// one goroutine, until ctx is done or it fails. emit blocks while a
	// subscriber queue is full when the manager's Overflow policy is
	// Backpressure, and returns ctx.Err() when ctx is done (or the group's
	// terminal error when the record could not be fanned out). Returning (nil
	// or an error) while ctx is not done terminates the group: ErrPollEnded
	// (or the error) is delivered to every subscriber.
	Open(ctx context.Context, emit func(rec *Record, payload any) error) error
	// Lane returns the ordering lane of a payload; it must be comparable (a
	// map key). Kafka: the partition. Called once per record, before fan-out,
	// on the poll goroutine; it must not block. An error or a non-comparable
	// lane terminates the group and the record is not fanned out.
	Lane(payload any) (any, error)
	// Advance is called by the single pump with the longest contiguous
	// resolved prefix of one lane, in fan-out order, never concurrently,
	// never after Close. ctx is not cancelled by a stop (a stop drains the
	// resolved prefixes through Advance). An error terminates the group: the
	// batch and every outstanding record are abandoned for redelivery. The
	// manager reuses the batch slice after Advance returns: a producer that
	// keeps items past the call copies them (the items' Record, Payload and
	// cause slices are not reused).
	Advance(ctx context.Context, batch []AdvanceItem) error
	// Close releases the producer. Errors are logged as warnings.
	Close() error
}

// Emit is one record of a batch handed to a BatchProducer's emit: the record
// and its broker payload, as the two arguments of Producer.Open's emit.
type Emit struct {
	Record  *Record
	Payload any
}

// BatchProducer is a Producer whose poll loop hands over the records it has
// at hand in one call (a Kafka fetch hands them out by the hundred): one lock
// acquisition, one clock read and at most one wake-up per subscriber for the
// whole batch instead of one each per record. The manager calls OpenBatch
// instead of Open.
type BatchProducer interface {
	Producer
	// OpenBatch is Open with a batch emit: emit fans out batch in order, as
	// many emit calls of one record each would, and returns the first error
	// such a call would return (ctx.Err(), the group's terminal error). On
	// an error, a prefix of the batch may have been fanned out and the rest
	// was not; the producer must treat the rest as never delivered (the
	// records stay unresolved and are fetched again by the next owner).
	// Under Backpressure emit waits for room record by record, so a batch
	// longer than a subscriber queue is fine. emit keeps no reference to
	// the batch slice after it returns (the producer may reuse it).
	OpenBatch(ctx context.Context, emit func(batch []Emit) error) error
}

// RoomWait says what a Backpressure emit waits for (RoomObserver).
type RoomWait int32

const (
	// RoomFree: emit does not wait.
	RoomFree RoomWait = iota
	// RoomQueue: a subscriber's queue is full (QueueSize): the agents are
	// behind the source; the wait ends as they take records.
	RoomQueue
	// RoomBytes: the group's records in flight count Config.MaxInFlightBytes
	// or more; the wait ends as the oldest ones advance. A record that
	// stays unresolved (a late confirmation) holds every record behind it
	// in flight, so the source stands still until it resolves.
	RoomBytes
)

// String returns "free", "queue" or "bytes".
func (w RoomWait) String() string {
	switch w {
	case RoomFree:
		return "free"
	case RoomQueue:
		return "queue"
	case RoomBytes:
		return "bytes"
	}
	return fmt.Sprintf("RoomWait(%d)", int32(w))
}

// RoomObserver may be implemented by a Producer (in ack mode) to learn when
// its emit waits for room under Backpressure and why, e.g. to report what
// holds a source back. The group calls WaitingForRoom on the poll goroutine
// with its lock held, once when a wait starts or its reason changes and
// with RoomFree when it ends: it must return at once and take no lock the
// producer holds while calling emit (an atomic store is what it is for).
type RoomObserver interface {
	WaitingForRoom(RoomWait)
}

// ProducerFactory builds the producer of a group. It is called once per group,
// after the cohort grace period, with a context cancelled when the group stops.
type ProducerFactory func(ctx context.Context) (Producer, error)

// OpenFunc is the upstream of a fast-path group (see Manager.SubscribeFast):
// it calls emit for every record until ctx is done. Same contract as
// Producer.Open, without payloads, lanes or advance.
type OpenFunc func(ctx context.Context, emit func(rec *Record) error) error

// Overflow is what happens when a subscriber's queue is full at fan-out.
type Overflow int

const (
	// FailSubscriber fails only the overflowing subscriber with an
	// *OverflowError (reference behaviour; external sources). Siblings and
	// the group are unaffected.
	FailSubscriber Overflow = iota
	// Backpressure makes emit block until every snapshot member has room
	// and the group's in-flight bytes are under Config.MaxInFlightBytes
	// (Kafka sources, docs/design.md §3.2: pause fetching instead of failing).
	Backpressure
)

// Config configures a Manager. Zero fields take the documented defaults.
type Config struct {
	// QueueSize is the per-subscriber queue capacity in records. Default 1024
	// (Airflow shared_stream_subscriber_queue_size). Negative is an error.
	QueueSize int
	// AckTimeout bounds how long a subscriber may take to resolve a record,
	// measured from fan-out. Default 300 s. The scanner runs every
	// max(10ms, AckTimeout/10) and fails a subscriber when elapsed >= AckTimeout,
	// so the effective timeout lies in [AckTimeout, AckTimeout+cadence).
	// Negative is an error.
	AckTimeout time.Duration
	// CohortGrace delays the factory call of a new group so that subscribers
	// starting together share one snapshot. Default 0 (no delay).
	CohortGrace time.Duration
	// Overflow is the queue-full policy. Default FailSubscriber.
	Overflow Overflow
	// MaxInFlightBytes bounds, under Backpressure, the bytes of the records
	// an ack-mode group holds in flight: fanned out and not yet advanced
	// (queued, in a subscriber's hands, waiting for its derived records'
	// confirmations, or resolved behind such a record). emit blocks while
	// the group holds this much or more, so that the poll loop stops
	// reading ahead (a Kafka partition consumer stops fetching) instead of
	// its records piling up between the fetch and the subscribers' own
	// output buffers. A record counts its key, value and headers plus 512
	// bytes (what a small record keeps alive besides them). The bound is soft by one
	// record: a record goes out whenever the group holds less, so a record
	// larger than the bound still passes (alone). Per group, so a worker
	// holds at most its groups' count times the bound (plus one record
	// each). Default DefaultMaxInFlightBytes; negative is an error. The
	// FailSubscriber policy and the fast path do not bound bytes.
	MaxInFlightBytes int64
	// Logger receives lifecycle logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock used for fan-out times and the ack timeout. Default
	// time.Now.
	Now func() time.Time
}

// Defaults of Config.
const (
	DefaultQueueSize  = 1024
	DefaultAckTimeout = 300 * time.Second
	// DefaultMaxInFlightBytes is the default MaxInFlightBytes: about 830
	// records of 100 bytes per group (Kafka Streams buffers 1,000 records
	// a partition). Measured (issue #28, bench/sidebyside stateless, 1M
	// records of 116 bytes, 8 partitions, 2 interleaved rounds): peak RSS
	// on kfake 97-99 MB against 146-147 unbounded and 115-117 at 1 MiB,
	// on Kafka 4.4 61-63 MB against 153-157 unbounded; 256 KiB took
	// about a third more CPU on Kafka 4.4 for little less memory.
	DefaultMaxInFlightBytes = 512 << 10
	// minScanCadence is the floor of the ack-timeout scanner cadence.
	minScanCadence = 10 * time.Millisecond
)

var (
	// ErrGroupStopped is returned by Subscription.Next when the group was
	// stopped deliberately (Manager.Stop, Manager.StopAll). Deviation from the
	// reference, which reports nothing on a cancel.
	ErrGroupStopped = errors.New("shared source stopped")
	// ErrPollEnded is delivered to every subscriber when Producer.Open
	// returned nil while its context was not done.
	ErrPollEnded = errors.New("shared source returned without an error; shared sources are expected to run for the lifetime of the group")
	// ErrUnsubscribed is returned by Subscription.Next after Unsubscribe.
	ErrUnsubscribed = errors.New("subscription ended")
)

// OverflowError is delivered to a subscriber whose queue was full at fan-out
// under the FailSubscriber policy.
type OverflowError struct {
	Key, ID   string
	QueueSize int
}

func (e *OverflowError) Error() string {
	return fmt.Sprintf("source %q: subscriber %s fell behind: its queue exceeded %d records", e.Key, e.ID, e.QueueSize)
}

// AckTimeoutError is delivered to a subscriber that did not resolve a record
// within the ack timeout (still on the record, or its derived records not yet
// confirmed).
type AckTimeoutError struct {
	Key, ID string
	// EventID is the group-local fan-out sequence number of the record (0-based).
	EventID uint64
	Offset  int64 // Record.Offset of the timed-out record
	Timeout time.Duration
}

func (e *AckTimeoutError) Error() string {
	return fmt.Sprintf("source %q: subscriber %s did not resolve record %d (offset %d) within the ack timeout %s (still on the record, or its derived records not yet acknowledged)",
		e.Key, e.ID, e.EventID, e.Offset, e.Timeout)
}
