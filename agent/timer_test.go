package agent

import (
	"context"
	"errors"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"strings"
	"testing"
	"time"
)

// A firing waits for the broker's answer to every record its function bound,
// returns the first delivery error, and refuses bindings after the function
// returned (a write or send then is outside the firing's window).
func TestFireWaitsForBoundRecords(t *testing.T) {
	var late *Tick
	answers := make(chan func(error), 2)
	tm := timer{interval: time.Minute, clock: WallClock, fn: func(ctx context.Context, tk *Tick) error {
		for range 2 {
			done, ok := tk.bindPersist()
			if !ok {
				t.Error("binding refused while the function runs")
			}
			answers <- done
		}
		late = tk
		return nil
	}}
	go func() {
		(<-answers)(nil)
		(<-answers)(errors.New("NOT_LEADER"))
	}()
	at := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	err := tm.Fire(context.Background(), 3, &tablestate.Env{}, at)
	if err == nil || !strings.Contains(err.Error(), "NOT_LEADER") || !strings.Contains(err.Error(), "partition 3") {
		t.Fatalf("Fire = %v, want the delivery error with the partition", err)
	}
	if _, ok := late.bindPersist(); ok || late.InWindow() {
		t.Fatal("a tick accepts bindings after its function returned")
	}
	if ts := tablestate.EventTime(late); !ts.Equal(at) || late.Partition() != 3 {
		t.Fatalf("event time %v, partition %d: want %v, 3", ts, late.Partition(), at)
	}
}

// A panicking timer function is an error of the firing, never a crash; an
// unanswered record makes Fire end with its context.
func TestFirePanicAndUnanswered(t *testing.T) {
	tm := timer{interval: time.Minute, fn: func(context.Context, *Tick) error { panic("boom") }}
	if err := tm.Fire(context.Background(), 0, nil, time.Now()); err == nil || !strings.Contains(err.Error(), "panic: boom") {
		t.Fatalf("Fire = %v, want the panic", err)
	}
	tm.fn = func(ctx context.Context, tk *Tick) error { _, _ = tk.bindPersist(); return nil }
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tm.Fire(ctx, 0, nil, time.Now()); err == nil || !strings.Contains(err.Error(), "1 records sent by the timer unanswered") {
		t.Fatalf("Fire = %v, want the unanswered record", err)
	}
}

func TestTimerBoundaryAndValidate(t *testing.T) {
	tm := timer{interval: time.Hour, clock: StreamTime, fn: func(context.Context, *Tick) error { return nil }}
	got := tm.Boundary(time.Date(2026, 3, 1, 9, 59, 59, 0, time.UTC))
	if want := time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("Boundary = %v, want %v", got, want)
	}
	if err := tm.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []timer{{interval: 0, fn: tm.fn}, {interval: time.Second}, {interval: time.Second, fn: tm.fn, clock: Clock(7)}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
