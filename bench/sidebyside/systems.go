package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// system is one stream processor under test: a peer app under bench/peers,
// built by that directory's build.sh into the harness's bin directory and run
// as a child process per worker.
type system struct {
	name      string   // column name in the results, e.g. "kstreams-2t"
	peer      string   // directory under bench/peers
	bin       string   // executable built by build.sh
	env       []string // extra BENCH_* settings of this system (they win over the harness's)
	workloads []string // workloads this system runs
	// changelog names the topic holding the count table of an app (or
	// consumer group) id.
	changelog func(id string) string
	// decode reads one count from the changelog.
	decode func([]byte) (int64, error)
	lang   string // go, java or python: which brokers and modes it joins
	// key reads a changelog key back into the input key; nil: as is.
	key func([]byte) string
	// createChangelog: the harness creates the changelog topic (the app
	// does not).
	createChangelog bool
	// optIn: only when named in -systems (an experiment, not a peer).
	optIn bool
	// eos: the system runs exactly-once. Its output and changelog are read
	// read_committed, and a record counted twice fails the run.
	eos bool
}

// runs reports whether s runs workload; a system runs the distinct-key
// variant of each workload it runs (the same app on other input), the
// latency workload when it runs stateless (the same app), and its hand-over
// and kill variants when it runs handover and kill.
func (s *system) runs(workload string) bool {
	workload = strings.TrimSuffix(workload, distinctSuffix)
	switch workload {
	case latencyWorkload:
		workload = "stateless"
	case latencyHandover:
		workload = "handover"
	case latencyKill:
		workload = "kill"
	}
	for _, w := range s.workloads {
		if w == workload {
			return true
		}
	}
	return false
}

func decimal(b []byte) (int64, error) {
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("decimal count %q: %w", b, err)
	}
	return n, nil
}

func bigEndian64(b []byte) (int64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("8-byte count: got %d bytes", len(b))
	}
	return int64(binary.BigEndian.Uint64(b)), nil
}

// jsonString reads a JSON string key (Faust's default key serializer).
func jsonString(b []byte) string {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return string(b) // not JSON: counted under its raw bytes, and so missing from the answer
	}
	return s
}

// quixKey reads the message key out of a Quix Streams changelog key (the
// JSON message key, "|", the JSON state key).
func quixKey(b []byte) string {
	k, _, _ := bytes.Cut(b, []byte("|"))
	return jsonString(k)
}

// allWorkloads in the order they run and appear in the table.
var allWorkloads = []string{"stateless", "stateful", "restore", "stateful-distinct", "restore-distinct", "handover", "kill", "scaleout", "rebalances", "redeliver",
	latencyWorkload, latencyHandover, latencyKill}

// distinctSuffix marks the distinct-key variant of a workload: the same app
// and checks on the distinct-key dataset (harness.distinct), where keys
// rarely repeat and a write cache has little to coalesce.
const distinctSuffix = "-distinct"

// restoreOf names the restore workload measured inside each stateful one
// (a restore needs the table its stateful run wrote).
var restoreOf = map[string]string{"stateful": "restore", "stateful-distinct": "restore-distinct"}

// systems returns every known system by name, in table order (Runnel first).
func systems() []*system {
	stateful := []string{"stateless", "stateful", "restore", "handover", "kill"}
	suffixed := func(suffix string) func(string) string {
		return func(id string) string { return id + suffix }
	}
	return []*system{
		{name: "runnel", peer: "runnel", bin: "runnel-peer", workloads: append(slices.Clone(stateful), "scaleout", "rebalances", "redeliver"),
			changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go"},
		{name: "sarama", peer: "sarama", bin: "sarama-peer", workloads: []string{"stateless", "stateful"},
			changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", createChangelog: true},
		// The raw loop writing every new count at once (no write cache), as
		// it did before the write cache and as Goka does: one changelog
		// record per input record.
		{name: "sarama-wt", peer: "sarama", bin: "sarama-peer", env: []string{"BENCH_SARAMA_WRITE_THROUGH=1"}, workloads: []string{"stateful"},
			changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", createChangelog: true, optIn: true},
		{name: "sarama-safe", peer: "sarama", bin: "sarama-peer", env: []string{"BENCH_SARAMA_SAFE=1"}, workloads: []string{"stateless", "stateful"},
			changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", createChangelog: true, optIn: true},
		{name: "goka", peer: "goka", bin: "goka-peer", workloads: stateful,
			changelog: suffixed("-table"), decode: decimal, lang: "go"},
		{name: "kstreams-1t", peer: "kstreams", bin: "kstreams-peer", env: []string{"BENCH_THREADS=1"}, workloads: stateful,
			changelog: suffixed("-counts-changelog"), decode: bigEndian64, lang: "java"},
		{name: "kstreams-2t", peer: "kstreams", bin: "kstreams-peer", env: []string{"BENCH_THREADS=2"}, workloads: stateful,
			changelog: suffixed("-counts-changelog"), decode: bigEndian64, lang: "java"},
		{name: "faust", peer: "faust", bin: "faust-peer", workloads: stateful,
			changelog: suffixed("-counts-changelog"), decode: decimal, key: jsonString, lang: "python"},
		{name: "quix", peer: "quix", bin: "quix-peer", workloads: stateful,
			changelog: func(id string) string { return "changelog__" + id + "--" + id[:len(id)-len("app")] + "in--default" },
			decode:    decimal, key: quixKey, lang: "python"},
		// Runnel with a 100 ms group heartbeat (default 250 ms): how much of a
		// hand-over is the survivor noticing the rebalance at its next
		// heartbeat.
		{name: "runnel-hb100", peer: "runnel", bin: "runnel-peer", env: []string{"BENCH_HEARTBEAT_MS=100"},
			workloads: []string{"handover", "rebalances"},
			changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", optIn: true},
		// Runnel with the Go collector at GOGC=400 (default 100): how much of
		// its latency tail and CPU is garbage collection, against its memory.
		{name: "runnel-gogc400", peer: "runnel", bin: "runnel-peer", env: []string{"GOGC=400"},
			workloads: []string{"stateless", "stateful"},
			changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", optIn: true},
		// Runnel reading its input through the claims' own Sarama partition
		// consumers (RUNNEL_FETCHER=sarama) instead of its Fetcher: what the
		// Fetcher changes, side by side.
		{name: "runnel-saramafetch", peer: "runnel", bin: "runnel-peer", env: []string{"RUNNEL_FETCHER=sarama"},
			workloads: []string{"stateless", "stateful", "handover", "kill"},
			changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", optIn: true},
		// Exactly-once: Runnel's transactional commit cycles at its default
		// interval under exactly-once (2.8 s; BENCH_COMMIT_MS=0 is the
		// app's default), and Kafka Streams' exactly_once_v2 at the same
		// commit interval as the rest.
		{name: "runnel-eos", peer: "runnel", bin: "runnel-peer", env: []string{"RUNNEL_GUARANTEE=exactly_once", "BENCH_COMMIT_MS=0"}, workloads: stateful,
			changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", eos: true},
		{name: "kstreams-2t-eos", peer: "kstreams", bin: "kstreams-peer", env: []string{"BENCH_THREADS=2", "BENCH_GUARANTEE=exactly_once_v2"}, workloads: stateful,
			changelog: suffixed("-counts-changelog"), decode: bigEndian64, lang: "java", eos: true},
		// Runnel exactly-once at other commit intervals (opt-in): how its
		// default was chosen (docs/semantics.md).
		{name: "runnel-eos-c100", peer: "runnel", bin: "runnel-peer", env: []string{"RUNNEL_GUARANTEE=exactly_once", "BENCH_COMMIT_MS=100"},
			workloads: stateful, changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", eos: true, optIn: true},
		{name: "runnel-eos-c200", peer: "runnel", bin: "runnel-peer", env: []string{"RUNNEL_GUARANTEE=exactly_once", "BENCH_COMMIT_MS=200"},
			workloads: stateful, changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", eos: true, optIn: true},
		{name: "runnel-eos-c500", peer: "runnel", bin: "runnel-peer", env: []string{"RUNNEL_GUARANTEE=exactly_once", "BENCH_COMMIT_MS=500"},
			workloads: stateful, changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", eos: true, optIn: true},
		{name: "runnel-eos-c2800", peer: "runnel", bin: "runnel-peer", env: []string{"RUNNEL_GUARANTEE=exactly_once", "BENCH_COMMIT_MS=2800"},
			workloads: stateful, changelog: suffixed("-counts-changelog"), decode: decimal, lang: "go", eos: true, optIn: true},
		// Kafka Streams' own default commit interval (30 s under at-least-once):
		// its record cache then holds the counts until the commit.
		{name: "kstreams-2t-c30s", peer: "kstreams", bin: "kstreams-peer", env: []string{"BENCH_THREADS=2", "BENCH_COMMIT_MS=30000"},
			workloads: []string{"stateless", "stateful"},
			changelog: suffixed("-counts-changelog"), decode: bigEndian64, lang: "java"},
	}
}

// build runs every selected system's build.sh once (two systems may share a
// peer) into binDir.
func build(root, binDir string, sel []*system) error {
	done := map[string]bool{}
	for _, s := range sel {
		if done[s.peer] {
			continue
		}
		done[s.peer] = true
		script := filepath.Join(root, "bench", "peers", s.peer, "build.sh")
		cmd := exec.Command(script, binDir)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build %s (%s): %w", s.peer, script, err)
		}
	}
	return nil
}
