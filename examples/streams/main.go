// Command streams is the example of Runnel's stream tools on the change
// data: per-directory and per-committer counts through repartition topics
// (agent.Repartition, agent.GroupBy), a timer that emits each partition's top
// actor (agent.Every) and a table-table join of two per-actor tables
// (table.Join). Run it on the bundled data with
//
//	go run ./examples/streams dev --input examples/changeaudit/testdata/git-history.jsonl.gz --workers 2
package main

import (
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/examples/streams/pipeline"
)

// main runs the command line; `dev --input FILE` and `send FILE` load FILE
// into change-events, keyed by each line's actor.
func main() {
	pipeline.Build("change-streams", 2*time.Second).App.Main(app.DevInput("change-events", "actor"))
}
