// Command weekly counts change events per actor and ISO week (Monday 00:00
// UTC to the next Monday) with a tumbling windowed table, on event time (the
// change's occurred_at, not the time the record was produced). Run it on the
// bundled history with
//
//	go run ./examples/weekly dev --input examples/changeaudit/testdata/git-history.jsonl.gz
//
// The history is out of order (author dates): a change that arrives more than
// four weeks (the grace) after its partition's stream time passed the end of
// its week is late and dropped (Windowed.LateRecords counts them).
package main

import (
	"context"
	"fmt"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/table"
)

// Change is the part of a change event this example reads.
type Change struct {
	EventID    string `json:"event_id"`
	Actor      string `json:"actor"`
	OccurredAt string `json:"occurred_at"`
}

// Weekly is the declared app with handles on its topic and table.
type Weekly struct {
	App     *app.App
	Changes *agent.Topic[string, Change]
	// PerWeek holds a count per actor and ISO week.
	PerWeek *table.Windowed[string, int64]
}

const (
	week = 7 * 24 * time.Hour
	// Grace lets changes arrive up to four weeks of stream time after their
	// week ended.
	Grace = 4 * week
	// Retention keeps closed weeks readable (and in the dev report) for 30
	// years of stream time instead of deleting them when they close.
	Retention = 30 * 365 * 24 * time.Hour
)

// ISOWeeks are tumbling windows of a week starting on Mondays 00:00 UTC: epoch
// alignment would start them on Thursdays (1970-01-01), hence the 4-day offset.
var ISOWeeks = table.Tumbling(week).WithOffset(4 * 24 * time.Hour)

// Build declares the app with the given ID ("weekly" from main; tests use
// unique IDs).
func Build(id string, opts ...app.Option) *Weekly {
	a := app.New(id, opts...)
	w := &Weekly{App: a}
	w.Changes = app.Topic(a, "change-events", codec.String(), codec.JSON[Change](), app.Partitions(8))
	log := a.Config().Logger
	w.PerWeek = table.NewWindowed(a, "changes-per-actor-week", codec.String(), codec.DecimalInt64(), ISOWeeks,
		table.Grace(Grace), table.Retention(Retention),
		table.OnClose(func(actor string, win table.Window, n int64) {
			y, wk := win.Start.ISOWeek()
			log.Debug("week closed", "actor", actor, "week", fmt.Sprintf("%d-W%02d", y, wk), "changes", n)
		}))
	agent.New(a, "count-per-week", w.Changes, func(ctx context.Context, s *agent.Stream[string, Change]) error {
		for ev := range s.Events() {
			at, err := time.Parse(time.RFC3339, ev.Value.OccurredAt)
			if err != nil {
				// Not retryable: dead-letter the record and go on.
				ev.Reject(fmt.Errorf("occurred_at %q: %w", ev.Value.OccurredAt, err))
				continue
			}
			w.PerWeek.UpdateAt(ev, ev.Value.Actor, at, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(w.PerWeek))
	return w
}

// main runs the command line; `dev --input FILE` and `send FILE` load FILE
// into change-events, keyed by each line's actor.
func main() { Build("weekly").App.Main(app.DevInput("change-events", "actor")) }
