// Package meticulous holds the property tests of the assignment laws: rapid
// (pgregory.net/rapid) generates clusters (co-partitioned source topics, some
// with a changelog, standby replicas, members) and sequences of members
// joining, leaving and rejoining, and checks every plan
// assignor.PlanAssignment returns against the laws it must keep:
//
//   - every plan is valid: co-partitioned topics move together, each
//     partition has exactly one active, a changelog partition has
//     min(replicas, members-1) standbys and never one on its active's member,
//     stateful actives and all actives are each balanced within one per
//     member, and standbys as narrowly as the actives allow;
//   - a plan is deterministic (member order does not matter) and idempotent
//     (re-planning its own output changes nothing);
//   - a join moves only what the newcomers need; a departure promotes an
//     orphaned stateful active to a surviving standby holder whenever balance
//     leaves it room (TestAssignmentProperties);
//   - a stateful active sits on a caught-up member when one exists, warm-ups
//     are bounded (KIP-441, TestLagRule);
//   - forged claims (a generation above the group's, foreign or corrupt
//     user data) never win; a stale claim (an older generation) loses to
//     the most recent owner, except that a rejoiner gets its earlier tasks
//     back where the balance allows: a rejoin moves only what goes to the
//     rejoiner, and a whole-group restart, in any join order and batches,
//     ends where it began (TestWholeGroupRestart; in two batches even
//     without the members' earlier claims; end to end through
//     assignor.Strategy and its wire format, with the lag known or not:
//     TestRestartThroughStrategies);
//   - a cooperative plan never gives a member a partition another member
//     still owns, and its follow-up assigns exactly the eager target (KIP-429,
//     TestCooperativeTwoPhase).
//
// Failing cases rapid found are kept as named regression tests with their
// seed (promotion_regress_test.go). The package has no code of its own: the
// tests exercise package assignor through its exported API only.
//
// Run them (100 cases per property by default, 20 with -short):
//
//	go test ./t/meticulous
//
// More cases, with each case's seed logged as it starts:
//
//	go test ./t/meticulous -run TestAssignmentProperties -rapid.checks=10000 -rapid.v -v
//
// A failure prints the seed and a fail file under testdata/rapid/ to
// replay it (rapid replays the fail files it finds there first):
//
//	go test ./t/meticulous -run 'TestAssignmentProperties$' -rapid.seed=605367156586382394
//	go test ./t/meticulous -run 'TestAssignmentProperties$' -rapid.failfile=testdata/rapid/...
//
// The same settings can be given as environment variables (RAPID_CHECKS,
// RAPID_SEED, RAPID_V); -rapid.shrinktime bounds the time spent minimizing a
// failing case (default 30 s), and a long run needs a matching -timeout, since
// rapid stops early when the test deadline nears.
//
// meticulous must never be imported by non-test code nor reach into
// assignor's unexported state: a law checked here is a law of the public API.
package meticulous
