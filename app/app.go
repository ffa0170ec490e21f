package app

import (
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/topicdecl"
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
	agents []agentrt.Runner
	tables []table.Def
	errs   []error
	// cfgErrs are the environment variables that did not parse (New);
	// validate reports them with the rest of the configuration's problems.
	cfgErrs []error
	// idWarning logs, once, that the app ID holds '.' or '_' (Topology).
	idWarning sync.Once
}

// New declares an app. id names the consumer group and prefixes changelog topics.
func New(id string, opts ...Option) *App {
	c := defaultConfig()
	for _, o := range opts {
		o(&c)
	}
	envErrs := applyEnv(&c, os.LookupEnv)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	a := &App{id: id, cfg: c, topics: map[string]agent.TopicDef{}, cfgErrs: envErrs}
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
func (a *App) RegisterAgent(d agent.Def) {
	r := agentrt.RunnerOf(d)
	if r == nil {
		a.errs = append(a.errs, fmt.Errorf("agent %s: not declared with agent.New", d.Name()))
		return
	}
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

// Partitions sets a topic's partition count (default 8). table.Partitions
// sets a table's, and agent.Partitions a repartition topic's.
func Partitions(n int32) TopicOption { return func(o *topicOptions) { o.partitions = n } }

// Topic declares a typed topic of app a, the one way to declare a topic an
// app reads or writes: its name (prefixed with WithTopicPrefix's prefix),
// key and value codecs, and partition count (Partitions, default 8). Agents
// consume it (agent.New) and send to it (Topic.Send, declared with
// agent.SendsTo). The worker creates it when missing, with that count.
func Topic[K any, V any](a *App, name string, kc codec.Codec[K], vc codec.Codec[V], opts ...TopicOption) *agent.Topic[K, V] {
	o := topicOptions{partitions: 8}
	for _, f := range opts {
		f(&o)
	}
	t := new(agent.Topic[K, V])
	topicdecl.Init(t, a.cfg.topicPrefix+name, o.partitions, kc, vc)
	a.RegisterTopic(t)
	return t
}

// Topology returns the declared graph, with table partition counts resolved
// and co-partitioning validated; the error lists every declaration problem.
func (a *App) Topology() (*topology.Graph, error) {
	a.idWarning.Do(a.warnTopicCollision)
	g := &topology.Graph{App: a.id}
	names := make([]string, 0, len(a.topics))
	for n := range a.topics {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t := a.topics[n]
		tt := topology.Topic{Name: n, Partitions: t.Partitions(), KeyCodec: t.KeyCodec(), ValueCodec: t.ValueCodec()}
		if r, ok := topicdecl.Of(t); ok {
			tt.RepartitionOf = r.RepartitionOf()
		}
		g.Topics = append(g.Topics, tt)
	}
	var declErrs []error // declarations of agents that name what the app does not hold
	for _, r := range a.agents {
		ta := describeAgent(r)
		ta.Sinks, ta.Tables = a.declaredSinks(r, &declErrs), a.declaredTables(r, &declErrs)
		ta.DeadLetterTopic = a.DeadLetterTopic(r.Name())
		g.Agents = append(g.Agents, ta)
	}
	for _, d := range a.tables {
		tt := topology.Table{Name: d.Name(), Changelog: d.Changelog(), Partitions: d.Partitions(),
			KeyCodec: d.KeyCodec(), ValueCodec: d.ValueCodec()}
		if j, ok := d.(tablestate.JoinDef); ok {
			kind, l, r := j.JoinOf()
			tt.JoinKind, tt.JoinOf = kind, []string{l, r}
		}
		if w, ok := d.(interface{ WindowSpec() string }); ok {
			tt.Windows = w.WindowSpec()
		}
		g.Tables = append(g.Tables, tt)
	}
	errs := append(append([]error(nil), a.errs...), declErrs...)
	if err := g.Resolve(); err != nil {
		errs = append(errs, err)
	}
	return g, joinErrors(errs)
}

// warnTopicCollision warns when the app ID holds '.' or '_': the ID
// prefixes the app's internal topics (changelogs, repartition and
// dead-letter topics), and Kafka's metric names turn '.' into '_', so two
// topics that differ only there collide (Kafka refuses to create the second
// with InvalidTopicException, and kafka-topics warns about it). The ID stays
// valid: a topic name allows both.
func (a *App) warnTopicCollision() {
	if !strings.ContainsAny(a.id, "._") {
		return
	}
	a.cfg.Logger.Warn("the app ID contains '.' or '_': Kafka's metric names treat them alike, so the app's topics (<app>-<table>-changelog, ...) "+
		"collide with topics that differ only there, and Kafka refuses to create the second; prefer '-'",
		"app", a.id, "example", strings.NewReplacer(".", "_", "_", ".").Replace(a.id)+"-<table>-changelog")
}

// declaredSinks returns the names of the topics agent r declared it sends
// to (agent.SendsTo), once each, and records an error for a topic that is
// not declared on a to errs (another app's, or made outside app.Topic,
// agent.Repartition and agent.GroupBy): the worker refuses every send not
// declared, so describe shows every edge.
func (a *App) declaredSinks(r agentrt.Runner, errs *[]error) []string {
	out := []string{}
	for _, t := range r.Settings().Sinks {
		if isNil(t) {
			*errs = append(*errs, fmt.Errorf("agent %s: agent.SendsTo got a nil topic", r.Name()))
			continue
		}
		if slices.Contains(out, t.Name()) {
			continue
		}
		if d, ok := a.topics[t.Name()]; !ok || d != t {
			*errs = append(*errs, fmt.Errorf("agent %s: sends to topic %q (agent.SendsTo), which is not declared on app %s: declare it with app.Topic on this app", r.Name(), t.Name(), a.id))
		}
		out = append(out, t.Name())
	}
	return out
}

// declaredTables is declaredSinks for the tables agent r declared it writes
// (agent.WritesTo).
func (a *App) declaredTables(r agentrt.Runner, errs *[]error) []string {
	out := []string{}
	for _, t := range r.Settings().Tables {
		if isNil(t) {
			*errs = append(*errs, fmt.Errorf("agent %s: agent.WritesTo got a nil table", r.Name()))
			continue
		}
		if slices.Contains(out, t.Name()) {
			continue
		}
		if !slices.ContainsFunc(a.tables, func(d table.Def) bool { return d == t }) {
			*errs = append(*errs, fmt.Errorf("agent %s: writes table %q (agent.WritesTo), which is not declared on app %s: declare it with table.New (or NewGlobal, NewWindowed, Join) on this app", r.Name(), t.Name(), a.id))
		}
		out = append(out, t.Name())
	}
	return out
}

// isNil reports whether v is nil or a nil pointer in an interface (a table
// or topic variable declared but never assigned), which would panic on its
// first method call.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}
