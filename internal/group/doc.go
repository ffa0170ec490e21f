// Package group holds the consumer-group side of a worker, the part that
// speaks Sarama's group protocol, taken out of app piece by piece (issue
// #24): what schedules a task's commit cycles (CycleClock), what bounds the
// records a cut waits for (CutWindow), the offset committer that sends the
// at-least-once cycles' OffsetCommits (OffsetCommitter), a claim's message
// channel (ClaimFeed), failed deliveries per record (Attempts), the
// member's rejoins that a transaction's offset commit follows (Rejoins) and
// the exactly-once transaction committer (TxnCommitter: one transaction per
// worker, its renewals and aborts).
//
// The package knows nothing of app's declarations (agents, tables, options):
// app hands it what it needs (a sarama.Client, the group ID, a logger, the
// lock that orders commits; for TxnCommitter its producer, its tasks behind
// TxnTasks, its metrics and timeouts) and keeps the App declaration,
// options, CLI, HTTP, metrics registration and wiring.
//
// This package must never import app, and never stops a worker itself: it
// returns errors to the caller, which owns the worker's lifecycle, or (the
// TxnCommitter, whose failures happen in its own loop or under another
// goroutine's call) reports a cause the worker cannot go on with to the
// caller's TxnConfig.Fatal.
package group
