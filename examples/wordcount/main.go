// Command wordcount is the app of docs/getting-started.md: agent split
// re-keys each line's words through the topic words, agent count counts them
// in the table word-counts. Build declares it, main runs it, and main_test.go
// tests it with runneltest: the guide's shape, compiled and tested in CI.
package main

import (
	"context"
	"errors"
	"strings"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/table"
)

// Line is one input record: {"id": "1", "text": "the quick brown fox"}.
type Line struct {
	ID   string `json:"id"`
	Text string `json:"text"`
}

// Wordcount is the declared app and the handles its tests use.
type Wordcount struct {
	App    *app.App
	Lines  *agent.Topic[string, Line]
	Words  *agent.Topic[string, string]
	Counts *table.Table[string, int64]
}

// Build declares the app under the app ID id (the consumer group, and the
// prefix of its changelog and dead-letter topics).
func Build(id string) *Wordcount {
	a := app.New(id)
	w := &Wordcount{
		App:    a,
		Lines:  app.Topic(a, "lines", codec.String(), codec.JSON[Line](), app.Partitions(4)),
		Words:  app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(4)),
		Counts: table.New(a, "word-counts", codec.String(), codec.DecimalInt64()),
	}
	agent.New(a, "split", w.Lines, func(ctx context.Context, s *agent.Stream[string, Line]) error {
		for ev := range s.Events() {
			if strings.TrimSpace(ev.Value.Text) == "" {
				ev.Reject(errors.New("empty line")) // to the dead-letter topic
				continue
			}
			for _, word := range strings.Fields(strings.ToLower(ev.Value.Text)) {
				w.Words.Send(ev, word, ev.Value.ID)
			}
		}
		return s.Err()
	}, agent.SendsTo(w.Words))
	agent.New(a, "count", w.Words, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			w.Counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(w.Counts))
	return w
}

func main() {
	// `dev --input FILE` and `send FILE` load FILE into lines, keyed by id.
	Build("wordcount-demo").App.Main(app.DevInput("lines", "id"))
}
