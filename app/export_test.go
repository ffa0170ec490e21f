package app

import (
	"context"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"io"
	"time"

	"github.com/IBM/sarama"
)

// SetMinTxnTimeout lowers the least transaction timeout under ExactlyOnce
// (10 s) to d for a test that times a transaction out, and returns the
// function that puts it back. Tests that call it must not run in parallel.
func SetMinTxnTimeout(d time.Duration) (restore func()) {
	prev := minTxnTimeout
	minTxnTimeout = d
	return func() { minTxnTimeout = prev }
}

// Execute runs a's command line with args as Main does, with stderr (the
// logs, the final error) going to stderr, and returns the exit status Main
// would exit with.
func Execute(ctx context.Context, a *App, stderr io.Writer, args ...string) int {
	cmd := a.Command()
	cmd.SetOut(io.Discard)
	cmd.SetErr(stderr)
	cmd.SetArgs(args)
	return a.execute(ctx, cmd)
}

// HoldRestores installs a hook that makes every activation's restore wait,
// before it reads the committed offsets and the changelog, while hold
// reports true (polled every 10 ms, at most 60 s): the partition stays
// restoring. It returns the function that removes the hook; install it
// before the test starts its first worker and remove it after the last one
// stopped (the hook is a package variable the workers read unsynchronized).
// Tests that call it must not run in parallel.
func HoldRestores(hold func() bool) (remove func()) {
	testRestoreOffsets = func(map[string]map[int32]int64) {
		for deadline := time.Now().Add(60 * time.Second); hold() && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
	}
	return func() { testRestoreOffsets = nil }
}

// WrapClient gives a test's Sarama client the type the tools take.
func WrapClient(c sarama.Client) *Client { return wrapClient(c) }

// GlobalReplica returns w's replica of the named global table (nil if there
// is none): the runtime the tests of global tables look into.
func (w *Worker) GlobalReplica(name string) *tablestate.GlobalState { return w.globalReplica(name) }
