// Package pipeline is the change-audit example: counts of change events per
// actor and per directory, computed from a stream of pseudonymized commits.
package pipeline

import (
	"context"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/table"
)

// Change is one change event of the input (see testdata/README of the data).
type Change struct {
	EventID    string   `json:"event_id"`
	Parents    int      `json:"parents"`
	Actor      string   `json:"actor"`
	Committer  string   `json:"committer"`
	OccurredAt string   `json:"occurred_at"`
	RecordedAt string   `json:"recorded_at"`
	Files      int      `json:"files"`
	Added      int64    `json:"added"`
	Deleted    int64    `json:"deleted"`
	Dirs       []string `json:"dirs"`
}

// DirChange is one directory touched by a change, keyed by Dir on the
// repartition topic "<app>-changes-by-dir-repartition".
type DirChange struct {
	Dir     string `json:"dir"`
	EventID string `json:"event_id"`
	Actor   string `json:"actor"`
}

// InputTopic is the topic of the change events, and InputKey the field of
// each JSONL line of them that keys the record (dev, send).
const (
	InputTopic = "change-events"
	InputKey   = "actor"
)

// Pipeline is the declared app with handles on its topics and tables.
type Pipeline struct {
	App             *app.App
	Events          *agent.Topic[string, Change]
	ByDir           *agent.Topic[string, DirChange]
	CommitsPerActor *table.Table[string, int64]
	LinesPerActor   *table.Table[string, int64]
	EventsPerDir    *table.Table[string, int64]
}

// Build declares the change-audit app with the given app ID ("change-audit"
// in production; tests use unique IDs so that runs never share a group).
func Build(id string, opts ...app.Option) *Pipeline {
	a := app.New(id, opts...)
	p := &Pipeline{App: a}
	p.Events = app.Topic(a, InputTopic, codec.String(), codec.JSON[Change](), app.Partitions(8))
	p.CommitsPerActor = table.New(a, "commits-per-actor", codec.String(), codec.DecimalInt64())
	p.LinesPerActor = table.New(a, "lines-per-actor", codec.String(), codec.DecimalInt64())
	p.EventsPerDir = table.New(a, "events-per-dir", codec.String(), codec.DecimalInt64())
	// Counting per directory needs the records keyed by directory: a table
	// key must live in the partition of the event that writes it. The
	// repartition topic "<app>-changes-by-dir-repartition" is created with
	// change-events' partition count; a record sent to it is a sink of the
	// change event (docs/streams.md).
	p.ByDir = agent.Repartition(a, "changes-by-dir", p.Events, codec.String(), codec.JSON[DirChange]())

	agent.New(a, "count-by-actor", p.Events, func(ctx context.Context, s *agent.Stream[string, Change]) error {
		for ev := range s.Events() {
			c := ev.Value
			p.CommitsPerActor.Update(ev, c.Actor, func(n int64) int64 { return n + 1 })
			p.LinesPerActor.Update(ev, c.Actor, func(n int64) int64 { return n + c.Added + c.Deleted })
		}
		return s.Err()
	}, agent.WritesTo(p.CommitsPerActor, p.LinesPerActor))
	agent.New(a, "split-by-dir", p.Events, func(ctx context.Context, s *agent.Stream[string, Change]) error {
		for ev := range s.Events() {
			for _, d := range ev.Value.Dirs {
				p.ByDir.Send(ev, d, DirChange{Dir: d, EventID: ev.Value.EventID, Actor: ev.Value.Actor})
			}
		}
		return s.Err()
	}, agent.SendsTo(p.ByDir), agent.Deterministic()) // its sends depend on the event only: hop 2 skips what a second run sends again
	agent.New(a, "count-by-dir", p.ByDir, func(ctx context.Context, s *agent.Stream[string, DirChange]) error {
		for ev := range s.Events() {
			p.EventsPerDir.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(p.EventsPerDir))
	return p
}
