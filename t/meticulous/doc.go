// Package meticulous holds Runnel's property tests: randomized sequences of
// cluster changes checked with rapid (pgregory.net/rapid) against the laws of
// DESIGN.md §4 (assignment: one active per partition, co-partitioning,
// stateful and total balance, standby counts and spread, stickiness,
// determinism, idempotence, promotion on removal, stale and forged claims,
// KIP-441 lag rule, KIP-429 two-phase moves), and the smallest failing cases
// rapid or an external checker found, kept as named regression tests.
//
// Running: go test ./t/meticulous (a few seconds); more cases with
// -rapid.checks=3000; a failure prints its seed and writes a fail file under
// testdata/rapid that -rapid.failfile replays.
//
// The package has no non-test code and must never be imported: it only
// tests other packages through their public API.
package meticulous
