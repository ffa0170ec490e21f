package app

import (
	"fmt"
	"os"
	"testing"
)

// TestMain fails the package's run when any worker of any test refused a task
// state transition as outside internal/task's table: every lifecycle path the
// tests drive (restores, standbys, hand-overs, restarts, fences, aborts) must
// be a transition of the table.
func TestMain(m *testing.M) {
	code := m.Run()
	if n := invalidTransitions.Load(); n > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: %d task state transitions outside the table (log lines \"invalid task state transition\")\n", n)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
