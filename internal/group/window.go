package group

import (
	"sync/atomic"
	"time"
)

// The bounds of a CutWindow, in records per source partition: at least
// MinWindow (a record and its neighbours always go out), at most MaxWindow
// (no bound: the agents' queues and Sarama's fetches bound it).
const (
	MinWindow = 16
	MaxWindow = 1 << 30
)

// CutWindow bounds how many records each source of a cycle may have handed
// out and not yet resolved (app's claim source waits on it). A cut waits for every
// record below its commit point to resolve, so what is unresolved when it
// begins is what it must wait for: under CPU starvation, with no bound, a cut
// never finishes within its budget and no cycle commits at all (issue #24:
// exactly-once made 0 commits in 40 minutes; at-least-once committed nothing
// for 11 s while members came and went, and everything was processed again
// after each expulsion: +81 % on the two-hop table). The window moves with
// the cuts' time (AIMD on delay, as TCP Vegas does): Adapt after each cut,
// Missed after a cut that did not finish. Under exactly-once the worker's
// transaction has one window (TxnCommitter.Window); under at-least-once each
// task has its own (app's taskRun.window). The zero value is no bound.
type CutWindow struct {
	n atomic.Int64 // 0: MaxWindow
}

// Load returns the window, in records per source partition.
func (cw *CutWindow) Load() int64 {
	if n := cw.n.Load(); n > 0 {
		return n
	}
	return MaxWindow
}

// Adapt moves the window after a cut that took cut of its budget, the
// sources holding at most held unresolved records when it began: a cut over
// half the budget shrinks the window to three quarters of what was held, a
// cut under an eighth of it grows the window by a quarter (to no bound once
// it passes what the sources hold anyway).
func (cw *CutWindow) Adapt(cut, budget time.Duration, held int64) {
	win := cw.Load()
	switch {
	case cut > budget/2:
		win = max(min(win, held)*3/4, MinWindow)
	case cut < budget/8 && win < MaxWindow:
		win += win/4 + MinWindow
		if win > 4*held+1024 {
			win = MaxWindow
		}
	default:
		return
	}
	cw.n.Store(win)
}

// Missed halves the window after a cut that did not finish in its budget
// (or before a transaction's deadline), the sources holding at most held
// unresolved records when it began.
func (cw *CutWindow) Missed(held int64) {
	cw.n.Store(max(min(cw.Load(), held)/2, MinWindow))
}
