package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// DefaultDeliveryTimeout is how long a record may wait for the broker's
// answer, retries included, when ProducerConfig.DeliveryTimeout is zero:
// Java's delivery.timeout.ms. Within it every error Kafka calls retriable
// (a leader moving or gone, a topic whose metadata has not propagated yet,
// a throttle, a lost connection) is retried; only past it does the record
// fail.
const DefaultDeliveryTimeout = 120 * time.Second

// kgoMaxBuffered bounds the bytes (keys, values, headers) of records sent and
// not yet answered: Send blocks above it. Every such record also keeps its
// source record unresolved upstream, so the bound is small; on the stateless
// benchmark 8 to 64 MiB ran alike with Runnel's previous producer. (The Java
// producer's buffer.memory is 32 MiB.)
const kgoMaxBuffered = 16 << 20

// kgoMaxBufferedRecords bounds the records sent and not yet answered, beside
// kgoMaxBuffered: small records hit it before the byte bound. Each of them
// keeps its source record, its event and the decoded key and value alive
// upstream (about 500 bytes of heap a record on the stateless benchmark), so
// this is what bounds a stateless worker's memory. Measured (issue #28,
// bench/sidebyside, 1M records, interleaved with 200,000 and Sarama's fetch
// at 1 MiB): 32,000 with a 512 KiB fetch (kafka.NewConfig) cut stateless peak
// RSS from 242–445 MB to 144–190 MB on Kafka 4.4 and from 275–403 to
// 168–171 MB on kfake, stateful by a quarter, with medians of time within
// the rounds' spread (kgo's default is 50,000).
const kgoMaxBufferedRecords = 32_000

// defaultMaxMessageBytes is the batch cap for a topic whose max.message.bytes
// is unknown: Kafka's default max.message.bytes (1 MiB + 12 bytes of batch
// header allowance), as kgo assumes.
const defaultMaxMessageBytes = 1_048_588

// ProducerConfig configures a Producer without a transactional ID
// (NewProducer). Zero fields take the defaults named on each.
type ProducerConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ClientID names the client to the brokers (Kafka's client.id).
	ClientID string
	// Security is the connection's TLS and SASL (zero: plaintext).
	Security Security
	// DeliveryTimeout bounds how long a record waits for its answer,
	// retries included (Java's delivery.timeout.ms), counted from Send (not
	// from the record's timestamp); default DefaultDeliveryTimeout. A
	// record past it fails with ErrDeliveryTimeout; one in a request the
	// broker may have written fails only once its answer came, so that no
	// sequence number is reused (KIP-98).
	DeliveryTimeout time.Duration
	// Linger is how long a partition's first record waits for more before
	// its batch goes out while a request to the same broker is not already
	// in flight; default 0 (batches fill while the previous request to the
	// broker is answered). Flush ends any lingering.
	Linger time.Duration
	// RetryBackoff is the wait before a retry; default kgo's (jittered,
	// from 100 ms growing to 1 s).
	RetryBackoff time.Duration
	// MaxMessageBytes caps a record batch (uncompressed) beside the topic's
	// own max.message.bytes, which the producer reads once per topic
	// (DescribeConfigs) so that no batch is larger than the topic accepts.
	// 0: the topic's limit alone. A record over the cap fails with
	// kerr.MessageTooLarge.
	MaxMessageBytes int32
	// Compression is the batches' codec: "none" (default), "gzip",
	// "snappy", "lz4" or "zstd".
	Compression string
	// TransactionalID, for NewTxnProducer only, is the producer's
	// transactional ID (Kafka's transactional.id).
	TransactionalID string
	// TransactionTimeout, for NewTxnProducer only, is how long the broker
	// lets a transaction stay open before it aborts it (Kafka's
	// transaction.timeout.ms); default kgo's 40 s.
	TransactionTimeout time.Duration
	// Logger gets the client's warnings and errors (nil: discarded).
	Logger *slog.Logger
}

// ProducerConfigOf returns the ProducerConfig matching a Sarama client: its
// brokers as seeds, and the client ID, TLS, SASL, compression, retry backoff
// and Producer.MaxMessageBytes of its configuration. It serves commands that
// hold a Sarama client for reading (send, dlq replay).
func ProducerConfigOf(client sarama.Client) ProducerConfig {
	conf := client.Config()
	pc := ProducerConfig{ClientID: conf.ClientID, RetryBackoff: conf.Producer.Retry.Backoff,
		MaxMessageBytes: int32(conf.Producer.MaxMessageBytes)}
	for _, b := range client.Brokers() {
		pc.Brokers = append(pc.Brokers, b.Addr())
	}
	if conf.Net.TLS.Enable {
		pc.Security.TLS = conf.Net.TLS.Config
	}
	if conf.Net.SASL.Enable {
		pc.Security.SASL = SASL{Mechanism: string(conf.Net.SASL.Mechanism), User: conf.Net.SASL.User,
			Password: conf.Net.SASL.Password}
	}
	switch conf.Producer.Compression {
	case sarama.CompressionGZIP:
		pc.Compression = "gzip"
	case sarama.CompressionSnappy:
		pc.Compression = "snappy"
	case sarama.CompressionLZ4:
		pc.Compression = "lz4"
	case sarama.CompressionZSTD:
		pc.Compression = "zstd"
	}
	return pc
}

// opts translates c into kgo's options for a producer-only client.
func (c ProducerConfig) opts() ([]kgo.Opt, error) {
	if len(c.Brokers) == 0 {
		return nil, errors.New("kafka: producer: no brokers")
	}
	if err := c.Security.SASL.Validate(); err != nil {
		return nil, err
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		// Runnel picks every record's partition (PartitionFor for keyed
		// records: murmur2 as the Java client, so that co-partitioned
		// topics written by other clients agree).
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		// No kgo.RecordDeliveryTimeout: kgo measures it from a record's
		// timestamp, and Runnel sends records stamped with their source
		// record's time (a repartitioned record of an old event would fail
		// at once). Each record carries a deadline context instead
		// (recordContext); kgo fails a batch whose first record's context
		// ended, where that keeps sequence numbers safe, as it does for its
		// own timeout.
		// A topic whose metadata has not reached every broker yet answers
		// UNKNOWN_TOPIC_OR_PARTITION for a while (1.5 s measured on a
		// fresh changelog): never give up on that alone, only at the
		// delivery timeout.
		kgo.UnknownTopicRetries(-1),
		// After NOT_LEADER_OR_FOLLOWER (without a KIP-951 leader hint) or a
		// lost connection a partition waits for fresh metadata before it is
		// retried; kgo's default minimum between refreshes, 5 s, would
		// make every leader move cost up to 5 s (the Java client refreshes
		// after retry.backoff.ms, 100 ms).
		kgo.MetadataMinAge(250 * time.Millisecond),
		kgo.ProducerLinger(c.Linger),
		kgo.MaxBufferedBytes(kgoMaxBuffered),
		kgo.MaxBufferedRecords(kgoMaxBufferedRecords),
		// No AllowAutoTopicCreation: Runnel creates its topics itself, and a
		// topic missing is waited for, never created by producing to it.
	}
	if c.ClientID != "" {
		opts = append(opts, kgo.ClientID(c.ClientID))
	}
	if c.RetryBackoff > 0 {
		b := c.RetryBackoff
		opts = append(opts, kgo.RetryBackoffFn(func(int) time.Duration { return b }))
	}
	codec := kgo.NoCompression()
	switch c.Compression {
	case "", "none":
	case "gzip":
		codec = kgo.GzipCompression()
	case "snappy":
		codec = kgo.SnappyCompression()
	case "lz4":
		codec = kgo.Lz4Compression()
	case "zstd":
		codec = kgo.ZstdCompression()
	default:
		return nil, fmt.Errorf("kafka: producer: compression %q: none, gzip, snappy, lz4 or zstd", c.Compression)
	}
	opts = append(opts, kgo.ProducerBatchCompression(codec))
	if c.Security.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(c.Security.TLS.Clone()))
	}
	switch s := c.Security.SASL; s.Mechanism {
	case SASLPlain:
		opts = append(opts, kgo.SASL(plain.Auth{User: s.User, Pass: s.Password}.AsMechanism()))
	case SASLSCRAMSHA256:
		opts = append(opts, kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha256Mechanism()))
	case SASLSCRAMSHA512:
		opts = append(opts, kgo.SASL(scram.Auth{User: s.User, Pass: s.Password}.AsSha512Mechanism()))
	}
	if c.Logger != nil {
		opts = append(opts, kgo.WithLogger(slogLogger{c.Logger}))
	}
	if c.TransactionalID != "" {
		opts = append(opts, kgo.TransactionalID(c.TransactionalID))
		if c.TransactionTimeout > 0 {
			opts = append(opts, kgo.TransactionTimeout(c.TransactionTimeout))
		}
	}
	return opts, nil
}

// NewProducer starts an idempotent (KIP-98), non-transactional producer on a
// producer-only kgo client configured by c: acks=all, at most one request in
// flight per broker (kgo's sink per broker, so a slow or throttled broker
// delays only its own partitions), every retriable error retried within
// c.DeliveryTimeout, and on OUT_OF_ORDER_SEQUENCE_NUMBER or
// UNKNOWN_PRODUCER_ID for a partition whose log start moved past its last
// record (an idle partition past retention) a bumped epoch instead of a
// failure (KIP-360). Reports for one partition arrive in offset order, on
// kgo's promise goroutine.
//
// It returns an error for a configuration kgo refuses (bad compression
// name, SASL without credentials); the brokers are contacted lazily, so an
// unreachable cluster shows as records failing at their delivery timeout.
func NewProducer(c ProducerConfig) (*Producer, error) {
	if c.TransactionalID != "" {
		return nil, errors.New("kafka: NewProducer with a transactional ID: use NewTxnProducer")
	}
	k, err := newKgoProducer(c)
	if err != nil {
		return nil, err
	}
	return &Producer{k: k}, nil
}

// newKgoProducer makes the kgoProducer of c, with extra options added to
// c's (a transactional producer's).
func newKgoProducer(c ProducerConfig, extra ...kgo.Opt) (*kgoProducer, error) {
	opts, err := c.opts()
	if err != nil {
		return nil, err
	}
	k := &kgoProducer{maxBytes: c.MaxMessageBytes, log: c.Logger}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	k.opts = append(append(opts, kgo.ProducerBatchMaxBytesFn(k.batchMaxBytes)), extra...)
	cl, err := kgo.NewClient(k.opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: producer: %w", err)
	}
	k.cl.Store(cl)
	k.ctx, k.cancel = context.WithCancel(context.Background())
	k.promise = k.report
	k.timeout = c.DeliveryTimeout
	if k.timeout <= 0 {
		k.timeout = DefaultDeliveryTimeout
	}
	return k, nil
}

// kgoProducer is the non-transactional producer behind a Producer from
// NewProducer.
//
// Invariants: a record is in flight from its Produce to the end of its
// report (kgo's Flush waits for exactly those); limits holds a topic's batch
// cap before the first record of the topic reaches kgo, so that kgo's
// partition discovery (which reads batchMaxBytes once per partition) sees
// it.
type kgoProducer struct {
	// cl is the client; Renew (transactional producers only) replaces it.
	// A record sent to a client Renew closed fails in its report.
	cl       atomic.Pointer[kgo.Client]
	opts     []kgo.Opt // cl's options, for Renew
	log      *slog.Logger
	maxBytes int32         // ProducerConfig.MaxMessageBytes (0: none)
	timeout  time.Duration // the delivery timeout
	// ctx ends at close: it releases senders waiting for buffer space.
	ctx    context.Context
	cancel context.CancelFunc
	// promise is report as a func value, made once (one allocation per
	// producer instead of one per record).
	promise func(*kgo.Record, error)
	// deadline is the context records sent now carry: it ends between
	// timeout−deadlineStep and timeout from now. recordContext replaces it
	// every deadlineStep under deadlineMu.
	deadline   atomic.Pointer[deadlineContext]
	deadlineMu sync.Mutex
	closed     atomic.Bool
	// onFail, when set (transactional producers), is told of every failed
	// record's error, on the promise goroutine.
	onFail func(error)
	// closeOnce guards close.
	closeOnce sync.Once
	// limits maps a topic to its batch cap (int32), the lower of its
	// max.message.bytes and maxBytes; learnMu serializes the look-ups.
	limits  sync.Map
	learnMu sync.Mutex
}

// deadlineStep is how often records get a new deadline context: a record's
// delivery timeout is between timeout−deadlineStep and timeout.
const deadlineStep = time.Second

// deadlineContext is a context that ends at the delivery timeout of the
// records sent until next.
type deadlineContext struct {
	ctx    context.Context
	cancel context.CancelFunc // called at close (k.ctx's end) at the latest
	next   time.Time
}

// recordContext returns the context of a record sent now: it ends at the
// record's delivery timeout (ErrDeliveryTimeout) or at close. One context
// serves every record of a deadlineStep, so a record costs a clock read.
func (k *kgoProducer) recordContext() context.Context {
	now := time.Now()
	if d := k.deadline.Load(); d != nil && now.Before(d.next) {
		return d.ctx
	}
	k.deadlineMu.Lock()
	defer k.deadlineMu.Unlock()
	if d := k.deadline.Load(); d != nil && now.Before(d.next) {
		return d.ctx
	}
	ctx, cancel := context.WithDeadline(k.ctx, now.Add(k.timeout))
	k.deadline.Store(&deadlineContext{ctx: ctx, cancel: cancel, next: now.Add(deadlineStep)})
	return ctx
}

// ErrDeliveryTimeout is in the error of a record that the broker did not
// acknowledge within the delivery timeout (ProducerConfig.DeliveryTimeout),
// retries included. It is transient: Permanent says false.
var ErrDeliveryTimeout = errors.New("kafka: record not acknowledged within the delivery timeout")

// kgoRecord is one record and the receiver of its answer, pooled. rec is the
// first field: report recovers the kgoRecord from the *kgo.Record kgo hands
// back (kgo keeps no reference to a record after its promise returned).
type kgoRecord struct {
	rec  kgo.Record
	ack  Acker
	done DeliveryFunc
	msg  *sarama.ProducerMessage // of Send: its Offset is set on success
}

var kgoRecordPool = sync.Pool{New: func() any { return new(kgoRecord) }}

// send queues one record for partition of topic; ack or done (one of them,
// or neither) gets its answer. key and value must not change until then.
func (k *kgoProducer) send(topic string, partition int32, key, value []byte, headers []kgo.RecordHeader, ts time.Time, ack Acker, done DeliveryFunc, msg *sarama.ProducerMessage) error {
	if k.closed.Load() {
		return ErrProducerClosed
	}
	if _, ok := k.limits.Load(topic); !ok {
		k.learnLimit(topic)
	}
	r := kgoRecordPool.Get().(*kgoRecord)
	r.rec = kgo.Record{Topic: topic, Partition: partition, Key: key, Value: value, Headers: headers, Timestamp: ts,
		Context: k.recordContext()}
	r.ack, r.done, r.msg = ack, done, msg
	k.cl.Load().Produce(k.ctx, &r.rec, k.promise)
	return nil
}

// sendMessage is send for a Sarama message, whose key and value it encodes.
func (k *kgoProducer) sendMessage(msg *sarama.ProducerMessage, done DeliveryFunc) error {
	var key, value []byte
	var err error
	if msg.Key != nil {
		if key, err = msg.Key.Encode(); err != nil {
			return fmt.Errorf("produce %s[%d]: encode key: %w", msg.Topic, msg.Partition, err)
		}
	}
	if msg.Value != nil {
		if value, err = msg.Value.Encode(); err != nil {
			return fmt.Errorf("produce %s[%d]: encode value: %w", msg.Topic, msg.Partition, err)
		}
	}
	var hs []kgo.RecordHeader
	if len(msg.Headers) > 0 {
		hs = make([]kgo.RecordHeader, len(msg.Headers))
		for i, h := range msg.Headers {
			hs[i] = kgo.RecordHeader{Key: string(h.Key), Value: h.Value}
		}
	}
	return k.send(msg.Topic, msg.Partition, key, value, hs, msg.Timestamp, nil, done, msg)
}

// report is every record's promise: it runs the record's Acker or
// DeliveryFunc and returns the kgoRecord to the pool.
func (k *kgoProducer) report(rec *kgo.Record, err error) {
	r := (*kgoRecord)(unsafe.Pointer(rec))
	if err != nil {
		switch {
		case errors.Is(err, kgo.ErrClientClosed) || errors.Is(err, context.Canceled) && k.closed.Load():
			err = fmt.Errorf("%w: %w", ErrProducerClosed, err)
		case errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("%w (%v): %w", ErrDeliveryTimeout, k.timeout, err)
		}
		if k.onFail != nil {
			k.onFail(err)
		}
		err = fmt.Errorf("produce %s[%d]: %w", rec.Topic, rec.Partition, err)
	}
	if r.msg != nil && err == nil {
		r.msg.Offset = rec.Offset
	}
	switch {
	case r.ack != nil:
		r.ack.Acked(rec.Offset, err)
	case r.done != nil:
		r.done(rec.Partition, rec.Offset, err)
	}
	*r = kgoRecord{}
	kgoRecordPool.Put(r)
}

// flush waits for every record's report, or for ctx.
func (k *kgoProducer) flush(ctx context.Context) error {
	cl := k.cl.Load()
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("flush producer (%d records in flight): %w", cl.BufferedProduceRecords(), err)
	}
	return nil
}

// close refuses new records, waits up to the delivery timeout (plus a
// request's time) for the answers of those sent, fails the rest and closes
// the client.
func (k *kgoProducer) close() {
	k.closeOnce.Do(func() {
		k.closed.Store(true)
		cl := k.cl.Load()
		ctx, cancel := context.WithTimeout(context.Background(), k.timeout+10*time.Second)
		if err := cl.Flush(ctx); err != nil {
			k.log.Warn("producer closed with records unanswered; they fail", "records", cl.BufferedProduceRecords(), "err", err)
		}
		cancel()
		k.cancel()
		cl.Close()
	})
}

// batchMaxBytes is kgo's per-topic batch cap (ProducerBatchMaxBytesFn):
// what learnLimit found, or Kafka's default when it found nothing.
func (k *kgoProducer) batchMaxBytes(topic string) int32 {
	if v, ok := k.limits.Load(topic); ok {
		return v.(int32)
	}
	if k.maxBytes > 0 && k.maxBytes < defaultMaxMessageBytes {
		return max(k.maxBytes, 512)
	}
	return defaultMaxMessageBytes
}

// learnLimit reads topic's max.message.bytes (DescribeConfigs; the broker
// answers with its message.max.bytes where the topic sets none) and keeps
// the lower of it and maxBytes as the topic's batch cap. kgo neither splits
// a batch the broker refuses as too large nor reads the topic's limit: a
// topic whose limit is below kgo's default 1 MB batch cap would fail every
// full batch. Runs once per topic: the first record of a topic waits one
// round trip. A look-up that fails (no DescribeConfigs permission, the topic
// not created yet) leaves the topic at Kafka's default for the producer's
// life.
func (k *kgoProducer) learnLimit(topic string) {
	k.learnMu.Lock()
	defer k.learnMu.Unlock()
	if _, ok := k.limits.Load(topic); ok {
		return
	}
	ctx, cancel := context.WithTimeout(k.ctx, 5*time.Second)
	defer cancel()
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = topic
	res.ConfigNames = []string{"max.message.bytes"}
	req.Resources = append(req.Resources, res)
	limit := int32(0)
	resp, err := req.RequestWith(ctx, k.cl.Load())
	if err == nil {
		for _, r := range resp.Resources {
			if err = kerr.ErrorForCode(r.ErrorCode); err != nil {
				break
			}
			for _, c := range r.Configs {
				if c.Name == "max.message.bytes" && c.Value != nil {
					if n, perr := strconv.ParseInt(*c.Value, 10, 32); perr == nil {
						limit = int32(n)
					}
				}
			}
		}
	}
	if limit <= 0 {
		// Unknown (not allowed to describe, the topic not there yet, no
		// answer): Kafka's default, and the client's own cap.
		k.log.Debug("topic limit unknown; assuming Kafka's default max.message.bytes", "topic", topic, "err", err)
		limit = defaultMaxMessageBytes
	}
	if k.maxBytes > 0 && k.maxBytes < limit {
		limit = k.maxBytes
	}
	k.limits.Store(topic, max(limit, 512))
}

// slogLogger adapts a slog.Logger to kgo.Logger at warning level: kgo's
// warnings (retries exhausted, a broker that keeps failing) and errors reach
// the worker's log; its info and debug chatter does not.
type slogLogger struct{ l *slog.Logger }

// Level implements kgo.Logger.
func (s slogLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

// Log implements kgo.Logger.
func (s slogLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	s.l.Log(context.Background(), lv, "kafka producer: "+msg, keyvals...)
}

// Permanent reports whether a produce error is one no retry fixes, in either
// client's vocabulary (Sarama's KError, kgo's kerr): the record is too large
// for its topic, the client may not write the topic or use its
// transactional ID, the topic name is invalid or the topic does not exist
// (kgo retries UNKNOWN_TOPIC_OR_PARTITION up to the delivery timeout, so
// here it means the topic stayed unknown that long), or the producer's
// configuration is refused. Everything else (timeouts, leaders moving,
// coordinators loading, throttles, lost connections) is transient.
func Permanent(err error) bool {
	if err == nil {
		return false
	}
	var cerr sarama.ConfigurationError
	if errors.As(err, &cerr) {
		return true
	}
	for _, e := range []error{sarama.ErrMessageSizeTooLarge, sarama.ErrTopicAuthorizationFailed,
		sarama.ErrClusterAuthorizationFailed, sarama.ErrUnknownTopicOrPartition, sarama.ErrInvalidTopic,
		sarama.ErrTransactionalIDAuthorizationFailed,
		kerr.MessageTooLarge, kerr.RecordListTooLarge, kerr.TopicAuthorizationFailed,
		kerr.ClusterAuthorizationFailed, kerr.UnknownTopicOrPartition, kerr.InvalidTopicException,
		kerr.TransactionalIDAuthorizationFailed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
