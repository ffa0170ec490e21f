package app

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"
)

// The worker's KIP-441 flags set what WithWarmups sets; without them the
// option's values stay. (The worker then fails to reach the unused broker
// address; only the configuration is checked.)
func TestWorkerWarmupFlags(t *testing.T) {
	run := func(opts []Option, args ...string) Config {
		a := New("warmup-flags", append(opts, WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))...)
		cmd := a.Command()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		cmd.SetArgs(append([]string{"worker", "--brokers", "127.0.0.1:1", "--data-dir", t.TempDir()}, args...))
		_ = cmd.ExecuteContext(ctx)
		return a.cfg
	}
	c := run(nil, "--acceptable-recovery-lag", "500", "--max-warmups", "4", "--probing-interval", "30s")
	if c.AcceptableRecoveryLag != 500 || c.MaxWarmupReplicas != 4 || c.ProbingRebalanceInterval != 30*time.Second {
		t.Fatalf("flags: lag %d, warm-ups %d, probing %v", c.AcceptableRecoveryLag, c.MaxWarmupReplicas, c.ProbingRebalanceInterval)
	}
	c = run([]Option{WithWarmups(700, 3, time.Minute)})
	if c.AcceptableRecoveryLag != 700 || c.MaxWarmupReplicas != 3 || c.ProbingRebalanceInterval != time.Minute {
		t.Fatalf("option without flags: lag %d, warm-ups %d, probing %v", c.AcceptableRecoveryLag, c.MaxWarmupReplicas, c.ProbingRebalanceInterval)
	}
	c = run([]Option{WithWarmups(700, 3, time.Minute)}, "--max-warmups", "5")
	if c.AcceptableRecoveryLag != 700 || c.MaxWarmupReplicas != 5 || c.ProbingRebalanceInterval != time.Minute {
		t.Fatalf("one flag over the option: lag %d, warm-ups %d, probing %v", c.AcceptableRecoveryLag, c.MaxWarmupReplicas, c.ProbingRebalanceInterval)
	}
}
