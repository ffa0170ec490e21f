package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// profile is one profiled (uncounted) Runnel run.
type profile struct {
	workload string
	cpu, mem string // pprof files
	top      string // `go tool pprof -top` of the CPU profile, first lines
}

// profileRunnel runs Runnel once more on wl with pprof on and writes
// runnel-<wl>.cpu.pprof and runnel-<wl>.allocs.pprof into the results dir.
func (h *harness) profileRunnel(sel []*system, wl string) (profile, error) {
	s := sel[0]
	for _, x := range sel {
		if x.name == h.cfg.profileSystem {
			s = x // -profile-system: a peer that honours BENCH_CPUPROFILE (sarama, sarama-safe)
		}
	}
	p := profile{workload: wl,
		cpu: filepath.Join(h.cfg.results, s.name+"-"+wl+".cpu.pprof"),
		mem: filepath.Join(h.cfg.results, s.name+"-"+wl+".allocs.pprof")}
	rs := h.runWorkload(s, wl, 0, []string{"BENCH_CPUPROFILE=" + p.cpu, "BENCH_MEMPROFILE=" + p.mem})
	if len(rs) == 0 || rs[0].Failure != "" {
		return p, fmt.Errorf("profiled run failed: %v", rs)
	}
	bin := filepath.Join(h.binDir, s.bin)
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", bin, p.cpu).Output()
	if err != nil {
		return p, fmt.Errorf("pprof -top %s: %w", p.cpu, err)
	}
	if err := os.WriteFile(strings.TrimSuffix(p.cpu, ".pprof")+".top.txt", out, 0o644); err != nil {
		return p, fmt.Errorf("write top: %w", err)
	}
	p.top = string(out)
	if out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=25", "-sample_index=alloc_space", bin, p.mem).Output(); err == nil {
		_ = os.WriteFile(strings.TrimSuffix(p.mem, ".pprof")+".top.txt", out, 0o644)
	}
	return p, nil
}

// report aggregates the results per workload and system.
type report struct {
	h        *harness
	sel      []*system
	results  []result
	profiles []profile
	elapsed  time.Duration
}

func newReport(h *harness, sel []*system, results []result, profiles []profile, elapsed time.Duration) *report {
	return &report{h: h, sel: sel, results: results, profiles: profiles, elapsed: elapsed}
}

func (r *report) failures() int {
	n := 0
	for _, x := range r.results {
		if x.Failure != "" {
			n++
		}
	}
	return n
}

// cell is the aggregate of one (workload, system).
type cell struct {
	runs, failed          int
	failure               string
	seconds, cpu, rss     float64 // medians (rss: the largest)
	firstOut              float64 // median start-up: from the worker's start to the first output (restore: to holding every input partition)
	steady                float64 // median of seconds − firstOut: from the first to the last output
	rate                  float64 // median records/s over the steady span
	records, span         int64   // medians
	doubles               int64
	warmup                float64 // scaleout: median seconds until the newcomer's last warm-up caught up
	doublesMin, doublesMx int64
	phases                map[string]float64 // handover, kill: median of each phase
	expelled              int                // rebalances: over every run
	ratio, ratioMin       float64            // redeliver: median and lowest
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *report) cell(wl, sys string) (cell, bool) {
	var c cell
	var secs, cpus, rates, recs, spans, dbl, firsts, steady, warm, ratios []float64
	phases := map[string][]float64{}
	for _, x := range r.results {
		if x.Workload != wl || x.System != sys {
			continue
		}
		c.runs++
		if x.Failure != "" {
			c.failed++
			if c.failure == "" {
				c.failure = x.Failure
			}
			continue
		}
		secs = append(secs, x.Seconds)
		cpus = append(cpus, x.CPU)
		rates = append(rates, x.Rate)
		firsts = append(firsts, x.FirstOut)
		if x.FirstOut > 0 {
			steady = append(steady, x.Seconds-x.FirstOut)
		}
		recs = append(recs, float64(x.Records))
		spans = append(spans, float64(x.Span))
		dbl = append(dbl, float64(x.Doubles))
		warm = append(warm, x.WarmupS)
		c.rss = max(c.rss, x.RSSMB)
		for p, v := range x.Phases {
			phases[p] = append(phases[p], v)
		}
		c.expelled += x.Expelled
		if x.Ratio > 0 {
			ratios = append(ratios, x.Ratio)
		}
	}
	if c.runs == 0 {
		return c, false
	}
	c.seconds, c.cpu, c.rate, c.firstOut, c.steady = median(secs), median(cpus), median(rates), median(firsts), median(steady)
	c.records, c.span, c.doubles = int64(median(recs)), int64(median(spans)), int64(median(dbl))
	c.warmup = median(warm)
	if len(phases) > 0 {
		c.phases = map[string]float64{}
		for p, vs := range phases {
			c.phases[p] = median(vs)
		}
	}
	if len(ratios) > 0 {
		c.ratio, c.ratioMin = median(ratios), slices.Min(ratios)
	}
	if len(dbl) > 0 {
		c.doublesMin, c.doublesMx = int64(slices.Min(dbl)), int64(slices.Max(dbl))
	}
	return c, true
}

// table renders the medians as a markdown table. Each run's time is split
// into its start-up (start → first output: process start, group join,
// restore) and its steady span (first → last output), and the speed-up is
// given for both: the whole time, and the steady rate, which leaves a
// slow start-up (a JVM, Goka's ~2 s) out.
func (r *report) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | system | runs | median s (start → last output) | start-up s (start → first output) | steady s (first → last output) | records/s (steady) | Runnel speed-up, total (peer s ÷ Runnel s) | Runnel speed-up, steady (Runnel records/s ÷ peer's) | CPU s | peak RSS MB | notes |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, wl := range allWorkloads {
		if isLatency(wl) {
			continue // latencyTable
		}
		base, baseOK := r.cell(wl, r.sel[0].name)
		baseOK = baseOK && base.failed == 0
		for _, s := range r.sel {
			c, ok := r.cell(wl, s.name)
			if !ok {
				continue
			}
			if c.failed > 0 {
				fmt.Fprintf(&b, "| %s | %s | %d | **FAILURE** (%d of %d) | | | | | | | | %s |\n", wl, s.name, c.runs, c.failed, c.runs, mdEscape(c.failure))
				continue
			}
			ratio, steadyRatio := "", ""
			if baseOK && base.seconds > 0 {
				ratio = fmt.Sprintf("%.2f×", c.seconds/base.seconds)
			}
			startup, steady, rate, cpu, rss, notes := "", "", "", "", "", ""
			if c.firstOut > 0 {
				startup = fmt.Sprintf("%.2f", c.firstOut)
				steady = fmt.Sprintf("%.2f", c.steady)
			}
			if c.rate > 0 {
				rate = fmt.Sprintf("%.0f", c.rate)
				if baseOK && base.rate > 0 {
					steadyRatio = fmt.Sprintf("%.2f×", base.rate/c.rate)
				}
			}
			if c.cpu > 0 {
				cpu = fmt.Sprintf("%.1f", c.cpu)
				rss = fmt.Sprintf("%.0f", c.rss)
			}
			switch strings.TrimSuffix(wl, distinctSuffix) {
			case "stateful":
				if c.span > 0 {
					notes = fmt.Sprintf("%d changelog records written", c.span)
				}
			case "restore":
				notes = fmt.Sprintf("%d changelog records read (of %d written); start-up: until it holds every input partition; every key checked after (untimed)", c.records, c.span)
			case "handover", "kill":
				notes = fmt.Sprintf("counted twice: median %d (%d–%d)", c.doubles, c.doublesMin, c.doublesMx)
				if c.phases != nil {
					notes += "; medians, ms after the signal: " + fmtPhases(c.phases)
				}
				cpu, rss = "", ""
			case "rebalances":
				notes = fmt.Sprintf("median s of one of %d joins/leaves; survivor expelled %d times in all runs; counted twice: median %d (%d–%d)",
					rebalanceSteps, c.expelled, c.doubles, c.doublesMin, c.doublesMx)
				cpu, rss = "", ""
			case "redeliver":
				notes = fmt.Sprintf("s until the other partitions are done while partition %d redelivers a record %d times; their throughput %.2f× (lowest %.2f×) of a run without the failure",
					redeliverPartition, redeliverTimes, c.ratio, c.ratioMin)
				cpu, rss = "", ""
			case "scaleout":
				notes = fmt.Sprintf("fair share after the newcomer's start; its warm-ups caught up after %.2f s; changelog %d offsets at its start; counted twice: median %d (%d–%d)", c.warmup, c.span, c.doubles, c.doublesMin, c.doublesMx)
				cpu, rss = "", ""
			}
			if kind := strings.TrimSuffix(wl, distinctSuffix); s.eos && (kind == "stateless" || kind == "stateful") {
				// Its output is visible only at transaction commits: the
				// first output waits for the first commit, and the rest
				// arrives in a few steps, so its steady rate is no rate.
				steadyRatio = ""
				notes = strings.TrimPrefix(notes+"; output visible at transaction commits: steady rate not comparable", "; ")
			}
			if !slices.Contains([]string{"stateless", "stateful", "restore"}, strings.TrimSuffix(wl, distinctSuffix)) {
				startup, steady = "", "" // these workloads time one event, not a run through the input
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %s | %s | %s | %s | %s | %s | %s | %s |\n", wl, s.name, c.runs, c.seconds, startup, steady, rate, ratio, steadyRatio, cpu, rss, notes)
		}
	}
	return b.String()
}

// latencyTable renders the latency workloads' results: per workload,
// system and level the medians over the rounds of p50, p99 and p99.9, the
// largest max, and the machine's load at the runs' starts ("" when no
// latency workload ran).
func (r *report) latencyTable() string {
	var b strings.Builder
	for _, wl := range allWorkloads {
		if !isLatency(wl) {
			continue
		}
		for _, s := range r.sel {
			var levels []string
			for _, x := range r.results {
				if x.Workload == wl && x.System == s.name && !slices.Contains(levels, x.Level) {
					levels = append(levels, x.Level)
				}
			}
			for _, lv := range levels {
				var runs, failed int
				var failure string
				var p50, p99, p999, rates, sent, fracs, loads []float64
				var mx, rss float64
				var dups int64
				for _, x := range r.results {
					if x.Workload != wl || x.System != s.name || x.Level != lv {
						continue
					}
					runs++
					if x.Failure != "" {
						failed++
						failure = x.Failure
						continue
					}
					p50, p99, p999 = append(p50, x.P50), append(p99, x.P99), append(p999, x.P999)
					rates, sent, fracs, loads = append(rates, x.InRate), append(sent, x.SentRate), append(fracs, x.CapFrac), append(loads, x.Load)
					mx, rss, dups = max(mx, x.MaxMS), max(rss, x.RSSMB), dups+x.Doubles
				}
				if b.Len() == 0 {
					b.WriteString("| workload | system | level | records/s in (sent) | of its stateless rate | runs | p50 ms | p99 ms | p99.9 ms | max ms | output twice (all runs) | peak RSS MB | load at start |\n")
					b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
				}
				if failed > 0 {
					fmt.Fprintf(&b, "| %s | %s | %s | | | %d | **FAILURE** (%d of %d) | | | | | | %s |\n", wl, s.name, lv, runs, failed, runs, mdEscape(failure))
					continue
				}
				load := fmt.Sprintf("%.1f", slices.Min(loads))
				if slices.Max(loads) != slices.Min(loads) {
					load += fmt.Sprintf("–%.1f", slices.Max(loads))
				}
				in := fmt.Sprintf("%.0f", median(rates))
				if sr := slices.Min(sent); sr > 0 && sr < 0.95*median(rates) {
					// The harness's producer fell behind: the level was not offered.
					in += fmt.Sprintf(" (**%.0f**)", sr)
				}
				frac := ""
				if f := median(fracs); f > 0 {
					frac = fmt.Sprintf("%.0f%%", 100*f)
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %d | %.0f | %s |\n",
					wl, s.name, lv, in, frac, runs, median(p50), median(p99), median(p999), mx, dups, rss, load)
			}
		}
	}
	return b.String()
}

func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	return strings.ReplaceAll(s, "\n", " ")
}

const (
	beginMark = "<!-- sidebyside:begin (generated by go run ./bench/sidebyside; edits inside are overwritten) -->"
	endMark   = "<!-- sidebyside:end -->"
)

// updateDoc replaces the generated section of the markdown file at path
// (between beginMark and endMark) for this broker; the rest is prose kept
// by hand.
func (r *report) updateDoc(path string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s (it holds the method; the harness fills in its results section): %w", path, err)
	}
	begin := strings.Replace(beginMark, "(", "("+r.h.cfg.section+"; ", 1)
	end := strings.Replace(endMark, "end", "end "+r.h.cfg.section, 1)
	i, j := bytes.Index(old, []byte(begin)), bytes.Index(old, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("%s: no section %q … %q to fill", path, begin, end)
	}
	var b bytes.Buffer
	b.Write(old[:i])
	b.WriteString(begin + "\n\n")
	b.WriteString(r.section())
	b.WriteString("\n" + end)
	b.Write(old[j+len(end):])
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// section is the generated markdown: run facts, the table, profiles.
func (r *report) section() string {
	cfg := r.h.cfg
	var b strings.Builder
	fmt.Fprintf(&b, "Run on %s UTC, %s, %d rounds, took %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04"), r.h.brokerName(), cfg.rounds, r.elapsed.Round(time.Second))
	fmt.Fprintf(&b, "- Machine: %s\n", machine())
	fmt.Fprintf(&b, "- Input: %d records, keys from %d distinct 16-byte keys, 100-byte values, %d partitions; commit interval %s for every system\n",
		cfg.records, cfg.keys, cfg.partitions, cfg.commit)
	if slices.ContainsFunc(cfg.workloads, isDistinct) {
		distinct := "?"
		if r.h.distinct != nil {
			distinct = fmt.Sprint(len(r.h.distinct.counts))
		}
		fmt.Fprintf(&b, "- Distinct-key workloads: the same %d records with keys drawn from %d keys (%s distinct keys)\n", cfg.records, cfg.distinctKeySpace(), distinct)
	}
	fmt.Fprintf(&b, "- Versions: %s\n", r.h.versions(r.sel))
	fmt.Fprintf(&b, "- Command: `go run ./bench/sidebyside%s`\n\n", r.h.flagsText())
	b.WriteString(r.table())
	if lt := r.latencyTable(); lt != "" {
		b.WriteString("\nLatency (produce → derived record visible to a read_committed reader; medians over the rounds, max: the largest):\n\n")
		b.WriteString(lt)
	}
	if len(r.profiles) > 0 {
		b.WriteString("\nProfiles of Runnel (one extra, uncounted run each; `go tool pprof` them):\n\n")
		for _, p := range r.profiles {
			rel := func(f string) string {
				x, err := filepath.Rel(filepath.Join(r.h.root, "docs"), f)
				if err != nil {
					return f
				}
				return x
			}
			fmt.Fprintf(&b, "- %s: [CPU](%s), [allocations](%s)\n", p.workload, rel(p.cpu), rel(p.mem))
		}
		for _, p := range r.profiles {
			fmt.Fprintf(&b, "\nTop of the CPU profile, %s:\n\n```\n%s```\n", p.workload, topLines(p.top, 18))
		}
	}
	return b.String()
}

// topLines keeps the header and the first n functions of pprof -top.
func topLines(top string, n int) string {
	var out []string
	started := false
	for _, l := range strings.Split(top, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "flat ") {
			started = true
			out = append(out, l)
			continue
		}
		if started && n > 0 && l != "" {
			out = append(out, l)
			n--
		}
		if !started && (strings.HasPrefix(l, "Duration") || strings.HasPrefix(l, "Showing")) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n") + "\n"
}

func (h *harness) brokerName() string {
	if h.cfg.broker == "kfake" {
		return "kfake (franz-go, in the harness process, a fresh one per run)"
	}
	return "Apache Kafka (scripts/kafka, one KRaft node on 127.0.0.1)"
}

func (h *harness) flagsText() string {
	if h.cfg.quick {
		return " -quick"
	}
	s := ""
	for _, f := range []string{"broker", "systems", "workloads", "rounds", "records", "keys", "distinct-keys", "section", "commit-interval"} {
		if v := flag.Lookup(f); v != nil && v.Value.String() != v.DefValue {
			s += fmt.Sprintf(" -%s %s", f, v.Value.String())
		}
	}
	return s
}

// machine describes the CPU, core count, memory and kernel.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					model = strings.TrimSpace(v)
				}
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.1f GiB RAM", float64(kb)/(1<<20))
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%s, %d cores (shared with other work: noisy)%s%s, %s", model, runtime.NumCPU(), mem, kernel, runtime.Version())
}

// versions lists the versions of the broker and of the selected systems,
// read from their build files.
func (h *harness) versions(sel []*system) string {
	mod := func(dir, path string) string {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", path)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off")
		out, err := cmd.Output()
		if err != nil {
			return "?"
		}
		return strings.TrimSpace(string(out))
	}
	v := []string{"Runnel " + gitDescribe(h.root)}
	if h.cfg.broker == "kfake" {
		v = append(v, "kfake "+mod(h.root, "github.com/twmb/franz-go/pkg/kfake"))
	} else {
		v = append(v, "Apache Kafka "+kafkaVersion())
	}
	seen := map[string]bool{}
	for _, s := range sel {
		if seen[s.peer] {
			continue
		}
		seen[s.peer] = true
		dir := filepath.Join(h.root, "bench", "peers", s.peer)
		switch s.peer {
		case "sarama":
			v = append(v, "Sarama "+mod(h.root, "github.com/IBM/sarama"))
		case "goka":
			v = append(v, "Goka "+mod(dir, "github.com/lovoo/goka")+" (Sarama "+mod(dir, "github.com/IBM/sarama")+")")
		case "kstreams":
			java, _ := exec.Command("java", "-version").CombinedOutput()
			first, _, _ := strings.Cut(string(java), "\n")
			v = append(v, "Kafka Streams 4.4.0 (pom.xml) on "+strings.TrimSpace(first))
		case "faust", "quix":
			req, _ := os.ReadFile(filepath.Join(dir, "requirements.txt"))
			py, _ := exec.Command("python3", "--version").CombinedOutput()
			v = append(v, strings.Join(strings.Fields(string(req)), " ")+" on "+strings.TrimSpace(string(py)))
		}
	}
	return strings.Join(v, ", ")
}

// kafkaVersion is the version of the broker jars scripts/kafka fetched.
func kafkaVersion() string {
	home := os.Getenv("RUNNEL_KAFKA_HOME")
	if home == "" {
		d, _ := os.UserHomeDir()
		home = filepath.Join(d, ".cache", "runnel", "kafka-bench")
	}
	jars, _ := filepath.Glob(filepath.Join(home, "libs", "kafka_2.13-*.jar"))
	if len(jars) == 0 {
		return "?"
	}
	return strings.TrimSuffix(strings.TrimPrefix(filepath.Base(jars[0]), "kafka_2.13-"), ".jar")
}

func gitDescribe(root string) string {
	out, err := exec.Command("git", "-C", root, "describe", "--always", "--dirty").Output()
	if err != nil {
		return "(no git)"
	}
	return strings.TrimSpace(string(out))
}
