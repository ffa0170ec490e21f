package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/hashicorp/go-multierror"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/kafkaversion"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
	"github.com/runnel-dev/runnel/topology"
)

// WorkerOptions override the app's settings for one worker.
type WorkerOptions struct {
	// Brokers overrides Config.Brokers.
	Brokers []string
	// DataDir overrides Config.DataDir.
	DataDir string
	// MemoryStores keeps table state in memory instead of Pebble (tests).
	MemoryStores bool
	// Name labels the worker's logs; default: the process ID.
	Name string
}

// Worker is one member of the app's consumer group: it owns the partitions the
// assignor gives it, restores their tables, runs the agents over them and
// commits offsets as records resolve.
type Worker struct {
	app    *App
	cfg    Config
	opts   WorkerOptions
	graph  *topology.Graph
	log    *slog.Logger
	procID string

	client   sarama.Client
	producer *kafka.Producer
	restorer *changelog.Restorer
	strategy *assignor.Strategy
	mgr      *source.Manager
	tables   []*tableRuntime
	env      *table.Env
	metrics  *metrics

	mu         sync.Mutex
	assignment assignor.Assignment // latest, guarded by mu
	ready      bool                // every active partition restored; guarded by mu

	restored atomic.Int64 // changelog records replayed by active restores

	adminOnce sync.Once // builds admin (tables_committed.go)
	admin     sarama.ClusterAdmin
	adminErr  error
}

type tableRuntime struct {
	def   table.Def
	parts int32
	store stores.Store
	state *table.State
}

// NewWorker prepares a worker of a; Run starts it.
func (a *App) NewWorker(o WorkerOptions) (*Worker, error) {
	g, err := a.Topology()
	if err != nil {
		return nil, fmt.Errorf("app %s: %w", a.id, err)
	}
	cfg := a.cfg
	if len(o.Brokers) > 0 {
		cfg.Brokers = o.Brokers
	}
	if o.DataDir != "" {
		cfg.DataDir = o.DataDir
	}
	w := &Worker{app: a, cfg: cfg, opts: o, graph: g}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if w.procID, err = processID(cfg.DataDir); err != nil {
		return nil, err
	}
	name := o.Name
	if name == "" {
		name = w.procID
	}
	w.log = cfg.Logger.With("worker", name)
	w.metrics = newMetrics()
	return w, nil
}

// processID returns the worker's stable identity, kept in the data dir so that
// it survives restarts (the assignor uses it to give a restarted worker its
// previous partitions back).
func processID(dir string) (string, error) {
	p := filepath.Join(dir, "process-id")
	if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	host, _ := os.Hostname()
	id := fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano()%1e6)
	if err := os.WriteFile(p, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("write process id: %w", err)
	}
	return id, nil
}

// Restored returns how many changelog records this worker's active restores
// replayed so far.
func (w *Worker) Restored() int64 { return w.restored.Load() }

// Assignment returns the worker's latest assignment.
func (w *Worker) Assignment() assignor.Assignment {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.assignment
}

// Ready reports whether every active partition's tables are restored.
func (w *Worker) Ready() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ready
}

func (w *Worker) timeouts() kafka.Timeouts {
	return kafka.Timeouts{Session: w.cfg.Session, Heartbeat: w.cfg.Heartbeat, Rebalance: w.cfg.Rebalance, MaxWait: w.cfg.FetchMaxWait}
}

func (w *Worker) topicSpecs() []kafka.TopicSpec {
	var specs []kafka.TopicSpec
	for _, t := range w.graph.Topics {
		specs = append(specs, kafka.TopicSpec{Name: t.Name, Partitions: t.Partitions})
	}
	for _, t := range w.graph.Tables {
		specs = append(specs, changelog.Spec(t.Changelog, t.Partitions))
	}
	specs = append(specs, kafka.TopicSpec{Name: dlqTopic(w.app.id), Partitions: 1})
	return specs
}

func dlqTopic(app string) string { return app + "-dlq" }

// ConnectTimeout bounds how long a worker or command waits for the brokers to
// answer before it gives up with an error (a wrong address never hangs).
var ConnectTimeout = 15 * time.Second

// connect detects the cluster's protocol version (ApiVersions), opens a client
// configured for it and creates the declared topics (specs may be empty).
func connect(ctx context.Context, brokers []string, clientID string, t kafka.Timeouts, specs []kafka.TopicSpec) (sarama.Client, *sarama.Config, error) {
	dctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	v, err := kafkaversion.Detect(dctx, brokers, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", strings.Join(brokers, ","), err)
	}
	c := kafka.NewConfig(clientID, v, t)
	c.Net.DialTimeout = 5 * time.Second
	c.Metadata.Retry.Max = 2
	c.Metadata.Retry.Backoff = 200 * time.Millisecond
	client, err := sarama.NewClient(brokers, c)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", strings.Join(brokers, ","), err)
	}
	if len(specs) == 0 {
		return client, c, nil
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("admin: %w", err)
	}
	if err := kafka.EnsureTopics(admin, len(client.Brokers()), specs); err != nil {
		client.Close()
		return nil, nil, err
	}
	return client, c, nil
}

// Run joins the group and processes records until ctx ends, then leaves the
// group cleanly: it stops fetching, lets in-flight records finish within the
// drain budget, commits what resolved and closes the stores.
func (w *Worker) Run(ctx context.Context) (err error) {
	brokers, err := resolveBrokers(w.cfg.Brokers)
	if err != nil {
		return err
	}
	var sc *sarama.Config
	w.client, sc, err = connect(ctx, brokers, "runnel-"+w.app.id, w.timeouts(), w.topicSpecs())
	if err != nil {
		return err
	}
	var closers []func() error
	defer func() {
		var errs *multierror.Error
		if err != nil {
			errs = multierror.Append(errs, err)
		}
		for i := len(closers) - 1; i >= 0; i-- {
			if e := closers[i](); e != nil {
				errs = multierror.Append(errs, e)
			}
		}
		err = errs.ErrorOrNil()
	}()
	closers = append(closers, w.client.Close)

	if w.producer, err = kafka.NewProducer(w.client); err != nil {
		return err
	}
	closers = append(closers, w.producer.Close)
	send := func(topic string, p int32, key, value []byte, done func(int64, error)) error {
		return w.producer.Send(&sarama.ProducerMessage{Topic: topic, Partition: p, Key: bytesOrNil(key), Value: bytesOrNil(value)},
			func(_ int32, off int64, err error) {
				if done != nil {
					done(off, err)
				}
			})
	}
	sendChangelog := func(topic string, p int32, key, value []byte, hs []table.Header, done func(int64, error)) error {
		m := &sarama.ProducerMessage{Topic: topic, Partition: p, Key: bytesOrNil(key), Value: bytesOrNil(value)}
		for _, h := range hs {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		return w.producer.Send(m, func(_ int32, off int64, err error) { done(off, err) })
	}
	consumer, err := sarama.NewConsumerFromClient(w.client)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	closers = append(closers, consumer.Close)
	w.restorer = &changelog.Restorer{Client: w.client, Consumer: consumer, Logger: w.log}

	for _, tt := range w.graph.Tables {
		var def table.Def
		for _, d := range w.app.tables {
			if d.Name() == tt.Name {
				def = d
			}
		}
		var st stores.Store
		if w.opts.MemoryStores {
			st = stores.NewMemory()
		} else if st, err = stores.OpenPebble(filepath.Join(w.cfg.DataDir, "tables", tt.Name), stores.PebbleOptions{}); err != nil {
			return fmt.Errorf("open store of table %s: %w", tt.Name, err)
		}
		closers = append(closers, st.Close)
		rt := &tableRuntime{def: def, parts: tt.Partitions, store: st, state: table.NewState(def, tt.Partitions, st, sendChangelog)}
		w.tables = append(w.tables, rt)
	}
	w.env = &table.Env{States: map[string]*table.State{}, Send: send}
	for _, t := range w.tables {
		w.env.States[t.def.Name()] = t.state
	}
	closers = append(closers, func() error {
		fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return w.producer.Flush(fctx)
	})

	if w.mgr, err = source.NewManager(source.Config{AckTimeout: w.cfg.AckTimeout, Overflow: source.Backpressure, Logger: w.log}); err != nil {
		return err
	}
	closers = append(closers, func() error { w.mgr.StopAll(); return nil })

	changelogs := map[string]int32{}
	for _, t := range w.graph.Tables {
		changelogs[t.Changelog] = t.Partitions
	}
	w.strategy = assignor.NewStrategy(assignor.Config{
		Changelogs:   changelogs,
		Replicas:     w.cfg.Replicas,
		ProcessID:    w.procID,
		URL:          w.cfg.HTTPAddr,
		Offsets:      w.localOffsets,
		EndOffsets:   w.endOffsets,
		OnAssignment: w.onAssignment,
		Logger:       w.log,
	})
	sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{w.strategy}
	group, err := sarama.NewConsumerGroupFromClient(w.app.id, w.client)
	if err != nil {
		return fmt.Errorf("join group %s: %w", w.app.id, err)
	}
	closers = append(closers, group.Close)
	go func() {
		for e := range group.Errors() {
			w.log.Warn("consumer group error", "err", e)
		}
	}()

	if w.cfg.HTTPAddr != "" {
		stop, err := w.serveHTTP(w.cfg.HTTPAddr)
		if err != nil {
			return err
		}
		closers = append(closers, stop)
	}

	topics := w.graph.Subscriptions()
	w.log.Info("worker joining group", "group", w.app.id, "topics", topics, "brokers", brokers)
	h := &handler{w: w}
	for ctx.Err() == nil {
		sctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-w.strategy.ProbeRequested():
				w.log.Info("probing rebalance requested; rejoining")
				cancel()
			case <-sctx.Done():
			}
		}()
		err := group.Consume(sctx, topics, h)
		cancel()
		if err != nil && ctx.Err() == nil {
			if errors.Is(err, sarama.ErrClosedConsumerGroup) {
				return err
			}
			w.log.Warn("group session ended with an error; rejoining", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	w.log.Info("worker leaving group", "group", w.app.id)
	return nil
}

func bytesOrNil(b []byte) sarama.Encoder {
	if b == nil {
		return nil
	}
	return sarama.ByteEncoder(b)
}

func (w *Worker) localOffsets() map[string]map[int32]int64 {
	out := map[string]map[int32]int64{}
	for _, t := range w.tables {
		parts, err := t.store.Partitions()
		if err != nil {
			continue
		}
		m := map[int32]int64{}
		for _, p := range parts {
			if off, err := t.store.Offset(p); err == nil && off != stores.NoOffset {
				m[p] = off
			}
		}
		out[t.state.Topic()] = m
	}
	return out
}

func (w *Worker) endOffsets(topics map[string]int32) map[string]map[int32]int64 {
	out := map[string]map[int32]int64{}
	for topic, n := range topics {
		m := map[int32]int64{}
		for p := int32(0); p < n; p++ {
			if off, err := w.client.GetOffset(topic, p, sarama.OffsetNewest); err == nil {
				m[p] = off
			}
		}
		out[topic] = m
	}
	return out
}

func (w *Worker) onAssignment(a assignor.Assignment) {
	w.mu.Lock()
	w.assignment = a
	w.ready = false
	w.mu.Unlock()
	w.log.Info("assignment", "generation", a.Generation, "leader", a.Leader,
		"actives", fmtParts(a.Actives), "standbys", fmtParts(a.Standbys), "warmups", fmtParts(a.Warmups))
}

func fmtParts(m map[string][]int32) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		if len(m[k]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s%v ", k, m[k])
	}
	return strings.TrimSpace(b.String())
}
