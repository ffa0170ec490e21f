// Package kafkashare is a shared-source producer (agent/source) over a Kafka
// share group (KIP-932, production-ready since Kafka 4.2): many workers read
// the same partitions, the broker hands each record to one member at a time
// under an acquisition lock, and every record is acknowledged on its own. A
// record's resolution in the ack-mode manager is mapped back to the broker:
//
//	clean    -> ACCEPT   (every subscriber accepted it)
//	rejected -> dead letter to each rejecting subscriber's topic, then REJECT
//	            (archived: the broker never delivers it again)
//	failed   -> RELEASE after a backoff that doubles with the broker's delivery
//	            count; once the record was delivered MaxRetries+1 times it is
//	            dead-lettered to every subscriber that failed or rejected it
//	            and REJECTed instead
//
// A worker that dies (kill -9) sends nothing more: the records it had
// acquired and not acknowledged go back to the share group when the broker
// closes the share session (the connection) or at the latest when their
// acquisition lock expires (group config share.record.lock.duration.ms,
// default 30 s), with their delivery count raised. An acknowledgement is
// sent asynchronously after Advance (like the NATS source's acks): one
// lost with the worker makes the broker deliver the record again
// (at-least-once).
//
// Offsets and ordering are the broker's: no partition is owned, nothing is
// committed, no table is fed from the source (an agent that needs keyed
// state writes through a keyed topic). A released record is delivered again
// after records fetched later, possibly to another worker.
//
// One fetch is in flight per producer: franz-go's share consumer accepts
// every record of the previous poll that carries no acknowledgement when it
// polls again, so the poll loop hands a fetch's records to the manager and
// polls again only once every one of them was acknowledged (or released
// after its backoff). Throughput per worker is therefore bounded by the
// fetch size (ShareMaxRecords, default 500) over the time the slowest
// record of a fetch takes; add workers to scale.
//
// Package kafkashare must never accept a record before its record resolved
// clean, and never reject one whose dead letters were not acknowledged.
package kafkashare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/runnel-dev/runnel/agent/source"
)

// Lane says how records are ordered for advancing.
type Lane int

const (
	// LanePerPartition advances the records of each topic partition in
	// fetch order (few, large Advance batches; the default).
	LanePerPartition Lane = iota
	// LanePerRecord advances every record as soon as it resolves (a slow
	// record holds back no acknowledgement of another).
	LanePerRecord
)

// Defaults of Config.
const (
	DefaultMaxRetries = 4 // five deliveries: the broker's default group.share.delivery.count.limit
	DefaultBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
)

// Config configures a Producer.
type Config struct {
	// Brokers are the bootstrap brokers (host:port). Required.
	Brokers []string
	// Group is the share group. Required.
	Group string
	// Topics are the topics the share group reads. Required.
	Topics []string
	// AutoOffsetReset, when "earliest" or "latest", is set as the group's
	// share.auto.offset.reset config at start (IncrementalAlterConfigs on
	// the GROUP resource): where a share group that has no state for a
	// partition yet starts reading it. Empty leaves the group's setting
	// (the broker's default is latest: records sent before the group first
	// read the partition are not delivered).
	AutoOffsetReset string
	// Lane is the ordering lane; default LanePerPartition.
	Lane Lane
	// MaxRetries is how many times a failed record is released for
	// redelivery: after MaxRetries+1 failed deliveries (the broker's
	// delivery count) it is dead-lettered and rejected. Default 4; negative
	// means 0. Keep MaxRetries+1 at most the group's delivery count limit
	// (group.share.delivery.count.limit, default 5): the broker archives a
	// record released that many times without telling anyone.
	MaxRetries int
	// Backoff is how long a record failed on its first delivery is held
	// before it is released; it doubles with every further delivery up to
	// MaxBackoff. Defaults 100 ms and 10 s. A held record delays the next
	// fetch of its producer (see the package doc) and must be released
	// before its acquisition lock expires (share.record.lock.duration.ms).
	Backoff, MaxBackoff time.Duration
	// DeadLetterTopic names the dead-letter topic of a subscriber (agent);
	// default "<Group>-<subscriber>-dlq". The topic is created with one
	// partition and retention.ms=-1 when it is missing.
	DeadLetterTopic func(subscriber string) string
	// ClientOpts are extra franz-go options for the share consumer's client,
	// which also writes the dead letters (ShareMaxRecords, timeouts, TLS,
	// SASL, ...). Those that are neither group nor consumer options (TLS,
	// SASL, dialer, timeouts) also configure the short-lived client that
	// checks the cluster and sets AutoOffsetReset at start.
	ClientOpts []kgo.Opt
	// Logger receives dead letters, release and acknowledgement errors;
	// default slog.Default().
	Logger *slog.Logger
}

// ErrShareGroupsDisabled is wrapped by the error New returns when the
// cluster does not serve share groups.
var ErrShareGroupsDisabled = errors.New("share groups are not enabled on the Kafka cluster")

// Producer is a source.BatchProducer over one share-group member.
type Producer struct {
	cfg Config
	cl  *kgo.Client
	log *slog.Logger

	// outstanding counts the records of the current fetch not yet
	// acknowledged; the poll loop waits for zero before polling again.
	mu          sync.Mutex
	outstanding int
	drained     chan struct{} // closed when outstanding drops to 0
	closed      bool
	timers      map[*time.Timer]struct{} // pending delayed releases

	dlqMu      sync.Mutex
	dlqCreated map[string]bool

	accepted, rejected, released, deadLettered, ackErrors atomic.Int64
}

// Stats counts what a producer did with its records since it was built.
type Stats struct {
	// Accepted, Rejected and Released count the records marked ACCEPT,
	// REJECT and RELEASE (the acknowledgements are sent asynchronously:
	// FlushAcks waits for them).
	Accepted, Rejected, Released int64
	// DeadLettered counts the dead letters the broker acknowledged (one
	// per subscriber of a record).
	DeadLettered int64
	// AckErrors counts the partitions of acknowledgement requests the
	// broker refused or the client could not deliver (their records are
	// delivered again after their acquisition lock).
	AckErrors int64
}

// Stats returns the producer's counts.
func (p *Producer) Stats() Stats {
	return Stats{Accepted: p.accepted.Load(), Rejected: p.rejected.Load(), Released: p.released.Load(), DeadLettered: p.deadLettered.Load(), AckErrors: p.ackErrors.Load()}
}

// FlushAcks sends the acknowledgements marked so far and waits until the
// broker answered every one (or ctx is done). Errors: ctx's.
func (p *Producer) FlushAcks(ctx context.Context) error {
	if err := p.cl.FlushAcks(ctx); err != nil {
		return fmt.Errorf("kafka share source: flush acknowledgements: %w", err)
	}
	return nil
}

// New checks the cluster serves share groups, sets AutoOffsetReset, and
// returns a producer whose share consumer joins Group when the manager opens
// it. Errors: a missing Brokers, Group or Topics, a bad AutoOffsetReset, a
// client that cannot be built, a cluster without share groups (wrapping
// ErrShareGroupsDisabled and naming the broker feature that enables them),
// a failed group config change.
func New(ctx context.Context, cfg Config) (*Producer, error) {
	if len(cfg.Brokers) == 0 || cfg.Group == "" || len(cfg.Topics) == 0 {
		return nil, errors.New("kafka share source: Config.Brokers, Group and Topics are required")
	}
	switch cfg.AutoOffsetReset {
	case "", "earliest", "latest":
	default:
		return nil, fmt.Errorf("kafka share source: AutoOffsetReset %q: want earliest, latest or empty", cfg.AutoOffsetReset)
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = DefaultMaxRetries
	} else if cfg.MaxRetries < 0 {
		cfg.MaxRetries = 0
	}
	if cfg.Backoff <= 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.Backoff)
	if cfg.DeadLetterTopic == nil {
		group := cfg.Group
		cfg.DeadLetterTopic = func(sub string) string { return group + "-" + sub + "-dlq" }
	}
	p := &Producer{cfg: cfg, log: cfg.Logger, timers: map[*time.Timer]struct{}{}, dlqCreated: map[string]bool{}}
	if p.log == nil {
		p.log = slog.Default()
	}
	// Check and configure with a plain client first: the share client
	// starts joining the group as soon as it is built, and a share fetch
	// before share.auto.offset.reset is set would initialize the partition
	// at the latest offset.
	adminOpts := []kgo.Opt{kgo.SeedBrokers(cfg.Brokers...)}
	for _, o := range cfg.ClientOpts {
		_, group := o.(kgo.GroupOpt)
		_, consumer := o.(kgo.ConsumerOpt)
		if !group && !consumer {
			adminOpts = append(adminOpts, o) // connection options: TLS, SASL, timeouts
		}
	}
	admin, err := kgo.NewClient(adminOpts...)
	if err != nil {
		return nil, fmt.Errorf("kafka share source: client: %w", err)
	}
	err = p.start(ctx, admin)
	admin.Close()
	if err != nil {
		return nil, err
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ShareGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.ShareAckCallback(p.ackResults),
	}, cfg.ClientOpts...)
	if p.cl, err = kgo.NewClient(opts...); err != nil {
		return nil, fmt.Errorf("kafka share source: client: %w", err)
	}
	return p, nil
}

// Factory returns a source.ProducerFactory building a producer over cfg
// (for source.Manager.Subscribe); New's errors end the group and reach every
// subscriber's Next.
func Factory(cfg Config) source.ProducerFactory {
	return func(ctx context.Context) (source.Producer, error) {
		p, err := New(ctx, cfg)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return p, nil
	}
}

// start checks share-group support and applies AutoOffsetReset.
func (p *Producer) start(ctx context.Context, cl *kgo.Client) error {
	if err := CheckShareGroups(ctx, cl); err != nil {
		return err
	}
	if p.cfg.AutoOffsetReset == "" {
		return nil
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	r.ResourceName = p.cfg.Group
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name = "share.auto.offset.reset"
	c.Value = kmsg.StringPtr(p.cfg.AutoOffsetReset)
	r.Configs = append(r.Configs, c)
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafka share source: set share.auto.offset.reset of group %s: %w", p.cfg.Group, err)
	}
	for _, rr := range resp.Resources {
		if err := kerr.ErrorForCode(rr.ErrorCode); err != nil {
			return fmt.Errorf("kafka share source: set share.auto.offset.reset of group %s: %w (%s)", p.cfg.Group, err, deref(rr.ErrorMessage))
		}
	}
	return nil
}

// CheckShareGroups asks the cluster (ApiVersions) whether it serves share
// groups: the ShareGroupHeartbeat API must be listed and the share.version
// feature finalized at level 1 or more. Kafka 4.4 lists the API even when
// the feature is off and then answers every heartbeat UNSUPPORTED_VERSION,
// which franz-go retries for ever; this check turns that into an error at
// start. The error wraps ErrShareGroupsDisabled.
func CheckShareGroups(ctx context.Context, cl *kgo.Client) error {
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("kafka share source: ApiVersions: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("kafka share source: ApiVersions: %w", err)
	}
	var api bool
	for _, k := range resp.ApiKeys {
		if k.ApiKey == kmsg.ShareGroupHeartbeat.Int16() {
			api = true
		}
	}
	if !api {
		return fmt.Errorf("kafka share source: %w: the broker does not know the ShareGroupHeartbeat API (KIP-932 needs Apache Kafka 4.1 or later; production-ready in 4.2)", ErrShareGroupsDisabled)
	}
	level := int16(0)
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "share.version" {
			level = f.MaxVersionLevel
		}
	}
	if level < 1 {
		return fmt.Errorf("kafka share source: %w: the cluster's share.version feature is 0; enable it with "+
			"`kafka-features.sh --bootstrap-server HOST:PORT upgrade --feature share.version=1` "+
			"(or format the nodes with `kafka-storage.sh format --feature share.version=1`)", ErrShareGroupsDisabled)
	}
	return nil
}

// Open implements source.Producer by emitting OpenBatch's batches one record
// at a time.
func (p *Producer) Open(ctx context.Context, emit func(*source.Record, any) error) error {
	return p.OpenBatch(ctx, func(batch []source.Emit) error {
		for _, e := range batch {
			if err := emit(e.Record, e.Payload); err != nil {
				return err
			}
		}
		return nil
	})
}

// HeaderDeliveryCount is the header the producer appends to every record it
// emits: the broker's delivery count of the record (decimal; 1 on the first
// delivery). It is not written to dead letters (their runnel-attempts header
// carries the count).
const HeaderDeliveryCount = "runnel-delivery-count"

// DeliveryCount returns the broker's delivery count of a record this
// producer emitted (its HeaderDeliveryCount header), or 0 when it has none.
func DeliveryCount(rec *source.Record) int {
	for i := len(rec.Headers) - 1; i >= 0; i-- {
		if string(rec.Headers[i].Key) == HeaderDeliveryCount {
			n, _ := strconv.Atoi(string(rec.Headers[i].Value))
			return n
		}
	}
	return 0
}

// OpenBatch implements source.BatchProducer: it polls the share group, emits
// each fetch's records (the payload is the *kgo.Record; the record's Topic,
// Partition, Offset, Key, Value and Timestamp are Kafka's, its Headers
// Kafka's followed by HeaderDeliveryCount), waits
// until every one of them was acknowledged, and polls again, until ctx is
// done. A share-group error the client cannot recover from (the group or a
// topic not authorized, share groups switched off) ends it with that error;
// other fetch errors are logged and the loop goes on.
func (p *Producer) OpenBatch(ctx context.Context, emit func([]source.Emit) error) error {
	var batch []source.Emit
	for {
		fetches := p.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var fatal error
		fetches.EachError(func(topic string, partition int32, err error) {
			switch {
			case errors.Is(err, kgo.ErrClientClosed), errors.Is(err, context.Canceled):
				fatal = err
			case errors.Is(err, kerr.UnsupportedVersion):
				fatal = fmt.Errorf("kafka share source: group %s: %w: the broker answered UNSUPPORTED_VERSION (%v); enable share groups with the share.version feature (kafka-features.sh upgrade --feature share.version=1)", p.cfg.Group, ErrShareGroupsDisabled, err)
			case errors.Is(err, kerr.GroupAuthorizationFailed), errors.Is(err, kerr.TopicAuthorizationFailed):
				fatal = fmt.Errorf("kafka share source: group %s: %w", p.cfg.Group, err)
			default:
				p.log.Warn("kafka share fetch error", "group", p.cfg.Group, "topic", topic, "partition", partition, "err", err)
			}
		})
		if fatal != nil {
			return fatal
		}
		batch = batch[:0]
		fetches.EachRecord(func(r *kgo.Record) {
			rec := &source.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.Timestamp}
			rec.Headers = make([]source.Header, len(r.Headers), len(r.Headers)+1)
			for i, h := range r.Headers {
				rec.Headers[i] = source.Header{Key: []byte(h.Key), Value: h.Value}
			}
			rec.Headers = append(rec.Headers, source.Header{Key: []byte(HeaderDeliveryCount), Value: []byte(strconv.Itoa(int(r.DeliveryCount())))})
			batch = append(batch, source.Emit{Record: rec, Payload: r})
		})
		if len(batch) == 0 {
			continue
		}
		drained := p.expect(len(batch))
		if err := emit(batch); err != nil {
			// The records not fanned out stay acquired; Close releases them.
			return err
		}
		select {
		case <-drained:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// expect registers n outstanding records and returns the channel closed
// when all were acknowledged.
func (p *Producer) expect(n int) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.outstanding = n
	p.drained = make(chan struct{})
	return p.drained
}

// acked marks one record of the current fetch acknowledged.
func (p *Producer) acked() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.outstanding--
	if p.outstanding == 0 && p.drained != nil {
		close(p.drained)
		p.drained = nil
	}
}

type partitionLane struct {
	topic     string
	partition int32
}

// Lane implements source.Producer: the record's topic partition, or the
// record itself under LanePerRecord.
func (p *Producer) Lane(payload any) (any, error) {
	r, ok := payload.(*kgo.Record)
	if !ok {
		return nil, fmt.Errorf("kafka share source: payload %T is not a *kgo.Record", payload)
	}
	if p.cfg.Lane == LanePerRecord {
		return r, nil
	}
	return partitionLane{r.Topic, r.Partition}, nil
}

// Advance implements source.Producer (see the package doc for the mapping).
// A record fanned out to no subscriber (Outcome 0,0,0) is not clean: it is
// released like a failed one (and rejected, without dead letters, after
// MaxRetries+1 deliveries). A dead letter the broker did not acknowledge
// makes the record count as failed. Advance never returns an error: every
// outcome ends in an acknowledgement, and the acknowledgement's own failure
// (reported by the broker later) leaves the record to the acquisition lock
// timeout.
func (p *Producer) Advance(ctx context.Context, batch []source.AdvanceItem) error {
	for _, it := range batch {
		r := it.Payload.(*kgo.Record)
		delivered := int(r.DeliveryCount())
		switch {
		case it.Outcome.Clean():
			p.ack(r, kgo.AckAccept)
		case it.Outcome.Failed == 0 && it.Outcome.Rejected > 0:
			if err := p.deadLetter(ctx, it, delivered); err != nil {
				p.log.Warn("kafka share dead letter failed; releasing the record for redelivery", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "err", err)
				p.release(r, delivered)
				continue
			}
			p.ack(r, kgo.AckReject)
		case delivered > p.cfg.MaxRetries:
			if err := p.deadLetter(ctx, it, delivered); err != nil {
				// The broker archives it at its delivery count limit
				// or delivers it again: either way nothing is lost
				// silently by us.
				p.log.Error("kafka share dead letter of an exhausted record failed; releasing it", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "deliveries", delivered, "err", err)
				p.release(r, delivered)
				continue
			}
			p.ack(r, kgo.AckReject)
		default:
			p.release(r, delivered)
		}
	}
	return nil
}

func (p *Producer) ack(r *kgo.Record, s kgo.AckStatus) {
	r.Ack(s)
	switch s {
	case kgo.AckAccept:
		p.accepted.Add(1)
	case kgo.AckReject:
		p.rejected.Add(1)
	case kgo.AckRelease:
		p.released.Add(1)
	}
	p.acked()
}

// release releases r after the backoff of its delivery count (1-based):
// Backoff·2^(delivered-1), capped at MaxBackoff.
func (p *Producer) release(r *kgo.Record, delivered int) {
	d := p.cfg.Backoff
	for i := 1; i < delivered && d < p.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, p.cfg.MaxBackoff)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return // the client's leave releases it
	}
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		p.mu.Lock()
		_, live := p.timers[t]
		delete(p.timers, t)
		p.mu.Unlock()
		if live {
			p.ack(r, kgo.AckRelease)
		}
	})
	p.timers[t] = struct{}{}
}

// Dead-letter headers (docs/ack-mode.md, "Dead-letter topics").
const (
	hdrReason    = "runnel-reason"
	hdrTopic     = "runnel-topic"
	hdrPartition = "runnel-partition"
	hdrOffset    = "runnel-offset"
	hdrAgent     = "runnel-agent"
	hdrAttempts  = "runnel-attempts"
	hdrTimestamp = "runnel-timestamp"
)

// deadLetter writes one dead letter per cause (subscriber) of it and waits
// for the broker's acknowledgement of every one.
func (p *Producer) deadLetter(ctx context.Context, it source.AdvanceItem, attempts int) error {
	if len(it.Causes) == 0 {
		return nil
	}
	r := it.Payload.(*kgo.Record)
	now := time.Now().UTC().Format(time.RFC3339)
	recs := make([]*kgo.Record, 0, len(it.Causes))
	for i, cause := range it.Causes {
		sub := ""
		if i < len(it.CauseIDs) {
			sub = it.CauseIDs[i]
		}
		topic := p.cfg.DeadLetterTopic(sub)
		if err := p.ensureTopic(ctx, topic); err != nil {
			return err
		}
		hs := make([]kgo.RecordHeader, 0, len(r.Headers)+7)
		hs = append(hs, r.Headers...)
		hs = append(hs,
			kgo.RecordHeader{Key: hdrReason, Value: []byte(cause.Error())},
			kgo.RecordHeader{Key: hdrTopic, Value: []byte(r.Topic)},
			kgo.RecordHeader{Key: hdrPartition, Value: []byte(strconv.Itoa(int(r.Partition)))},
			kgo.RecordHeader{Key: hdrOffset, Value: []byte(strconv.FormatInt(r.Offset, 10))},
			kgo.RecordHeader{Key: hdrAgent, Value: []byte(sub)},
			kgo.RecordHeader{Key: hdrAttempts, Value: []byte(strconv.Itoa(attempts))},
			kgo.RecordHeader{Key: hdrTimestamp, Value: []byte(now)},
		)
		recs = append(recs, &kgo.Record{Topic: topic, Key: r.Key, Value: r.Value, Headers: hs, Timestamp: r.Timestamp})
		p.log.Info("kafka share record dead-lettered", "topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "subscriber", sub, "dead_letter_topic", topic, "reason", cause.Error())
	}
	if err := p.cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return fmt.Errorf("kafka share source: write dead letter of %s[%d]@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	p.deadLettered.Add(int64(len(recs)))
	return nil
}

// ensureTopic creates a dead-letter topic (one partition, retention.ms=-1)
// once per producer; an existing topic is left as it is.
func (p *Producer) ensureTopic(ctx context.Context, topic string) error {
	p.dlqMu.Lock()
	defer p.dlqMu.Unlock()
	if p.dlqCreated[topic] {
		return nil
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic = topic
	t.NumPartitions = 1
	t.ReplicationFactor = -1
	c := kmsg.NewCreateTopicsRequestTopicConfig()
	c.Name = "retention.ms"
	c.Value = kmsg.StringPtr("-1")
	t.Configs = append(t.Configs, c)
	req.Topics = append(req.Topics, t)
	req.TimeoutMillis = 30000
	resp, err := req.RequestWith(ctx, p.cl)
	if err != nil {
		return fmt.Errorf("kafka share source: create dead-letter topic %s: %w", topic, err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("kafka share source: create dead-letter topic %s: %w (%s)", topic, err, deref(rt.ErrorMessage))
		}
	}
	p.dlqCreated[topic] = true
	return nil
}

// ackResults logs the acknowledgements the broker refused: those records go
// back to the group when their acquisition lock expires.
func (p *Producer) ackResults(_ *kgo.Client, rs kgo.ShareAckResults) {
	for _, r := range rs {
		if r.Err != nil {
			p.ackErrors.Add(1)
			p.log.Warn("kafka share acknowledgement failed; the broker redelivers the partition's records of it after their acquisition lock", "group", p.cfg.Group, "topic", r.Topic, "partition", r.Partition, "err", r.Err)
		}
	}
}

// Close implements source.Producer: it cancels the pending delayed
// releases, sends the acknowledgements still buffered (up to 10 s) and
// leaves the share group, which releases every record acquired and not
// acknowledged (the broker delivers them again at once, delivery count
// raised).
func (p *Producer) Close() error {
	p.mu.Lock()
	p.closed = true
	for t := range p.timers {
		t.Stop()
	}
	clear(p.timers)
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := p.cl.FlushAcks(ctx)
	p.cl.Close()
	if err != nil {
		return fmt.Errorf("kafka share source: flush acknowledgements: %w", err)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return strings.TrimSpace(*s)
}
