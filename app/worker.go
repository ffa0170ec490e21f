package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/group"
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
	sec    kafka.Security // TLS and SASL of every client the worker opens (Config.security)

	client   sarama.Client // the group consumer's (fetch long-polls)
	meta     sarama.Client // offset lookups, committed offsets: never behind a fetch
	producer *kafka.Producer
	restorer *changelog.Restorer
	// fetcher reads the claimed source partitions (one fetch loop per
	// leader broker; kafka.Fetcher); nil with RUNNEL_FETCHER=sarama, when
	// the claims' own Sarama partition consumers are read instead.
	fetcher  *kafka.Fetcher
	cgroup   sarama.ConsumerGroup // the Sarama group, to pause its claims' fetching
	strategy *assignor.Strategy
	mgr      *source.Manager
	tables   []*tableRuntime
	env      *tablestate.Env
	metrics  *metrics

	parts *tableParts                   // table partition lifecycles (restores, standby followers)
	tasks taskSet                       // commit cycles of the active partitions (tasks.go)
	txn   *group.TxnCommitter[*taskRun] // ExactlyOnce: the worker's transactions (txn.go); nil otherwise
	glob  globals                       // global-table replicas (global.go)

	mu         sync.Mutex
	assignment assignor.Assignment               // latest, guarded by mu
	ready      bool                              // every active partition restored; guarded by mu
	claims     map[restoreKey]context.CancelFunc // running claims (topic, partition); guarded by mu

	processed atomic.Int64 // source records resolved (Advance)
	// commitMu orders the offset commits of the session (Sarama's, from
	// marked offsets) with the commit cycles' own: a cycle's commit and the
	// marking of its offsets happen under it, so that Sarama never commits
	// an older marked offset after a cycle committed a newer one.
	commitMu     sync.Mutex
	restored     atomic.Int64    // changelog records replayed by active restores
	restoredSpan atomic.Int64    // changelog offsets covered by active restores
	fatal        fatalState      // agent.StopWorker errors end Run (redeliver.go)
	runDone      <-chan struct{} // closed when Run's context ends (set by Run before anything starts)
	attempts     group.Attempts  // failed deliveries per record, across sessions (redeliver.go)

	derived derivedURLs // URL map derived when the leader left it out (global_http.go)

	adminOnce sync.Once // builds admin (tables_committed.go)
	admin     sarama.ClusterAdmin
	adminErr  error

	answers brokerAnswers // the status page's cached broker answers (status_broker.go)
	rates   rateSampler   // the status page's rates (status_rates.go)
}

type tableRuntime struct {
	def   table.Def
	parts int32
	store stores.Store
	state *tablestate.State
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
	if err := errors.Join(append(slices.Clone(a.cfgErrs), cfg.validate())...); err != nil {
		return nil, fmt.Errorf("app %s: %w", a.id, err)
	}
	sec, err := cfg.security()
	if err != nil {
		return nil, fmt.Errorf("app %s: %w", a.id, err)
	}
	cfg.CommitInterval = cfg.commitInterval() // 0: the guarantee's default
	w := &Worker{app: a, cfg: cfg, opts: o, graph: g, sec: sec}
	w.tasks.w = w
	w.answers.ask = w.askBrokers
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
	w.metrics = newMetrics(w)
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

// Tasks returns the status of this worker's tasks (partitions whose agents
// write tables), ordered by partition count and partition.
//
// A restoring or standby task lists its table partitions' positions against
// their changelogs (TaskStatus.Changelogs; one ListOffsets per partition).
func (w *Worker) Tasks() []TaskStatus { return w.tasksWith(w.Assignment(), nil, w.liveHighwater) }

// tasksWith is Tasks under assignment a, taking the positions of the table
// partitions in known (tablePartitions, when the caller has them already)
// and the highwaters of the others from hw. Each task has its rate of
// records handed out over the sampled window.
func (w *Worker) tasksWith(a assignor.Assignment, known []TablePartitionStatus, hw highwaterFunc) []TaskStatus {
	out := w.tasks.status()
	handed := w.rates.rates().handed
	for i := range out {
		ts := &out[i]
		ts.HandedPerSecond = handed[taskKey{ts.Partitions, ts.Partition}]
		if ts.State != TaskRestoring && ts.State != TaskStandby {
			continue
		}
		for _, name := range ts.Tables {
			i := slices.IndexFunc(known, func(s TablePartitionStatus) bool { return s.Table == name && s.Partition == ts.Partition })
			if i >= 0 {
				ts.Changelogs = append(ts.Changelogs, known[i])
				continue
			}
			if t := w.tableByName(name); t != nil {
				if s, ok := w.tablePartition(t, a, ts.Partition, hw); ok {
					ts.Changelogs = append(ts.Changelogs, s)
				}
			}
		}
	}
	return out
}

// Processed returns how many source records every subscribed agent moved
// past (resolved: acked, rejected or dead-lettered) on this worker; their
// offsets are committed by the next commit cycle.
func (w *Worker) Processed() int64 { return w.processed.Load() }

// Restored returns how many changelog records this worker's active restores
// replayed so far.
func (w *Worker) Restored() int64 { return w.restored.Load() }

// RestoredSpan returns the changelog offset span this worker's active restores
// covered (end minus start offset, summed): records compacted away inside the
// span count, so it is exact where Restored depends on compaction.
func (w *Worker) RestoredSpan() int64 { return w.restoredSpan.Load() }

// StoreOffset returns the changelog offset applied to partition p of table's
// local store (stores.NoOffset when none), for tests and the status page.
func (w *Worker) StoreOffset(tableName string, p int32) (int64, error) {
	for _, t := range w.tables {
		if t.def.Name() == tableName {
			return t.store.Offset(p)
		}
	}
	return 0, fmt.Errorf("no table %q", tableName)
}

// ChangelogTopic returns the changelog topic of the named table ("" if none).
func (w *Worker) ChangelogTopic(tableName string) string {
	for _, t := range w.graph.Tables {
		if t.Name == tableName {
			return t.Changelog
		}
	}
	return ""
}

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
		specs = append(specs, topicSpec(t)) // repartition.go
	}
	for _, t := range w.graph.Tables {
		specs = append(specs, changelog.Spec(t.Changelog, t.Partitions, w.changelogConfig(t.Name)))
	}
	return append(specs, w.dlqSpecs()...)
}

// ConnectTimeout bounds how long a worker or command waits for the brokers to
// answer before it gives up with an error (a wrong address never hangs).
var ConnectTimeout = 15 * time.Second

// connect detects the cluster's protocol version (ApiVersions), opens a client
// configured for it and creates the declared topics (specs may be empty).
// Every connection, the version probe's included, is secured by sec (TLS,
// SASL); an error says which security protocol and SASL user were tried,
// never the password.
func connect(ctx context.Context, sec kafka.Security, brokers []string, clientID string, t kafka.Timeouts, specs []kafka.TopicSpec) (sarama.Client, *sarama.Config, error) {
	dctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	where := strings.Join(brokers, ",")
	if p := sec.Protocol(); p != "PLAINTEXT" {
		where += " (" + p
		if sec.SASL.Mechanism != "" {
			where += ", SASL " + sec.SASL.String()
		}
		where += ")"
	}
	v, err := kafkaversion.Detect(dctx, brokers, kafka.Base(clientID, sec))
	if err != nil {
		// A broker that refuses the credentials may just close the
		// connection (kfake does; Kafka answers SaslAuthenticate with an
		// error first): if it answers ApiVersions without SASL (allowed
		// before authentication, KIP-43), the credentials were refused.
		if sec.SASL.Mechanism != "" {
			plain := kafka.Security{TLS: sec.TLS}
			if _, perr := kafkaversion.Detect(dctx, brokers, kafka.Base(clientID, plain)); perr == nil {
				return nil, nil, fmt.Errorf("connect to %s: SASL authentication failed: the brokers answer but refuse %s (check the mechanism, user and password): %w", where, sec.SASL, err)
			}
		}
		return nil, nil, fmt.Errorf("connect to %s: %w", where, err)
	}
	c := kafka.NewSecureConfig(clientID, v, t, sec)
	c.Net.DialTimeout = 5 * time.Second
	c.Metadata.Retry.Max = 2
	c.Metadata.Retry.Backoff = 200 * time.Millisecond
	client, err := sarama.NewClient(brokers, c)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to %s: %w", where, err)
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
		return nil, nil, oneError(err)
	}
	return client, c, nil
}

// connect is connect with the app's configuration, validated first (the
// commands' path to the brokers).
func (a *App) connect(ctx context.Context, brokers []string, clientID string, t kafka.Timeouts, specs []kafka.TopicSpec) (sarama.Client, *sarama.Config, error) {
	if err := a.validate(); err != nil {
		return nil, nil, err
	}
	sec, err := a.cfg.security()
	if err != nil {
		return nil, nil, err
	}
	return connect(ctx, sec, brokers, clientID, t, specs)
}

// txnID is the worker's transactional ID under ExactlyOnce:
// runnel-<app ID>-<process ID of the data dir>.
func (w *Worker) txnID() string { return "runnel-" + w.app.id + "-" + w.procID }

// Run joins the group and processes records until ctx ends, then leaves the
// group cleanly: it stops fetching, lets in-flight records finish within the
// drain budget, commits what resolved and closes the stores.
func (w *Worker) Run(ctx context.Context) (err error) {
	ctx, stop := w.fatal.context(ctx)
	defer stop()
	w.runDone = ctx.Done()
	brokers, err := resolveBrokers(w.cfg.Brokers)
	if err != nil {
		return err
	}
	var sc *sarama.Config
	w.client, sc, err = connect(ctx, w.sec, brokers, "runnel-"+w.app.id, w.timeouts(), w.topicSpecs())
	if err != nil {
		return err
	}
	if w.cfg.Guarantee == ExactlyOnce {
		// Every reader of the app's topics (the group consumer, restores,
		// standbys, seeks back) sees only committed transactions.
		sc.Consumer.IsolationLevel = sarama.ReadCommitted
	}
	var closers []func() error
	defer func() {
		var errs []error
		if err != nil {
			errs = append(errs, err)
		}
		for i := len(closers) - 1; i >= 0; i-- {
			if e := closers[i](); e != nil {
				errs = append(errs, e)
			}
		}
		err = joinErrors(errs)
	}()
	closers = append(closers, w.client.Close)

	// The producer is a kgo client with broker connections of its own: a
	// changelog or sink record never waits behind the fetch long-polls of
	// the group consumer and the standby followers. A record waits for its
	// answer as long as a cycle waits for its acks (flushBudget): every
	// retriable error (a leader moving or down, a changelog's metadata
	// still propagating) is retried within it, and the cycle gives up at
	// the same point.
	pcfg := kafka.ProducerConfig{Brokers: brokers, ClientID: "runnel-" + w.app.id, Security: w.sec,
		DeliveryTimeout: w.flushBudget(), Logger: w.log}
	if w.cfg.Guarantee == ExactlyOnce {
		// One transactional ID per worker, stable across restarts of its
		// data dir: a restarted worker fences its previous incarnation and
		// aborts the transaction it left open at once (InitProducerId).
		pcfg.TransactionalID = w.txnID()
		// A transaction the worker leaves open when it dies blocks
		// read_committed readers of its partitions (the next owner's
		// restore among them) until the broker aborts it: Kafka Streams
		// uses 10 s under exactly-once too.
		pcfg.TransactionTimeout = w.txnTimeout()
		w.producer, err = kafka.NewTxnProducer(pcfg)
	} else {
		w.producer, err = kafka.NewProducer(pcfg)
	}
	if err != nil {
		return err
	}
	closers = append(closers, w.producer.Close)
	if w.cfg.Guarantee == ExactlyOnce {
		w.txn = newTxnCommitter(w)
		if err := w.txn.Begin(); err != nil {
			return err
		}
		// The cycle loop stops before the producer closes (closers run in
		// reverse order).
		lctx, stopLoop := context.WithCancel(ctx)
		loopDone := make(chan struct{})
		go func() { defer close(loopDone); w.txn.Loop(lctx) }()
		closers = append(closers, func() error { stopLoop(); <-loopDone; return nil })
	}
	send := func(topic string, p int32, key, value []byte, ack tablestate.Acker) error {
		return w.producer.SendRecord(topic, p, key, value, ack)
	}
	sendChangelog := func(topic string, p int32, key, value []byte, hs []tablestate.Header, done func(int64, error)) error {
		m := &sarama.ProducerMessage{Topic: topic, Partition: p, Key: bytesOrNil(key), Value: bytesOrNil(value)}
		for _, h := range hs {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		return w.producer.Send(m, func(_ int32, off int64, err error) { done(off, err) })
	}
	// Restores and standby followers get clients of their own as well: one
	// for offset lookups and one for their fetches, so that neither waits
	// behind the group consumer's fetch long-polls (up to the fetch max wait
	// each) nor behind each other's.
	offClient, err := sarama.NewClient(brokers, sc)
	if err != nil {
		return fmt.Errorf("restore client: %w", err)
	}
	// The status page's broker refreshes (status_broker.go) use offClient:
	// they are joined after it closed (closers run in reverse order), which
	// ends a request still waiting for a broker.
	closers = append(closers, func() error { w.answers.setOpen(false); return nil })
	closers = append(closers, offClient.Close)
	w.meta = offClient
	w.answers.setOpen(true)
	rc := *sc
	rc.Consumer.MaxWaitTime = min(sc.Consumer.MaxWaitTime, 100*time.Millisecond)
	rc.Consumer.Fetch.Default = 4 << 20 // changelog records are small and many
	restoreClient, err := sarama.NewClient(brokers, &rc)
	if err != nil {
		return fmt.Errorf("restore client: %w", err)
	}
	closers = append(closers, restoreClient.Close)
	consumer, err := sarama.NewConsumerFromClient(restoreClient)
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	closers = append(closers, consumer.Close)
	if os.Getenv("RUNNEL_FETCHER") != "sarama" {
		fc := kafka.FetcherConfigOf(w.client)
		fc.Logger = w.log
		if w.fetcher, err = kafka.NewFetcher(fc); err != nil {
			return err
		}
		closers = append(closers, func() error { w.fetcher.Close(); return nil })
	}
	// The log has one summary line for all restores every 5 s (and one when
	// they are done), not a line per partition: changelog.ProgressLog.
	plog := &changelog.ProgressLog{Logger: w.log, TableOf: w.tableOfChangelog}
	plogCtx, stopPlog := context.WithCancel(ctx)
	plogDone := make(chan struct{})
	go func() { defer close(plogDone); plog.Run(plogCtx) }()
	closers = append(closers, func() error { stopPlog(); <-plogDone; return nil })
	rateCtx, stopRates := context.WithCancel(ctx)
	ratesDone := make(chan struct{})
	go func() { defer close(ratesDone); w.sampleRates(rateCtx) }()
	closers = append(closers, func() error { stopRates(); <-ratesDone; return nil })
	restoreMetrics := w.metrics.restoreProgress(w.tableOfChangelog)
	w.restorer = &changelog.Restorer{Client: offClient, Consumer: consumer, Logger: w.log, ProgressInterval: time.Second,
		OnProgress: func(pr changelog.Progress) {
			if !pr.Stopped { // the gauges and the status page keep the last position read
				restoreMetrics(pr)
			}
			plog.Observe(pr)
		}}

	for _, tt := range w.graph.Tables {
		var def table.Def
		for _, d := range w.app.tables {
			if d.Name() == tt.Name {
				def = d
			}
		}
		if isGlobal(def) {
			continue // global.go
		}
		var st stores.Store
		if w.opts.MemoryStores {
			st = stores.NewMemory()
		} else if st, err = stores.OpenPebble(filepath.Join(w.cfg.DataDir, "tables", tt.Name), stores.PebbleOptions{}); err != nil {
			return fmt.Errorf("open store of table %s: %w", tt.Name, err)
		}
		closers = append(closers, st.Close)
		state := tablestate.NewState(def, tt.Partitions, st, sendChangelog)
		state.OwnedWrites = true // a write no task cuts fails (tasks.go, takeTable)
		rt := &tableRuntime{def: def, parts: tt.Partitions, store: st, state: state}
		nparts := tt.Partitions
		rt.state.CacheBytes = w.cfg.CacheBytes
		rt.state.OnFull = func(p int32) { w.metrics.cacheFlushes.WithLabelValues(tt.Name).Inc(); w.tasks.wake(taskKey{nparts, p}) }
		w.tables = append(w.tables, rt)
	}
	w.parts = newTableParts(w, ctx)
	closers = append(closers, func() error { w.parts.stop(); return nil })
	w.env = &tablestate.Env{States: map[string]*tablestate.State{}, Send: send}
	w.env.SendAt = w.sendAt // repartition.go
	for _, t := range w.tables {
		w.env.States[t.def.Name()] = t.state
	}
	gclosers, err := w.openGlobals(sendChangelog)
	closers = append(closers, gclosers...)
	if err != nil {
		return err
	}
	w.env.Globals = w.globalStates()
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
		if _, global := w.globalChangelogs()[t.Changelog]; !global {
			changelogs[t.Changelog] = t.Partitions
		}
	}
	w.strategy = assignor.NewStrategy(assignor.Config{
		Changelogs:               changelogs,
		Globals:                  w.globalChangelogs(),
		Replicas:                 w.cfg.Replicas,
		AcceptableRecoveryLag:    w.cfg.AcceptableRecoveryLag,
		MaxWarmupReplicas:        w.cfg.MaxWarmupReplicas,
		ProbingRebalanceInterval: w.cfg.ProbingRebalanceInterval,
		MaxURLMapBytes:           w.cfg.MaxURLMapBytes,
		Protocol:                 w.cfg.rebalanceProtocol(),
		ProcessID:                w.procID,
		URL:                      w.cfg.HTTPAddr,
		Offsets:                  w.localOffsets,
		EndOffsets:               w.endOffsets,
		OnAssignment:             w.onAssignment,
		Logger:                   w.log,
	})
	// After a restart, report the assignment this worker last held, so that
	// a group restarting as a whole gives members their partitions back.
	if a, ok := w.loadAssignment(); ok && w.strategy.Restore(a) {
		w.log.Info("reporting the assignment persisted in the data dir", "generation", a.Generation, "actives", topicParts(a.Actives))
	}
	// A warm-up that caught up asks for the follow-up rebalance at once
	// (KIP-441), instead of waiting for the probing rebalance.
	go w.strategy.WatchWarmups(ctx, time.Second)
	sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{w.strategy}
	if w.txn != nil {
		sc.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{group.RejoinStrategy{Strategy: w.strategy, Rejoins: w.txn.Rejoins()}}
	}
	if w.cfg.InstanceID != "" {
		sc.Consumer.Group.InstanceId = w.cfg.InstanceID
	}
	// Started after the writes to sc above: its admin client opens broker
	// connections of w.client, which validate (read) sc (a data race
	// under -race when it started first).
	go w.purgeRepartitions(ctx) // repartition.go
	group, err := sarama.NewConsumerGroupFromClient(w.app.id, w.client)
	if err != nil {
		return fmt.Errorf("join group %s: %w", w.app.id, err)
	}
	w.cgroup = group
	closers = append(closers, func() error {
		// LeaveGroup: the coordinator rebalances the others at once instead
		// of after the session timeout. Leaving is that courtesy only: the
		// session's end committed the offsets before (handler.Cleanup), and
		// a member that failed to leave (NOT_COORDINATOR after a coordinator
		// move, a broken connection) is removed when its session times out.
		// So a failed leave is a warning, never the run's error: a requested
		// stop that finished its work exits 0. Close also returns the last
		// group error still queued, which the loop below logs as a warning
		// too.
		if err := group.Close(); err != nil {
			w.log.Warn("leaving the group failed; the coordinator removes this member when its session times out",
				"group", w.app.id, "err", err)
			return nil
		}
		w.log.Info("worker left group", "group", w.app.id)
		return nil
	})
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

	// Global tables are restored before the worker joins: no agent reads one
	// before it holds what the changelog held at start (global.go).
	stopGlobals, err := w.startGlobals(ctx)
	closers = append(closers, stopGlobals)
	if err != nil {
		return err
	}

	topics := w.graph.Subscriptions()
	w.log.Info("worker joining group", "group", w.app.id, "topics", topics, "brokers", brokers, "protocol", w.cfg.rebalanceProtocolName(),
		"security", w.sec.Protocol(), "sasl", w.sec.SASL)
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
	return w.fatal.get()
}

func bytesOrNil(b []byte) sarama.Encoder {
	if b == nil {
		return nil
	}
	return sarama.ByteEncoder(b)
}

func (w *Worker) localOffsets() map[string]map[int32]int64 {
	w.metrics.joining() // called before every JoinGroup: a rebalance starts
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
		if w.parts != nil {
			w.parts.received(t.def.Name(), m)
		}
		out[t.state.Topic()] = m
	}
	return out
}

// received raises m's offsets (table partition -> last changelog offset held)
// of table's followed partitions to what their standby followers received,
// held-back records included (changelog.Handoff.Received: a promotion applies
// those from memory).
func (tp *tableParts) received(table string, m map[int32]int64) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for k, p := range tp.parts {
		if k.table != table || p.handoff == nil {
			continue
		}
		if r, ok := p.handoff.Received(); ok {
			if off, held := m[k.p]; !held || r > off {
				m[k.p] = r
			}
		}
	}
}

func (w *Worker) endOffsets(topics map[string]int32) map[string]map[int32]int64 {
	out := map[string]map[int32]int64{}
	for topic, n := range topics {
		m := map[int32]int64{}
		for p := int32(0); p < n; p++ {
			if off, err := w.meta.GetOffset(topic, p, sarama.OffsetNewest); err == nil {
				m[p] = off
			}
		}
		out[topic] = m
	}
	return out
}

// onAssignment runs inside sarama's SyncGroup handling, before revoked claims
// stop (cooperative) and before new claims start: it ends the claims the
// assignment no longer holds, starts and stops standby followers, and
// recomputes readiness (a member whose partitions did not change stays ready).
func (w *Worker) onAssignment(a assignor.Assignment) {
	followed, active := map[string][]int32{}, map[string][]int32{}
	for _, t := range w.tables {
		topic := t.state.Topic()
		followed[t.def.Name()] = append(slices.Clone(a.Standbys[topic]), a.Warmups[topic]...)
		active[t.def.Name()] = a.Actives[topic]
	}
	if w.parts != nil {
		w.parts.setFollowed(followed, active)
	}
	w.checkGlobals(a)
	ready := w.parts == nil || w.parts.restoredAll(a)
	if err := w.saveAssignment(a); err != nil {
		w.log.Warn("could not persist the assignment in the data dir", "err", err)
	}
	w.mu.Lock()
	w.assignment = a
	w.ready = ready
	for k, cancel := range w.claims {
		if !slices.Contains(a.Actives[k.table], k.p) {
			cancel()
		}
	}
	w.mu.Unlock()
	if w.txn != nil {
		w.txn.Rejoins().Assigned(a.Generation)
	}
	w.metrics.assigned(a)
	// The restores of partitions that left this worker leave the status
	// page and the restore gauges; the page's broker answers are asked for
	// the copies of the new assignment at once.
	w.metrics.forgetRestores(func(topic string, p int32) bool { return holdsCopy(a, topic, p) }, w.tableOfChangelog)
	w.answers.prefetch(w.heldCopies(a))
	w.log.Info("assignment", "generation", a.Generation, "leader", a.Leader,
		"actives", topicParts(a.Actives), "standbys", topicParts(a.Standbys), "warmups", topicParts(a.Warmups), "pending", topicParts(a.Pending))
}

// assignmentFile is where a worker keeps its last assignment (JSON), so that
// it reports it after a restart (assignor.Strategy.Restore).
func (w *Worker) assignmentFile() string { return filepath.Join(w.cfg.DataDir, "assignment.json") }

// saveAssignment writes a to the data dir atomically (a temporary file
// renamed over the last one).
func (w *Worker) saveAssignment(a assignor.Assignment) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	tmp := w.assignmentFile() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, w.assignmentFile())
}

// loadAssignment reads the persisted assignment; ok is false when there is
// none or it does not decode (logged: the worker then joins as a newcomer).
func (w *Worker) loadAssignment() (assignor.Assignment, bool) {
	var a assignor.Assignment
	b, err := os.ReadFile(w.assignmentFile())
	if err != nil {
		return a, false
	}
	if err := json.Unmarshal(b, &a); err != nil {
		w.log.Warn("persisted assignment does not decode; ignored", "file", w.assignmentFile(), "err", err)
		return a, false
	}
	return a, true
}

// tablePart is the lifecycle of one table partition on this worker: active
// while at least one claim of a co-partitioned source topic runs (restored once
// per activation), otherwise followed as a standby or warm-up when the
// assignment says so. A partition is never restored and followed at once.
type tablePart struct {
	claims int          // running claims that need the partition active
	gate   *restoreGate // restore of the current activation; nil while inactive

	wantFollow bool
	stopFollow context.CancelFunc // nil when no follower runs
	followDone chan struct{}      // closed when the last follower exited
	// handoff promotes the running follower in place (changelog.Handoff);
	// set and cleared with stopFollow: nil when no follower runs or it was
	// told to stop.
	handoff *changelog.Handoff
	// rebuild: a claim found the store out of step with where it starts
	// (checkStart); the next activation wipes the partition and restores
	// it from the start of its changelog.
	rebuild bool
}

// tableParts tracks every table partition of a worker across group sessions;
// the cooperative protocol changes the assignment inside one session, so the
// lifecycle is driven by claims and assignments, not by Setup and Cleanup.
type tableParts struct {
	w     *Worker
	ctx   context.Context // the worker's run context: followers end with it
	mu    sync.Mutex
	parts map[restoreKey]*tablePart // guarded by mu
	bg    sync.WaitGroup            // followers
}

func newTableParts(w *Worker, ctx context.Context) *tableParts {
	return &tableParts{w: w, ctx: ctx, parts: map[restoreKey]*tablePart{}}
}

func (tp *tableParts) get(k restoreKey) *tablePart {
	p := tp.parts[k]
	if p == nil {
		p = &tablePart{}
		tp.parts[k] = p
	}
	return p
}

// tableNamesOf returns the names of the tables co-partitioned with task k
// (its partition count), the tables its claims restore and write.
func (w *Worker) tableNamesOf(k taskKey) []string {
	out := []string{}
	for _, t := range w.tables {
		if t.parts == k.parts {
			out = append(out, t.def.Name())
		}
	}
	return out
}

// followed tells the worker's tasks whether table partition k is followed
// (a standby or warm-up replica): its task is a standby while no claim holds
// it (taskSet.following).
func (tp *tableParts) followed(k restoreKey, on bool) {
	if t := tp.w.tableByName(k.table); t != nil {
		tp.w.tasks.following(taskKey{t.parts, k.p}, k.table, on)
	}
}

func (w *Worker) tableByName(name string) *tableRuntime {
	for _, t := range w.tables {
		if t.def.Name() == name {
			return t
		}
	}
	return nil
}

// startFollower starts the standby follower of k; mu must be held. The new
// follower starts reading once the previous one of k (stopped by
// setFollowed, which does not wait) has exited: both read the partition
// through the restorer's one consumer, which refuses a partition consumed
// twice ("That topic/partition is already being consumed"), and the store
// must have one writer.
func (tp *tableParts) startFollower(k restoreKey, p *tablePart) {
	t := tp.w.tableByName(k.table)
	if t == nil || p.stopFollow != nil || tp.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithCancel(tp.ctx)
	done := make(chan struct{})
	prev := p.followDone
	h := changelog.NewHandoff()
	p.stopFollow, p.followDone, p.handoff = cancel, done, h
	tp.followed(k, true)
	follow := append(tp.w.followOptions(ctx, &tp.bg), changelog.WithHandoff(h))
	tp.bg.Add(1)
	go func() {
		defer tp.bg.Done()
		defer close(done)
		if prev != nil {
			select {
			case <-prev:
			case <-ctx.Done():
				return
			}
		}
		if err := tp.w.restorer.Follow(ctx, t.state.Topic(), k.p, t.store, follow...); err != nil {
			tp.w.log.Warn("standby stopped", "table", k.table, "partition", k.p, "err", err)
		}
	}()
}

// setFollowed makes the followed partitions want (table -> partitions:
// standbys and warm-ups); a partition with a running claim starts following
// when its last claim ends. A follower of a partition that became active
// (table -> partitions) keeps running until the partition's claim promotes
// it (acquire: changelog.Handoff); stopped here, the claim would read again
// from the broker what it held back.
func (tp *tableParts) setFollowed(want, active map[string][]int32) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for table, ps := range want {
		for _, q := range ps {
			tp.get(restoreKey{table, q})
		}
	}
	for k, p := range tp.parts {
		p.wantFollow = slices.Contains(want[k.table], k.p)
		switch {
		case p.wantFollow && p.claims == 0:
			tp.startFollower(k, p)
		case !p.wantFollow && p.stopFollow != nil && !slices.Contains(active[k.table], k.p):
			p.stopFollow()
			p.stopFollow, p.handoff = nil, nil
			tp.followed(k, false)
		}
	}
}

// acquire makes table partition k active for one claim: the claim that
// starts the activation promotes or stops its follower and restores it once
// (every other claim of the activation waits for that) and marks it
// writable.
func (tp *tableParts) acquire(ctx context.Context, k restoreKey, topic string, start int64) error {
	t := tp.w.tableByName(k.table)
	tp.mu.Lock()
	p := tp.get(k)
	p.claims++
	// The claim that starts the activation (creates its gate) takes over
	// the follower and brings the partition up; the activation's other
	// claims wait for it. No follower starts while a claim holds the
	// partition (setFollowed, release), so a gate and a follower never
	// exist at once.
	first := p.gate == nil
	var stopFollow context.CancelFunc
	var handoff *changelog.Handoff
	var followDone chan struct{}
	rebuild := false
	if first {
		p.gate = &restoreGate{done: make(chan struct{})}
		stopFollow, handoff, followDone = p.stopFollow, p.handoff, p.followDone
		p.stopFollow, p.handoff = nil, nil
		if stopFollow != nil {
			tp.followed(k, false) // the claim takes the follower over (restoring)
		}
		rebuild, p.rebuild = p.rebuild, false
	}
	g := p.gate
	tp.mu.Unlock()
	w := tp.w
	if first {
		defer close(g.done)
		res, committed, err := w.promoteOrRestore(ctx, t, k, stopFollow, handoff, followDone, rebuild)
		if err != nil {
			g.err = err
			return err
		}
		g.committed = committed
		if err := tp.checkStart(k, g, topic, start); err != nil {
			g.err = err
			return err
		}
		w.restored.Add(res.Records)
		w.restoredSpan.Add(res.To - res.Start)
		w.metrics.restored.WithLabelValues(k.table).Add(float64(res.Records))
		lvl := slog.LevelDebug // the restore summary (changelog.ProgressLog) has the totals
		if res.Rebuilt {
			lvl = slog.LevelInfo
		}
		w.log.Log(ctx, lvl, "restored", "table", k.table, "partition", k.p, "records", res.Records,
			"from", res.From, "to", res.To, "rebuilt", res.Rebuilt, "promoted", res.Promoted, "elapsed", res.Elapsed)
		if g.err = w.activatePartition(t, k.p); g.err == nil {
			g.err = t.state.SetActive(k.p, true)
		}
		return g.err
	}
	select {
	case <-g.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if g.err != nil {
		return g.err
	}
	return tp.checkStart(k, g, topic, start)
}

// testRestoreOffsets, set by tests only, changes the committed offsets an
// activation's restore uses, as offsets that moved between the claim's fetch
// and the restore's would (checkStart).
var testRestoreOffsets func(m map[string]map[int32]int64)

// errStartMismatch: a claim would start at another offset than the one the
// activation's restore took as committed for its partition.
var errStartMismatch = errors.New("claim start differs from the committed offset the table was restored to")

// checkStart checks the invariant that makes a claim's records and its
// task's tables agree: the store holds the effects of exactly the source
// records below the committed offsets the restore used (g.committed), so
// the claim of topic partition k.p must start at that offset. The claim's
// start was fetched before the restore's offsets (Sarama fetches it before
// the claim runs), and no other member commits the partition's offsets while
// it is handed over, so the two agree; when they do not (offsets that moved
// between the two fetches, by a path this check exists to catch), the store
// would either lack effects the start skips (lost updates) or hold effects
// of records processed again (double counts). The partition is then marked
// for a rebuild and errStartMismatch returned: the claim fails, the session
// restarts, and the next activation restores the store from the start of
// its changelog under the offsets of that moment. start < 0 (Sarama's
// sentinel for a partition the group never committed) matches an offset of
// 0 or none.
func (tp *tableParts) checkStart(k restoreKey, g *restoreGate, topic string, start int64) error {
	want, ok := g.committed[topic][k.p]
	if !ok || (start < 0 && want <= 0) || start == want {
		return nil
	}
	tp.mu.Lock()
	tp.get(k).rebuild = true
	tp.mu.Unlock()
	tp.w.log.Error("a claim's start offset differs from the committed offset its table partition was restored to; the partition will be rebuilt",
		"table", k.table, "partition", k.p, "topic", topic, "claim_start", start, "restored_to", want)
	tp.w.metrics.startMismatch.WithLabelValues(k.table).Inc()
	return fmt.Errorf("%s[%d]: table %s: claim starts at %d, table restored to committed offset %d: %w", topic, k.p, k.table, start, want, errStartMismatch)
}

// promoteOrRestore brings table partition k up to its changelog's highwater
// for an activation: it promotes the partition's standby follower in place
// when one runs (changelog.Handoff: the records it held back are applied
// from memory, no new partition consumer), and otherwise, or when the
// follower declines, stops it and restores (changelog.Restore). Either way
// the store ends as Restore under the group's committed offsets of now (after
// the previous owner's final commit) leaves it. stop, h and done are the
// follower's, nil when none runs.
func (w *Worker) promoteOrRestore(ctx context.Context, t *tableRuntime, k restoreKey, stop context.CancelFunc, h *changelog.Handoff, done chan struct{}, rebuild bool) (changelog.Result, map[string]map[int32]int64, error) {
	if stop == nil {
		stop = func() {}
		h = nil // cannot happen: the two are set and cleared together
	}
	m, err := w.committedOffsets(ctx)
	if err != nil {
		stop()
		return changelog.Result{}, nil, err
	}
	if testRestoreOffsets != nil {
		testRestoreOffsets(m)
	}
	committed := committedFunc(m)
	if rebuild {
		h = nil // the standby's store is the one to rebuild
	}
	if h != nil {
		res, err := h.Promote(ctx, committed, done)
		stop() // a follower that promoted has ended or is ending
		if !errors.Is(err, changelog.ErrNotPromoted) {
			// The follower ended; wait for it to release the partition
			// (the restorer's consumer takes it once).
			select {
			case <-done:
			case <-ctx.Done():
				return res, m, ctx.Err()
			}
			return res, m, err
		}
		w.log.Debug("standby not promoted; restoring", "table", k.table, "partition", k.p, "err", err)
	} else {
		stop()
	}
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return changelog.Result{}, m, ctx.Err()
		}
	}
	if rebuild {
		w.log.Warn("rebuilding the table partition from the start of its changelog", "table", k.table, "partition", k.p)
		if err := t.store.DropPartition(k.p); err != nil {
			return changelog.Result{}, m, fmt.Errorf("rebuild %s[%d]: %w", k.table, k.p, err)
		}
	}
	res, err := w.restorer.Restore(ctx, t.state.Topic(), k.p, t.store, changelog.SkipUncommitted(committed))
	res.Rebuilt = res.Rebuilt || rebuild
	return res, m, err
}

// release ends one claim's hold on each of keys; a partition whose last claim
// ended becomes read-only and is followed again if it is a standby.
func (tp *tableParts) release(keys []restoreKey) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, k := range keys {
		p := tp.get(k)
		if p.claims--; p.claims > 0 {
			continue
		}
		p.claims = 0
		if t := tp.w.tableByName(k.table); t != nil {
			_ = t.state.SetActive(k.p, false) // deactivation cannot fail
			tp.w.deactivatePartition(t, k.p)
		}
		p.gate = nil
		if p.wantFollow {
			tp.startFollower(k, p)
		}
	}
}

// restoredAll reports whether every active table partition of a finished its
// restore.
func (tp *tableParts) restoredAll(a assignor.Assignment) bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for _, t := range tp.w.tables {
		for _, q := range a.Actives[t.state.Topic()] {
			p := tp.parts[restoreKey{t.def.Name(), q}]
			if p == nil || p.gate == nil {
				return false
			}
			select {
			case <-p.gate.done:
				if p.gate.err != nil {
					return false
				}
			default:
				return false
			}
		}
	}
	return true
}

// stop ends every follower and waits for them.
func (tp *tableParts) stop() {
	tp.mu.Lock()
	for k, p := range tp.parts {
		if p.stopFollow != nil {
			p.stopFollow()
			p.stopFollow, p.handoff = nil, nil
			tp.followed(k, false)
		}
	}
	tp.mu.Unlock()
	tp.bg.Wait()
}

// claimContext returns the context of one claim: it ends with the session or
// when an assignment no longer holds the partition (the cooperative protocol
// revokes single partitions inside a session: sarama then closes the claim's
// Messages channel and waits for ConsumeClaim to return). done unregisters it.
func (w *Worker) claimContext(sess sarama.ConsumerGroupSession, topic string, p int32) (context.Context, func()) {
	ctx, cancel := context.WithCancel(sess.Context())
	k := restoreKey{topic, p}
	w.mu.Lock()
	if w.claims == nil {
		w.claims = map[restoreKey]context.CancelFunc{}
	}
	w.claims[k] = cancel
	revoked := w.assignment.Actives != nil && !slices.Contains(w.assignment.Actives[topic], p)
	w.mu.Unlock()
	if revoked {
		cancel()
	}
	return ctx, func() {
		w.mu.Lock()
		delete(w.claims, k)
		w.mu.Unlock()
		cancel()
	}
}

// Running reports what this worker runs right now: claims maps each source
// topic to the partitions whose ConsumeClaim runs; followed maps each table
// changelog topic to the partitions a standby follower tails. Tests compare
// it with Assignment (actives and standbys plus warm-ups).
func (w *Worker) Running() (claims, followed map[string][]int32) {
	claims, followed = map[string][]int32{}, map[string][]int32{}
	w.mu.Lock()
	for k := range w.claims {
		claims[k.table] = append(claims[k.table], k.p)
	}
	w.mu.Unlock()
	if w.parts != nil {
		w.parts.mu.Lock()
		for k, p := range w.parts.parts {
			if p.stopFollow != nil {
				if t := w.tableByName(k.table); t != nil {
					followed[t.state.Topic()] = append(followed[t.state.Topic()], k.p)
				}
			}
		}
		w.parts.mu.Unlock()
	}
	for _, m := range []map[string][]int32{claims, followed} {
		for t := range m {
			slices.Sort(m[t])
		}
	}
	return claims, followed
}
