package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// FetcherConfig configures a Fetcher. Zero fields take the defaults named on
// each.
type FetcherConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ClientID names the client to the brokers (Kafka's client.id).
	ClientID string
	// Security is the connection's TLS and SASL (zero: plaintext).
	Security Security
	// ReadCommitted makes the fetches read_committed (KIP-98): records of
	// open and aborted transactions are not returned.
	ReadCommitted bool
	// MaxWait is how long the broker holds a fetch that has no data yet
	// (Kafka's fetch.max.wait.ms); default 100 ms.
	MaxWait time.Duration
	// PartitionMaxBytes is the bytes asked of each partition per fetch
	// (Kafka's max.partition.fetch.bytes); default 512 KiB. A partition
	// holding more than RefetchBelow records not yet taken is left out of
	// the next fetches until Take brings it there, so it buffers one
	// fetch's records at most (this much, or one record batch when a batch
	// is larger: a broker returns a batch whole; decompressed) beside
	// RefetchBelow records.
	PartitionMaxBytes int32
	// Logger gets the fetcher's warnings (nil: discarded).
	Logger *slog.Logger
}

// FetcherConfigOf returns the FetcherConfig matching a Sarama client: its
// brokers as seeds, and the client ID, TLS, SASL, isolation level,
// Consumer.MaxWaitTime and Consumer.Fetch.Default of its configuration.
func FetcherConfigOf(client sarama.Client) FetcherConfig {
	conf := client.Config()
	pc := ProducerConfigOf(client)
	return FetcherConfig{Brokers: pc.Brokers, ClientID: pc.ClientID, Security: pc.Security,
		ReadCommitted: conf.Consumer.IsolationLevel == sarama.ReadCommitted,
		MaxWait:       conf.Consumer.MaxWaitTime, PartitionMaxBytes: conf.Consumer.Fetch.Default}
}

// Fetcher reads partitions with one fetch loop per leader broker, on a kgo
// client used as the connection (Fetch requests of its own, decoded with
// kgo.ProcessFetchPartition, which checks CRCs, decompresses and drops the
// records of aborted transactions). A fetch loop hands each partition's
// records straight to its Sub: a fetch response reaches the reader after one
// goroutine hand-off, where Sarama's consumer takes three (its response
// reader, its per-broker loop, a feeder per partition).
//
// Partitions are added and removed one at a time (Subscribe, Sub.Close); the
// consumer group stays Sarama's (the assignment), the Fetcher only reads what
// it assigned. Errors a broker calls retriable (a leader moving, a topic not
// yet known everywhere, a lost connection) are retried with a fresh leader
// and never reach the reader; an offset out of range moves the partition to
// its log start offset (below it) or its highwater (above it) with a warning,
// as Sarama's consumer and Kafka's auto.offset.reset=earliest do for a start
// offset. Other errors are logged and retried every second.
type Fetcher struct {
	cfg FetcherConfig
	cl  *kgo.Client
	dec kgo.Decompressor
	log *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	loops     map[int32]*fetchLoop // by broker ID
	unrouted  map[*Sub]struct{}    // partitions waiting for their leader
	routeWake chan struct{}
	closed    bool
}

// NewFetcher returns a Fetcher; Close releases it.
func NewFetcher(cfg FetcherConfig) (*Fetcher, error) {
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 100 * time.Millisecond
	}
	if cfg.PartitionMaxBytes <= 0 {
		cfg.PartitionMaxBytes = 512 << 10
	}
	base, err := ProducerConfig{Brokers: cfg.Brokers, ClientID: cfg.ClientID, Security: cfg.Security}.opts()
	if err != nil {
		return nil, fmt.Errorf("kafka: fetcher: %w", err)
	}
	// Fetch v12 names topics; v13 and later want topic IDs. Kafka 4 still
	// serves v4 to v12 (KIP-896 removed v0 to v3).
	vs := kversion.Stable()
	vs.SetMaxKeyVersion(kmsg.Fetch.Int16(), 12)
	opts := append(base, kgo.MaxVersions(vs))
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts = append(opts, kgo.WithLogger(slogLogger{log}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: fetcher: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &Fetcher{cfg: cfg, cl: cl, dec: kgo.DefaultDecompressor(), log: log, ctx: ctx, cancel: cancel,
		loops: map[int32]*fetchLoop{}, unrouted: map[*Sub]struct{}{}, routeWake: make(chan struct{}, 1)}
	f.wg.Add(1)
	go f.route()
	return f, nil
}

// Close stops every fetch loop and closes the client. Subs still open
// receive nothing more.
func (f *Fetcher) Close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.cancel()
	f.wg.Wait()
	f.cl.Close()
}

// Sub is one partition read by a Fetcher, from an offset on: records in
// offset order, each once per position (SeekTo starts a new position).
type Sub struct {
	f         *Fetcher
	topic     string
	partition int32
	ready     chan struct{} // capacity 1: signalled when records arrived
	hwm       atomic.Int64

	// Routing, under f.mu: the fetch loop of the partition's leader, nil
	// while the leader is looked up.
	loop *fetchLoop

	mu      sync.Mutex
	next    int64  // offset of the next fetch
	gen     uint64 // bumped by SeekTo: what a fetch in flight returns is dropped
	q       []*sarama.ConsumerMessage
	qBytes  int
	size    int32 // bytes asked per fetch (doubled while a batch does not fit)
	retryAt time.Time
	closed  bool
	// reset is where the partition reads again after an offset above its
	// log end (-1 none); held keeps it from being fetched until SeekTo.
	reset int64
	held  bool
}

// Subscribe starts reading topic partition p at offset: an offset, or
// sarama.OffsetOldest (-2) for the log start, or sarama.OffsetNewest (-1)
// for its end (under ReadCommitted the last stable offset), looked up by
// the fetch loop (retried until the partition answers).
func (f *Fetcher) Subscribe(topic string, p int32, offset int64) *Sub {
	s := &Sub{f: f, topic: topic, partition: p, ready: make(chan struct{}, 1), next: offset,
		size: f.cfg.PartitionMaxBytes, reset: -1}
	s.hwm.Store(-1)
	f.reroute(s)
	return s
}

// Ready is signalled when records may be waiting for Take.
func (s *Sub) Ready() <-chan struct{} { return s.ready }

// Take appends at most max waiting records to dst, without blocking.
func (s *Sub) Take(dst []*sarama.ConsumerMessage, max int) []*sarama.ConsumerMessage {
	s.mu.Lock()
	n := min(max, len(s.q))
	for _, m := range s.q[:n] {
		s.qBytes -= msgBytes(m)
	}
	dst = append(dst, s.q[:n]...)
	clear(s.q[:n])
	s.q = s.q[n:]
	if len(s.q) == 0 {
		s.q = nil
		s.qBytes = 0
	} else {
		s.signal()
	}
	room := n > 0 && len(s.q) <= RefetchBelow && len(s.q)+n > RefetchBelow
	s.mu.Unlock()
	if room {
		s.f.wakeLoopOf(s)
	}
	return dst
}

// SeekTo makes the next records taken start at offset: records fetched
// before are dropped.
func (s *Sub) SeekTo(offset int64) {
	s.mu.Lock()
	s.gen++
	s.next = offset
	clear(s.q)
	s.q, s.qBytes = nil, 0
	s.retryAt = time.Time{}
	s.reset, s.held = -1, false
	s.mu.Unlock()
	s.f.wakeLoopOf(s)
}

// Reset reports an offset out of range above the partition's log end
// (records lost on the broker, or the topic deleted and created again):
// the partition reads again from to, its log start, after the caller's
// SeekTo(to); until then nothing is fetched or taken. ok is false without
// such a reset.
func (s *Sub) Reset() (to int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reset, s.reset >= 0
}

// Buffered returns the records fetched and not yet taken, and their bytes
// as the bound counts them (key, value and 64 bytes of overhead each).
func (s *Sub) Buffered() (records, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.q), s.qBytes
}

// HighWatermark returns the partition's highwater at the last fetch
// response, -1 before the first.
func (s *Sub) HighWatermark() int64 { return s.hwm.Load() }

// Close stops reading the partition.
func (s *Sub) Close() {
	s.mu.Lock()
	s.closed = true
	clear(s.q)
	s.q, s.qBytes = nil, 0
	s.mu.Unlock()
	f := s.f
	f.mu.Lock()
	if s.loop != nil {
		delete(s.loop.subs, s)
		s.loop = nil
	}
	delete(f.unrouted, s)
	f.mu.Unlock()
}

func (s *Sub) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

func msgBytes(m *sarama.ConsumerMessage) int { return len(m.Key) + len(m.Value) + 64 }

// reroute detaches s from its fetch loop and has the router find its leader.
func (f *Fetcher) reroute(s *Sub) {
	f.mu.Lock()
	if s.loop != nil {
		delete(s.loop.subs, s)
		s.loop = nil
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if !closed && !f.closed {
		f.unrouted[s] = struct{}{}
	}
	f.mu.Unlock()
	select {
	case f.routeWake <- struct{}{}:
	default:
	}
}

func (f *Fetcher) wakeLoopOf(s *Sub) {
	f.mu.Lock()
	l := s.loop
	f.mu.Unlock()
	if l != nil {
		l.wakeUp()
	}
}

// route finds the leaders of unrouted partitions (a metadata request, which
// also tells the client where the brokers are) and hands each to its
// broker's fetch loop, starting the loop on first use.
func (f *Fetcher) route() {
	defer f.wg.Done()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	erring, warned := map[string]time.Time{}, map[string]time.Time{}
	for {
		select {
		case <-f.ctx.Done():
			return
		case <-f.routeWake:
		case <-retry.C:
		}
		f.mu.Lock()
		topics := map[string]bool{}
		for s := range f.unrouted {
			topics[s.topic] = true
		}
		f.mu.Unlock()
		if len(topics) == 0 {
			continue
		}
		req := kmsg.NewPtrMetadataRequest()
		for t := range topics {
			mt := kmsg.NewMetadataRequestTopic()
			mt.Topic = kmsg.StringPtr(t)
			req.Topics = append(req.Topics, mt)
		}
		leaders := map[string]map[int32]int32{}
		resp, err := req.RequestWith(f.ctx, f.cl)
		if err != nil {
			if f.ctx.Err() != nil {
				return
			}
			f.log.Warn("fetch: metadata request failed; retrying", "err", err)
		} else {
			for _, t := range resp.Topics {
				if t.Topic == nil {
					continue
				}
				if t.ErrorCode != 0 {
					// Unknown for a while after its creation; a lasting
					// error (no authorization) stalls the partitions, so
					// after 5 s it is logged, once every 30 s per topic.
					now := time.Now()
					first, ok := erring[*t.Topic]
					if !ok {
						erring[*t.Topic] = now
					} else if now.Sub(first) > 5*time.Second && now.Sub(warned[*t.Topic]) > 30*time.Second {
						warned[*t.Topic] = now
						f.log.Warn("fetch: topic metadata error; retrying", "topic", *t.Topic, "err", kerr.ErrorForCode(t.ErrorCode), "since", first)
					}
					continue
				}
				delete(erring, *t.Topic)
				m := map[int32]int32{}
				for _, p := range t.Partitions {
					if p.ErrorCode == 0 || p.ErrorCode == kerr.ReplicaNotAvailable.Code {
						m[p.Partition] = p.Leader
					}
				}
				leaders[*t.Topic] = m
			}
		}
		left := 0
		var wake []*fetchLoop
		f.mu.Lock()
		for s := range f.unrouted {
			id, ok := leaders[s.topic][s.partition]
			if !ok || id < 0 {
				left++
				continue
			}
			l := f.loops[id]
			if l == nil {
				l = &fetchLoop{f: f, id: id, wake: make(chan struct{}, 1), subs: map[*Sub]struct{}{}}
				f.loops[id] = l
				f.wg.Add(1)
				go l.run()
			}
			l.subs[s] = struct{}{}
			s.loop = l
			delete(f.unrouted, s)
			wake = append(wake, l)
		}
		f.mu.Unlock()
		for _, l := range wake {
			l.wakeUp()
		}
		if left > 0 {
			// Leaders not elected yet, or a topic not known to the broker
			// asked: look again shortly (the Java client's
			// retry.backoff.ms is 100 ms).
			retry.Reset(250 * time.Millisecond)
		}
	}
}

// fetchLoop fetches the partitions one broker leads.
type fetchLoop struct {
	f    *Fetcher
	id   int32
	wake chan struct{} // capacity 1
	subs map[*Sub]struct{}
	turn int // rotates the partitions' order in requests
}

func (l *fetchLoop) wakeUp() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// RefetchBelow is the number of records a partition may hold not yet taken
// and still be fetched: one hand-out batch of the claim source, so that
// the next fetch is under way while it is handed out.
const RefetchBelow = 256

// drainingMaxWait is the broker's longest wait for a fetch sent while a
// partition left out of it still has records to be taken.
const drainingMaxWait = 10 * time.Millisecond

// resolve looks up a negative start offset (s.mu held; the lookup is made
// without it).
func (l *fetchLoop) resolve(s *Sub) {
	ts, gen := s.next, s.gen
	s.mu.Unlock()
	off, err := l.listOffset(s, ts)
	s.mu.Lock()
	if s.gen != gen || s.next != ts {
		return
	}
	if err != nil {
		l.f.log.Warn("fetch: looking up the start offset failed; retrying", "topic", s.topic, "partition", s.partition, "err", err)
		s.retryAt = time.Now().Add(250 * time.Millisecond)
		return
	}
	s.next = off
	l.wakeUp()
}

// fetchPart is one partition of a fetch request: where it was asked from and
// under which SeekTo generation.
type fetchPart struct {
	s      *Sub
	gen    uint64
	offset int64
}

func (l *fetchLoop) run() {
	f := l.f
	defer f.wg.Done()
	idle := time.NewTimer(time.Hour)
	defer idle.Stop()
	var subs []*Sub
	for {
		f.mu.Lock()
		subs = subs[:0]
		for s := range l.subs {
			subs = append(subs, s)
		}
		f.mu.Unlock()
		now := time.Now()
		var parts []fetchPart
		wait := time.Duration(-1)
		draining := false
		for _, s := range subs {
			s.mu.Lock()
			switch {
			case s.closed || s.held:
			case len(s.q) > RefetchBelow:
				draining = true
			case now.Before(s.retryAt):
				if d := s.retryAt.Sub(now); wait < 0 || d < wait {
					wait = d
				}
			case s.next < 0:
				l.resolve(s)
				if d := time.Until(s.retryAt); d > 0 && (wait < 0 || d < wait) {
					wait = d // a failed lookup is retried
				}
			default:
				parts = append(parts, fetchPart{s: s, gen: s.gen, offset: s.next})
			}
			s.mu.Unlock()
		}
		if len(parts) == 0 {
			if wait >= 0 {
				idle.Reset(wait)
			}
			select {
			case <-f.ctx.Done():
				return
			case <-l.wake:
			case <-idle.C:
			}
			idle.Stop()
			continue
		}
		// While a partition's records wait to be taken it is left out; a
		// fetch held by the broker for the others would keep it waiting
		// after it is taken: a short wait then.
		maxWait := f.cfg.MaxWait
		if draining {
			maxWait = min(maxWait, drainingMaxWait)
		}
		if err := l.fetch(parts, maxWait); err != nil {
			if f.ctx.Err() != nil {
				return
			}
			// A lost connection or a broker gone: the partitions find their
			// leader again (maybe this broker, once it is back).
			f.log.Warn("fetch failed; looking up the leaders again", "broker", l.id, "err", err)
			for _, p := range parts {
				p.s.mu.Lock()
				p.s.retryAt = time.Now().Add(100 * time.Millisecond)
				p.s.mu.Unlock()
				f.reroute(p.s)
			}
		}
	}
}

// fetch sends one Fetch request for parts and hands out what it returns.
func (l *fetchLoop) fetch(parts []fetchPart, maxWait time.Duration) error {
	f := l.f
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = int32(maxWait.Milliseconds())
	req.MinBytes = 1
	req.MaxBytes = 50 << 20 // Kafka's fetch.max.bytes
	if f.cfg.ReadCommitted {
		req.IsolationLevel = 1
	}
	req.SessionID = 0
	req.SessionEpoch = -1 // a full fetch, no fetch session (KIP-227)
	// A broker returns a batch larger than a partition's bytes only for the
	// first partition with data (KIP-74): rotating the order makes every
	// partition first in turn.
	l.turn++
	byTopic := map[string]int{}
	for i := range parts {
		p := parts[(i+l.turn)%len(parts)]
		ti, ok := byTopic[p.s.topic]
		if !ok {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic = p.s.topic
			req.Topics = append(req.Topics, rt)
			ti = len(req.Topics) - 1
			byTopic[p.s.topic] = ti
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition = p.s.partition
		rp.CurrentLeaderEpoch = -1
		rp.FetchOffset = p.offset
		rp.LogStartOffset = -1
		p.s.mu.Lock()
		rp.PartitionMaxBytes = p.s.size
		p.s.mu.Unlock()
		req.Topics[ti].Partitions = append(req.Topics[ti].Partitions, rp)
	}
	resp, err := req.RequestWith(f.ctx, f.cl.Broker(int(l.id)))
	if err != nil {
		return err
	}
	if resp.ErrorCode != 0 {
		return kerr.ErrorForCode(resp.ErrorCode)
	}
	asked := make(map[string]map[int32]fetchPart, len(byTopic))
	for _, p := range parts {
		m := asked[p.s.topic]
		if m == nil {
			m = map[int32]fetchPart{}
			asked[p.s.topic] = m
		}
		m[p.s.partition] = p
	}
	iso := kgo.ReadUncommitted()
	if f.cfg.ReadCommitted {
		iso = kgo.ReadCommitted()
	}
	for ti := range resp.Topics {
		rt := &resp.Topics[ti]
		for pi := range rt.Partitions {
			rp := &rt.Partitions[pi]
			p, ok := asked[rt.Topic][rp.Partition]
			if !ok {
				continue
			}
			delete(asked[rt.Topic], rp.Partition) // once per request
			l.take(p, rt.Topic, rp, iso)
		}
	}
	return nil
}

// take decodes one partition of a fetch response into its Sub.
func (l *fetchLoop) take(p fetchPart, topic string, rp *kmsg.FetchResponseTopicPartition, iso kgo.IsolationLevel) {
	f, s := l.f, p.s
	s.mu.Lock()
	stale := s.closed || s.gen != p.gen
	s.mu.Unlock()
	if stale {
		return
	}
	fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: p.offset, IsolationLevel: iso,
		Topic: topic, Partition: rp.Partition}, rp, f.dec, nil)
	if fp.Err != nil {
		l.failed(p, fp)
		return
	}
	if fp.HighWatermark >= 0 {
		s.hwm.Store(fp.HighWatermark)
	}
	msgs := toMessages(fp.Records)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.gen != p.gen {
		return
	}
	if len(fp.Records) == 0 && next == p.offset && len(rp.RecordBatches) > 0 {
		// Bytes came back but no whole batch: the next batch is larger than
		// asked. Ask twice as much until it fits (as Sarama does).
		s.size = min(2*s.size, 64<<20)
		return
	}
	s.size = f.cfg.PartitionMaxBytes
	if next > s.next {
		s.next = next
	}
	if len(msgs) == 0 {
		return
	}
	for _, m := range msgs {
		s.qBytes += msgBytes(m)
	}
	s.q = append(s.q, msgs...)
	s.signal()
}

// failed handles a partition's error in a fetch response.
func (l *fetchLoop) failed(p fetchPart, fp kgo.FetchPartition) {
	f, s := l.f, p.s
	switch {
	case errors.Is(fp.Err, kerr.OffsetOutOfRange):
		start, err := l.listOffset(s, -2)
		s.mu.Lock()
		defer s.mu.Unlock()
		if err != nil {
			f.log.Warn("fetch: offset out of range, and listing the partition's log start failed; retrying",
				"topic", s.topic, "partition", s.partition, "offset", p.offset, "err", err)
			s.retryAt = time.Now().Add(time.Second)
			return
		}
		if s.closed || s.gen != p.gen {
			return
		}
		if p.offset < start {
			// The records are gone (retention, DeleteRecords): nothing to
			// read below the log start. Records skipped forward are known
			// absent to the reader.
			f.log.Warn("fetch: offset below the log start; reading from the log start",
				"topic", s.topic, "partition", s.partition, "offset", p.offset, "log_start", start)
			s.next = start
			return
		}
		// Above the log end: the leader's log is shorter than what was
		// read (records lost by an unclean election, or the topic deleted
		// and created again). As Kafka's auto.offset.reset=earliest, read
		// again from the log start; the reader is told (Reset), since the
		// offsets go back, and the partition waits for its SeekTo.
		f.log.Error("fetch: offset above the log end (records lost on the broker, or the topic recreated); reading again from the log start",
			"topic", s.topic, "partition", s.partition, "offset", p.offset, "log_start", start)
		s.reset, s.held = start, true
		clear(s.q)
		s.q, s.qBytes = nil, 0
		s.signal()
	case kerr.IsRetriable(fp.Err):
		// The leader moved or is being elected, the topic is not known to
		// this broker yet, a replica or the log directory is unavailable.
		s.mu.Lock()
		s.retryAt = time.Now().Add(100 * time.Millisecond)
		s.mu.Unlock()
		f.reroute(s)
	default:
		f.log.Warn("fetch: partition error; retrying in 1s", "topic", s.topic, "partition", s.partition, "err", fp.Err)
		s.mu.Lock()
		s.retryAt = time.Now().Add(time.Second)
		s.mu.Unlock()
	}
}

// listOffset returns the partition's log start offset (ts -2) or its end
// (ts -1: the highwater, or under ReadCommitted the last stable offset).
func (l *fetchLoop) listOffset(s *Sub, ts int64) (int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	if l.f.cfg.ReadCommitted {
		req.IsolationLevel = 1
	}
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = s.topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition = s.partition
	rp.CurrentLeaderEpoch = -1
	rp.Timestamp = ts
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(l.f.ctx, l.f.cl)
	if err != nil {
		return 0, err
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return 0, errors.New("list offsets: no answer for the partition")
	}
	rpr := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(rpr.ErrorCode); err != nil {
		return 0, err
	}
	return rpr.Offset, nil
}

// toMessages converts kgo's records to Sarama's messages (one allocation
// for the messages and one for the headers of the whole slice; key, value and
// header bytes are shared with the records).
func toMessages(recs []*kgo.Record) []*sarama.ConsumerMessage {
	if len(recs) == 0 {
		return nil
	}
	ms := make([]sarama.ConsumerMessage, len(recs))
	out := make([]*sarama.ConsumerMessage, len(recs))
	nh := 0
	for _, r := range recs {
		nh += len(r.Headers)
	}
	var hs []sarama.RecordHeader
	var hp []*sarama.RecordHeader
	if nh > 0 {
		hs = make([]sarama.RecordHeader, nh)
		hp = make([]*sarama.RecordHeader, nh)
	}
	for i, r := range recs {
		m := &ms[i]
		m.Topic, m.Partition, m.Offset = r.Topic, r.Partition, r.Offset
		m.Key, m.Value = r.Key, r.Value
		m.Timestamp = r.Timestamp
		if n := len(r.Headers); n > 0 {
			for j, h := range r.Headers {
				hs[j] = sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value}
				hp[j] = &hs[j]
			}
			m.Headers = hp[:n:n]
			hs, hp = hs[n:], hp[n:]
		}
		out[i] = m
	}
	return out
}
