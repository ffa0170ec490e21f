package app

import (
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/table"
	"github.com/runnel-dev/runnel/topology"
)

// App is a Runnel application: its declared topics, agents and tables, and the
// settings its workers run with. Declare everything before calling Main or
// starting a worker; declarations are not safe for concurrent use.
type App struct {
	id     string
	cfg    Config
	topics map[string]agent.TopicDef
	agents []agent.Runner
	tables []table.Def
	errs   []error
}

// Config holds an app's settings. Options set them; environment variables
// (RUNNEL_*) override options, and CLI flags override both.
type Config struct {
	// Brokers is the bootstrap list; "embedded" starts the in-process broker.
	// Env RUNNEL_BROKERS (comma-separated). Default localhost:9092.
	Brokers []string
	// DataDir holds the Pebble stores (one directory per table). Env
	// RUNNEL_DATA_DIR. Default ./var.
	DataDir string
	// CommitInterval is how often resolved offsets are committed, and how
	// often each task runs a commit cycle (its table writes go to the
	// changelog and the store; docs/tables.md); default 2.8 s (Faust's
	// default; Kafka Streams uses 30 s under at-least-once). Offsets are also
	// committed on every revoke and on shutdown.
	CommitInterval time.Duration
	// AcceptableRecoveryLag, MaxWarmupReplicas and ProbingRebalanceInterval
	// are KIP-441's acceptable.recovery.lag (offsets; default 10 000),
	// max.warmup.replicas (default 2) and probing.rebalance.interval.ms
	// (default 10 min): an active moves to a member whose changelog lag is
	// at most the acceptable lag; otherwise a warm-up replica restores on the
	// target first, and the move follows as soon as it caught up (the worker
	// checks every second) or at the probing rebalance. WithWarmups.
	AcceptableRecoveryLag    int64
	MaxWarmupReplicas        int
	ProbingRebalanceInterval time.Duration
	// MaxURLMapBytes bounds what the partition -> URL map for interactive
	// queries may add to the group's assignments in total (the leader's
	// assignor.Config.MaxURLMapBytes; default 256 KiB, negative: always left
	// out). Above it workers derive the map from the group's description
	// (assignor.URLsFromGroup). WithURLMapBudget.
	MaxURLMapBytes int
	// InstanceID enables static membership (KIP-345): a worker that restarts
	// with the same ID within the session timeout gets its partitions back
	// without a rebalance. Each worker needs its own. Env RUNNEL_INSTANCE_ID,
	// flag --instance-id. Default: none (dynamic membership).
	InstanceID string
	// Guarantee is the processing guarantee: AtLeastOnce (default) or
	// ExactlyOnce. Env RUNNEL_GUARANTEE, flag --guarantee; docs/semantics.md
	// says what each promises and costs.
	Guarantee Guarantee
	// IdleCommit: a task whose sources handed out records since its last
	// cycle, and none for this long, runs a cycle at once (the partition is
	// caught up: waiting would batch nothing more, only delay the state and
	// the commit). Default: a tenth of CommitInterval, between 20 and
	// 200 ms; negative disables it. WithIdleCommit.
	IdleCommit time.Duration
	// CacheBytes is the size of a table partition's write cache at which its
	// task runs a cycle before the interval ends; default
	// table.DefaultCacheBytes (4 MiB).
	CacheBytes int
	// Replicas is the number of standby replicas of each changelog partition;
	// default 1 (clamped to workers−1).
	Replicas int
	// AckTimeout fails a record whose agent did not move past it, or whose
	// derived records were not acknowledged, within this time; default 300 s.
	AckTimeout time.Duration
	// Session, Heartbeat, Rebalance: consumer-group timeouts; defaults 10 s,
	// 250 ms, 60 s. A member learns of a rebalance from its next heartbeat's
	// answer, so the heartbeat interval bounds how long a clean hand-over
	// waits for the survivors (Sarama's and Kafka's default is 3 s; a
	// heartbeat is one small request). FetchMaxWait: how long a fetch waits
	// for data when there is none; default 100 ms (Kafka's fetch.max.wait.ms
	// is 500 ms): a partition consumer closed on a revoke waits for the
	// fetch in flight, and an idle fetch every 100 ms costs little.
	Session, Heartbeat, Rebalance, FetchMaxWait time.Duration
	// Logger receives the app's logs; default slog on stderr.
	Logger *slog.Logger
	// HTTPAddr is where a worker serves /healthz, /readyz, /metrics, the
	// status page and the JSON API (docs/http-api.md); empty disables it.
	// An address without a host (":8080") binds to localhost only; name the
	// host to listen on others ("0.0.0.0:8080"). Env RUNNEL_HTTP_ADDR.
	HTTPAddr string
	// Pprof serves Go's profiles under /debug/pprof/ on HTTPAddr; default
	// off. WithPprof, worker --pprof.
	Pprof bool

	redelivery            Redelivery       // WithRedelivery (redeliver.go)
	repartitionPurge      time.Duration    // WithRepartitionPurge (repartition.go)
	cronClock             func() time.Time // WithCronClock (timers.go)
	devTopic, devKeyField string
	topicPrefix           string
	eager                 bool // WithRebalanceProtocol(eager)
	userLogger            bool // WithLogger: the CLI keeps it unless a log flag is given
}

// Defaults of Config.Heartbeat and Config.FetchMaxWait.
const (
	DefaultHeartbeat    = 250 * time.Millisecond
	DefaultFetchMaxWait = 100 * time.Millisecond
)

// Option configures an App.
type Option func(*Config)

// WithBrokers sets the bootstrap brokers ("embedded" for the in-process broker).
func WithBrokers(addrs ...string) Option { return func(c *Config) { c.Brokers = addrs } }

// WithDataDir sets the directory of the local stores.
func WithDataDir(dir string) Option { return func(c *Config) { c.DataDir = dir } }

// WithCommitInterval sets how often offsets are committed (default 2.8 s).
func WithCommitInterval(d time.Duration) Option { return func(c *Config) { c.CommitInterval = d } }

// WithWarmups sets KIP-441's acceptable recovery lag (offsets), the maximum
// of warm-up replicas per plan and the probing rebalance interval (zero keeps
// a default: 10 000, 2, 10 min).
func WithWarmups(acceptableLag int64, maxWarmups int, probing time.Duration) Option {
	return func(c *Config) {
		c.AcceptableRecoveryLag, c.MaxWarmupReplicas, c.ProbingRebalanceInterval = acceptableLag, maxWarmups, probing
	}
}

// Guarantee is a processing guarantee (docs/semantics.md).
type Guarantee string

const (
	// AtLeastOnce: no record is lost; after a failure some records are
	// processed again, so sink records (and tables fed from them through
	// an intermediate topic) may hold duplicates. Tables written straight
	// from a source stay exact (commit cycles).
	AtLeastOnce Guarantee = "at_least_once"
	// ExactlyOnce: every commit cycle of a worker is one Kafka transaction
	// holding its sink records, its changelog records and its source offsets
	// (KIP-98, with the group's generation fencing stale members, KIP-447);
	// consumers, restores and standbys read read_committed. After a failure
	// nothing is processed twice as far as Kafka and the tables can see.
	ExactlyOnce Guarantee = "exactly_once"
)

// ParseGuarantee parses "at_least_once" or "exactly_once" (also with dashes);
// the empty string is AtLeastOnce.
func ParseGuarantee(s string) (Guarantee, error) {
	switch strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_") {
	case "", string(AtLeastOnce):
		return AtLeastOnce, nil
	case string(ExactlyOnce):
		return ExactlyOnce, nil
	}
	return "", fmt.Errorf("guarantee %q: at_least_once or exactly_once", s)
}

// WithGuarantee sets the processing guarantee (Config.Guarantee).
func WithGuarantee(g Guarantee) Option { return func(c *Config) { c.Guarantee = g } }

// WithURLMapBudget sets Config.MaxURLMapBytes (bytes over all members'
// assignments; negative: workers always derive the URL map).
func WithURLMapBudget(bytes int) Option { return func(c *Config) { c.MaxURLMapBytes = bytes } }

// WithInstanceID enables static membership (KIP-345) with this worker's
// group.instance.id; see Config.InstanceID.
func WithInstanceID(id string) Option { return func(c *Config) { c.InstanceID = id } }

// WithIdleCommit sets Config.IdleCommit (negative: cycles only every commit
// interval and when a cache is full).
func WithIdleCommit(d time.Duration) Option { return func(c *Config) { c.IdleCommit = d } }

// WithCacheBytes sets the write-cache size per table partition that triggers
// an early commit cycle (default table.DefaultCacheBytes, 4 MiB).
func WithCacheBytes(n int) Option { return func(c *Config) { c.CacheBytes = n } }

// WithReplicas sets the standby replicas per changelog partition (default 1).
func WithReplicas(n int) Option { return func(c *Config) { c.Replicas = n } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option {
	return func(c *Config) { c.Logger, c.userLogger = l, l != nil }
}

// WithGroupTimeouts sets the consumer-group session, heartbeat and rebalance
// timeouts and the fetch max wait (zero keeps a default).
func WithGroupTimeouts(session, heartbeat, rebalance, fetchMaxWait time.Duration) Option {
	return func(c *Config) {
		c.Session, c.Rebalance = session, rebalance
		if heartbeat > 0 {
			c.Heartbeat = heartbeat
		}
		if fetchMaxWait > 0 {
			c.FetchMaxWait = fetchMaxWait
		}
	}
}

// WithHTTPAddr sets the worker's HTTP listen address (empty disables it).
func WithHTTPAddr(addr string) Option { return func(c *Config) { c.HTTPAddr = addr } }

// WithTopicPrefix prefixes the names of the app's declared topics, so that
// several instances of one app (tests, tenants) can share a cluster. Changelog
// topics are named from the app ID and need no prefix.
func WithTopicPrefix(p string) Option { return func(c *Config) { c.topicPrefix = p } }

// New declares an app. id names the consumer group and prefixes changelog topics.
func New(id string, opts ...Option) *App {
	c := Config{Brokers: []string{"localhost:9092"}, DataDir: "./var", CommitInterval: 2800 * time.Millisecond,
		Replicas: 1, AckTimeout: 300 * time.Second, Heartbeat: DefaultHeartbeat, FetchMaxWait: DefaultFetchMaxWait}
	for _, o := range opts {
		o(&c)
	}
	if v := os.Getenv("RUNNEL_BROKERS"); v != "" {
		c.Brokers = strings.Split(v, ",")
	}
	if v := os.Getenv("RUNNEL_DATA_DIR"); v != "" {
		c.DataDir = v
	}
	if v := os.Getenv("RUNNEL_HTTP_ADDR"); v != "" {
		c.HTTPAddr = v
	}
	if v := os.Getenv("RUNNEL_INSTANCE_ID"); v != "" {
		c.InstanceID = v
	}
	if v := os.Getenv("RUNNEL_GUARANTEE"); v != "" {
		c.Guarantee = Guarantee(v)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	a := &App{id: id, cfg: c, topics: map[string]agent.TopicDef{}}
	if err := topology.ValidName(id); err != nil {
		a.errs = append(a.errs, fmt.Errorf("app id: %w", err))
	}
	if g, err := ParseGuarantee(string(c.Guarantee)); err != nil {
		a.errs = append(a.errs, err)
	} else {
		a.cfg.Guarantee = g
	}
	return a
}

// ID returns the app ID.
func (a *App) ID() string { return a.id }

// AppID implements table.Host.
func (a *App) AppID() string { return a.id }

// Config returns the app's settings.
func (a *App) Config() Config { return a.cfg }

// RegisterTopic implements agent.Host.
func (a *App) RegisterTopic(t agent.TopicDef) {
	if _, dup := a.topics[t.Name()]; dup {
		a.errs = append(a.errs, fmt.Errorf("topic %s declared twice", t.Name()))
		return
	}
	if err := topology.ValidName(t.Name()); err != nil {
		a.errs = append(a.errs, fmt.Errorf("topic: %w", err))
	}
	a.topics[t.Name()] = t
}

// RegisterAgent implements agent.Host.
func (a *App) RegisterAgent(r agent.Runner) {
	for _, o := range a.agents {
		if o.Name() == r.Name() {
			a.errs = append(a.errs, fmt.Errorf("agent %s declared twice", r.Name()))
			return
		}
	}
	for _, tm := range r.Settings().Timers {
		if err := tm.Validate(); err != nil {
			a.errs = append(a.errs, fmt.Errorf("agent %s: %w", r.Name(), err))
		}
	}
	a.agents = append(a.agents, r)
}

// RegisterTable implements table.Host.
func (a *App) RegisterTable(d table.Def) {
	for _, o := range a.tables {
		if o.Name() == d.Name() {
			a.errs = append(a.errs, fmt.Errorf("table %s declared twice", d.Name()))
			return
		}
	}
	if err := topology.ValidName(d.Name()); err != nil {
		a.errs = append(a.errs, fmt.Errorf("table: %w", err))
	}
	a.tables = append(a.tables, d)
}

// TopicOption configures a declared topic.
type TopicOption func(*topicOptions)

type topicOptions struct{ partitions int32 }

// Partitions sets a topic's partition count (default 8).
func Partitions(n int32) TopicOption { return func(o *topicOptions) { o.partitions = n } }

// Topic declares a typed topic of app a.
func Topic[K any, V any](a *App, name string, kc codec.Codec[K], vc codec.Codec[V], opts ...TopicOption) *agent.Topic[K, V] {
	o := topicOptions{partitions: 8}
	for _, f := range opts {
		f(&o)
	}
	return agent.NewTopic(a, a.cfg.topicPrefix+name, kc, vc, o.partitions)
}

// Topology returns the declared graph, with table partition counts resolved
// and co-partitioning validated; the error lists every declaration problem.
func (a *App) Topology() (*topology.Graph, error) {
	g := &topology.Graph{App: a.id}
	names := make([]string, 0, len(a.topics))
	for n := range a.topics {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := a.topics[n]
		tt := topology.Topic{Name: n, Partitions: t.Partitions(), KeyCodec: t.KeyCodec(), ValueCodec: t.ValueCodec()}
		if rp, ok := t.(agent.Repartitioned); ok {
			tt.RepartitionOf = rp.RepartitionOf()
		}
		g.Topics = append(g.Topics, tt)
	}
	for _, r := range a.agents {
		ta := describeAgent(r)
		ta.Sinks, ta.Tables = nonNilStrings(r.Settings().Sinks), nonNilStrings(r.Settings().Tables)
		ta.DeadLetterTopic = a.DeadLetterTopic(r.Name())
		g.Agents = append(g.Agents, ta)
	}
	for _, d := range a.tables {
		tt := topology.Table{Name: d.Name(), Changelog: d.Changelog(), Partitions: d.Partitions(),
			KeyCodec: d.KeyCodec(), ValueCodec: d.ValueCodec()}
		if j, ok := d.(table.JoinDef); ok {
			kind, l, r := j.JoinOf()
			tt.JoinKind, tt.JoinOf = kind, []string{l, r}
		}
		g.Tables = append(g.Tables, tt)
	}
	errs := append([]error(nil), a.errs...)
	if err := g.Resolve(); err != nil {
		errs = append(errs, err)
	}
	return g, joinErrors(errs)
}

// nonNilStrings returns s, or an empty slice for nil (JSON [] rather than null).
func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
