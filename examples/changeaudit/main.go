// Command changeaudit is the Runnel example app: it counts change events per
// actor and per directory. Run it on the bundled data with
//
//	go run ./examples/changeaudit dev --input examples/changeaudit/testdata/git-history.jsonl.gz --workers 2
package main

import (
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/examples/changeaudit/pipeline"
)

// main runs the command line; `dev --input FILE` and `send FILE` load FILE
// into change-events, keyed by each line's actor.
func main() {
	pipeline.Build("change-audit").App.Main(app.DevInput(pipeline.InputTopic, pipeline.InputKey))
}
