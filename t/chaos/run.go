package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/examples/changeaudit/pipeline"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/kafkaversion"
	"github.com/runnel-dev/runnel/table"
)

// Guarantees a run can ask the workers for (RUNNEL_GUARANTEE, --guarantee).
const (
	AtLeastOnce = "at_least_once"
	ExactlyOnce = "exactly_once"
)

// Config is one chaos run.
type Config struct {
	// Brokers of a real Kafka cluster; empty starts kfake in this process
	// (internal/embedded, no compaction during the run: kfake ignores
	// min.compaction.lag.ms, docs/kafka-compat.md).
	Brokers []string
	// KafkaScript and KafkaHome, both set, let a StepBroker stop and restart
	// node 1 of the scripts/kafka cluster in KafkaHome (RUNNEL_KAFKA_HOME).
	KafkaScript, KafkaHome string
	// Guarantee is passed to every worker (RUNNEL_GUARANTEE, and --guarantee
	// when the worker has the flag); it also sets the verdict: under
	// at-least-once, duplicates in changes-by-dir and events-per-dir are
	// reported, not failed.
	Guarantee string
	Seed      uint64
	Plan      Plan
	// Input is the JSONL file produced Rounds times (Limit lines of it; 0:
	// all) at Rate records per second while the schedule runs.
	Input         string
	Limit, Rounds int
	Rate          int
	// Dir keeps the worker binary, data dirs and logs.
	Dir string
	// Session is the workers' consumer-group session timeout; CommitInterval
	// their commit interval (0: the app's default).
	Session, CommitInterval time.Duration
	// Race builds the workers with the race detector.
	Race bool
	// BadValues injects the seven bad values of issue #12 (badValues) into
	// the middle of the input; each must end in the dead-letter topics of
	// the agents that cannot process it, and no worker may stop on one.
	BadValues bool
	// LagTimeout bounds the wait for lag 0 after the schedule.
	LagTimeout time.Duration
	// Brokers3, when its Schedule is set, replaces the worker schedule with
	// a broker schedule on a three-node scripts/kafka cluster (KafkaScript
	// and KafkaHome): the workers run untouched while the input is produced
	// until the broker schedule and its Settle time are over. The app's
	// topics must have replication factor 3 and min.insync.replicas=2.
	Brokers3 BrokerPlan
	// MaxOvercount fails an at-least-once run whose two-hop over-count
	// (events-per-dir against the input) is above it, in percent; 0: no
	// limit.
	MaxOvercount float64
	Logf         func(format string, args ...any)
}

// Run builds the worker, runs the schedule of cfg while producing the input,
// waits for lag 0, stops the workers and verifies every table and topic. An
// error means the run could not be carried out or verified; the verdict on
// the data is in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	start := time.Now()
	logf := func(format string, args ...any) { // prefixed with the time since the start
		cfg.Logf("%6.1fs "+format, append([]any{time.Since(start).Seconds()}, args...)...)
	}
	rep := &Report{Seed: cfg.Seed, Guarantee: cfg.Guarantee, Broker: "kfake"}
	if cfg.Guarantee != AtLeastOnce && cfg.Guarantee != ExactlyOnce {
		return nil, fmt.Errorf("guarantee %q: %s or %s", cfg.Guarantee, AtLeastOnce, ExactlyOnce)
	}
	if len(cfg.Brokers) > 0 {
		rep.Broker = "kafka " + strings.Join(cfg.Brokers, ",")
	}
	canStopBroker := len(cfg.Brokers) > 0 && cfg.KafkaScript != "" && cfg.KafkaHome != ""
	if cfg.Plan.BrokerStops > 0 && !canStopBroker {
		return nil, errors.New("broker stops need a real Kafka started by scripts/kafka (KafkaScript and KafkaHome)")
	}
	var brokerKinds []string
	if cfg.Brokers3.Schedule != "" {
		if !canStopBroker {
			return nil, errors.New("a broker schedule needs a three-node Kafka started by scripts/kafka (KafkaScript and KafkaHome)")
		}
		cfg.Brokers3 = cfg.Brokers3.withDefaults()
		var err error
		if brokerKinds, err = cfg.Brokers3.kinds(); err != nil {
			return nil, err
		}
		rep.BrokerSchedule = cfg.Brokers3.Schedule
		cfg.Plan = Plan{Workers: cfg.Plan.Workers} // the workers run untouched
	}
	rep.Steps = Schedule(cfg.Seed, cfg.Plan)
	logf("chaos: seed %d, guarantee %s, broker %s, %d workers; schedule:", cfg.Seed, cfg.Guarantee, rep.Broker, cfg.Plan.Workers)
	for i, s := range rep.Steps {
		logf("chaos:   %2d %s", i+1, s)
	}
	recs, err := loadInput(cfg.Input, cfg.Limit, cfg.Rounds)
	if err != nil {
		return nil, err
	}
	logf("chaos: %d input records from %s (%d rounds) at %d/s", len(recs), cfg.Input, cfg.Rounds, cfg.Rate)

	bin := filepath.Join(cfg.Dir, "chaosapp")
	build := []string{"build", "-o", bin}
	if cfg.Race {
		build = append(build, "-race")
	}
	build = append(build, "github.com/runnel-dev/runnel/t/chaos/chaosapp")
	if out, err := exec.CommandContext(ctx, "go", build...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build chaosapp: %w\n%s", err, out)
	}
	brokers := cfg.Brokers
	if len(brokers) == 0 {
		b, err := embedded.Start(embedded.Options{CleanerBackoff: 24 * time.Hour})
		if err != nil {
			return nil, err
		}
		defer b.Close()
		brokers = b.Addrs()
	}
	version, err := kafkaversion.Detect(ctx, brokers, nil)
	if err != nil {
		return nil, fmt.Errorf("broker version: %w", err)
	}
	kcfg := kafka.NewConfig("runnel-chaos", version, kafka.Timeouts{})
	kcfg.Consumer.IsolationLevel = sarama.ReadCommitted
	kcfg.Consumer.MaxWaitTime = 50 * time.Millisecond
	kcfg.Metadata.Retry.Max = 300
	kcfg.Metadata.Retry.Backoff = 200 * time.Millisecond

	// Names unique to the run: a real cluster keeps every run's topics.
	suffix := fmt.Sprintf("%d-%d", cfg.Seed, time.Now().UnixMilli()%1e6)
	appID := "chaos-" + suffix
	prefix := "chaos-" + suffix + "-"
	p := pipeline.Build(appID, app.WithTopicPrefix(prefix), app.WithBrokers(brokers...))
	tables := map[string]table.Def{"commits-per-actor": p.CommitsPerActor, "lines-per-actor": p.LinesPerActor, "events-per-dir": p.EventsPerDir}
	inputTopic, dirTopic := p.Events.Name(), p.ByDir.Name()
	// The agents of the input topic and their dead-letter topics (checked
	// when the input holds bad values).
	deadLetters := map[string]string{}
	for _, name := range []string{"count-by-actor", "split-by-dir"} {
		if deadLetters[name] = p.App.DeadLetterTopic(name); deadLetters[name] == "" {
			return nil, fmt.Errorf("the app has no agent %s (the bad-value check names the input topic's agents)", name)
		}
	}

	// RUNNEL_CHAOS_LOG_LEVEL=debug gives the workers' debug lines (each
	// offset commit with its offsets, postponed cycles) for a run's analysis.
	level := "info"
	if l := os.Getenv("RUNNEL_CHAOS_LOG_LEVEL"); l != "" {
		level = l
	}
	args := []string{"worker", "--log-level", level}
	if supportsFlag(ctx, bin, "--guarantee") {
		args = append(args, "--guarantee", cfg.Guarantee)
	} else {
		logf("chaos: this worker build has no --guarantee flag; the guarantee goes through RUNNEL_GUARANTEE only")
	}
	env := []string{"RUNNEL_BROKERS=" + strings.Join(brokers, ","), "RUNNEL_GUARANTEE=" + cfg.Guarantee,
		"CHAOS_APP=" + appID, "CHAOS_PREFIX=" + prefix, "CHAOS_SESSION=" + cfg.Session.String()}
	if cfg.CommitInterval > 0 {
		env = append(env, "CHAOS_COMMIT_INTERVAL="+cfg.CommitInterval.String())
	}
	ws := &workerSet{bin: bin, args: args, env: env, dir: cfg.Dir, logf: logf, procs: map[string]*proc{}}
	logf("chaos: worker built; starting %d workers", cfg.Plan.Workers)
	defer ws.close()
	for i := 1; i <= cfg.Plan.Workers; i++ {
		if err := ws.start(fmt.Sprintf("w%d", i)); err != nil {
			return nil, err
		}
	}
	client, err := sarama.NewClient(brokers, kcfg)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	defer client.Close()
	// The workers create the app's topics.
	var partitions int
	for deadline := time.Now().Add(60 * time.Second); ; {
		_ = client.RefreshMetadata(inputTopic)
		ps, err := client.Partitions(inputTopic)
		if err == nil && len(ps) > 0 {
			partitions = len(ps)
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("topic %s not created within 60 s: %v (logs in %s)", inputTopic, err, cfg.Dir)
		}
		time.Sleep(200 * time.Millisecond)
	}

	if cfg.BadValues {
		if n := cfg.Rate * 60; cfg.Brokers3.Schedule != "" && n < len(recs) {
			// The input ends with the broker schedule, somewhere in it:
			// the bad values go into its first minute.
			recs = append(withBadValues(recs[:n:n], int32(partitions)), recs[n:]...)
		} else {
			recs = withBadValues(recs, int32(partitions))
		}
		logf("chaos: %d bad values injected into the input", len(badValues))
	}
	prod := &producer{ackedBy: make([]bool, len(recs))}
	if cfg.Brokers3.Schedule != "" {
		// Live input for as long as the broker schedule runs, then stop:
		// the input is sized for the longest schedule.
		prod.stop = make(chan struct{})
	}
	prodDone := make(chan error, 1)
	pctx, cancelProd := context.WithCancel(ctx)
	defer cancelProd()
	go func() {
		prodDone <- prod.produce(pctx, brokers, kcfg, inputTopic, int32(partitions), recs, cfg.Rate)
	}()

	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	problem := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		logf("chaos: PROBLEM: %s", msg)
		rep.Problems = append(rep.Problems, msg)
	}
	kafkaScript := func(args ...string) error {
		cmd := exec.CommandContext(ctx, cfg.KafkaScript, args...)
		cmd.Env = append(os.Environ(), "RUNNEL_KAFKA_HOME="+cfg.KafkaHome)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w\n%s", cfg.KafkaScript, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if cfg.Brokers3.Schedule != "" {
		admin, err := sarama.NewClusterAdminFromClient(client)
		if err != nil {
			return nil, fmt.Errorf("admin: %w", err)
		}
		ops := &brokerOps{script: cfg.KafkaScript, home: cfg.KafkaHome, client: client, admin: admin, logf: logf,
			lag: func() (int64, error) { return groupLag(client, appID, []string{inputTopic, dirTopic}) }}
		if _, err := ops.waitReplicated(ctx, replicatedTimeout); err != nil {
			return nil, fmt.Errorf("before the schedule: %w", err)
		}
		if err := sleep(cfg.Brokers3.Warmup); err != nil {
			return nil, err
		}
		// Every topic of the app (its declared topics carry the prefix,
		// changelogs, repartition and dead-letter topics the app ID, which
		// the prefix starts with) is checked after the workers made them.
		n, bad, err := checkTopics(admin, appID+"-", 3, "2")
		switch {
		case err != nil:
			problem("topics: %v", err)
		case len(bad) > 0:
			problem("topics: %s", strings.Join(bad, "; "))
		default:
			rep.Topics = fmt.Sprintf("%d topics of the app, every one with replication factor 3 and min.insync.replicas=2", n)
			logf("chaos: %s", rep.Topics)
		}
		for _, k := range brokerKinds {
			var err error
			switch k {
			case BrokerRolling:
				err = ops.rolling(ctx, cfg.Brokers3.RollingRounds)
			case BrokerLeaderKill:
				err = ops.leaderKill(ctx, cfg.Brokers3.KillDown)
			case BrokerSigstop:
				err = ops.sigstop(ctx, cfg.Brokers3.StopFor)
			case BrokerQuota:
				err = ops.quota(ctx, "runnel-"+appID, cfg.Brokers3.QuotaRate, cfg.Brokers3.QuotaFor)
			}
			if err != nil {
				rep.BrokerSteps = ops.steps
				return nil, fmt.Errorf("broker schedule %s: %w", k, err)
			}
			if err := sleep(cfg.Brokers3.Settle); err != nil {
				return nil, err
			}
		}
		rep.BrokerSteps = ops.steps
		close(prod.stop)
	}
	for i, s := range rep.Steps {
		if err := sleep(s.Gap); err != nil {
			return nil, err
		}
		logf("chaos: step %d/%d: %s (%d/%d records acked)", i+1, len(rep.Steps), s, prod.acked.Load(), len(recs))
		switch s.Kind {
		case StepKill, StepTerm:
			sig := syscall.SIGKILL
			if s.Kind == StepTerm {
				sig = syscall.SIGTERM
			}
			if err := ws.stop(s.Worker, sig); errors.Is(err, errNotRunning) {
				logf("chaos: step %d: %v (an unexpected exit, reported below)", i+1, err)
			} else if err != nil {
				problem("step %d (%s): %v", i+1, s, err)
			}
			if err := sleep(s.Down); err != nil {
				return nil, err
			}
			if s.Wipe {
				if err := ws.wipe(s.Worker); err != nil {
					return nil, err
				}
			}
			if err := ws.start(s.Worker); err != nil {
				return nil, err
			}
		case StepAdd:
			if err := ws.start(s.Worker); err != nil {
				return nil, err
			}
		case StepRemove:
			if err := ws.stop(s.Worker, syscall.SIGTERM); errors.Is(err, errNotRunning) {
				logf("chaos: step %d: %v (an unexpected exit, reported below)", i+1, err)
			} else if err != nil {
				problem("step %d (%s): %v", i+1, s, err)
			}
		case StepBroker:
			if err := kafkaScript("stop", "--node", "1"); err != nil {
				return nil, err
			}
			if err := sleep(s.Down); err != nil {
				return nil, err
			}
			if err := kafkaScript("restart-node", "1"); err != nil {
				return nil, err
			}
			logf("chaos: broker back")
		}
	}
	logf("chaos: schedule done; waiting for the producer (%d/%d records acked)", prod.acked.Load(), len(recs))
	if err := <-prodDone; err != nil {
		return nil, err
	}
	rep.Produced, rep.Failed = prod.acked.Load(), prod.failed.Load()
	for _, e := range prod.errs {
		logf("chaos: producer error: %v", e)
	}
	logf("chaos: input produced (%d acked, %d failed); waiting for lag 0 with workers %v", rep.Produced, rep.Failed, ws.running())
	if err := waitCaughtUp(ctx, client, appID, []string{inputTopic, dirTopic}, cfg.LagTimeout); err != nil {
		rep.Crashes = ws.unexpected()
		problem("lag did not reach 0: %v", err)
		return rep, nil
	}
	logf("chaos: lag 0; stopping the workers")
	for _, name := range ws.running() {
		if err := ws.stop(name, syscall.SIGTERM); err != nil {
			problem("final stop: %v", err)
		}
	}
	rep.Crashes = ws.unexpected()
	// Every worker log once: start-mismatch rebuilds, refused table writes,
	// and (a worker killed
	// by the schedule never exits with the race detector's status) race
	// reports in Runnel's code.
	logs, _ := filepath.Glob(filepath.Join(cfg.Dir, "*", "worker.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			problem("read %s: %v", l, err)
			continue
		}
		text := string(b)
		for _, line := range strings.Split(text, "\n") {
			if strings.Contains(line, "claim's start offset differs") {
				rep.Rebuilds = append(rep.Rebuilds, filepath.Base(filepath.Dir(l))+": "+line)
			}
			if strings.Contains(line, "no running task cuts the partition") {
				rep.Unowned = append(rep.Unowned, filepath.Base(filepath.Dir(l))+": "+line)
			}
		}
		if cfg.Race {
			if ours, _ := ourRaces(text); len(ours) > 0 {
				problem("%d data race(s) in Runnel's code in %s, first at %s", len(ours), l, ours[0])
			}
		}
	}
	if cfg.BadValues && len(rep.Crashes) > 0 {
		// Nothing in the schedule makes a worker exit on its own: with bad
		// values in the input, an exit is the fleet-stopping record of
		// issue #12 until its log says otherwise.
		problem("%d workers exited on their own (bad values in the input must be dead-lettered, never stop a worker): %s",
			len(rep.Crashes), strings.Join(rep.Crashes, "; "))
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	logf("chaos: workers stopped; verifying")
	rows, problems, err := verify(vctx, client, verifyInput{appID: appID, inputTopic: inputTopic, dirTopic: dirTopic, tables: tables,
		produced: recs, acked: prod.ackedBy, exactlyOnce: cfg.Guarantee == ExactlyOnce, diagDir: cfg.Dir,
		deadLetters: deadLetters})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	logf("chaos: verified")
	rep.Rows = rows
	rep.Problems = append(rep.Problems, problems...)
	if cfg.Guarantee == AtLeastOnce && cfg.MaxOvercount > 0 {
		for _, row := range rows {
			if row.Name == "events-per-dir" && row.FedFrom == "input" && row.Overcount() > cfg.MaxOvercount {
				rep.Problems = append(rep.Problems, fmt.Sprintf("two-hop over-count %.2f %% (events-per-dir against the input) is above %.1f %%", row.Overcount(), cfg.MaxOvercount))
			}
		}
	}
	rep.Elapsed = time.Since(start)
	return rep, nil
}
