// Command chaosapp is the worker process of the chaos suite (t/chaos): the
// README's main job, examples/changeaudit/pipeline, built with the app ID and
// topic prefix of one chaos run and with consumer-group timeouts short enough
// that a killed worker's partitions move within seconds. Everything else is
// the example's own command line (`chaosapp worker`, `tables dump`, ...).
//
// Environment (besides the app's own RUNNEL_* variables, RUNNEL_GUARANTEE
// included, which the app reads itself):
//
//	CHAOS_APP              app ID (consumer group, changelog prefix); required
//	CHAOS_PREFIX           prefix of the declared topics (change-events; the repartition topic
//	                       changes-by-dir is named from the app ID)
//	CHAOS_SESSION          consumer-group session timeout (Go duration); default 6s,
//	                       Kafka's group.min.session.timeout.ms
//	CHAOS_COMMIT_INTERVAL  commit interval; default the app's (2.8 s)
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/examples/changeaudit/pipeline"
)

func main() {
	id := os.Getenv("CHAOS_APP")
	if id == "" {
		fmt.Fprintln(os.Stderr, "chaosapp: CHAOS_APP (the app ID) is not set")
		os.Exit(2)
	}
	session, err := envDuration("CHAOS_SESSION", 6*time.Second)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaosapp:", err)
		os.Exit(2)
	}
	opts := []app.Option{
		app.WithTopicPrefix(os.Getenv("CHAOS_PREFIX")),
		// Heartbeat 250 ms (the app's default) and a rebalance timeout of
		// 2.5 sessions: a killed member is dropped after one session.
		app.WithGroupTimeouts(session, 0, session*5/2, 0),
		// The verifier reads the changes-by-dir repartition topic back whole:
		// no purge of its consumed records.
		app.WithRepartitionPurge(-1),
	}
	if v := os.Getenv("CHAOS_COMMIT_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaosapp: CHAOS_COMMIT_INTERVAL %q: %v\n", v, err)
			os.Exit(2)
		}
		opts = append(opts, app.WithCommitInterval(d))
	}
	pipeline.Build(id, opts...).App.Main()
}

func envDuration(name string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", name, v, err)
	}
	return d, nil
}
