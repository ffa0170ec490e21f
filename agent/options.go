package agent

import (
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"log/slog"

	"github.com/runnel-dev/runnel/table"
)

// ErrorPolicy is what a worker does when an agent returns an error or panics
// on a partition. In every policy the record the agent was on (its open
// window) is never acked: Restart and StopWorker fail it (the source
// redelivers it), DeadLetter rejects it (it goes to the agent's dead-letter
// topic and its offset is committed).
type ErrorPolicy int

const (
	// Restart (the default) fails the record and runs the agent again on the
	// same subscription after a backoff (exponential, from the app's
	// redelivery backoff, doubling up to its maximum): the agent continues
	// with its next queued record and sees the failed one again when the
	// source redelivers it. A record that keeps failing is dead-lettered by
	// the source after its retry budget (app.WithRedelivery).
	Restart ErrorPolicy = iota
	// StopWorker fails the record, stops the partition and makes Worker.Run
	// return the agent's error (the process exits; a supervisor restarts it
	// from the last committed offset).
	StopWorker
	// DeadLetter rejects the record with the agent's error as reason (it is
	// written to the agent's dead-letter topic) and runs the agent again at
	// once on its next record.
	DeadLetter
)

func (p ErrorPolicy) String() string { return agentrt.ErrorPolicy(p).String() }

// LogValue makes slog print the name in JSON logs too (the JSON handler
// would print the number: it does not call String).
func (p ErrorPolicy) LogValue() slog.Value { return slog.StringValue(p.String()) }

// settings are an agent's per-agent options, as the options set them; the
// worker reads them as agentrt.Settings (runner.Settings).
type settings struct {
	// OnError is the agent's error policy; default Restart.
	OnError ErrorPolicy
	// DeadLetterTopic is where the agent's rejected records, and records it
	// failed more often than the retry budget allows, are written; empty
	// means "<app>-<agent>-dlq".
	DeadLetterTopic string
	// Sinks are the topics the agent sends to (SendsTo) and Tables the
	// tables it writes (WritesTo): the App checks at build that each is
	// declared on it, and that each table is co-partitioned with the
	// agent's topic; the worker refuses a send or a write outside them
	// (table.UndeclaredError), so describe shows every edge.
	Sinks  []TopicDef
	Tables []table.Def
	// Timers run on every partition of the agent's topic (Every).
	Timers []timer
	// Lookups are the tables the agent reads by the record's key (Lookup):
	// the App checks that each is co-partitioned with the agent's topic.
	Lookups []table.Def
	// Effects name the effects the agent applies, as declared with
	// Applies: `replay --effect` refuses another name before reading.
	Effects []string
	// Deterministic is set by Deterministic.
	Deterministic bool
}

// Option configures an agent (see New).
type Option func(*settings)

// OnError sets the agent's error policy (default Restart).
func OnError(p ErrorPolicy) Option { return func(s *settings) { s.OnError = p } }

// WithDeadLetterTopic names the agent's dead-letter topic (default
// "<app>-<agent>-dlq"). The worker creates it (one partition) if missing.
// Every dead letter carries the headers runnel-reason, runnel-topic,
// runnel-partition, runnel-offset, runnel-agent, runnel-attempts and
// runnel-timestamp (see docs/ack-mode.md).
func WithDeadLetterTopic(topic string) Option { return func(s *settings) { s.DeadLetterTopic = topic } }

// SendsTo declares the topics the agent sends records to (sinks): describe
// and its --dot graph show them, and the App refuses at build a topic that is
// not declared on it (app.Topic, Repartition, GroupBy). A send to a topic the
// agent did not declare is refused: Topic.Send fails the event with a
// *table.UndeclaredError (TrySend returns it) naming the agent, the topic and
// this option, and the worker stops on it (a fix of the code, which no redelivery makes; the
// record is not committed). Sends from the agent's timers (Every, Cron) and
// from EmitOnClose of a windowed table it writes are the agent's sends too.
func SendsTo(topics ...TopicDef) Option {
	return func(s *settings) { s.Sinks = append(s.Sinks, topics...) }
}

// WritesTo declares the tables the agent writes (Put, Update, Compute,
// Delete and their Try… forms; a windowed table's Update and UpdateAt):
// describe and its --dot graph show them, and the App refuses at build a
// table that is not declared on it or whose partition count differs from the
// agent's topic's (co-partitioning). A write to a table the agent did not
// declare is refused: it fails the event with a *table.UndeclaredError (the
// Try… forms return it) naming the agent, the table and this option, and the
// worker stops on it, as for SendsTo. Writes from the agent's timers
// are the agent's writes too. A joined table (table.Join) is written by the
// join when the agent writes one of its sides: declare the side. Reads (Get,
// Lookup, Range) need no declaration (Lookup declares a read by the record's
// key for the co-partitioning check).
func WritesTo(tables ...table.Def) Option {
	return func(s *settings) { s.Tables = append(s.Tables, tables...) }
}

// Applies declares the effects the agent calls (Effect.Apply), so that
// `replay --effect NAME` refuses a name the agent does not apply at once,
// before planning and reading the range, instead of after the replay ran
// (replay.ErrEffectUnused). Unlike SendsTo and WritesTo, the declaration is
// not enforced: an undeclared effect still applies.
func Applies(effects ...*Effect) Option {
	return func(s *settings) {
		for _, e := range effects {
			s.Effects = append(s.Effects, e.Name())
		}
	}
}

// Deterministic declares that what the agent sends for a record depends only
// on that record (and on tables only the agent's own partition writes): the
// same records, to the same partitions, in the same order, whenever the
// record is processed. The sends of one event must therefore be made one
// after another, not from several goroutines at once (their order, which
// numbers them, would change from run to run). Under at-least-once a record processed again (after a
// kill -9, a failed commit or an abandoned task: everything processed since
// the partition's last commit) is sent again; with this option the records
// the agent sends to a repartition topic (Repartition, GroupBy) carry where
// they come from (header "runnel-src": the source record's topic, partition
// and offset, the agent, and the run that sent them), and the repartition
// topic's reader skips each one an earlier run of the same source partition
// already delivered, so the aggregates behind a repartition count each input
// record once. GroupBy's agent sets it (its key function must depend only on
// the record). Exactly-once needs no stamps (an aborted transaction's records
// are never read) and sends none.
//
// A run that goes on past a record it did not finish (the agent failed on it
// and was run again, it was dead-lettered, or one of its derived records was
// refused, so that its later sends were refused too) stops covering records
// there, so the record's redelivery is kept. Costs: about
// 60 bytes of header per repartition record, the stamped sends of one
// source partition's agents made one at a time (under one lock, with the
// producer call), and marks for at most about 90 (source partition, agent)
// pairs per repartition partition (the commit metadata's room): beyond that,
// records sent again are counted again.
//
// An agent whose sends depend on anything else (the clock, randomness, a
// table another partition or another agent writes) must not set it: after a
// failed send its second run could send a record to a partition whose reader
// takes it for the first run's and skips it. Resetting the agent's input
// offsets by hand below where the current run started is recognised (the
// reader keeps what the earlier-starting run sends); to reprocess records of
// the current run, reset the repartition topic's offsets too, which drops
// the reader's marks (package internal/dedup describes the rule).
func Deterministic() Option { return func(s *settings) { s.Deterministic = true } }

// Error is the error of one agent run on one partition, as the worker
// reports it (an agent's error policy decides what follows).
type Error struct {
	Agent     string
	Partition int32
	// Offset is the record the agent was on when it failed (its window was
	// open), or -1 when the error did not happen inside a record's window.
	Offset int64
	// Stream is true when the stream itself failed (ack timeout, overflow,
	// the source terminated): the subscription is over, and the partition
	// must be restarted rather than the agent alone.
	Stream bool
	// Panic is true when the agent panicked (Err holds the value and stack).
	Panic bool
	Err   error
}

func (e *Error) Error() string {
	where := ""
	if e.Offset >= 0 {
		where = fmt.Sprintf("@%d", e.Offset)
	}
	return fmt.Sprintf("agent %s[%d]%s: %v", e.Agent, e.Partition, where, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }
