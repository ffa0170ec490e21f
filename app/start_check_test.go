package app

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// A worker restarts while the group's committed offset of its one partition
// is 10, and its restore is handed offsets 5 records stale (as offsets that
// moved between the claim's fetch and the restore's would be): the restore
// skips the changelog records of source offsets 5..9 and puts their key back
// to its value before them, while the claim starts at 10. Unchecked, the
// count ended at 15 of 20 (lost updates). The claim's start is checked
// against the offsets the table was restored to: the claim fails, the
// partition is rebuilt from its changelog under the real offsets, and the
// count is exact.
func TestClaimStartCheckedAgainstRestore(t *testing.T) {
	for _, g := range []Guarantee{AtLeastOnce, ExactlyOnce} {
		t.Run(string(g), func(t *testing.T) { claimStartChecked(t, g) })
	}
}

func claimStartChecked(t *testing.T, g Guarantee) {
	brokers := testbroker.Brokers(t)
	f := newAckFixture(t, brokers, WithGuarantee(g), WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))))
	counts := table.New(f.app, "counts", codec.String(), codec.DecimalInt64())
	agent.New(f.app, "count", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, "x", func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(counts))
	run := func() (*Worker, func()) {
		w, err := f.app.NewWorker(WorkerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		return w, func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("worker: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("worker did not stop")
			}
		}
	}
	vals := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, "v"+strconv.Itoa(i))
		}
		return out
	}
	last := func() string {
		var v string
		for _, m := range f.readCommittedRecords(counts.Changelog()) {
			if string(m.Key) == "x" {
				v = string(m.Value)
			}
		}
		return v
	}

	_, stop := run()
	f.produce(vals(0, 10)...)
	f.eventually(60*time.Second, "count 10", func() bool { return f.committed() == 10 && last() == "10" })
	stop()

	var once sync.Once
	testRestoreOffsets = func(m map[string]map[int32]int64) {
		once.Do(func() { m[f.in.Name()][0] -= 5 })
	}
	t.Cleanup(func() { testRestoreOffsets = nil })
	w, stop := run()
	defer stop()
	f.produce(vals(10, 20)...)
	f.eventually(60*time.Second, "committed offset 20", func() bool { return f.committed() == 20 })
	deadline := time.Now().Add(30 * time.Second)
	for last() != "20" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if got := last(); got != "20" {
		t.Fatalf("count[x] = %s after 20 records, want 20", got)
	}
	if n, _ := counterSum(t, w.metrics, "runnel_claim_start_mismatches_total"); n < 1 {
		t.Fatalf("start mismatches counted: %v, want at least 1", n)
	}
}
