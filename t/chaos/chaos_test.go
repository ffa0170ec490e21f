package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testbroker"
)

// TestChaosShort runs the short schedule (3 workers; 3 kill -9/restarts, one
// with a wiped data dir, a SIGTERM/restart, an added and a removed worker)
// while 25,000 records of the real input are produced, then checks every
// table and topic against the input: nothing lost anywhere, the tables fed
// from the input exact, events-per-dir exact against the changes-by-dir
// records it consumed; under exactly-once (RUNNEL_GUARANTEE=exactly_once)
// everything exact. kfake by default, real Kafka with RUNNEL_KAFKA_BROKERS
// (no broker stop there: other tests share the broker). CHAOS_SEED replays
// a seed; the seed is logged either way.
//
// It runs under both guarantees (RUNNEL_GUARANTEE chooses one).
func TestChaosShort(t *testing.T) {
	gs := []string{AtLeastOnce, ExactlyOnce}
	if g := os.Getenv("RUNNEL_GUARANTEE"); g != "" {
		gs = []string{g}
	}
	for _, g := range gs {
		t.Run(g, func(t *testing.T) { chaosShort(t, g) })
	}
}

func chaosShort(t *testing.T, guarantee string) {
	plan, limit, rounds, rate := Short()
	cfg := Config{Guarantee: guarantee, Plan: plan, Limit: limit, Rounds: rounds, Rate: rate,
		Input: filepath.Join("..", "..", "examples", "changeaudit", "testdata", "git-history.jsonl.gz"),
		Dir:   t.TempDir(), Session: 2 * time.Second, CommitInterval: time.Second, LagTimeout: 3 * time.Minute,
		Race: raceEnabled, Logf: t.Logf, Seed: rand.Uint64() % 1e9, BadValues: true}
	if s := os.Getenv("CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("CHAOS_SEED %q: %v", s, err)
		}
		cfg.Seed = n
	}
	if testbroker.Real() {
		cfg.Brokers = testbroker.Brokers(t)
		cfg.Session = 6 * time.Second // Kafka's group.min.session.timeout.ms
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("seed %d: %v", cfg.Seed, err)
	}
	var out strings.Builder
	rep.Write(&out)
	t.Log("\n" + out.String())
	if !rep.OK() {
		// Keep the worker logs and diagnostics: t.TempDir goes away.
		keep := filepath.Join("..", "..", "tmp", fmt.Sprintf("chaos-fail-seed%d-%s", cfg.Seed, time.Now().UTC().Format("150405")))
		files, _ := filepath.Glob(filepath.Join(cfg.Dir, "*", "worker.log"))
		diags, _ := filepath.Glob(filepath.Join(cfg.Dir, "diag-*.txt"))
		for _, f := range append(files, diags...) {
			rel, _ := filepath.Rel(cfg.Dir, f)
			dst := filepath.Join(keep, rel)
			b, err := os.ReadFile(f)
			if err == nil {
				err = os.MkdirAll(filepath.Dir(dst), 0o755)
			}
			if err == nil {
				err = os.WriteFile(dst, b, 0o644)
			}
			if err != nil {
				t.Errorf("keep %s: %v", f, err)
			}
		}
		for _, f := range files {
			t.Logf("last lines of %s:\n%s", f, tail(f, 20))
		}
		t.Logf("worker logs and diagnostics kept in %s", keep)
		t.Fatalf("seed %d fails %s (replay: CHAOS_SEED=%d go test ./t/chaos -run TestChaosShort)", cfg.Seed, cfg.Guarantee, cfg.Seed)
	}
	// The run must have exercised the chaos: records produced and
	// duplicates, if any, only where the guarantee allows them.
	if rep.Produced < int64(limit) {
		t.Fatalf("only %d of %d records produced", rep.Produced, limit)
	}
}
