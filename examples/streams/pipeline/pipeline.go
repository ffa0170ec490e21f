// Package pipeline is the stream-tools example: the change events of
// examples/changeaudit counted per actor, per committer (GroupBy) and per
// directory (Repartition), a join of the two per-actor tables into actor
// profiles, and a timer that emits each partition's top actor.
package pipeline

import (
	"cmp"
	"context"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/examples/changeaudit/pipeline"
	"github.com/runnel-dev/runnel/table"
)

// DirChange is one directory touched by a change, keyed by Dir on the
// repartition topic.
type DirChange struct {
	Dir   string `json:"dir"`
	Actor string `json:"actor"`
}

// Profile is an actor's joined profile: commits and lines changed.
type Profile struct {
	Commits int64 `json:"commits"`
	Lines   int64 `json:"lines"`
}

// Top is a partition's top actor by commits when the timer fired (ties: the
// smaller actor ID).
type Top struct {
	Partition int32     `json:"partition"`
	Actor     string    `json:"actor"`
	Commits   int64     `json:"commits"`
	At        time.Time `json:"at"`
}

// Pipeline is the declared app with handles on its topics and tables.
type Pipeline struct {
	App                 *app.App
	Events              *agent.Topic[string, pipeline.Change]
	ByDir               *agent.Topic[string, DirChange]
	ByCommitter         *agent.Topic[string, pipeline.Change]
	TopActors           *agent.Topic[string, Top]
	CommitsPerActor     *table.Table[string, int64]
	LinesPerActor       *table.Table[string, int64]
	EventsPerDir        *table.Table[string, int64]
	CommitsPerCommitter *table.Table[string, int64]
	Profiles            *table.Joined[string, Profile]
}

// Build declares the app with the given ID; topEvery is the interval of the
// top-actor timer (wall clock).
func Build(id string, topEvery time.Duration, opts ...app.Option) *Pipeline {
	a := app.New(id, opts...)
	p := &Pipeline{App: a}
	p.Events = app.Topic(a, "change-events", codec.String(), codec.JSON[pipeline.Change](), app.Partitions(8))
	p.TopActors = app.Topic(a, "top-actors", codec.String(), codec.JSON[Top](), app.Partitions(8))
	p.CommitsPerActor = table.New(a, "commits-per-actor", codec.String(), codec.DecimalInt64())
	p.LinesPerActor = table.New(a, "lines-per-actor", codec.String(), codec.DecimalInt64())
	p.EventsPerDir = table.New(a, "events-per-dir", codec.String(), codec.DecimalInt64())
	p.CommitsPerCommitter = table.New(a, "commits-per-committer", codec.String(), codec.DecimalInt64())
	// The join: kept up to date by every write of either table, in the
	// same commit cycle.
	p.Profiles = table.Join(a, "actor-profiles", table.InnerJoin, p.CommitsPerActor, p.LinesPerActor, codec.JSON[Profile](),
		func(commits table.Side[int64], lines table.Side[int64]) Profile {
			return Profile{Commits: commits.Value, Lines: lines.Value}
		})

	// Flat map through a repartition topic: one record per directory.
	p.ByDir = agent.Repartition(a, "by-dir", p.Events, codec.String(), codec.JSON[DirChange]())
	// Re-key only: GroupBy declares the topic and the re-keying agent.
	p.ByCommitter = agent.GroupBy(a, "by-committer", p.Events, codec.String(),
		func(ev *agent.Event[string, pipeline.Change]) (string, error) { return ev.Value.Committer, nil })

	agent.New(a, "count-by-actor", p.Events, func(ctx context.Context, s *agent.Stream[string, pipeline.Change]) error {
		for ev := range s.Events() {
			c := ev.Value
			p.CommitsPerActor.Update(ev, c.Actor, func(n int64) int64 { return n + 1 })
			p.LinesPerActor.Update(ev, c.Actor, func(n int64) int64 { return n + c.Added + c.Deleted })
		}
		return s.Err()
	}, agent.Every(topEvery, agent.WallClock, p.emitTop), agent.WritesTo(p.CommitsPerActor, p.LinesPerActor), agent.SendsTo(p.TopActors))
	agent.New(a, "split-by-dir", p.Events, func(ctx context.Context, s *agent.Stream[string, pipeline.Change]) error {
		for ev := range s.Events() {
			for _, d := range ev.Value.Dirs {
				p.ByDir.Send(ev, d, DirChange{Dir: d, Actor: ev.Value.Actor})
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
	agent.New(a, "count-by-committer", p.ByCommitter, func(ctx context.Context, s *agent.Stream[string, pipeline.Change]) error {
		for ev := range s.Events() {
			p.CommitsPerCommitter.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(p.CommitsPerCommitter))
	return p
}

// emitTop sends the partition's top actor by commits to top-actors, keyed by
// the actor; nothing when the partition has no actor yet.
func (p *Pipeline) emitTop(ctx context.Context, tk *agent.Tick) error {
	var top Top
	err := p.CommitsPerActor.Range(tk, func(actor string, n int64) bool {
		if n > top.Commits || (n == top.Commits && cmp.Less(actor, top.Actor)) {
			top.Actor, top.Commits = actor, n
		}
		return true
	})
	if err != nil || top.Actor == "" {
		return err
	}
	top.Partition, top.At = tk.Partition(), tk.Time
	p.TopActors.Send(tk, top.Actor, top)
	return nil
}
