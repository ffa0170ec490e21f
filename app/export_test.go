package app

import "time"

// SetMinTxnTimeout lowers the least transaction timeout under ExactlyOnce
// (10 s) to d for a test that times a transaction out, and returns the
// function that puts it back. Tests that call it must not run in parallel.
func SetMinTxnTimeout(d time.Duration) (restore func()) {
	prev := minTxnTimeout
	minTxnTimeout = d
	return func() { minTxnTimeout = prev }
}
