package app

import (
	"context"
	"io"
	"time"
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
