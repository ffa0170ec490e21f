// Package agentrt is the runtime side of Runnel's agents: what the worker
// (package app) and a replay (package replay) call to run an agent on a
// partition, read its options and drive its timers. Package agent is the API
// an app author uses (declaring topics and agents, options, events, timers);
// an agent's runtime side is reached through RunnerOf, so that no method
// that runs a partition (Run, a timer's Fire or Arm) is part of agent's API:
// called from an app it would resolve records outside their windows and
// break the ack accounting, and every change to the runtime would be a
// breaking change.
//
// It never imports package agent: agent implements these interfaces with
// unexported types and links them to its values (Link, as
// internal/tablestate links tables).
//
// agentrt must never run or decide anything itself: it holds the interfaces,
// the link, and FireFunc, which package agent sets once at initialization.
package agentrt

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/internal/tablestate"
)

// Runner is an agent independent of its key and value types, as the worker
// runs it.
type Runner interface {
	Name() string
	// Topic is the source topic.
	Topic() string
	// Settings are the agent's options (error policy, dead-letter topic,
	// timers, declared sinks and tables).
	Settings() Settings
	// Run runs the agent body once over sub, the subscription of partition
	// p. It returns nil when the stream ended because the source stopped,
	// otherwise an *agent.Error (a panic is recovered into one). Before
	// returning an error it resolves the record the agent was on according
	// to the error policy: rejected under DeadLetter, failed otherwise,
	// never acked. Run may be called again with the same subscription to
	// restart the agent; it continues with the next queued record.
	Run(ctx context.Context, p int32, sub *source.Subscription, env *tablestate.Env) error
}

// Settings are an agent's options as the worker reads them.
type Settings struct {
	// OnError is the agent's error policy (agent.OnError); default Restart.
	OnError ErrorPolicy
	// DeadLetterTopic is where the agent's rejected records go; empty means
	// "<app>-<agent>-dlq".
	DeadLetterTopic string
	// Sinks are the topics the agent sends to (agent.SendsTo) and Tables
	// the tables it writes (agent.WritesTo): a write or send elsewhere fails
	// with a *table.UndeclaredError.
	Sinks  []Topic
	Tables []tablestate.Def
	// Timers run on every partition of the agent's topic (agent.Every,
	// agent.Cron).
	Timers []Timer
	// Lookups are the tables the agent reads by the record's key
	// (agent.Lookup): the App checks that each is co-partitioned with the
	// agent's topic.
	Lookups []tablestate.Def
	// Effects name the effects the agent applies (agent.Applies).
	Effects []string
	// Deterministic says the agent's sends depend only on the record it
	// processes (agent.Deterministic): under at-least-once its records to
	// repartition topics are stamped so that their reader skips what a
	// second run of the same source records sends again (package dedup).
	Deterministic bool
}

// Topic is a declared topic as the runtime reads it: the method set of
// agent.TopicDef.
type Topic interface {
	Name() string
	// Partitions is the declared partition count.
	Partitions() int32
	KeyCodec() string
	ValueCodec() string
}

// ErrorPolicy is agent.ErrorPolicy as the runtime reads it: the same values.
type ErrorPolicy int

// The error policies, with agent.Restart, agent.StopWorker and
// agent.DeadLetter's values.
const (
	Restart ErrorPolicy = iota
	StopWorker
	DeadLetter
)

func (p ErrorPolicy) String() string {
	switch p {
	case Restart:
		return "restart"
	case StopWorker:
		return "stop-worker"
	case DeadLetter:
		return "dead-letter"
	}
	return fmt.Sprintf("ErrorPolicy(%d)", int(p))
}

// LogValue makes slog print the name in JSON logs too.
func (p ErrorPolicy) LogValue() slog.Value { return slog.StringValue(p.String()) }

// Clock is agent.Clock as the runtime reads it: the same values.
type Clock int

// The clocks, with agent.WallClock and agent.StreamTime's values.
const (
	WallClock Clock = iota
	StreamTime
)

func (c Clock) String() string {
	switch c {
	case WallClock:
		return "wall-clock"
	case StreamTime:
		return "stream-time"
	}
	return fmt.Sprintf("Clock(%d)", int(c))
}

// LogValue makes slog print the name in JSON logs too.
func (c Clock) LogValue() slog.Value { return slog.StringValue(c.String()) }

// Timer is a timer declared on an agent (agent.Every, agent.Cron), as the
// worker drives it.
type Timer interface {
	// Interval is an Every timer's interval; 0 for a Cron timer.
	Interval() time.Duration
	// Clock is the time an Every timer follows; WallClock for Cron.
	Clock() Clock
	// Cron is a Cron timer's crontab expression; "" for Every.
	Cron() string
	// String describes the timer ("every 1m0s wall-clock", "cron 0 9 * * * (UTC)").
	String() string
	// Validate reports a timer that cannot run (interval not positive, no
	// function, a crontab expression that does not parse).
	Validate() error
	// Boundary returns the latest multiple of the interval (since the Unix
	// epoch) at or before t: the time a firing at t is for.
	Boundary(t time.Time) time.Time
	// Next is a Cron timer's first firing after t.
	Next(t time.Time) time.Time
	// Prev is a Cron timer's latest firing in (after, now], if any.
	Prev(after, now time.Time) (time.Time, bool)
	// WithPartitions returns the timer for an agent whose topic has parts
	// partitions (a Cron timer keys its last firings by partition).
	WithPartitions(parts int32) Timer
	// LastFiring reads a Cron timer's last firing on partition p from its
	// cron table.
	LastFiring(p, parts int32, env *tablestate.Env) (time.Time, bool, error)
	// Arm records a Cron timer's first firing time on partition p without
	// running it (a timer first seen starts from now).
	Arm(ctx context.Context, p, parts int32, env *tablestate.Env, at time.Time) error
	// Fire runs the timer's function once on partition p with Tick.Time at
	// and waits for the broker's answer to every record it sent (ctx bounds
	// that wait). The worker calls it between two commit cycles of the
	// partition's task.
	Fire(ctx context.Context, p int32, env *tablestate.Env, at time.Time) error
}

// Link ties an agent value of package agent to its Runner. agent.Agent
// embeds it through an unexported alias: the embedding adds no exported
// field or method, only the unexported one RunnerOf asks for.
type Link struct{ r Runner }

// NewLink returns a link to r.
func NewLink(r Runner) Link { return Link{r: r} }

func (l Link) agentRunner() Runner { return l.r }

// linked is implemented by the types that embed a Link, and by no type
// outside this module (its method is unexported).
type linked interface{ agentRunner() Runner }

// RunnerOf returns the runtime side of a declared agent (an agent.Def; a
// Runner is its own), nil for a value package agent did not make.
func RunnerOf(d any) Runner {
	switch x := d.(type) {
	case linked:
		return x.agentRunner()
	case Runner:
		return x
	}
	return nil
}

// FireFunc runs fn once as a timer firing on partition p at time at, with a
// tick (an *agent.Tick) as its event, and waits for the broker's answer to
// every record fn bound to it; it returns fn's error (a panic recovered
// into one) joined with the first delivery error. Package agent sets it
// when it is initialized (only agent makes ticks); the worker backfills a
// join with it.
var FireFunc func(ctx context.Context, p int32, env *tablestate.Env, at time.Time, fn func(ctx context.Context, ev tablestate.Event) error) error
