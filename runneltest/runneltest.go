package runneltest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/kafkaversion"
	"github.com/runnel-dev/runnel/table"
)

// Options configures a Driver. The zero value is ready to use.
type Options struct {
	// Workers is the number of workers run in this process; default 1. With
	// more, the partitions (and their table state) are spread over them as
	// in a cluster.
	Workers int
	// Logger receives the workers' logs; default: discarded. Pass
	// slog.New(slog.NewTextHandler(os.Stderr, nil)) to see them.
	Logger *slog.Logger
	// Timeout bounds Start (the workers joining the group and restoring)
	// and every Wait; default 1 min.
	Timeout time.Duration
	// CommitInterval is the workers' commit interval; default 100 ms, so
	// that Wait returns soon after the last record (a worker's default is
	// 2.8 s). A task also runs a cycle as soon as it has been idle for a
	// tenth of it (app.Config.IdleCommit).
	CommitInterval time.Duration
	// Brokers, when set, runs the workers on that cluster (host:port
	// bootstrap addresses, e.g. a real Kafka for an integration test)
	// instead of an embedded broker. The app's topics, consumer group and
	// changelogs are created there and stay after Close (only the local
	// stores are removed), so give every run its own app ID. The cluster
	// must accept the group timeouts of Runnel's in-process workers
	// (kafka.TestTimeouts: a 20 s session, 100 ms heartbeats, a 15 s
	// rebalance timeout) and needs no TLS or SASL.
	Brokers []string
}

// Driver runs an app's agents and tables in this process on an embedded Kafka
// broker (kfake: the Kafka wire protocol in memory). Records go in with Send,
// Wait returns when everything sent (and everything derived from it) is
// processed and committed, and Get, Table, Records and DeadLetters read the
// results back from the broker: table changelogs, sink topics and dead-letter
// topics. A Driver's methods are safe for concurrent use, except Restart.
type Driver struct {
	app     *app.App
	broker  *embedded.Broker // nil with Options.Brokers
	addrs   []string         // the broker's bootstrap addresses
	client  sarama.Client
	tools   *app.Client // what app.GroupLag and app.ReadTable take
	prod    sarama.SyncProducer
	workers []*app.Worker // replaced by Restart; not safe for concurrent use with it
	n       int           // workers to run
	dir     string
	timeout time.Duration
	// sources are the topics the app's agents consume: Wait waits for the
	// group's committed offsets to reach their highwaters.
	sources   []string
	isolation sarama.IsolationLevel

	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex // guards errs
	errs   []error    // workers' Run errors
	closed bool       // guarded by mu
}

// Start starts an embedded broker (or uses o.Brokers), creates the app's topics and runs
// o.Workers workers of a, with their stores in a temporary directory. It
// returns when every worker joined the group and restored its tables. The
// app must not run elsewhere; Start changes its broker, logger, group
// timeouts and commit interval for the test, and turns its HTTP listener and
// static membership off (app.App.Configure).
// Close stops everything.
func Start(a *app.App, o Options) (_ *Driver, err error) {
	if o.Workers <= 0 {
		o.Workers = 1
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
	if o.CommitInterval <= 0 {
		o.CommitInterval = 100 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	g, err := a.Topology()
	if err != nil {
		return nil, fmt.Errorf("runneltest: %w", err)
	}
	d := &Driver{app: a, addrs: o.Brokers, timeout: o.Timeout, sources: g.Subscriptions(), isolation: sarama.ReadUncommitted}
	if len(d.addrs) == 0 {
		broker, err := embedded.Start(embedded.Options{})
		if err != nil {
			return nil, fmt.Errorf("runneltest: %w", err)
		}
		d.broker, d.addrs = broker, broker.Addrs()
	}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	// The short group timeouts of Runnel's own tests on kfake (a member
	// waiting in JoinGroup is evicted after the session timeout there). No
	// HTTP listener (workers of one test would share its port) and no static
	// membership (workers sharing a group.instance.id fence each other,
	// KIP-345), whatever the app or RUNNEL_* say.
	t := kafka.TestTimeouts
	a.Configure(app.WithBrokers(d.addrs...), app.WithLogger(o.Logger), app.WithHTTPAddr(""), app.WithInstanceID(""),
		app.WithCommitInterval(o.CommitInterval), app.WithGroupTimeouts(t.Session, t.Heartbeat, t.Rebalance, t.MaxWait))
	if a.Config().Guarantee == app.ExactlyOnce {
		d.isolation = sarama.ReadCommitted
	}
	if d.dir, err = os.MkdirTemp("", "runneltest-"); err != nil {
		return nil, fmt.Errorf("runneltest: %w", err)
	}
	vctx, vcancel := context.WithTimeout(context.Background(), o.Timeout)
	v, err := kafkaversion.Detect(vctx, d.addrs, nil)
	vcancel()
	if err != nil {
		return nil, fmt.Errorf("runneltest: %w", err)
	}
	cfg := kafka.NewConfig("runneltest", v, t)
	cfg.Consumer.IsolationLevel = d.isolation
	if d.client, err = sarama.NewClient(d.addrs, cfg); err != nil {
		return nil, fmt.Errorf("runneltest: client: %w", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), o.Timeout)
	d.tools, err = app.Dial(dctx, d.addrs)
	dcancel()
	if err != nil {
		return nil, fmt.Errorf("runneltest: client: %w", err)
	}
	if d.prod, err = sarama.NewSyncProducerFromClient(d.client); err != nil {
		return nil, fmt.Errorf("runneltest: producer: %w", err)
	}
	d.n = o.Workers
	if err := d.startWorkers(); err != nil {
		return nil, err
	}
	return d, nil
}

// startWorkers starts d.n workers with stores under d.dir and waits until
// every one joined the group and restored its active partitions.
func (d *Driver) startWorkers() error {
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.workers = nil
	for i := range d.n {
		w, err := d.app.NewWorker(app.WorkerOptions{DataDir: filepath.Join(d.dir, fmt.Sprintf("worker-%d", i)), Name: fmt.Sprintf("worker-%d", i)})
		if err != nil {
			return fmt.Errorf("runneltest: %w", err)
		}
		d.workers = append(d.workers, w)
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := w.Run(ctx); err != nil {
				d.mu.Lock()
				d.errs = append(d.errs, fmt.Errorf("worker-%d: %w", i, err))
				d.mu.Unlock()
			}
		}()
	}
	if err := d.poll(func() (bool, error) {
		for _, w := range d.workers {
			if !w.Ready() {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("runneltest: start: %w", err)
	}
	return nil
}

// Restart stops every worker cleanly, deletes their stores and starts them
// again: each table is then restored from its changelog, as on a machine that
// lost its disk, and the sources resume from the group's committed offsets.
// It returns when the new workers are ready (restored), or the stopped
// workers' errors. The broker and everything in it survive.
func (d *Driver) Restart() error {
	d.cancel()
	d.wg.Wait()
	if err := d.workerErr(); err != nil {
		return fmt.Errorf("runneltest: restart: %w", err)
	}
	for i := range d.n {
		if err := os.RemoveAll(filepath.Join(d.dir, fmt.Sprintf("worker-%d", i))); err != nil {
			return fmt.Errorf("runneltest: restart: %w", err)
		}
	}
	return d.startWorkers()
}

// Close stops the workers cleanly (they leave the group and commit), the
// broker, and removes the stores. It returns the workers' errors, if any.
// Closing twice is a no-op.
func (d *Driver) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	if d.cancel != nil {
		d.cancel()
	}
	d.wg.Wait()
	if d.prod != nil {
		_ = d.prod.Close()
	}
	if d.tools != nil {
		_ = d.tools.Close()
	}
	if d.client != nil {
		_ = d.client.Close()
	}
	if d.broker != nil {
		d.broker.Close()
	}
	if d.dir != "" {
		_ = os.RemoveAll(d.dir)
	}
	return d.workerErr()
}

// Brokers returns the broker's addresses (host:port): the embedded broker's,
// or Options.Brokers. For a client of the test's own.
func (d *Driver) Brokers() []string { return d.addrs }

// Workers returns the running workers (their Processed, DeadLettered and
// Tasks counts and states).
func (d *Driver) Workers() []*app.Worker { return d.workers }

func (d *Driver) workerErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return errors.Join(d.errs...)
}

// poll calls done until it reports true, a worker fails, or the timeout passes.
func (d *Driver) poll(done func() (bool, error)) error {
	deadline := time.Now().Add(d.timeout)
	var last error
	for {
		if err := d.workerErr(); err != nil {
			return err
		}
		ok, err := done()
		if ok && err == nil {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("not done after %s: %w", d.timeout, last)
			}
			return fmt.Errorf("not done after %s", d.timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// RecordOption sets a field of a record Send produces: At, Header.
type RecordOption interface {
	apply(*sarama.ProducerMessage)
}

// recordOption is a RecordOption that is a function.
type recordOption func(*sarama.ProducerMessage)

func (o recordOption) apply(m *sarama.ProducerMessage) { o(m) }

// At sets the record's timestamp (its CreateTime, the event time of windowed
// tables and stream time); default: the time of Send.
func At(ts time.Time) RecordOption {
	return recordOption(func(m *sarama.ProducerMessage) { m.Timestamp = ts })
}

// Header adds a record header (KIP-82).
func Header(key, value string) RecordOption {
	return recordOption(func(m *sarama.ProducerMessage) {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(key), Value: []byte(value)})
	})
}

// Send produces one record to topic, encoded with the topic's codecs, to the
// partition the worker's own sinks would choose (murmur2 of the encoded key,
// as Kafka's default partitioner), and returns when the broker acknowledged
// it. It returns the partition and offset of the record. Each Send is one
// round trip (about 4 ms on kfake); SendAll sends many in one.
func Send[K any, V any](d *Driver, topic *agent.Topic[K, V], key K, value V, opts ...RecordOption) (partition int32, offset int64, err error) {
	m, err := message(topic, key, value)
	if err != nil {
		return 0, 0, err
	}
	for _, o := range opts {
		o.apply(m)
	}
	p, off, err := d.prod.SendMessage(m)
	if err != nil {
		return 0, 0, fmt.Errorf("runneltest: send to %s[%d]: %w", topic.Name(), m.Partition, err)
	}
	return p, off, nil
}

// SendAll produces records to topic as Send does, in one batch, and returns
// when the broker acknowledged every one; records of one partition keep
// their order. Of each Record, Key, Value, Timestamp (zero: now) and Headers
// are used; Partition and Offset are set to where the record was written.
func SendAll[K any, V any](d *Driver, topic *agent.Topic[K, V], records []Record[K, V]) error {
	ms := make([]*sarama.ProducerMessage, len(records))
	for i, r := range records {
		m, err := message(topic, r.Key, r.Value)
		if err != nil {
			return err
		}
		if !r.Timestamp.IsZero() {
			m.Timestamp = r.Timestamp
		}
		for k, v := range r.Headers {
			Header(k, v).apply(m)
		}
		ms[i] = m
	}
	if err := d.prod.SendMessages(ms); err != nil {
		return fmt.Errorf("runneltest: send %d records to %s: %w", len(ms), topic.Name(), err)
	}
	for i, m := range ms {
		records[i].Partition, records[i].Offset = m.Partition, m.Offset
	}
	return nil
}

// message encodes one record for topic.
func message[K any, V any](topic *agent.Topic[K, V], key K, value V) (*sarama.ProducerMessage, error) {
	kc, vc := topic.Codecs()
	kb, err := kc.Encode(key)
	if err != nil {
		return nil, fmt.Errorf("runneltest: send to %s: encode key: %w", topic.Name(), err)
	}
	vb, err := vc.Encode(value)
	if err != nil {
		return nil, fmt.Errorf("runneltest: send to %s: encode value: %w", topic.Name(), err)
	}
	m := &sarama.ProducerMessage{Topic: topic.Name(), Partition: kafka.PartitionFor(kb, topic.Partitions()),
		Key: sarama.ByteEncoder(kb), Value: sarama.ByteEncoder(vb), Timestamp: time.Now()}
	if vb == nil {
		m.Value = nil // a tombstone
	}
	return m, nil
}

// Wait returns when the app's consumer group has committed, on every
// partition of every topic its agents consume, the topic's highwater: every
// record sent before Wait, and every record derived from one (sink and
// repartition records, dead letters, table changelog records), is processed,
// and its table writes are in the changelogs and the stores. It returns an
// error when a worker failed or after Options.Timeout.
//
// One look suffices, no second check after a pause: a worker commits a
// source offset only after the broker acknowledged every record derived from
// it (docs/semantics.md), so when the committed offsets, read in one
// OffsetFetch, equal the highwaters read after it, the derived records are
// below those highwaters and processed too.
func (d *Driver) Wait() error {
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	if err := d.poll(func() (bool, error) {
		lag, err := app.GroupLag(ctx, d.tools, d.app.ID(), d.sources)
		if err != nil {
			return false, err
		}
		for _, ps := range lag {
			for _, l := range ps {
				if l != 0 {
					return false, nil
				}
			}
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("runneltest: wait for group %s: %w", d.app.ID(), err)
	}
	return nil
}

// Table waits (Wait) and returns the whole content of a table (any kind:
// plain, windowed, global) read back from its changelog topic: the latest
// value of every key, tombstones removed, keyed by the key's text
// (fmt.Sprint of the decoded key; a windowed table's key carries its
// window), values decoded with the table's codec.
func (d *Driver) Table(def table.Def) (map[string]any, error) {
	if err := d.Wait(); err != nil {
		return nil, err
	}
	m, err := app.ReadTable(context.Background(), d.tools, def)
	if err != nil {
		return nil, fmt.Errorf("runneltest: %w", err)
	}
	return m, nil
}

// Get waits (Wait) and returns the value of key in t and whether the key
// exists, read back from the table's changelog, as a worker restoring the
// table would see it.
func Get[K any, V any](d *Driver, t *table.Table[K, V], key K) (V, bool, error) {
	var zero V
	m, err := d.Table(t)
	if err != nil {
		return zero, false, err
	}
	v, ok := m[fmt.Sprint(key)]
	if !ok {
		return zero, false, nil
	}
	tv, ok := v.(V)
	if !ok {
		return zero, false, fmt.Errorf("runneltest: table %s: value of %v is %T, not %T", t.Name(), key, v, zero)
	}
	return tv, true, nil
}

// Record is one record of a topic, decoded with the topic's codecs.
type Record[K any, V any] struct {
	Partition int32
	Offset    int64
	Key       K
	Value     V
	Timestamp time.Time
	Headers   map[string]string
}

// Records waits (Wait) and returns every record of topic, from the log start
// to the highwater, ordered by partition, then offset. Under exactly-once
// only records of committed transactions are returned. A record whose key or
// value does not decode is an error.
func Records[K any, V any](d *Driver, topic *agent.Topic[K, V]) ([]Record[K, V], error) {
	if err := d.Wait(); err != nil {
		return nil, err
	}
	kc, vc := topic.Codecs()
	var out []Record[K, V]
	err := d.read(topic.Name(), func(p int32, f kafka.Fetched) error {
		r := Record[K, V]{Partition: p, Offset: f.Offset, Timestamp: f.Timestamp}
		var err error
		if r.Key, err = kc.Decode(f.Key); err != nil {
			return fmt.Errorf("%s[%d]@%d: key: %w", topic.Name(), p, f.Offset, err)
		}
		if r.Value, err = vc.Decode(f.Value); err != nil {
			return fmt.Errorf("%s[%d]@%d: value: %w", topic.Name(), p, f.Offset, err)
		}
		if len(f.Headers) > 0 {
			r.Headers = map[string]string{}
			for _, h := range f.Headers {
				r.Headers[string(h.Key)] = string(h.Value)
			}
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("runneltest: %w", err)
	}
	return out, nil
}

// DeadLetters waits (Wait) and returns the dead letters the agent named
// agentName wrote (rejected records, and records that failed past their
// retries), in partition and offset order of the dead-letter topic.
func (d *Driver) DeadLetters(agentName string) ([]app.DeadLetter, error) {
	topic := d.app.DeadLetterTopic(agentName)
	if topic == "" {
		return nil, fmt.Errorf("runneltest: dead letters: no agent %q", agentName)
	}
	if err := d.Wait(); err != nil {
		return nil, err
	}
	var out []app.DeadLetter
	err := d.read(topic, func(p int32, f kafka.Fetched) error {
		rec := &source.Record{Topic: topic, Partition: p, Offset: f.Offset, Key: f.Key, Value: f.Value, Timestamp: f.Timestamp}
		for _, h := range f.Headers {
			if h != nil {
				rec.Headers = append(rec.Headers, source.Header{Key: h.Key, Value: h.Value})
			}
		}
		out = append(out, app.DecodeDeadLetter(rec))
		return nil
	})
	if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return nil, nil // the worker creates a dead-letter topic at its first dead letter
	}
	if err != nil {
		return nil, fmt.Errorf("runneltest: %w", err)
	}
	return out, nil
}

// read calls fn for every data record of every partition of topic, from the
// log start to the highwater captured first, in offset order per partition.
// It fetches record batches directly (kafka.FetchAt), so it knows it reached
// the highwater also when the last offsets are transaction markers.
func (d *Driver) read(topic string, fn func(p int32, f kafka.Fetched) error) error {
	if err := d.client.RefreshMetadata(topic); err != nil {
		return fmt.Errorf("metadata of %s: %w", topic, err)
	}
	ps, err := d.client.Partitions(topic)
	if err != nil {
		return fmt.Errorf("partitions of %s: %w", topic, err)
	}
	sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout)
	defer cancel()
	for _, p := range ps {
		hw, err := d.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("highwater of %s[%d]: %w", topic, p, err)
		}
		pos, err := d.client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("log start of %s[%d]: %w", topic, p, err)
		}
		for pos < hw {
			res, err := kafka.FetchAt(ctx, d.client, topic, p, pos, 10*time.Millisecond, d.isolation)
			if err != nil {
				return err
			}
			for _, f := range res.Records {
				if f.Offset < pos || f.Offset >= hw {
					continue // a batch fetched again from its middle; past the captured end
				}
				if err := fn(p, f); err != nil {
					return err
				}
			}
			pos = max(pos, res.Next)
		}
	}
	return nil
}
