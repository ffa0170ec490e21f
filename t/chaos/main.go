// Command chaos is the chaos suite of issue #11: it runs N worker processes of
// the README's main job (examples/changeaudit, built as t/chaos/chaosapp)
// against kfake or a real Kafka, applies a seeded schedule of kill -9,
// SIGTERM, restarts, added and removed workers and broker stops while the
// input is produced, waits for lag 0, and compares every table (committed
// state) and the intermediate topic (read_committed) with values computed
// independently from the input topic: keys lost, duplicated, wrong, exact.
//
//	go run ./t/chaos                      # short schedule on kfake
//	go run ./t/chaos -long                # ≥30 kill -9 cycles, 573,762 records, 3 workers
//	go run ./t/chaos -long -seed 42 -guarantee exactly_once
//
// On real Kafka (broker stop included) see scripts/chaos.sh and docs/chaos.md;
// the three-broker tier (rolling restarts, a killed leader, a frozen broker,
// a produce quota, workers untouched) is
//
//	go run ./t/chaos -brokers3 -broker-schedule rolling|leaderkill|sigstop|quota|all -guarantee exactly_once
//
// on a cluster of scripts/kafka start --nodes 3 (scripts/chaos3.sh does it all).
// The exit status is 1 when the run fails its guarantee, 2 when it could not
// be run. The same run is the test TestChaosShort (go test ./t/chaos).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Short is the schedule of TestChaosShort and of `go run ./t/chaos`: about a
// minute on kfake.
func Short() (Plan, int, int, int) {
	return Plan{Workers: 3, Kills: 3, Terms: 1, Adds: 1, Removes: 1, WipeOneIn: 3,
		GapMin: time.Second, GapMax: 3 * time.Second, DownMin: time.Second, DownMax: 3 * time.Second,
		BrokerDownMin: 5 * time.Second, BrokerDownMax: 10 * time.Second}, 25000, 1, 1000 // limit, rounds, rate
}

// Long is the schedule of issue #11's targets: 3 workers, 30 kill -9/restart
// cycles (one in six with a wiped data dir), 4 SIGTERM/restarts, 2 added and
// 2 removed workers, one broker stop on real Kafka, 7 rounds of the input
// (573,762 records).
func Long() (Plan, int, int, int) {
	return Plan{Workers: 3, Kills: 30, Terms: 4, Adds: 2, Removes: 2, WipeOneIn: 6,
		GapMin: time.Second, GapMax: 4 * time.Second, DownMin: 500 * time.Millisecond, DownMax: 4 * time.Second,
		BrokerDownMin: 10 * time.Second, BrokerDownMax: 20 * time.Second}, 0, 7, 3500
}

func main() { os.Exit(run()) }

func run() int {
	long := flag.Bool("long", false, "the long schedule (issue #11 targets) instead of the short one")
	seed := flag.Uint64("seed", 0, "schedule seed (0: a random one, printed)")
	guarantee := flag.String("guarantee", AtLeastOnce, "at_least_once or exactly_once (passed to the workers)")
	brokers := flag.String("brokers", os.Getenv("RUNNEL_KAFKA_BROKERS"), "real Kafka bootstrap addresses (default $RUNNEL_KAFKA_BROKERS; empty: kfake in this process)")
	kafkaHome := flag.String("kafka-home", os.Getenv("RUNNEL_KAFKA_HOME"), "RUNNEL_KAFKA_HOME of the scripts/kafka cluster, for broker stops")
	brokerStops := flag.Int("broker-stops", -1, "broker stops (-1: 1 with -long on a scripts/kafka cluster, else 0)")
	input := flag.String("input", "", "JSONL input (default: examples/changeaudit/testdata/git-history.jsonl.gz)")
	rounds := flag.Int("rounds", 0, "replays of the input (0: the schedule's)")
	limit := flag.Int("limit", -1, "lines of the input per round (-1: the schedule's, 0: all)")
	rate := flag.Int("rate", 0, "records produced per second (0: the schedule's)")
	kills := flag.Int("kills", -1, "kill -9/restart cycles (-1: the schedule's)")
	workers := flag.Int("workers", 0, "workers at the start (0: the schedule's)")
	session := flag.Duration("session", 0, "worker session timeout (0: 2 s on kfake, 6 s on Kafka)")
	commit := flag.Duration("commit-interval", time.Second, "worker commit interval")
	lagTimeout := flag.Duration("lag-timeout", 10*time.Minute, "how long to wait for lag 0 after the schedule")
	race := flag.Bool("race", false, "build the workers with the race detector")
	bad := flag.Bool("bad-values", true, "inject the seven bad values of issue #12 mid-stream (each must be dead-lettered)")
	dir := flag.String("dir", "", "where worker data dirs and logs go (default: a new directory under tmp/chaos of the module; kept)")
	brokers3 := flag.Bool("brokers3", false, "the three-broker tier: a broker schedule on a 3-node scripts/kafka cluster (-brokers, -kafka-home), workers untouched")
	brokerSchedule := flag.String("broker-schedule", BrokerAll, "with -brokers3: "+strings.Join(brokerSchedules, ", "))
	rollingRounds := flag.Int("rolling-rounds", 2, "with -brokers3: rolling restarts of all three brokers")
	quotaRate := flag.Float64("quota-rate", 16<<10, "with -brokers3: the produce quota's producer_byte_rate (bytes/s per broker)")
	warmup := flag.Duration("warmup", 15*time.Second, "with -brokers3: live input before the first broker fault")
	settle := flag.Duration("settle", 10*time.Second, "with -brokers3: live input after each broker fault")
	maxOver := flag.Float64("max-overcount", 0, "fail an at-least-once run whose two-hop over-count (events-per-dir vs input) is above this, in percent (0: no limit, or 5 with -brokers3; -1: no limit)")
	flag.Parse()

	fail := func(err error) int { fmt.Fprintln(os.Stderr, "chaos:", err); return 2 }
	root, err := moduleRoot()
	if err != nil {
		return fail(err)
	}
	plan, lim, rnd, rt := Short()
	if *long {
		plan, lim, rnd, rt = Long()
	}
	cfg := Config{Guarantee: *guarantee, Seed: *seed, Plan: plan, Limit: lim, Rounds: rnd, Rate: rt,
		Input: *input, Race: *race, BadValues: *bad, CommitInterval: *commit, Session: *session, LagTimeout: *lagTimeout,
		Logf: func(f string, a ...any) {
			fmt.Fprintf(os.Stderr, time.Now().UTC().Format("15:04:05.000 ")+f+"\n", a...)
		}}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64() % 1e9
	}
	cfg.MaxOvercount = *maxOver
	if *brokers3 {
		// Three workers of the README's app, untouched; live input at
		// 500/s (a 2-core machine runs three JVMs beside them) for as long
		// as the broker schedule runs: up to 7 rounds of the input.
		cfg.Plan, cfg.Limit, cfg.Rounds, cfg.Rate = Plan{Workers: 3}, 0, 7, 500
		cfg.Brokers3 = BrokerPlan{Schedule: *brokerSchedule, RollingRounds: *rollingRounds, QuotaRate: *quotaRate,
			Warmup: *warmup, Settle: *settle}
		if *maxOver == 0 {
			cfg.MaxOvercount = 5
		}
		if *brokers == "" || *kafkaHome == "" {
			return fail(errors.New("-brokers3 needs -brokers (or RUNNEL_KAFKA_BROKERS) and -kafka-home (or RUNNEL_KAFKA_HOME) of a scripts/kafka start --nodes 3 cluster"))
		}
	}
	if *brokers != "" {
		cfg.Brokers = strings.Split(*brokers, ",")
		if *kafkaHome != "" {
			cfg.KafkaScript, cfg.KafkaHome = filepath.Join(root, "scripts", "kafka"), *kafkaHome
		}
	}
	switch {
	case *brokerStops >= 0:
		cfg.Plan.BrokerStops = *brokerStops
	case *long && cfg.KafkaHome != "":
		cfg.Plan.BrokerStops = 1
	}
	if cfg.Input == "" {
		cfg.Input = filepath.Join(root, "examples", "changeaudit", "testdata", "git-history.jsonl.gz")
	}
	if *rounds > 0 {
		cfg.Rounds = *rounds
	}
	if *limit >= 0 {
		cfg.Limit = *limit
	}
	if *rate > 0 {
		cfg.Rate = *rate
	}
	if *kills >= 0 {
		cfg.Plan.Kills = *kills
	}
	if *workers > 0 {
		cfg.Plan.Workers = *workers
	}
	if cfg.Session == 0 {
		cfg.Session = 2 * time.Second
		if len(cfg.Brokers) > 0 {
			cfg.Session = 6 * time.Second // Kafka's group.min.session.timeout.ms
		}
	}
	cfg.Dir = *dir
	if cfg.Dir == "" {
		base := filepath.Join(root, "tmp", "chaos")
		if err := os.MkdirAll(base, 0o755); err != nil {
			return fail(err)
		}
		if cfg.Dir, err = os.MkdirTemp(base, fmt.Sprintf("seed%d-", cfg.Seed)); err != nil {
			return fail(err)
		}
	}
	cfg.Logf("chaos: worker logs and data in %s", cfg.Dir)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg)
	if err != nil {
		return fail(fmt.Errorf("seed %d: %w (logs in %s)", cfg.Seed, err, cfg.Dir))
	}
	rep.Write(os.Stdout)
	if !rep.OK() {
		fmt.Printf("chaos: worker logs and data dirs kept in %s\n", cfg.Dir)
		return 1
	}
	// A pass keeps the logs only (the data dirs of a long run take GBs).
	_ = os.Remove(filepath.Join(cfg.Dir, "chaosapp"))
	dirs, _ := filepath.Glob(filepath.Join(cfg.Dir, "*", "data"))
	for _, d := range dirs {
		_ = os.RemoveAll(d)
	}
	fmt.Printf("chaos: worker logs in %s\n", cfg.Dir)
	return 0
}

// moduleRoot is the directory of the runnel module (go env GOMOD).
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the runnel module (go env GOMOD is %q)", mod)
	}
	return filepath.Dir(mod), nil
}
