package group

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// fakeHanded is a sources' hand-out counter. While busy, every read hands
// out one more record, so each idle check sees records handed since the one
// before, however late the checks run on a loaded machine.
type fakeHanded struct {
	n, reads atomic.Int64
	busy     atomic.Bool
}

func (f *fakeHanded) handed() int64 {
	f.reads.Add(1)
	if f.busy.Load() {
		return f.n.Add(1)
	}
	return f.n.Load()
}

// stillWaiting checks that the wait on ch goes on while the clock reads the
// counter k more times (its checks ran), for at most 2 s.
func (f *fakeHanded) stillWaiting(t *testing.T, ch <-chan bool, k int64, why string) {
	t.Helper()
	want := f.reads.Load() + k
	deadline := time.Now().Add(2 * time.Second)
	for f.reads.Load() < want {
		select {
		case ok := <-ch:
			t.Fatalf("%s: wait returned %v, want it still waiting", why, ok)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the clock read the counter %d times in 2 s, want %d", why, f.reads.Load()-want+k, k)
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case ok := <-ch:
		t.Fatalf("%s: wait returned %v, want it still waiting", why, ok)
	default:
	}
}

// waitAsync runs c.Wait(ctx) on its own goroutine.
func waitAsync(ctx context.Context, c *CycleClock) <-chan bool {
	ch := make(chan bool, 1)
	go func() { ch <- c.Wait(ctx) }()
	return ch
}

func due(t *testing.T, ch <-chan bool, why string) {
	t.Helper()
	select {
	case ok := <-ch:
		if !ok {
			t.Fatalf("%s: wait returned false, want a cycle", why)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("%s: no cycle within 2 s", why)
	}
}

// stopWait ends a wait still in progress and checks it returned false.
func stopWait(t *testing.T, cancel context.CancelFunc, ch <-chan bool) {
	t.Helper()
	cancel()
	select {
	case ok := <-ch:
		if ok {
			t.Fatal("wait returned true after its context ended")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("wait did not return within 2 s of its context ending")
	}
}

func TestCycleClockIdleAfterRecordsStop(t *testing.T) {
	var f fakeHanded
	c := NewCycleClock(time.Hour, 10*time.Millisecond, false, f.handed, nil)
	defer c.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	ch := waitAsync(ctx, c)
	f.stillWaiting(t, ch, 3, "no record handed out yet")

	f.busy.Store(true)
	f.stillWaiting(t, ch, 3, "records handed out at every idle check")

	f.busy.Store(false)
	due(t, ch, "records handed out, then none for an idle interval")
	cancel()

	// Nothing handed out since that cycle: idle checks do not cycle again.
	ctx, cancel = context.WithCancel(context.Background())
	ch = waitAsync(ctx, c)
	f.stillWaiting(t, ch, 3, "no record handed out since the last cycle")
	f.n.Add(5)
	due(t, ch, "records handed out since the last cycle, then none")
	cancel()
}

func TestCycleClockFirstRecord(t *testing.T) {
	var f fakeHanded
	// The idle check is on (the first-record check needs it) but never
	// comes in the test: the cycle below is the first-record check's.
	c := NewCycleClock(time.Hour, time.Hour, true, f.handed, nil)
	defer c.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	ch := waitAsync(ctx, c)
	f.stillWaiting(t, ch, 3, "no record handed out yet")
	f.n.Add(1)
	due(t, ch, "the first record handed out")
	cancel()
	if c.first != nil {
		t.Error("the first-record check still runs after the first cycle")
	}

	off := NewCycleClock(time.Hour, 0, true, f.handed, nil)
	defer off.Stop()
	if off.first != nil {
		t.Error("the first-record check runs with the idle check off")
	}
}

func TestCycleClockWake(t *testing.T) {
	var f fakeHanded
	wake := make(chan struct{}, 1)
	c := NewCycleClock(time.Hour, 0, false, f.handed, wake)
	defer c.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wake <- struct{}{}
	due(t, waitAsync(ctx, c), "woken")
}

func TestCycleClockTick(t *testing.T) {
	var f fakeHanded
	c := NewCycleClock(10*time.Millisecond, 0, false, f.handed, nil)
	defer c.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	due(t, waitAsync(ctx, c), "the commit interval passed")
}

func TestCycleClockContextEnds(t *testing.T) {
	var f fakeHanded
	c := NewCycleClock(time.Hour, 10*time.Millisecond, true, f.handed, make(chan struct{}, 1))
	defer c.Stop()

	ctx, cancel := context.WithCancel(context.Background())
	ch := waitAsync(ctx, c)
	f.stillWaiting(t, ch, 2, "nothing due")
	stopWait(t, cancel, ch)
}
