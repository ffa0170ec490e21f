// Command sidebyside runs Runnel's side-by-side benchmarks: the same
// workloads for Runnel and its peers (the raw Sarama loop, Goka, Kafka
// Streams) on the same broker, in interleaved rounds, each system's workers
// as child processes (so CPU and peak RSS are their own), every run checked
// for the right answer. It prints a table of medians and writes it, with the
// method and the machine, into docs/benchmarks.md.
//
//	go run ./bench/sidebyside -quick          # CI: 1 round, 100k records, kfake, Go systems
//	go run ./bench/sidebyside                 # full: 3 rounds, 500k records, kfake
//	go run ./bench/sidebyside -broker kafka   # full on Apache Kafka 4.4 (scripts/kafka)
//
// See docs/benchmarks.md for what each workload measures.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// config is the harness's command line.
type config struct {
	quick bool
	// warmup: before round 1, one stateless run of the first system that
	// has it, discarded (the broker's first minute is slow: its JVM is
	// not yet compiled).
	warmup    bool
	broker    string // kfake or kafka
	bootstrap string // an already running Kafka (with -broker kafka)
	kafkaPort int    // where scripts/kafka starts it
	workloads []string
	rounds    int
	records   int
	keys      int
	// distinctKeys is the key space of the distinct-key dataset (0: as
	// many keys as records).
	distinctKeys int
	partitions   int
	commit       time.Duration
	timeout      time.Duration
	results      string // directory for results.json, profiles and logs
	doc          string // markdown file to update ("" = none)
	section      string // which generated section of doc (default: the broker)
	profile      bool
	// profileSystem is the system profiled (default runnel; the Sarama
	// loops write CPU profiles too, to compare where the time goes).
	profileSystem string
	// The latency workloads: input rates given in records/s, or else as
	// fractions of each system's capacity (latencyLoad); each level lasts
	// latencyDuration after a warm-up of latencyWarmup (at least the
	// system's commit interval).
	latencyRates    []float64
	latencyLoad     []float64
	latencyDuration time.Duration
	latencyWarmup   time.Duration
}

// harness holds what every run shares.
type harness struct {
	cfg     config
	root    string // repository root
	binDir  string
	workDir string
	data    *dataset // the input of every workload but the distinct-key ones
	// distinct is the input of the distinct-key workloads (stateful-distinct,
	// restore-distinct); nil when none is selected.
	distinct *dataset
	shared   *broker // real Kafka; nil with kfake (a fresh broker per run)
	seq      int
	// capacity is each system's stateless rate (records/s) per round so
	// far: the latency workloads' levels are fractions of it.
	capacity map[string][]float64
}

func (h *harness) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sidebyside: "+format+"\n", args...)
}

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		killLive()
		fmt.Fprintf(os.Stderr, "sidebyside: %v: stopped the workers\n", s)
		os.Exit(2)
	}()
	if err := realMain(); err != nil {
		fmt.Fprintln(os.Stderr, "sidebyside:", err)
		os.Exit(1)
	}
}

func realMain() error {
	var cfg config
	var systemsFlag, workloadsFlag string
	flag.BoolVar(&cfg.warmup, "warmup", true, "before round 1, run the first system's stateless workload once and discard it (on Kafka 4.4 the first system of round 1 met the broker's first minute: 2.6x its later times); off in -quick")
	flag.BoolVar(&cfg.quick, "quick", false, "CI mode: 1 round, 100k records, kfake, Go systems, no profiles, docs untouched")
	flag.StringVar(&cfg.broker, "broker", "kfake", "kfake (a fresh in-process kfake per run) or kafka (Apache Kafka 4.4 via scripts/kafka)")
	flag.StringVar(&cfg.bootstrap, "bootstrap", "", "with -broker kafka: use this running broker instead of starting scripts/kafka")
	flag.IntVar(&cfg.kafkaPort, "kafka-port", 29592, "with -broker kafka: the client port of the broker scripts/kafka starts (its controller: +100)")
	flag.StringVar(&systemsFlag, "systems", "", "comma-separated systems (default: every system the broker supports)")
	flag.StringVar(&workloadsFlag, "workloads", strings.Join(allWorkloads, ","), "comma-separated workloads")
	flag.IntVar(&cfg.rounds, "rounds", 3, "interleaved rounds")
	flag.IntVar(&cfg.records, "records", 500_000, "input records")
	flag.IntVar(&cfg.keys, "keys", 10_000, "distinct 16-byte keys")
	flag.IntVar(&cfg.distinctKeys, "distinct-keys", 0, "key space of the distinct-key workloads, keys drawn with replacement (0: as many as -records, which gives ~63% as many distinct keys as records)")
	flag.IntVar(&cfg.partitions, "partitions", 8, "partitions of the input (and every derived) topic")
	flag.DurationVar(&cfg.commit, "commit-interval", 2800*time.Millisecond, "commit interval of every system (Runnel's default)")
	flag.DurationVar(&cfg.timeout, "timeout", 5*time.Minute, "a run that is not done in this time fails")
	flag.StringVar(&cfg.results, "results", "", "results directory (default bench/results/<broker>, quick: a temp dir)")
	flag.StringVar(&cfg.doc, "doc", "docs/benchmarks.md", "markdown file whose results section is rewritten (not in -quick)")
	flag.StringVar(&cfg.section, "section", "", "the generated section of -doc to rewrite (default: the broker's name)")
	latencyRates := flag.String("latency-rates", "", "latency workloads: comma-separated input rates in records/s, the same for every system (default: -latency-load of each system's capacity)")
	latencyLoad := flag.String("latency-load", "0.25,0.5,0.9", "latency workloads without -latency-rates: comma-separated fractions of each system's stateless rate measured in this run")
	flag.DurationVar(&cfg.latencyDuration, "latency-duration", 10*time.Second, "latency workloads: how long each input rate lasts")
	flag.DurationVar(&cfg.latencyWarmup, "latency-warmup", time.Second, "latency workloads: warm-up after the first output (at least the system's commit interval)")
	reportOnly := flag.String("report-only", "", "render this results.json (of an interrupted run) with the other flags as they were, run nothing")
	flag.BoolVar(&cfg.profile, "profile", true, "write pprof CPU and allocation profiles of Runnel stateless and stateful (extra runs; only the selected workloads)")
	flag.StringVar(&cfg.profileSystem, "profile-system", "runnel", "the selected system -profile profiles (runnel, or sarama and sarama-safe for a CPU profile of the raw loop)")
	flag.Parse()

	root, err := repoRoot()
	if err != nil {
		return err
	}
	if cfg.latencyRates, err = parseFloats("-latency-rates", *latencyRates); err != nil {
		return err
	}
	if cfg.latencyLoad, err = parseFloats("-latency-load", *latencyLoad); err != nil {
		return err
	}
	if cfg.quick {
		// Latency in CI checks the workload's answer, not its numbers:
		// two low fixed rates, briefly.
		if cfg.latencyRates == nil {
			cfg.latencyRates = []float64{1000, 5000}
		}
		cfg.latencyDuration, cfg.latencyWarmup = min(cfg.latencyDuration, 2*time.Second), min(cfg.latencyWarmup, 500*time.Millisecond)
		cfg.rounds, cfg.records, cfg.broker, cfg.profile, cfg.doc = 1, 100_000, "kfake", false, ""
		cfg.warmup = false
		cfg.timeout = 90 * time.Second
		if systemsFlag == "" {
			systemsFlag = "runnel,sarama,goka"
		}
	}
	sel, err := selectSystems(systemsFlag, cfg.broker)
	if err != nil {
		return err
	}
	cfg.workloads = strings.Split(workloadsFlag, ",")
	for _, w := range cfg.workloads {
		if !contains(allWorkloads, w) {
			return fmt.Errorf("-workloads: unknown %q (known: %s)", w, strings.Join(allWorkloads, ", "))
		}
		if isLatency(w) && cfg.latencyRates == nil && !contains(cfg.workloads, "stateless") {
			return fmt.Errorf("-workloads %s: its rates are fractions of the stateless rate: select stateless too, or give -latency-rates", w)
		}
	}
	if cfg.section == "" {
		cfg.section = cfg.broker
	}
	if cfg.results == "" {
		if cfg.quick {
			if cfg.results, err = os.MkdirTemp("", "sidebyside-"); err != nil {
				return fmt.Errorf("results dir: %w", err)
			}
		} else {
			cfg.results = filepath.Join(root, "bench", "results", cfg.section)
		}
	}
	h := &harness{cfg: cfg, root: root, binDir: filepath.Join(cfg.results, "bin"), workDir: filepath.Join(cfg.results, "runs")}
	for _, d := range []string{h.binDir, h.workDir} {
		if *reportOnly != "" {
			break
		}
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("clean %s: %w", d, err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("results dir: %w", err)
		}
	}
	started := time.Now()
	if *reportOnly != "" {
		b, err := os.ReadFile(*reportOnly)
		if err != nil {
			return fmt.Errorf("-report-only: %w", err)
		}
		var results []result
		if err := json.Unmarshal(b, &results); err != nil {
			return fmt.Errorf("-report-only %s: %w", *reportOnly, err)
		}
		rounds := 0
		for _, r := range results {
			rounds = max(rounds, r.Round)
		}
		h.cfg.rounds = rounds
		if slices.ContainsFunc(cfg.workloads, isDistinct) {
			h.distinct = newDataset(cfg.records, cfg.distinctKeySpace(), cfg.partitions) // for its key count
		}
		rep := newReport(h, sel, results, nil, 0)
		fmt.Print(rep.table(), rep.latencyTable())
		if cfg.doc != "" {
			return rep.updateDoc(docPath(root, cfg.doc))
		}
		return nil
	}
	h.logf("building %d systems into %s", len(sel), h.binDir)
	if err := build(root, h.binDir, sel); err != nil {
		return err
	}
	h.data = newDataset(cfg.records, cfg.keys, cfg.partitions)
	if slices.ContainsFunc(cfg.workloads, isDistinct) {
		h.distinct = newDataset(cfg.records, cfg.distinctKeySpace(), cfg.partitions)
		h.logf("distinct-key input: %d records, %d distinct keys (from a space of %d)", cfg.records, len(h.distinct.counts), cfg.distinctKeySpace())
	}
	if cfg.broker == "kafka" {
		stop, err := h.startKafka()
		if err != nil {
			return err
		}
		defer stop()
	}

	if cfg.warmup {
		for _, s := range sel {
			if !s.runs("stateless") {
				continue
			}
			load := loadAvg()
			for _, r := range h.runWorkload(s, "stateless", 0, nil) {
				if r.Load == 0 {
					r.Load, r.LoadEnd = load, loadAvg()
				}
				h.logf("warm-up (discarded) %-10s %-12s %s", r.Workload, r.System, r.short())
			}
			break
		}
	}
	var results []result
	for round := 1; round <= cfg.rounds; round++ {
		// Interleaved: each round runs every system once per workload, the
		// order rotated by one system per round so none always goes first.
		for _, wl := range cfg.workloads {
			if stateful := statefulOf(wl); stateful != "" && contains(cfg.workloads, stateful) {
				continue // measured inside the stateful run
			}
			for i := range sel {
				s := sel[(i+round-1)%len(sel)]
				if !s.runs(wl) {
					continue
				}
				load := loadAvg()
				for _, r := range h.runWorkload(s, wl, round, nil) {
					if r.Load == 0 {
						r.Load, r.LoadEnd = load, loadAvg()
					}
					h.noteCapacity(s, r)
					h.logf("round %d %-10s %-12s %s", round, r.Workload, r.System, r.short())
					results = append(results, r)
					// After every run, so that an interrupted run keeps what it
					// measured (-report-only renders it).
					if err := writeJSON(filepath.Join(cfg.results, "results.json"), results); err != nil {
						return err
					}
				}
			}
		}
	}
	var profiles []profile
	if cfg.profile {
		for _, wl := range []string{"stateless", "stateful"} {
			if !contains(cfg.workloads, wl) {
				continue
			}
			p, err := h.profileRunnel(sel, wl)
			if err != nil {
				h.logf("profile %s: %v", wl, err)
				continue
			}
			profiles = append(profiles, p)
		}
	}
	rep := newReport(h, sel, results, profiles, time.Since(started))
	fmt.Print(rep.table(), rep.latencyTable())
	if err := writeJSON(filepath.Join(cfg.results, "results.json"), results); err != nil {
		return err
	}
	if cfg.doc != "" {
		if err := rep.updateDoc(docPath(root, cfg.doc)); err != nil {
			return err
		}
		h.logf("wrote %s", cfg.doc)
	}
	if n := rep.failures(); n > 0 {
		return fmt.Errorf("%d runs failed (a wrong answer or no answer); see the table", n)
	}
	return nil
}

// runWorkload runs one workload of s once and returns its results (the
// stateful run also yields the restore result when restore is selected).
func (h *harness) runWorkload(s *system, wl string, round int, profile []string) []result {
	switch wl {
	case "stateless":
		return []result{h.runStateless(s, round, profile)}
	case "stateful", "stateful-distinct":
		rwl := restoreOf[wl]
		withRestore := contains(h.cfg.workloads, rwl) && s.runs(rwl) && profile == nil
		st, rs := h.runStateful(s, wl, round, withRestore, profile)
		if withRestore {
			return []result{st, rs}
		}
		return []result{st}
	case "restore", "restore-distinct":
		_, rs := h.runStateful(s, statefulOf(wl), round, true, nil)
		return []result{rs}
	case "handover":
		return []result{h.runTakeover(s, wl, syscall.SIGTERM, round)}
	case "kill":
		return []result{h.runTakeover(s, wl, syscall.SIGKILL, round)}
	case "scaleout":
		return []result{h.runScaleOut(s, round)}
	case "rebalances":
		return []result{h.runRebalances(s, round)}
	case "redeliver":
		return []result{h.runRedeliver(s, round)}
	case latencyWorkload, latencyHandover, latencyKill:
		return h.runLatency(s, wl, round)
	}
	return nil
}

func (r result) short() string {
	if r.Failure != "" {
		return "FAILURE: " + r.Failure
	}
	s := fmt.Sprintf("%.2f s", r.Seconds)
	if r.Rate > 0 {
		s += fmt.Sprintf(" (first output after %.2f s, then %.0f records/s)", r.FirstOut, r.Rate)
	}
	if r.Level != "" {
		frac := ""
		if r.CapFrac > 0 {
			frac = fmt.Sprintf(", %.0f%% of its stateless rate", 100*r.CapFrac)
		}
		s = fmt.Sprintf("%s at %.0f records/s (%.0f sent/s%s): p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, max %.1f ms over %d records (%d output twice)",
			r.Level, r.InRate, r.SentRate, frac, r.P50, r.P99, r.P999, r.MaxMS, r.Samples, r.Doubles)
	}
	if r.CPU > 0 {
		s += fmt.Sprintf(", cpu %.1f s, rss %.0f MB", r.CPU, r.RSSMB)
	}
	s += fmt.Sprintf(", load %.1f→%.1f", r.Load, r.LoadEnd)
	if r.Records > 0 {
		s += fmt.Sprintf(", %d changelog records (of %d written)", r.Records, r.Span)
	}
	switch r.Workload {
	case "handover", "kill":
		s += fmt.Sprintf(", %d counted twice", r.Doubles)
	case "rebalances":
		s += fmt.Sprintf(" per step, %d counted twice, survivor expelled %d times", r.Doubles, r.Expelled)
		if r.ExpelledWhy != "" {
			s += " (first: " + r.ExpelledWhy + ")"
		}
	case "redeliver":
		s += fmt.Sprintf(" with the failure, other partitions' throughput %.2f× of the run without", r.Ratio)
	}
	return s
}

func selectSystems(names, broker string) ([]*system, error) {
	all := systems()
	if names == "" {
		var out []*system
		for _, s := range all {
			// Python peers are 30–100× slower: run them on their own, with
			// fewer records (docs/benchmarks.md).
			if !s.optIn && (s.lang == "go" || (broker == "kafka" && s.lang == "java")) {
				out = append(out, s)
			}
		}
		return out, nil
	}
	var out []*system
	for _, n := range strings.Split(names, ",") {
		var found *system
		for _, s := range all {
			if s.name == n {
				found = s
			}
		}
		if found == nil {
			return nil, fmt.Errorf("-systems: unknown %q", n)
		}
		if found.lang != "go" && broker != "kafka" {
			return nil, fmt.Errorf("-systems: %s runs on -broker kafka only", n)
		}
		out = append(out, found)
	}
	if len(out) == 0 || out[0].name != "runnel" {
		return nil, fmt.Errorf("-systems: runnel must come first (ratios are against it)")
	}
	return out, nil
}

// distinctKeySpace is the key space of the distinct-key dataset.
func (c config) distinctKeySpace() int {
	if c.distinctKeys > 0 {
		return c.distinctKeys
	}
	return c.records
}

// isDistinct reports whether wl is a distinct-key workload.
func isDistinct(wl string) bool { return strings.HasSuffix(wl, distinctSuffix) }

// statefulOf names the stateful workload a restore workload is measured in
// ("" for a workload that is no restore).
func statefulOf(wl string) string {
	for st, rs := range restoreOf {
		if rs == wl {
			return st
		}
	}
	return ""
}

// dataFor is the input of workload wl (nil: none loaded before the run).
func (h *harness) dataFor(wl string) *dataset {
	if isLatency(wl) {
		return nil
	}
	if isDistinct(wl) {
		return h.distinct
	}
	return h.data
}

// parseFloats reads a comma-separated list of positive numbers (nil for "").
func parseFloats(name, v string) ([]float64, error) {
	if v == "" {
		return nil, nil
	}
	var out []float64
	for _, f := range strings.Split(v, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || x <= 0 {
			return nil, fmt.Errorf("%s: %q is no positive number", name, f)
		}
		out = append(out, x)
	}
	return out, nil
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("find the module root (run inside the repository): %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", path, err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

var addrRE = regexp.MustCompile(`[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+:[0-9]+|localhost:[0-9]+`)

// startKafka uses -bootstrap, or starts a one-node Apache Kafka with
// scripts/kafka and returns its stop.
func (h *harness) startKafka() (func(), error) {
	bootstrap := h.cfg.bootstrap
	stop := func() {}
	if bootstrap == "" {
		script := filepath.Join(h.root, "scripts", "kafka")
		// Its own cache dir and port: the tests' broker (scripts/ci-kafka.sh,
		// the default dir and port 29092) may run at the same time, and
		// `scripts/kafka stop` stops every node of its dir.
		env := os.Environ()
		if os.Getenv("RUNNEL_KAFKA_HOME") == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return nil, fmt.Errorf("home dir: %w", err)
			}
			env = append(env, "RUNNEL_KAFKA_HOME="+filepath.Join(home, ".cache", "runnel", "kafka-bench"))
		}
		cmd := exec.Command(script, "start", "--port", fmt.Sprint(h.cfg.kafkaPort))
		cmd.Env = env
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("scripts/kafka start: %w", err)
		}
		// The last host:port it prints (Maven may print escape codes before).
		if m := addrRE.FindAllString(string(out), -1); len(m) > 0 {
			bootstrap = m[len(m)-1]
		}
		if bootstrap == "" {
			return nil, fmt.Errorf("scripts/kafka start printed no bootstrap address: %q", out)
		}
		stop = func() {
			cmd := exec.Command(script, "stop")
			cmd.Env = env
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				h.logf("scripts/kafka stop: %v", err)
			}
		}
	}
	b, err := openBroker(bootstrap)
	if err != nil {
		stop()
		return nil, err
	}
	h.shared = b
	return func() { b.Close(); stop() }, nil
}

// docPath is -doc's file: an absolute path as given, a relative one from the
// repository's root.
func docPath(root, doc string) string {
	if filepath.IsAbs(doc) {
		return doc
	}
	return filepath.Join(root, doc)
}
