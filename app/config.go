package app

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/spf13/pflag"
)

// This file is the one place of an app's configuration: Config, its
// defaults (Default* and defaultConfig), every option (With*), the table of
// settings that derives the environment variables (RUNNEL_*) and the CLI
// flags from the same list, and validate. docs/configuration.md is generated
// from the table (TestConfigurationDoc; go test ./app -run
// TestConfigurationDoc -update rewrites it).
//
// Precedence: options, then environment variables (read by New), then flags
// (parsed by Command): a later source wins.

// Config holds an app's settings. Options set them; environment variables
// (RUNNEL_*) override options, and CLI flags override both. Zero values of
// the tuning fields mean "the default" where a field's doc says so.
type Config struct {
	// Brokers is the bootstrap list; "embedded" starts the in-process broker.
	// Env RUNNEL_BROKERS (comma-separated). Default localhost:9092.
	Brokers []string
	// DataDir holds the Pebble stores (one directory per table). Env
	// RUNNEL_DATA_DIR. Default ./var.
	DataDir string
	// CommitInterval is how often resolved offsets are committed, and how
	// often each task runs a commit cycle (its table writes go to the
	// changelog and the store; docs/tables.md). Zero (the default) takes
	// the guarantee's default: DefaultCommitInterval under AtLeastOnce,
	// DefaultExactlyOnceCommitInterval under ExactlyOnce (both 2.8 s, as
	// measured; docs/semantics.md). Offsets are also committed on every
	// revoke and on shutdown.
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
	// 0: 4 MiB.
	CacheBytes int
	// WriteCacheLimit is the hard limit of a table partition's write cache
	// (bytes, measured as CacheBytes): while a cache of a task is at or over
	// it (a cut is blocked: a record below the commit point unresolved, a
	// slow sink, a transaction waiting), the task's sources hand out no
	// further record until a cycle cut it (backpressure). Records already
	// handed out still complete, so a cache holds at most the limit plus the
	// writes of the records in flight: per source partition, the agents'
	// queue (1024 records) and one fetched batch (256). Default 0: twice the
	// effective CacheBytes (8 MiB); negative: no limit. WithWriteCacheLimit.
	WriteCacheLimit int
	// Replicas is the number of standby replicas of each changelog partition;
	// default 1 (clamped to workers−1).
	Replicas int
	// AckTimeout fails a record whose agent did not move past it, or whose
	// derived records were not acknowledged, within this time; default 300 s.
	// WithAckTimeout, env RUNNEL_ACK_TIMEOUT, flag --ack-timeout.
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
	// TLS, when not nil, encrypts every connection to the brokers (Kafka's
	// security.protocol SSL, or SASL_SSL with SASL). WithTLS sets it;
	// TLSCAFile, TLSCertFile and TLSKeyFile (WithTLSFiles, RUNNEL_TLS_*,
	// --tls-*) add a CA and a client certificate to it, or make one.
	TLS *tls.Config
	// TLSCAFile is a PEM file of CA certificates the brokers' certificates
	// are verified with (Kafka's ssl.truststore); empty: the system's roots.
	TLSCAFile string
	// TLSCertFile and TLSKeyFile are the PEM client certificate and its key,
	// for brokers that authenticate clients by certificate
	// (ssl.client.auth=required; Kafka's ssl.keystore). Both or neither.
	TLSCertFile, TLSKeyFile string
	// SASL authenticates every connection (KIP-43, KIP-84): PLAIN,
	// SCRAM-SHA-256 or SCRAM-SHA-512. The zero value is no SASL. WithSASL,
	// RUNNEL_SASL_*, --sasl-*. Its password is never logged.
	SASL SASL

	redelivery       Redelivery       // WithRedelivery
	repartitionPurge time.Duration    // WithRepartitionPurge
	cronClock        func() time.Time // WithCronClock; read by timers.go
	topicPrefix      string           // WithTopicPrefix
	eager            bool             // WithRebalanceProtocol(eager)
	userLogger       bool             // WithLogger: the CLI keeps it unless a log flag is given
}

// Defaults of Config fields whose zero value is not their default.
const (
	// DefaultBroker is the default bootstrap broker (Kafka's own default
	// listener).
	DefaultBroker = "localhost:9092"
	// DefaultDataDir is the default Config.DataDir.
	DefaultDataDir = "./var"
	// DefaultCommitInterval is the default Config.CommitInterval under
	// AtLeastOnce (Faust's broker_commit_every; Kafka Streams'
	// commit.interval.ms is 30 s under at-least-once).
	DefaultCommitInterval = 2800 * time.Millisecond
	// DefaultExactlyOnceCommitInterval is the default Config.CommitInterval
	// under ExactlyOnce: 2.8 s, as under AtLeastOnce, on measurements. A
	// read_committed reader sees a record's effects only when its cycle's
	// transaction commits, so the interval is latency (the last records of
	// a burst wait up to one interval); but each cycle stops the worker's
	// sources while it drains the records in flight, flushes the changelog
	// and commits one transaction (AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
	// then the next AddPartitionsToTxn), tens to hundreds of milliseconds on
	// a loaded machine. Kafka Streams uses 100 ms under exactly_once_v2
	// (StreamsConfig's EOS_DEFAULT_COMMIT_INTERVAL_MS); measured side by side
	// on kfake and Kafka 4.4, 100, 200 and 500 ms cost Runnel's stateful app
	// 1.4 to 10 times at-least-once's time, 2.8 s about the same
	// (docs/semantics.md). Lower it once a cycle no longer stops the sources
	// for its commit.
	DefaultExactlyOnceCommitInterval = DefaultCommitInterval
	// DefaultReplicas is the default Config.Replicas (Kafka Streams'
	// num.standby.replicas is 0).
	DefaultReplicas = 1
	// DefaultAckTimeout is the default Config.AckTimeout.
	DefaultAckTimeout = 300 * time.Second
	// DefaultHeartbeat is the default Config.Heartbeat.
	DefaultHeartbeat = 250 * time.Millisecond
	// DefaultFetchMaxWait is the default Config.FetchMaxWait.
	DefaultFetchMaxWait = 100 * time.Millisecond
	// DefaultRepartitionPurge is how often repartition topics are purged
	// unless WithRepartitionPurge says otherwise (Kafka Streams'
	// repartition.purge.interval.ms).
	DefaultRepartitionPurge = 30 * time.Second
)

// Defaults of Redelivery.
const (
	DefaultMaxRetries = 5
	DefaultBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff = 10 * time.Second
)

// defaultConfig is the configuration before options, environment and flags.
// Fields left zero take the defaults their docs give where they are used.
func defaultConfig() Config {
	return Config{
		Brokers:      []string{DefaultBroker},
		DataDir:      DefaultDataDir,
		Guarantee:    AtLeastOnce,
		Replicas:     DefaultReplicas,
		AckTimeout:   DefaultAckTimeout,
		Heartbeat:    DefaultHeartbeat,
		FetchMaxWait: DefaultFetchMaxWait,
	}
}

// Option configures an App.
type Option func(*Config)

// WithBrokers sets the bootstrap brokers, host:port each ("embedded" for the
// in-process broker); default localhost:9092. Kafka's bootstrap.servers.
func WithBrokers(addrs ...string) Option { return func(c *Config) { c.Brokers = addrs } }

// WithDataDir sets the directory of the local stores (one Pebble store per
// table under tables/, the process ID, the last assignment); default ./var.
// Kafka Streams' state.dir.
func WithDataDir(dir string) Option { return func(c *Config) { c.DataDir = dir } }

// WithCommitInterval sets how often offsets are committed and each task runs
// a commit cycle; must not be negative. Default 0: the guarantee's default,
// 2.8 s under both guarantees for now (DefaultCommitInterval,
// DefaultExactlyOnceCommitInterval). Kafka Streams' commit.interval.ms (30 s under
// at-least-once, 100 ms under exactly-once); Faust's broker_commit_every.
func WithCommitInterval(d time.Duration) Option { return func(c *Config) { c.CommitInterval = d } }

// WithWarmups sets KIP-441's acceptable.recovery.lag (changelog offsets;
// negative: 0), max.warmup.replicas (warm-up replicas per plan) and
// probing.rebalance.interval.ms (zero keeps a default: 10 000, 2, 10 min).
func WithWarmups(acceptableLag int64, maxWarmups int, probing time.Duration) Option {
	return func(c *Config) {
		c.AcceptableRecoveryLag, c.MaxWarmupReplicas, c.ProbingRebalanceInterval = acceptableLag, maxWarmups, probing
	}
}

// WithGuarantee sets the processing guarantee (Config.Guarantee): AtLeastOnce
// (default) or ExactlyOnce. Kafka Streams' processing.guarantee
// (at_least_once, exactly_once_v2; KIP-98, KIP-447).
func WithGuarantee(g Guarantee) Option { return func(c *Config) { c.Guarantee = g } }

// WithURLMapBudget sets Config.MaxURLMapBytes (bytes over all members'
// assignments; default 256 KiB; negative: workers always derive the URL map).
func WithURLMapBudget(bytes int) Option { return func(c *Config) { c.MaxURLMapBytes = bytes } }

// WithInstanceID enables static membership (KIP-345) with this worker's
// group.instance.id; see Config.InstanceID. Default none.
func WithInstanceID(id string) Option { return func(c *Config) { c.InstanceID = id } }

// cacheBytes is the write-cache size at which a table partition asks for a
// cycle (CacheBytes, or tablestate.DefaultCacheBytes).
func (c *Config) cacheBytes() int {
	if c.CacheBytes > 0 {
		return c.CacheBytes
	}
	return tablestate.DefaultCacheBytes
}

// writeCacheLimit is the hard limit of a table partition's write cache in
// bytes (WriteCacheLimit; 0: twice cacheBytes), 0 when there is none.
func (c *Config) writeCacheLimit() int {
	switch {
	case c.WriteCacheLimit < 0:
		return 0
	case c.WriteCacheLimit > 0:
		return c.WriteCacheLimit
	}
	return 2 * c.cacheBytes()
}

// WithIdleCommit sets Config.IdleCommit (default 0: a tenth of the commit
// interval, between 20 and 200 ms; negative: cycles only every commit
// interval and when a cache is full).
func WithIdleCommit(d time.Duration) Option { return func(c *Config) { c.IdleCommit = d } }

// WithCacheBytes sets the write-cache size per table partition that triggers
// an early commit cycle (bytes; default 0: 4 MiB).
// Kafka Streams' statestore.cache.max.bytes (per instance there, per table
// partition here).
func WithCacheBytes(n int) Option { return func(c *Config) { c.CacheBytes = n } }

// WithWriteCacheLimit sets Config.WriteCacheLimit, the hard limit of a
// table partition's write cache above which its task's sources wait for a
// cycle to cut it (bytes; default 0: twice the cache size of
// WithCacheBytes, 8 MiB; negative: no limit; a positive limit must be at
// least the cache size). Memory per table partition is then bounded by the
// limit plus the writes of the records in flight (at most 1024 queued and
// 256 fetched per source partition), while a cut is blocked.
func WithWriteCacheLimit(n int) Option { return func(c *Config) { c.WriteCacheLimit = n } }

// WithReplicas sets the standby replicas per changelog partition (default 1,
// clamped to workers−1; negative: 0). Kafka Streams' num.standby.replicas.
func WithReplicas(n int) Option { return func(c *Config) { c.Replicas = n } }

// WithAckTimeout sets Config.AckTimeout: a record whose agent did not move
// past it, or whose derived records were not acknowledged, within d fails
// (and is redelivered); default 300 s, must be positive (docs/ack-mode.md).
func WithAckTimeout(d time.Duration) Option { return func(c *Config) { c.AckTimeout = d } }

// WithLogger sets the logger (default: slog's text handler on stderr at
// info). The CLI keeps it unless --log-level or --log-format is given.
func WithLogger(l *slog.Logger) Option {
	return func(c *Config) { c.Logger, c.userLogger = l, l != nil }
}

// WithGroupTimeouts sets the consumer-group session timeout
// (session.timeout.ms; 0: Sarama's 10 s), heartbeat interval
// (heartbeat.interval.ms; default 250 ms), rebalance timeout (the JoinGroup
// rebalance timeout, KIP-62; 0: 60 s) and the fetch max wait
// (fetch.max.wait.ms; default 100 ms). A zero heartbeat or fetch max wait
// keeps its default.
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

// WithHTTPAddr sets the worker's HTTP listen address, host:port (default
// empty: no HTTP server; ":8080" binds localhost only). Kafka Streams'
// application.server names the same endpoint for interactive queries.
func WithHTTPAddr(addr string) Option { return func(c *Config) { c.HTTPAddr = addr } }

// WithPprof serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/ on the worker's HTTP address; off by default, since a
// profile exposes the process's internals and costs CPU while it runs.
func WithPprof(on bool) Option { return func(c *Config) { c.Pprof = on } }

// WithTopicPrefix prefixes the names of the app's declared topics, so that
// several instances of one app (tests, tenants) can share a cluster. Changelog
// topics are named from the app ID and need no prefix. Default none.
func WithTopicPrefix(p string) Option { return func(c *Config) { c.topicPrefix = p } }

// RebalanceProtocol is a consumer-group rebalance protocol (WithRebalanceProtocol).
type RebalanceProtocol int

const (
	// RebalanceCooperative is the incremental protocol (KIP-429), the
	// default: only partitions that move stop, each revoked in one
	// generation and assigned in the next. It needs Kafka >= 2.4.
	RebalanceCooperative RebalanceProtocol = iota
	// RebalanceEager is the classic protocol: every member stops every
	// partition on each rebalance.
	RebalanceEager
)

// String returns the protocol's name as RUNNEL_REBALANCE_PROTOCOL spells it:
// "cooperative" or "eager".
func (p RebalanceProtocol) String() string {
	if p == RebalanceEager {
		return "eager"
	}
	return "cooperative"
}

// WithRebalanceProtocol selects the consumer-group rebalance protocol:
// RebalanceCooperative (the default) or RebalanceEager. All workers of an app
// must use the same one.
func WithRebalanceProtocol(p RebalanceProtocol) Option {
	return func(c *Config) { c.eager = p == RebalanceEager }
}

func (c Config) rebalanceProtocol() sarama.RebalanceProtocol {
	if c.eager {
		return sarama.RebalanceProtocolEager
	}
	return sarama.RebalanceProtocolCooperative
}

// rebalanceProtocolName is the protocol as RUNNEL_REBALANCE_PROTOCOL names
// it (sarama.RebalanceProtocol has no name of its own: logs would show 1).
func (c Config) rebalanceProtocolName() string {
	if c.eager {
		return "eager"
	}
	return "cooperative"
}

// Redelivery bounds how often a failed record is redelivered and how long the
// source waits before each redelivery (docs/semantics.md).
type Redelivery struct {
	// MaxRetries is how many times a failed record is redelivered; when it
	// fails again after that (MaxRetries+1 deliveries), it is dead-lettered to
	// the dead-letter topic of every agent that failed or rejected it, and its
	// partition continues. Default 5; negative means 0 (dead-letter on the
	// first failure).
	MaxRetries int
	// Backoff is the wait before the first redelivery; it doubles for every
	// further attempt of the same record, up to MaxBackoff. It is also the
	// first wait before an agent is restarted (agent.Restart) or a partition
	// restarts after its stream failed. Defaults 100 ms and 10 s.
	Backoff, MaxBackoff time.Duration
}

// WithRedelivery sets the retry budget and backoff of failed records (zero
// fields keep the defaults: 5 retries, 100 ms doubling up to 10 s; Kafka's
// retry.backoff.ms and retry.backoff.max.ms, KIP-580, name the same shape
// for client requests).
func WithRedelivery(r Redelivery) Option { return func(c *Config) { c.redelivery = r } }

// WithRepartitionPurge sets how often a worker deletes the records of
// repartition topics below the group's committed offsets, on the partitions
// it owns (Kafka Streams' repartition.purge.interval.ms); default 30 s,
// negative disables it (the topics then grow without bound: they are created
// with retention.ms=-1).
func WithRepartitionPurge(d time.Duration) Option { return func(c *Config) { c.repartitionPurge = d } }

// WithCronClock sets the wall clock Cron timers (agent.Cron) read; default
// time.Now. A clock set ahead (time.Now().Add(d)) runs the schedules as they
// would run d later, which a test of "0 9 * * *" or a rehearsal of a
// schedule needs; the clock must advance at the real pace (the timers wait
// with real timers for the time it says). No variable or flag: a clock is
// code.
func WithCronClock(now func() time.Time) Option { return func(c *Config) { c.cronClock = now } }

// WithTLS encrypts the connections to the brokers with cfg (Kafka's
// security.protocol SSL; SASL_SSL with WithSASL). cfg is used as given: set
// RootCAs for a private CA and Certificates for a client certificate, or use
// WithTLSFiles. Default: plaintext.
func WithTLS(cfg *tls.Config) Option { return func(c *Config) { c.TLS = cfg } }

// WithTLSFiles turns TLS on with PEM files: caFile holds the CA certificates
// the brokers' certificates are verified with (empty: the system's roots),
// certFile and keyFile a client certificate and its key (both or neither).
// Kafka's ssl.truststore.location and ssl.keystore.location, in PEM. The
// files are read when a worker or command connects; errors name the file.
func WithTLSFiles(caFile, certFile, keyFile string) Option {
	return func(c *Config) { c.TLSCAFile, c.TLSCertFile, c.TLSKeyFile = caFile, certFile, keyFile }
}

// SASL holds SASL credentials (KIP-43, KIP-84). String, GoString and
// LogValue never show the password; it is never put in an error.
type SASL struct {
	// Mechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (Kafka's
	// sasl.mechanism); empty: no SASL.
	Mechanism string
	// User is the SASL user name.
	User string
	// Password is the user's password.
	Password string `json:"-"`
}

func (s SASL) kafka() kafka.SASL {
	return kafka.SASL{Mechanism: s.Mechanism, User: s.User, Password: s.Password}
}

// String describes s without its password: "SCRAM-SHA-256 user \"app\"".
func (s SASL) String() string { return s.kafka().String() }

// GoString is String, so that %#v does not print the password either.
func (s SASL) GoString() string { return s.String() }

// LogValue implements slog.LogValuer: mechanism and user, never the password.
func (s SASL) LogValue() slog.Value { return s.kafka().LogValue() }

// WithSASL authenticates every connection with SASL: mechanism PLAIN,
// SCRAM-SHA-256 or SCRAM-SHA-512 (case-insensitive; Kafka's sasl.mechanism),
// user and password (sasl.jaas.config's username and password). PLAIN sends
// the password as it is: use it over TLS only. Default: no SASL.
func WithSASL(mechanism, user, password string) Option {
	return func(c *Config) {
		c.SASL = SASL{Mechanism: strings.ToUpper(strings.TrimSpace(mechanism)), User: user, Password: password}
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

// setting describes one configuration setting: the option that sets it, its
// environment variable and flag (either may be absent), its default, unit
// and source, and how a string sets and shows it. The environment, the flags
// and docs/configuration.md are all derived from settings.
type setting struct {
	name   string // the Config field (or the option's argument) it sets
	option string // the option that sets it in code
	env    string // environment variable; empty: none
	flag   string // CLI flag; empty: none
	worker bool   // the flag belongs to the worker command; else to every command
	def    string // the default, as the docs show it
	unit   string // unit or allowed values
	source string // KIP, Kafka / Kafka Streams config name
	usage  string // one line for --help
	secret bool   // never shown (--help, errors, docs)
	field  field
	check  func(*Config) error // nil: every value the field parses is valid
	isBool bool
}

// field reads and writes one setting of a Config as a string.
type field interface {
	set(c *Config, v string) error
	get(c *Config) string
}

type durationField func(*Config) *time.Duration

func (f durationField) set(c *Config, v string) error {
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("want a duration such as 250ms or 2s: %w", err)
	}
	*f(c) = d
	return nil
}

func (f durationField) get(c *Config) string {
	if d := *f(c); d != 0 {
		return d.String()
	}
	return "0"
}

type intField func(*Config) *int

func (f intField) set(c *Config, v string) error {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("want an integer: %w", err)
	}
	*f(c) = n
	return nil
}

func (f intField) get(c *Config) string { return strconv.Itoa(*f(c)) }

type int64Field func(*Config) *int64

func (f int64Field) set(c *Config, v string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return fmt.Errorf("want an integer: %w", err)
	}
	*f(c) = n
	return nil
}

func (f int64Field) get(c *Config) string { return strconv.FormatInt(*f(c), 10) }

type stringField func(*Config) *string

func (f stringField) set(c *Config, v string) error { *f(c) = v; return nil }
func (f stringField) get(c *Config) string          { return *f(c) }

type boolField func(*Config) *bool

func (f boolField) set(c *Config, v string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return fmt.Errorf("want true or false: %w", err)
	}
	*f(c) = b
	return nil
}

func (f boolField) get(c *Config) string { return strconv.FormatBool(*f(c)) }

// funcField is a field with its own parsing.
type funcField struct {
	setF func(*Config, string) error
	getF func(*Config) string
}

func (f funcField) set(c *Config, v string) error { return f.setF(c, v) }
func (f funcField) get(c *Config) string          { return f.getF(c) }

func nonNegative(name string, get func(*Config) int64) func(*Config) error {
	return func(c *Config) error {
		if v := get(c); v < 0 {
			return fmt.Errorf("%s is %d: must be 0 or more", name, v)
		}
		return nil
	}
}

func nonNegativeDuration(get func(*Config) time.Duration) func(*Config) error {
	return func(c *Config) error {
		if d := get(c); d < 0 {
			return fmt.Errorf("%v: must be 0 or more", d)
		}
		return nil
	}
}

func positiveDuration(get func(*Config) time.Duration) func(*Config) error {
	return func(c *Config) error {
		if d := get(c); d <= 0 {
			return fmt.Errorf("%v: must be positive", d)
		}
		return nil
	}
}

// settings is the list every configuration source is derived from, in the
// order the docs show it.
var settings = []setting{
	{name: "Brokers", option: "WithBrokers", env: "RUNNEL_BROKERS", flag: "brokers",
		def: DefaultBroker, unit: "host:port, comma-separated; embedded: the in-process broker",
		source: "Kafka bootstrap.servers", usage: "bootstrap brokers, comma-separated",
		field: funcField{
			setF: func(c *Config, v string) error {
				c.Brokers = nil
				for _, b := range strings.Split(v, ",") {
					if b = strings.TrimSpace(b); b != "" {
						c.Brokers = append(c.Brokers, b)
					}
				}
				return nil
			},
			getF: func(c *Config) string { return strings.Join(c.Brokers, ",") },
		},
		check: func(c *Config) error {
			if len(c.Brokers) == 0 {
				return errors.New("empty: name at least one host:port (or embedded)")
			}
			for _, b := range c.Brokers {
				if b == "embedded" && len(c.Brokers) == 1 {
					continue
				}
				if _, _, err := net.SplitHostPort(b); err != nil {
					return fmt.Errorf("%q: want host:port (or embedded alone): %w", b, err)
				}
			}
			return nil
		}},
	{name: "DataDir", option: "WithDataDir", env: "RUNNEL_DATA_DIR", flag: "data-dir",
		def: DefaultDataDir, unit: "directory",
		source: "Kafka Streams state.dir", usage: "directory of the local table stores",
		field: stringField(func(c *Config) *string { return &c.DataDir }),
		check: func(c *Config) error {
			if c.DataDir == "" {
				return errors.New("empty: name a directory")
			}
			return nil
		}},
	{name: "Guarantee", option: "WithGuarantee", env: "RUNNEL_GUARANTEE", flag: "guarantee",
		def: string(AtLeastOnce), unit: "at_least_once or exactly_once",
		source: "Kafka Streams processing.guarantee; KIP-98, KIP-447",
		usage:  "at_least_once or exactly_once: each commit cycle one Kafka transaction",
		field: funcField{
			setF: func(c *Config, v string) error {
				g, err := ParseGuarantee(v)
				if err == nil {
					c.Guarantee = g
				}
				return err
			},
			getF: func(c *Config) string { return string(c.Guarantee) },
		},
		check: func(c *Config) error { _, err := ParseGuarantee(string(c.Guarantee)); return err }},
	{name: "TLS (on)", option: "WithTLS", env: "RUNNEL_TLS", flag: "tls",
		def: "false", unit: "true or false",
		source: "Kafka security.protocol SSL (SASL_SSL with SASL)",
		usage:  "connect to the brokers over TLS, verified with the system's CA roots unless --tls-ca-file names a CA",
		isBool: true,
		field: funcField{
			setF: func(c *Config, v string) error {
				on, err := strconv.ParseBool(strings.TrimSpace(v))
				if err != nil {
					return fmt.Errorf("want true or false: %w", err)
				}
				switch {
				case on && c.TLS == nil:
					c.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
				case !on:
					c.TLS, c.TLSCAFile, c.TLSCertFile, c.TLSKeyFile = nil, "", "", ""
				}
				return nil
			},
			getF: func(c *Config) string { return strconv.FormatBool(c.tlsOn()) },
		}},
	{name: "TLSCAFile", option: "WithTLSFiles", env: "RUNNEL_TLS_CA_FILE", flag: "tls-ca-file",
		def: "none (the system's roots)", unit: "PEM file",
		source: "Kafka ssl.truststore.type=PEM, ssl.truststore.location (KIP-651)",
		usage:  "PEM file of the CA certificates that sign the brokers' certificates (turns TLS on)",
		field:  stringField(func(c *Config) *string { return &c.TLSCAFile })},
	{name: "TLSCertFile", option: "WithTLSFiles", env: "RUNNEL_TLS_CERT_FILE", flag: "tls-cert-file",
		def: "none", unit: "PEM file",
		source: "Kafka ssl.keystore.type=PEM, ssl.keystore.certificate.chain (KIP-651)",
		usage:  "PEM client certificate, for brokers with ssl.client.auth=required (turns TLS on; needs --tls-key-file)",
		field:  stringField(func(c *Config) *string { return &c.TLSCertFile }),
		check: func(c *Config) error {
			if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
				return errors.New("a client certificate needs both its certificate and its key file")
			}
			return nil
		}},
	{name: "TLSKeyFile", option: "WithTLSFiles", env: "RUNNEL_TLS_KEY_FILE", flag: "tls-key-file",
		def: "none", unit: "PEM file",
		source: "Kafka ssl.keystore.key (PEM, unencrypted; KIP-651)",
		usage:  "PEM private key of --tls-cert-file",
		field:  stringField(func(c *Config) *string { return &c.TLSKeyFile })},
	{name: "SASL.Mechanism", option: "WithSASL", env: "RUNNEL_SASL_MECHANISM", flag: "sasl-mechanism",
		def: "none", unit: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
		source: "Kafka sasl.mechanism; KIP-43, KIP-84",
		usage:  "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
		field: funcField{
			setF: func(c *Config, v string) error {
				c.SASL.Mechanism = strings.ToUpper(strings.TrimSpace(v))
				return nil
			},
			getF: func(c *Config) string { return c.SASL.Mechanism },
		},
		check: func(c *Config) error { return c.SASL.kafka().Validate() }},
	{name: "SASL.User", option: "WithSASL", env: "RUNNEL_SASL_USER", flag: "sasl-user",
		def: "none", unit: "user name",
		source: "Kafka sasl.jaas.config username", usage: "SASL user",
		field: stringField(func(c *Config) *string { return &c.SASL.User })},
	{name: "SASL.Password", option: "WithSASL", env: "RUNNEL_SASL_PASSWORD", flag: "sasl-password",
		def: "none", unit: "password (never logged)",
		source: "Kafka sasl.jaas.config password",
		usage:  "SASL password; prefer RUNNEL_SASL_PASSWORD, since other users of the host can read a process's arguments",
		secret: true,
		field:  stringField(func(c *Config) *string { return &c.SASL.Password })},
	{name: "CommitInterval", option: "WithCommitInterval", env: "RUNNEL_COMMIT_INTERVAL", flag: "commit-interval", worker: true,
		def: "0 (the guarantee's default: 2.8s under either)", unit: "duration",
		source: "Kafka Streams commit.interval.ms (30 s there at-least-once, 100 ms exactly_once_v2); Faust broker_commit_every",
		usage:  "how often offsets are committed and each task runs a commit cycle (0: the guarantee's default, 2.8s under either)",
		field:  durationField(func(c *Config) *time.Duration { return &c.CommitInterval }),
		check:  nonNegativeDuration(func(c *Config) time.Duration { return c.CommitInterval })},
	{name: "IdleCommit", option: "WithIdleCommit", env: "RUNNEL_IDLE_COMMIT", flag: "idle-commit", worker: true,
		def: "0 (a tenth of the commit interval, 20 to 200 ms)", unit: "duration; negative: off",
		usage: "a task idle this long after handing out records runs its cycle at once (0: a tenth of --commit-interval within 20-200ms; negative: off)",
		field: durationField(func(c *Config) *time.Duration { return &c.IdleCommit })},
	{name: "CacheBytes", option: "WithCacheBytes", env: "RUNNEL_CACHE_BYTES", flag: "cache-bytes", worker: true,
		def: "0 (4 MiB)", unit: "bytes per table partition",
		source: "Kafka Streams statestore.cache.max.bytes (per instance there)",
		usage:  "a table partition's write cache at which its task cycles early (0: 4 MiB)",
		field:  intField(func(c *Config) *int { return &c.CacheBytes }),
		check:  nonNegative("cache bytes", func(c *Config) int64 { return int64(c.CacheBytes) })},
	{name: "WriteCacheLimit", option: "WithWriteCacheLimit", env: "RUNNEL_WRITE_CACHE_LIMIT", flag: "write-cache-limit", worker: true,
		def: "0 (twice CacheBytes: 8 MiB)", unit: "bytes per table partition; negative: none",
		source: "Runnel's backpressure (docs/tables.md); Kafka Streams has none (its cache flushes instead)",
		usage:  "a table partition's write cache at which its task's sources hand out no record until a cycle cuts it (0: twice --cache-bytes; negative: no limit)",
		field:  intField(func(c *Config) *int { return &c.WriteCacheLimit }),
		check: func(c *Config) error {
			if l, b := c.WriteCacheLimit, c.cacheBytes(); l > 0 && l < b {
				return fmt.Errorf("%d: must be at least the write cache size (%d bytes, CacheBytes), 0 or negative", l, b)
			}
			return nil
		}},
	{name: "Replicas", option: "WithReplicas", env: "RUNNEL_REPLICAS", flag: "replicas", worker: true,
		def: "1", unit: "standby replicas per changelog partition (clamped to workers-1)",
		source: "Kafka Streams num.standby.replicas (0 there)",
		usage:  "standby replicas of each changelog partition",
		field:  intField(func(c *Config) *int { return &c.Replicas })},
	{name: "AckTimeout", option: "WithAckTimeout", env: "RUNNEL_ACK_TIMEOUT", flag: "ack-timeout", worker: true,
		def: "5m0s", unit: "duration",
		source: "Runnel's ack mode (docs/ack-mode.md)",
		usage:  "a record not moved past, or whose derived records were not acknowledged, within this time fails",
		field:  durationField(func(c *Config) *time.Duration { return &c.AckTimeout }),
		check:  positiveDuration(func(c *Config) time.Duration { return c.AckTimeout })},
	{name: "Session", option: "WithGroupTimeouts", env: "RUNNEL_SESSION_TIMEOUT", flag: "session-timeout", worker: true,
		def: "0 (Sarama's 10s)", unit: "duration",
		source: "Kafka session.timeout.ms",
		usage:  "consumer-group session timeout (0: 10s)",
		field:  durationField(func(c *Config) *time.Duration { return &c.Session }),
		check: func(c *Config) error {
			if c.Session < 0 {
				return fmt.Errorf("%v: must be 0 or more", c.Session)
			}
			if session := cmp0(c.Session, 10*time.Second); c.Heartbeat >= session {
				return fmt.Errorf("%v: must exceed the heartbeat interval (%v)", session, c.Heartbeat)
			}
			return nil
		}},
	{name: "Heartbeat", option: "WithGroupTimeouts", env: "RUNNEL_HEARTBEAT_INTERVAL", flag: "heartbeat-interval", worker: true,
		def: "250ms", unit: "duration",
		source: "Kafka heartbeat.interval.ms (3 s there)",
		usage:  "consumer-group heartbeat interval: bounds how long a member takes to learn of a rebalance",
		field:  durationField(func(c *Config) *time.Duration { return &c.Heartbeat }),
		check:  positiveDuration(func(c *Config) time.Duration { return c.Heartbeat })},
	{name: "Rebalance", option: "WithGroupTimeouts", env: "RUNNEL_REBALANCE_TIMEOUT", flag: "rebalance-timeout", worker: true,
		def: "0 (Sarama's 60s)", unit: "duration",
		source: "Kafka JoinGroup rebalance timeout (max.poll.interval.ms; KIP-62)",
		usage:  "how long the group waits for members to rejoin in a rebalance (0: 60s)",
		field:  durationField(func(c *Config) *time.Duration { return &c.Rebalance }),
		check:  nonNegativeDuration(func(c *Config) time.Duration { return c.Rebalance })},
	{name: "FetchMaxWait", option: "WithGroupTimeouts", env: "RUNNEL_FETCH_MAX_WAIT", flag: "fetch-max-wait", worker: true,
		def: "100ms", unit: "duration",
		source: "Kafka fetch.max.wait.ms (500 ms there)",
		usage:  "how long a fetch waits for data when there is none",
		field:  durationField(func(c *Config) *time.Duration { return &c.FetchMaxWait }),
		check:  positiveDuration(func(c *Config) time.Duration { return c.FetchMaxWait })},
	{name: "AcceptableRecoveryLag", option: "WithWarmups", env: "RUNNEL_ACCEPTABLE_RECOVERY_LAG", flag: "acceptable-recovery-lag", worker: true,
		def: "0 (10000)", unit: "changelog offsets; negative: 0",
		source: "KIP-441 acceptable.recovery.lag",
		usage:  "KIP-441: changelog offsets a worker may lag and still take an active (0: 10000)",
		field:  int64Field(func(c *Config) *int64 { return &c.AcceptableRecoveryLag })},
	{name: "MaxWarmupReplicas", option: "WithWarmups", env: "RUNNEL_MAX_WARMUPS", flag: "max-warmups", worker: true,
		def: "0 (2)", unit: "warm-up replicas per plan",
		source: "KIP-441 max.warmup.replicas",
		usage:  "KIP-441: warm-up replicas per plan at most (0: 2)",
		field:  intField(func(c *Config) *int { return &c.MaxWarmupReplicas })},
	{name: "ProbingRebalanceInterval", option: "WithWarmups", env: "RUNNEL_PROBING_INTERVAL", flag: "probing-interval", worker: true,
		def: "0 (10m)", unit: "duration",
		source: "KIP-441 probing.rebalance.interval.ms",
		usage:  "KIP-441: rebalance this long after a plan with warm-ups at the latest (0: 10m; a caught-up warm-up asks at once)",
		field:  durationField(func(c *Config) *time.Duration { return &c.ProbingRebalanceInterval }),
		check:  nonNegativeDuration(func(c *Config) time.Duration { return c.ProbingRebalanceInterval })},
	{name: "MaxURLMapBytes", option: "WithURLMapBudget", env: "RUNNEL_URL_MAP_BUDGET", flag: "url-map-budget", worker: true,
		def: "0 (256 KiB)", unit: "bytes over all members' assignments; negative: always left out",
		usage: "bytes the partition -> URL map may add to the group's assignments (0: 256 KiB; negative: derived by each worker)",
		field: intField(func(c *Config) *int { return &c.MaxURLMapBytes })},
	{name: "InstanceID", option: "WithInstanceID", env: "RUNNEL_INSTANCE_ID", flag: "instance-id", worker: true,
		def: "none (dynamic membership)", unit: "string, unique per worker",
		source: "Kafka group.instance.id; KIP-345",
		usage:  "static group membership (KIP-345): this worker's own stable ID",
		field:  stringField(func(c *Config) *string { return &c.InstanceID })},
	{name: "rebalance protocol", option: "WithRebalanceProtocol", env: "RUNNEL_REBALANCE_PROTOCOL", flag: "rebalance-protocol", worker: true,
		def: "cooperative", unit: "cooperative or eager",
		source: "KIP-429; Kafka Streams upgrade.from (eager)",
		usage:  "consumer-group rebalance protocol: cooperative or eager (every worker of an app the same)",
		field: funcField{
			setF: func(c *Config, v string) error {
				switch strings.ToLower(strings.TrimSpace(v)) {
				case "cooperative":
					c.eager = false
				case "eager":
					c.eager = true
				default:
					return fmt.Errorf("%q: cooperative or eager", v)
				}
				return nil
			},
			getF: func(c *Config) string { return c.rebalanceProtocolName() },
		}},
	{name: "HTTPAddr", option: "WithHTTPAddr", env: "RUNNEL_HTTP_ADDR", flag: "http-addr", worker: true,
		def: "none (no HTTP server)", unit: "host:port; no host: localhost only",
		source: "Kafka Streams application.server",
		usage:  "serve the status page, /metrics, /healthz, /readyz and the JSON API here; \":8080\" binds localhost, \"0.0.0.0:8080\" every interface",
		field:  stringField(func(c *Config) *string { return &c.HTTPAddr }),
		check: func(c *Config) error {
			if c.HTTPAddr == "" {
				return nil
			}
			if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
				return fmt.Errorf("%q: want host:port or :port: %w", c.HTTPAddr, err)
			}
			return nil
		}},
	{name: "Pprof", option: "WithPprof", env: "RUNNEL_PPROF", flag: "pprof", worker: true,
		def: "false", unit: "true or false",
		usage:  "serve Go profiles under /debug/pprof/ on --http-addr",
		isBool: true,
		field:  boolField(func(c *Config) *bool { return &c.Pprof })},
	{name: "Redelivery.MaxRetries", option: "WithRedelivery", env: "RUNNEL_MAX_RETRIES", flag: "max-retries", worker: true,
		def: "0 (5)", unit: "redeliveries of a failed record before it is dead-lettered; negative: none",
		usage: "redeliveries of a failed record before it is dead-lettered (0: 5; negative: none)",
		field: intField(func(c *Config) *int { return &c.redelivery.MaxRetries })},
	{name: "Redelivery.Backoff", option: "WithRedelivery", env: "RUNNEL_RETRY_BACKOFF", flag: "retry-backoff", worker: true,
		def: "0 (100ms)", unit: "duration, doubling per attempt",
		source: "like Kafka retry.backoff.ms",
		usage:  "wait before the first redelivery of a failed record, doubling per attempt (0: 100ms)",
		field:  durationField(func(c *Config) *time.Duration { return &c.redelivery.Backoff })},
	{name: "Redelivery.MaxBackoff", option: "WithRedelivery", env: "RUNNEL_RETRY_MAX_BACKOFF", flag: "retry-max-backoff", worker: true,
		def: "0 (10s)", unit: "duration",
		source: "like Kafka retry.backoff.max.ms (KIP-580)",
		usage:  "longest wait before a redelivery (0: 10s)",
		field:  durationField(func(c *Config) *time.Duration { return &c.redelivery.MaxBackoff })},
	{name: "repartition purge interval", option: "WithRepartitionPurge", env: "RUNNEL_REPARTITION_PURGE", flag: "repartition-purge", worker: true,
		def: "0 (30s)", unit: "duration; negative: off",
		source: "Kafka Streams repartition.purge.interval.ms",
		usage:  "how often consumed records of repartition topics are deleted (0: 30s; negative: never)",
		field:  durationField(func(c *Config) *time.Duration { return &c.repartitionPurge })},
	{name: "topic prefix", option: "WithTopicPrefix", env: "RUNNEL_TOPIC_PREFIX",
		def: "none", unit: "string prefixed to declared topic names",
		usage: "prefix of the declared topics' names (read when they are declared, so no flag)",
		field: stringField(func(c *Config) *string { return &c.topicPrefix })},
	{name: "Logger", option: "WithLogger",
		def: "slog text on stderr, level info", unit: "*slog.Logger",
		usage: "the app's logger; the CLI's --log-level and --log-format replace it"},
}

// commitInterval is the commit interval in effect: CommitInterval, or when
// it is 0 the guarantee's default (DefaultCommitInterval,
// DefaultExactlyOnceCommitInterval).
func (c *Config) commitInterval() time.Duration {
	switch {
	case c.CommitInterval > 0:
		return c.CommitInterval
	case c.Guarantee == ExactlyOnce:
		return DefaultExactlyOnceCommitInterval
	}
	return DefaultCommitInterval
}

func cmp0(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// tlsOn reports whether connections use TLS.
func (c *Config) tlsOn() bool {
	return c.TLS != nil || c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSKeyFile != ""
}

// names is how an error names a setting: its option, variable and flag.
func (s *setting) names() string {
	n := []string{s.option}
	if s.env != "" {
		n = append(n, s.env)
	}
	if s.flag != "" {
		n = append(n, "--"+s.flag)
	}
	return strings.Join(n, ", ")
}

// applyEnv sets c from the environment variables of settings; it returns one
// error per variable that does not parse (the value of a secret is not shown).
func applyEnv(c *Config, lookup func(string) (string, bool)) []error {
	var errs []error
	for i := range settings {
		s := &settings[i]
		if s.env == "" || s.field == nil {
			continue
		}
		v, ok := lookup(s.env)
		if !ok || v == "" {
			continue
		}
		if err := s.field.set(c, v); err != nil {
			shown := strconv.Quote(v)
			if s.secret {
				shown = "(hidden)"
			}
			errs = append(errs, fmt.Errorf("config: %s=%s: %w", s.env, shown, err))
		}
	}
	return errs
}

// validate checks c; each error names the setting (option, environment
// variable, flag) and what it allows.
func (c *Config) validate() error {
	var errs []error
	for i := range settings {
		s := &settings[i]
		if s.check == nil {
			continue
		}
		if err := s.check(c); err != nil {
			errs = append(errs, fmt.Errorf("config %s (%s): %w", s.name, s.names(), err))
		}
	}
	return errors.Join(errs...)
}

// security returns the TLS and SASL settings as the Kafka clients take them,
// reading the TLS files. Errors name the file and the setting.
func (c *Config) security() (kafka.Security, error) {
	sec := kafka.Security{SASL: c.SASL.kafka()}
	if !c.tlsOn() {
		return sec, nil
	}
	var t *tls.Config
	if c.TLS != nil {
		t = c.TLS.Clone()
	} else {
		t = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.TLSCAFile != "" {
		pem, err := os.ReadFile(c.TLSCAFile)
		if err != nil {
			return sec, fmt.Errorf("config TLSCAFile (RUNNEL_TLS_CA_FILE, --tls-ca-file): %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return sec, fmt.Errorf("config TLSCAFile (RUNNEL_TLS_CA_FILE, --tls-ca-file): %s holds no PEM certificate", c.TLSCAFile)
		}
		t.RootCAs = pool
	}
	if c.TLSCertFile != "" || c.TLSKeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return sec, fmt.Errorf("config TLSCertFile, TLSKeyFile (RUNNEL_TLS_CERT_FILE, RUNNEL_TLS_KEY_FILE, --tls-cert-file, --tls-key-file): %w", err)
		}
		t.Certificates = append(t.Certificates, cert)
	}
	sec.TLS = t
	return sec, nil
}

// clearSecurity drops TLS and SASL: the in-process broker of dev speaks
// neither.
func (c *Config) clearSecurity() {
	c.TLS, c.TLSCAFile, c.TLSCertFile, c.TLSKeyFile, c.SASL = nil, "", "", "", SASL{}
}

// validate reports the environment variables New could not parse and every
// problem of the configuration (Config.validate).
func (a *App) validate() error {
	return errors.Join(append(append([]error(nil), a.cfgErrs...), a.cfg.validate())...)
}

// settingFlag is a setting as a pflag.Value over c.
type settingFlag struct {
	s *setting
	c *Config
}

func (f settingFlag) String() string {
	if f.c == nil || f.s.secret {
		return ""
	}
	return f.s.field.get(f.c)
}

func (f settingFlag) Set(v string) error { return f.s.field.set(f.c, v) }

func (f settingFlag) Type() string {
	switch f.s.field.(type) {
	case durationField:
		return "duration"
	case intField, int64Field:
		return "int"
	}
	if f.s.isBool {
		return "bool"
	}
	return "string"
}

// addSettingFlags registers the flag of every setting that has one: on
// every command (all) or on the worker command (worker). A flag's value
// shown by --help is the value options and the environment gave.
func (a *App) addSettingFlags(all, worker *pflag.FlagSet) {
	for i := range settings {
		s := &settings[i]
		if s.flag == "" || s.field == nil {
			continue
		}
		fs := all
		if s.worker {
			fs = worker
		}
		usage := s.usage
		if s.env != "" {
			usage += " (env " + s.env + ")"
		}
		f := fs.VarPF(settingFlag{s, &a.cfg}, s.flag, "", usage)
		if s.isBool {
			f.NoOptDefVal = "true"
		}
	}
}
