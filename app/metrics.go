package app

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/task"
)

// metrics are one worker's Prometheus collectors (a registry per worker, so
// that several workers in one process, as in dev mode, do not collide), and
// the recent events the status page shows. The instruments are updated where
// the events happen (worker.go, tasks.go, redeliver.go, dlq.go: one call
// each); gauges of state (lag, task states, standby lag) are read from the
// worker at scrape time (workerCollector).
//
// Names follow runnel_<noun>_<unit>; labels use the log attribute keys
// (topic, partition, agent, table).
type metrics struct {
	reg       *prometheus.Registry
	committed *prometheus.CounterVec
	restored  *prometheus.CounterVec

	restarts        *prometheus.CounterVec
	dupsSkipped     *prometheus.CounterVec
	startMismatch   *prometheus.CounterVec
	taskTransitions *prometheus.CounterVec
	taskInvalid     prometheus.Counter
	cycleRecords    prometheus.Counter
	cycleSeconds    prometheus.Histogram
	cycleSize       prometheus.Histogram
	timerFirings    *prometheus.CounterVec // timers.go

	processed    *prometheus.CounterVec // topic, agent
	sent         *prometheus.CounterVec // topic (destination), agent
	retried      *prometheus.CounterVec // topic, agent
	deadLetters  *prometheus.CounterVec // topic (source), agent
	ackTimeouts  *prometheus.CounterVec // topic, agent
	cacheFlushes *prometheus.CounterVec // table
	restoreLeft  *prometheus.GaugeVec   // table, partition
	restoreRate  *prometheus.GaugeVec   // table, partition
	rebalances   prometheus.Counter
	rebalanceDur prometheus.Histogram
	generation   prometheus.Gauge
	// cacheWaits and cacheWaitSeconds count the waits of a source whose
	// task's write cache of the table was at its hard limit, and their
	// time (claimProducer.awaitCacheRoom); by table.
	cacheWaits, cacheWaitSeconds *prometheus.CounterVec

	nRetried, nDeadLettered atomic.Int64

	mu          sync.Mutex
	claims      map[restoreKey]*claimPos          // running claims (topic, partition); guarded by mu
	restores    map[restoreKey]changelog.Progress // latest progress per changelog (topic, partition); guarded by mu
	dlqByAgent  map[string]int64                  // dead letters written per agent; guarded by mu
	joinStarted time.Time                         // first JoinGroup of the rebalance under way, zero when none; guarded by mu
	history     []RebalanceEvent                  // the last maxHistory rebalances, oldest first; guarded by mu
	txn         txnMetrics                        // ExactlyOnce transactions (txn.go)
}

// txnMetrics are the ExactlyOnce transactions' collectors (txn.go).
type txnMetrics struct {
	commits, aborts, timedOut prometheus.Counter
	resent                    prometheus.Counter // offset commits sent again under a new generation
	seconds                   prometheus.Histogram
	renewals                  *prometheus.CounterVec // by reason: fenced, timeout, failed
}

func newTxnMetrics(reg *prometheus.Registry) txnMetrics {
	t := txnMetrics{
		commits: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_transactions_committed_total",
			Help: "ExactlyOnce: transactions committed (one per worker commit cycle)."}),
		aborts: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_transactions_aborted_total",
			Help: "ExactlyOnce: transactions aborted (every partition then restarts from its committed offsets)."}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnel_transaction_commit_seconds",
			Help: "ExactlyOnce: time to add the offsets to a transaction and commit it.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		resent: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_transaction_offset_commits_resent_total",
			Help: "ExactlyOnce: offset commits the group coordinator refused for a generation the group had just left (a rebalance between a cycle's cut and its commit), sent again in the same transaction under the member's new generation instead of aborting it."}),
		timedOut: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_transactions_timed_out_total",
			Help: "ExactlyOnce: transactions aborted after they were open at least the transaction timeout (the broker aborts them)."}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runnel_transactional_producer_renewals_total",
			Help: "ExactlyOnce: transactional producers replaced by a new one with the same transactional ID (new epoch), by reason: fenced (another producer initialized the ID), timeout (the broker aborted a transaction open past its timeout), failed (an abort or begin that failed otherwise)."}, []string{"reason"}),
	}
	reg.MustRegister(t.commits, t.aborts, t.resent, t.timedOut, t.seconds, t.renewals)
	return t
}

// maxHistory is how many rebalances the status page lists.
const maxHistory = 20

// claimPos is a running claim as lag sees it: the claim (its highwater, from
// the last fetch response) and the next offset to process (the offset after
// the last resolved record, as marked for commit).
type claimPos struct {
	claim sarama.ConsumerGroupClaim
	next  atomic.Int64
	sub   atomic.Pointer[kafka.Sub] // the Fetcher's reader of the partition, if any: its highwater is current
}

// RebalanceEvent is one rebalance as this member saw it: the assignment it
// received and how long it took from the member's first JoinGroup of the
// rebalance to the assignment (SyncGroup).
type RebalanceEvent struct {
	Generation int32     `json:"generation"`
	At         time.Time `json:"at"`
	// DurationMS is 0 when the start was not seen (a rebalance led by the
	// group coordinator without this member re-joining first).
	DurationMS float64 `json:"duration_ms"`
	Leader     bool    `json:"leader"`
	Actives    int     `json:"actives"`
	Standbys   int     `json:"standbys"`
	Warmups    int     `json:"warmups"`
}

func newMetrics(w *Worker) *metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &metrics{reg: prometheus.NewRegistry(),
		committed: counter("runnel_records_advanced_total",
			"Source records advanced (resolved by every agent and marked for commit).", "topic"),
		restored: counter("runnel_restore_records_total",
			"Changelog records replayed into local stores by active restores (added when a restore ends).", "table"),
		restarts: counter("runnel_partition_restarts_total",
			"Partition restarts in place after a failed record (redelivery from the last commit point).", "topic"),
		dupsSkipped: counter("runnel_repartition_duplicates_skipped_total",
			"At-least-once: records of a repartition topic skipped because an earlier run of their source partition already delivered them (agent.Deterministic).", "topic"),
		startMismatch: counter("runnel_claim_start_mismatches_total",
			"Claims that would have started at another offset than the one their table partition was restored to (the partition is rebuilt; should stay 0).", "table"),
		taskTransitions: counter("runnel_task_transitions_total",
			"Task state transitions, by the state entered.", "to"),
		taskInvalid: prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_task_invalid_transitions_total",
			Help: "Task state transitions refused as outside the table of valid transitions (a bug in Runnel; should stay 0)."}),
		processed: counter("runnel_records_processed_total",
			"Source records resolved by an agent (acked, rejected or dead-lettered), per agent.", "topic", "agent"),
		sent: counter("runnel_records_sent_total",
			"Sink records an agent sent and the broker acknowledged, by destination topic.", "topic", "agent"),
		retried: counter("runnel_records_retried_total",
			"Failed deliveries of a source record that are redelivered (Redelivery.MaxRetries), by the failing agent.", "topic", "agent"),
		deadLetters: counter("runnel_dead_letters_total",
			"Source records written to an agent's dead-letter topic and acknowledged, by source topic.", "topic", "agent"),
		ackTimeouts: counter("runnel_ack_timeouts_total",
			"Agent streams failed because a record was not resolved within the ack timeout.", "topic", "agent"),
		cacheFlushes: counter("runnel_cache_flushes_total",
			"Commit cycles asked for early because a table partition's write cache reached its size (WithCacheBytes).", "table"),
		cacheWaits: counter("runnel_write_cache_waits_total",
			"Times a source partition stopped handing out records because its task's write cache of the table was at its hard limit (WithWriteCacheLimit) while a cut was blocked.", "table"),
		cacheWaitSeconds: counter("runnel_write_cache_wait_seconds_total",
			"Seconds source partitions spent waiting for a cycle to cut a write cache at its hard limit (WithWriteCacheLimit); added when each wait ends.", "table"),
		restoreLeft: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "runnel_restore_remaining_records",
			Help: "Changelog offsets an active restore still has to read (target highwater minus position); 0 when done."}, []string{"table", "partition"}),
		restoreRate: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "runnel_restore_rate_records_per_second",
			Help: "Offsets per second an active restore read so far (last progress report)."}, []string{"table", "partition"}),
		claims:     map[restoreKey]*claimPos{},
		restores:   map[restoreKey]changelog.Progress{},
		dlqByAgent: map[string]int64{},
	}
	m.cycleRecords = prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_cycle_changelog_records_total",
		Help: "Changelog records written by commit cycles (one per dirty key per cycle)."})
	m.cycleSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnel_cycle_duration_seconds",
		Help: "Duration of commit cycles that wrote records: cut, flush, commit, apply.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)})
	m.timerFirings = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runnel_timer_firings_total",
		Help: "Timer firings (agent.Every) that completed, by agent and clock."}, []string{"agent", "clock"})
	m.cycleSize = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnel_cycle_size_records",
		Help: "Changelog records written by one commit cycle (cycles that wrote records).", Buckets: prometheus.ExponentialBuckets(1, 4, 10)})
	m.rebalances = prometheus.NewCounter(prometheus.CounterOpts{Name: "runnel_rebalances_total",
		Help: "Assignments this member received (one per completed rebalance it took part in)."})
	m.rebalanceDur = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "runnel_rebalance_duration_seconds",
		Help:    "Time from this member's first JoinGroup of a rebalance to its assignment (SyncGroup).",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)})
	m.generation = prometheus.NewGauge(prometheus.GaugeOpts{Name: "runnel_group_generation",
		Help: "Consumer group generation of this member's latest assignment."})
	m.reg.MustRegister(m.committed, m.restored, m.restarts, m.dupsSkipped, m.startMismatch, m.taskTransitions, m.taskInvalid, m.cycleRecords, m.cycleSeconds, m.cycleSize,
		m.processed, m.sent, m.retried, m.deadLetters, m.ackTimeouts, m.cacheFlushes, m.cacheWaits, m.cacheWaitSeconds, m.restoreLeft, m.restoreRate,
		m.rebalances, m.rebalanceDur, m.generation, m.timerFirings,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&workerCollector{w: w})
	m.txn = newTxnMetrics(m.reg)
	m.presetSeries(w)
	return m
}

// presetSeries creates, at 0, the series of every counter for the label
// values the topology knows (each agent's source topic, declared sinks and
// timers, each table, each task state), so that a counter has a series from
// the worker's start instead of from its first event: an alert on
// `increase(runnel_ack_timeouts_total[5m]) > 0` or a dashboard's rate has
// something to match before the first ack timeout.
func (m *metrics) presetSeries(w *Worker) {
	if w.graph == nil {
		return // a worker built by a package test without a topology
	}
	for _, a := range w.graph.Agents {
		if a.Source == "" {
			continue
		}
		m.committed.WithLabelValues(a.Source)
		m.restarts.WithLabelValues(a.Source)
		m.dupsSkipped.WithLabelValues(a.Source)
		m.processed.WithLabelValues(a.Source, a.Name)
		m.retried.WithLabelValues(a.Source, a.Name)
		m.ackTimeouts.WithLabelValues(a.Source, a.Name)
		if a.DeadLetterTopic != "" {
			m.deadLetters.WithLabelValues(a.Source, a.Name)
		}
		for _, sink := range a.Sinks {
			m.sent.WithLabelValues(sink, a.Name)
		}
	}
	for _, r := range w.app.agents {
		for _, tm := range r.Settings().Timers {
			m.timerFirings.WithLabelValues(r.Name(), timerClock(tm))
		}
	}
	for _, d := range w.app.tables {
		m.restored.WithLabelValues(d.Name())
		// A global table's partitions written by this worker's tasks have
		// write caches too (tablestate.GlobalState), held to the same limit.
		m.cacheWaits.WithLabelValues(d.Name())
		m.cacheWaitSeconds.WithLabelValues(d.Name())
		if !isGlobal(d) { // a global table has no write cache and no claims
			m.startMismatch.WithLabelValues(d.Name())
			m.cacheFlushes.WithLabelValues(d.Name())
		}
	}
	for _, s := range task.States() {
		if s != task.Created { // every transition leaves created
			m.taskTransitions.WithLabelValues(s.String())
		}
	}
	for _, reason := range []string{"fenced", "timeout", "failed"} { // txn.go's renewal reasons
		m.txn.renewals.WithLabelValues(reason)
	}
}

// advanced counts n source records resolved on topic by each of agents.
func (m *metrics) advanced(topic string, agents []string, n int) {
	m.committed.WithLabelValues(topic).Add(float64(n))
	for _, a := range agents {
		m.processed.WithLabelValues(topic, a).Add(float64(n))
	}
}

// cycle records one commit cycle that wrote records changelog records.
func (m *metrics) cycle(records int, elapsed time.Duration) {
	m.cycleRecords.Add(float64(records))
	m.cycleSeconds.Observe(elapsed.Seconds())
	m.cycleSize.Observe(float64(records))
}

// retry counts one redelivery of a record of topic failed by the agents.
func (m *metrics) retry(topic string, agents []string) {
	m.nRetried.Add(1)
	for _, a := range agents {
		m.retried.WithLabelValues(topic, a).Inc()
	}
}

// deadLettered counts one dead letter of agent for a record of topic.
func (m *metrics) deadLettered(topic, agent string) {
	m.nDeadLettered.Add(1)
	m.deadLetters.WithLabelValues(topic, agent).Inc()
	m.mu.Lock()
	m.dlqByAgent[agent]++
	m.mu.Unlock()
}

// agentFailed counts an agent's stream that failed on an ack timeout.
func (m *metrics) agentFailed(topic, agent string, err error) {
	var at *source.AckTimeoutError
	if errors.As(err, &at) {
		m.ackTimeouts.WithLabelValues(topic, agent).Inc()
	}
}

// agentEnv returns env as agent r's events and timer firings use it: with
// r's declared tables and sinks (agent.WritesTo, agent.SendsTo; a write or a
// send outside them is refused, table.UndeclaredError) and a Send that
// counts the acknowledged sink records of r.
//
// The per-record cost is kept off the common case: the counter of the last
// destination topic is cached (most agents send to one topic), and an
// answer receiver that can count its own success (the agent's events:
// ackCounter) is told to instead of being wrapped in a countedAck, one
// allocation per sink record less.
func (w *Worker) agentEnv(env *tablestate.Env, r agentrt.Runner) *tablestate.Env {
	m, name := w.metrics, r.Name()
	e := *env
	e.Agent, e.Writes, e.Sends = name, nil, nil
	for _, t := range r.Settings().Tables {
		e.Writes = append(e.Writes, t.Name())
	}
	for _, t := range r.Settings().Sinks {
		e.Sends = append(e.Sends, t.Name())
	}
	e.SendFrom = nil
	if r.Settings().Deterministic && w.txn == nil && env.Send != nil {
		e.SendFrom = w.sendFrom // dedup.go
	}
	send := env.Send
	if send == nil {
		return &e
	}
	var counters sync.Map                // destination topic → *sinkCounter of name
	var last atomic.Pointer[sinkCounter] // the counter of the last destination
	e.Send = func(topic string, p int32, key, value []byte, ack tablestate.Acker) error {
		c := last.Load()
		if c == nil || c.topic != topic {
			v, ok := counters.Load(topic)
			if !ok {
				sc := m.sent.WithLabelValues(topic, name)
				v, _ = counters.LoadOrStore(topic, &sinkCounter{topic: topic, counter: sc, inc: sc.Inc})
			}
			c = v.(*sinkCounter)
			last.Store(c)
		}
		if ac, ok := ack.(ackCounter); ok && ac.CountAcked(c.inc) {
			return send(topic, p, key, value, ack)
		}
		return send(topic, p, key, value, &countedAck{ack: ack, sent: c.counter})
	}
	return &e
}

// sinkCounter is runnel_records_sent_total of one (destination topic,
// agent), with its Inc as a func value made once.
type sinkCounter struct {
	topic   string
	counter prometheus.Counter
	inc     func()
}

// ackCounter is an answer receiver that counts its own success: CountAcked
// makes a successful answer call inc once; false when it cannot (then the
// sender wraps it in a countedAck). The agent's sink records implement it.
type ackCounter interface {
	CountAcked(inc func()) bool
}

// countedAck counts a sink record the broker acknowledged, then passes the
// answer on.
type countedAck struct {
	ack  tablestate.Acker
	sent prometheus.Counter
}

// Acked implements tablestate.Acker.
func (a *countedAck) Acked(off int64, err error) {
	if err == nil {
		a.sent.Inc()
	}
	if a.ack != nil {
		a.ack.Acked(off, err)
	}
}

// trackClaim registers a running claim for the lag gauge; the returned func
// unregisters it.
func (m *metrics) trackClaim(claim sarama.ConsumerGroupClaim) func() {
	k := restoreKey{claim.Topic(), claim.Partition()}
	c := &claimPos{claim: claim}
	c.next.Store(claim.InitialOffset())
	m.mu.Lock()
	m.claims[k] = c
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if m.claims[k] == c {
			delete(m.claims, k)
		}
		m.mu.Unlock()
	}
}

// claimSub records that sub reads topic partition p (its highwater is the
// claim's: the claim's own fetching is paused).
func (m *metrics) claimSub(topic string, p int32, sub *kafka.Sub) {
	m.mu.Lock()
	c := m.claims[restoreKey{topic, p}]
	m.mu.Unlock()
	if c != nil {
		c.sub.Store(sub)
	}
}

// position records next, the offset marked for commit on topic partition p
// (the next record to process).
func (m *metrics) position(topic string, p int32, next int64) {
	m.mu.Lock()
	c := m.claims[restoreKey{topic, p}]
	m.mu.Unlock()
	if c != nil {
		c.next.Store(next)
	}
}

// PartitionLag is the consumer lag of one claimed source partition.
type PartitionLag struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	// Highwater is the partition's end offset at the last fetch response;
	// Position the next offset to process (the offset marked for commit);
	// Lag is Highwater - Position, at least 0.
	Highwater int64 `json:"highwater"`
	Position  int64 `json:"position"`
	Lag       int64 `json:"lag"`
}

// lags returns the lag of every running claim, by topic and partition.
func (m *metrics) lags() []PartitionLag {
	m.mu.Lock()
	out := make([]PartitionLag, 0, len(m.claims))
	for k, c := range m.claims {
		hw, pos := c.claim.HighWaterMarkOffset(), c.next.Load()
		if s := c.sub.Load(); s != nil {
			if h := s.HighWatermark(); h >= 0 {
				hw = h
			}
		}
		switch pos {
		case sarama.OffsetNewest: // no committed offset, no record resolved yet
			pos = hw
		case sarama.OffsetOldest:
			pos = 0
		}
		out = append(out, PartitionLag{Topic: k.table, Partition: k.p, Highwater: hw, Position: pos, Lag: max(hw-pos, 0)})
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b PartitionLag) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	return out
}

// restoreProgress is changelog.Restorer.OnProgress: the remaining-records and
// rate gauges, and the status page's restore list. tableOf maps a changelog
// topic to its table.
func (m *metrics) restoreProgress(tableOf func(string) string) func(changelog.Progress) {
	return func(pr changelog.Progress) {
		tbl := tableOf(pr.Topic)
		p := strconv.Itoa(int(pr.Partition))
		left := max(pr.Target-pr.Position, 0)
		if pr.Done {
			left = 0
		}
		m.restoreLeft.WithLabelValues(tbl, p).Set(float64(left))
		m.restoreRate.WithLabelValues(tbl, p).Set(pr.Rate)
		m.mu.Lock()
		m.restores[restoreKey{pr.Topic, pr.Partition}] = pr
		m.mu.Unlock()
	}
}

// forgetRestores drops the restores of the changelog partitions this worker
// no longer holds a copy of (held false; a copy kept as a standby or warm-up
// keeps its last restore): their entries of the status page's list and their
// restore gauges, labelled by tableOf(topic). Status filters its list by the
// assignment as well, for a last report of a revoked partition's restore
// that arrives after the assignment.
func (m *metrics) forgetRestores(held func(topic string, p int32) bool, tableOf func(string) string) {
	m.mu.Lock()
	var gone []restoreKey
	for k := range m.restores {
		if !held(k.table, k.p) {
			gone = append(gone, k)
			delete(m.restores, k)
		}
	}
	m.mu.Unlock()
	for _, k := range gone {
		tbl, p := tableOf(k.table), strconv.Itoa(int(k.p))
		m.restoreLeft.DeleteLabelValues(tbl, p)
		m.restoreRate.DeleteLabelValues(tbl, p)
	}
}

// joining records the start of a JoinGroup (assignor Config.Offsets is called
// before every one); the first since the last assignment starts the
// rebalance's clock.
func (m *metrics) joining() {
	m.mu.Lock()
	if m.joinStarted.IsZero() {
		m.joinStarted = time.Now()
	}
	m.mu.Unlock()
}

// assigned records a completed rebalance.
func (m *metrics) assigned(a assignor.Assignment) {
	now := time.Now()
	count := func(tp map[string][]int32) int {
		n := 0
		for _, ps := range tp {
			n += len(ps)
		}
		return n
	}
	ev := RebalanceEvent{Generation: a.Generation, At: now.UTC(), Leader: a.Leader,
		Actives: count(a.Actives), Standbys: count(a.Standbys), Warmups: count(a.Warmups)}
	m.mu.Lock()
	if !m.joinStarted.IsZero() {
		d := now.Sub(m.joinStarted)
		ev.DurationMS = float64(d.Microseconds()) / 1000
		m.rebalanceDur.Observe(d.Seconds())
	}
	m.joinStarted = time.Time{}
	m.history = append(m.history, ev)
	if len(m.history) > maxHistory {
		m.history = slices.Delete(m.history, 0, len(m.history)-maxHistory)
	}
	m.mu.Unlock()
	m.rebalances.Inc()
	m.generation.Set(float64(a.Generation))
}

// workerCollector reads the worker's state at scrape time: consumer lag per
// claimed partition, standby lag per followed changelog partition, task
// states, table cache hits and misses.
type workerCollector struct{ w *Worker }

var (
	descLag = prometheus.NewDesc("runnel_consumer_lag_records",
		"Source records of a claimed partition not yet processed: highwater (last fetch response) minus the offset marked for commit.",
		[]string{"topic", "partition"}, nil)
	descStandbyLag = prometheus.NewDesc("runnel_standby_lag_records",
		"Changelog offsets a standby or warm-up replica is behind: changelog highwater minus the offset after the last applied record.",
		[]string{"table", "partition"}, nil)
	descTaskState = prometheus.NewDesc("runnel_task_state",
		"1 for each task of this worker in its current state (task = partition of a co-partitioned group of partitions partitions).",
		[]string{"partition", "partitions", "state"}, nil)
	descCacheHits = prometheus.NewDesc("runnel_cache_hits_total",
		"Table reads answered by the write cache of the current or flushing commit cycle.", []string{"table"}, nil)
	descCacheMisses = prometheus.NewDesc("runnel_cache_misses_total",
		"Table reads that went to the local store.", []string{"table"}, nil)
)

// Describe implements prometheus.Collector.
func (c *workerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLag, descStandbyLag, descTaskState, descCacheHits, descCacheMisses} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *workerCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.w
	for _, l := range w.metrics.lags() {
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(l.Lag), l.Topic, strconv.Itoa(int(l.Partition)))
	}
	for _, s := range w.standbyLags(w.Assignment(), w.liveHighwater) {
		ch <- prometheus.MustNewConstMetric(descStandbyLag, prometheus.GaugeValue, float64(s.Lag), s.Table, strconv.Itoa(int(s.Partition)))
	}
	for _, t := range w.tasks.status() { // no changelog positions: no broker round trips per scrape
		ch <- prometheus.MustNewConstMetric(descTaskState, prometheus.GaugeValue, 1,
			strconv.Itoa(int(t.Partition)), strconv.Itoa(int(t.Partitions)), t.State)
	}
	for _, t := range w.tables {
		hits, misses := t.state.CacheStats()
		ch <- prometheus.MustNewConstMetric(descCacheHits, prometheus.CounterValue, float64(hits), t.def.Name())
		ch <- prometheus.MustNewConstMetric(descCacheMisses, prometheus.CounterValue, float64(misses), t.def.Name())
	}
}

// StandbyLag is how far one followed changelog partition (standby or
// warm-up) is behind.
type StandbyLag struct {
	Table     string `json:"table"`
	Partition int32  `json:"partition"`
	// Warmup is set for a warm-up replica (it takes the active once caught up).
	Warmup bool `json:"warmup"`
	// Highwater is the changelog's end offset; Applied the offset after the
	// last record applied to the local store; Lag the difference.
	Highwater int64 `json:"highwater"`
	Applied   int64 `json:"applied"`
	Lag       int64 `json:"lag"`
}

// standbyLags returns the lag of every changelog partition this worker
// follows under a, with the highwaters from hw (asked of the brokers by the
// scrape; cached by the status page). A partition whose highwater hw does
// not know is left out.
func (w *Worker) standbyLags(a assignor.Assignment, hw highwaterFunc) []StandbyLag {
	out := []StandbyLag{}
	for _, t := range w.tables {
		topic := t.state.Topic()
		for _, kind := range []struct {
			ps     []int32
			warmup bool
		}{{a.Standbys[topic], false}, {a.Warmups[topic], true}} {
			for _, p := range kind.ps {
				c, err := w.copyLagWith(t, p, hw)
				if err != nil {
					continue
				}
				out = append(out, StandbyLag{Table: t.def.Name(), Partition: p, Warmup: kind.warmup,
					Highwater: c.highwater, Applied: c.applied, Lag: c.lag()})
			}
		}
	}
	return out
}

// tableOfChangelog returns the table whose changelog is topic (topic itself
// when none).
func (w *Worker) tableOfChangelog(topic string) string {
	for _, t := range w.graph.Tables {
		if t.Changelog == topic {
			return t.Name
		}
	}
	return topic
}

// Retried returns how many failed deliveries of source records this worker
// redelivered.
func (w *Worker) Retried() int64 { return w.metrics.nRetried.Load() }

// DeadLettered returns how many dead letters this worker wrote (one per
// rejecting or failing agent of a record).
func (w *Worker) DeadLettered() int64 { return w.metrics.nDeadLettered.Load() }

// serveHTTP serves /healthz, /readyz, /metrics, the status page and the
// JSON API (status.go) on addr.
func (w *Worker) serveHTTP(addr string) (func() error, error) {
	mux := w.httpMux()
	ln, err := net.Listen("tcp", listenAddr(addr))
	if err != nil {
		return nil, fmt.Errorf("http listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	w.log.Info("http listening", "addr", ln.Addr().String())
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return srv.Shutdown(ctx)
	}, nil
}

// joinErrors returns nil for no error, the error itself for one (no "1 error
// occurred" wrapper around it), and errors.Join of all of them otherwise (one
// line each; errors.Is and errors.As see every one).
func joinErrors(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	return errors.Join(errs...)
}

// oneError unwraps a go-multierror that holds a single error, whose text would
// otherwise read "1 error occurred: * ..." (internal/kafka.EnsureTopics
// returns one); any other error is returned as it is.
func oneError(err error) error {
	if m, ok := err.(interface{ WrappedErrors() []error }); ok {
		if ws := m.WrappedErrors(); len(ws) == 1 {
			return ws[0]
		}
	}
	return err
}

// errEmbedded is returned when a worker is pointed at "embedded" outside dev mode.
var errEmbedded = errors.New(`brokers "embedded" start an in-process broker only in dev mode; run "dev", or point --brokers at a Kafka cluster`)

func resolveBrokers(b []string) ([]string, error) {
	if len(b) == 0 {
		return nil, errors.New("no brokers configured (RUNNEL_BROKERS or --brokers)")
	}
	if len(b) == 1 && b[0] == "embedded" {
		return nil, errEmbedded
	}
	return b, nil
}

// agentNames names the agents of the partition's topic.
func (pt *partition) agentNames() []string {
	names := make([]string, len(pt.runners))
	for i, r := range pt.runners {
		names[i] = r.Name()
	}
	return names
}
