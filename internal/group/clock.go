package group

import (
	"context"
	"time"
)

// FirstCheck is how often a new task looks whether its sources handed out a
// record yet, for its first cycle (CycleClock's first-record check).
const FirstCheck = 10 * time.Millisecond

// CycleClock says when the next commit cycle is due. It schedules the cycles
// of one task (app's taskSet.loop) and, under ExactlyOnce, the worker-wide cycles
// of all tasks (TxnCommitter.Loop); the loop that calls Wait runs the cycle.
// A cycle is due on the first of:
//
//   - the tick: every commit interval (TxnCommitter.Loop ticks at most every
//     half transaction timeout: a transaction must commit well within it);
//   - wake: a table cache is full (app's taskSet.wake sends, never blocking);
//   - the idle check, every idle interval (app's Worker.idleCommit; off when
//     Config.IdleCommit is negative): an idle task cycles at once: when its
//     sources handed out records since the last cycle and none in the last
//     idle interval (the partition is caught up, or the input paused),
//     nothing would join the batch by waiting, and the state and the commit
//     would only come later;
//   - the first-record check, every FirstCheck until the first cycle (for
//     taskSet.loop only; like the idle check, off when Config.IdleCommit is
//     negative): the first cycle of a task comes as soon as its sources
//     handed out a record, idle or not: after a hand-over or a restart the
//     partition's new state, and its owner's position, reach the changelog
//     and the group at once (standbys, global replicas and readers of the
//     changelog see the partition live again). Waiting for the idle check
//     instead cost up to 200 ms of every hand-over (measured in
//     bench/sidebyside's handover trace; docs/benchmarks.md).
//
// handed counts the records the sources handed out so far; it never
// decreases. A CycleClock is owned by the goroutine of its loop.
type CycleClock struct {
	handed func() int64
	wake   <-chan struct{}
	tick   *time.Ticker
	idle   *time.Ticker // nil when the idle check is off
	first  *time.Ticker // nil when the first-record check is off or done
	// cycled is handed() when the last cycle was due, read right before it
	// ran; seen is handed() at the last idle check.
	cycled, seen int64
}

// NewCycleClock starts a clock ticking every commit interval (every), with
// an idle check every idle (off when idle <= 0) and, if firstRecord and the
// idle check is on, a first-record check every FirstCheck. Stop it with
// Stop.
func NewCycleClock(every, idle time.Duration, firstRecord bool, handed func() int64, wake <-chan struct{}) *CycleClock {
	c := &CycleClock{handed: handed, wake: wake, tick: time.NewTicker(every)}
	if idle > 0 {
		c.idle = time.NewTicker(idle)
		if firstRecord {
			c.first = time.NewTicker(FirstCheck)
		}
	}
	return c
}

// Wait blocks until the next cycle is due and returns true, having counted
// the records handed out so far as cycled (the caller runs the cycle at
// once); it returns false when ctx ends. The first-record check stops at
// the first cycle, whatever brought it.
func (c *CycleClock) Wait(ctx context.Context) bool {
	var idleC, firstC <-chan time.Time // nil (never ready) when off
	if c.idle != nil {
		idleC = c.idle.C
	}
	if c.first != nil {
		firstC = c.first.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-c.tick.C:
		case <-c.wake:
		case <-firstC:
			if c.handed() == 0 {
				continue
			}
		case <-idleC:
			n := c.handed()
			quiet := n == c.seen && n != c.cycled
			c.seen = n
			if !quiet {
				continue
			}
		}
		if c.first != nil {
			c.first.Stop()
			c.first = nil
		}
		c.cycled = c.handed()
		return true
	}
}

// Stop stops the clock's tickers.
func (c *CycleClock) Stop() {
	c.tick.Stop()
	if c.idle != nil {
		c.idle.Stop()
	}
	if c.first != nil {
		c.first.Stop()
	}
}
