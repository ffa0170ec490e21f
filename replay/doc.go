// Package replay runs a bounded range of a topic's history through one agent
// in a consumer group of its own, without touching the live group, so that an
// auditor's "show me yesterday's change events again" re-applies one effect
// and nothing else (docs/replay.md).
//
// A Plan fixes, per partition, the half-open offset range [start, stop):
// from a time range of record timestamps through ListOffsets (KIP-79), or from
// explicit offsets. The end offsets are captured before anything is read; an
// explicit stop past them, or a replay group equal to the live group, is an
// error before the first fetch. Empty partitions are in the plan, marked
// empty.
//
// Run reads each partition with direct fetches from the resume point (the
// replay group's committed offset, or start) to stop. Offsets only move
// forward: a record at or below one already read is ErrBackwards; offsets
// without a data record (compaction, transaction markers, aborted records)
// are counted as gaps. An idle timeout and an independent wall-clock deadline
// bound the run; an incomplete range is an *IncompleteError that says how far
// each partition got, never a partial success. Offsets are committed in the
// replay group only for records the agent moved past with their effect done.
//
// Replay mode of an agent. The agent runs unchanged, through the same
// shared-source machinery as in a worker (package agent/source), with a
// replay runtime instead of the worker's (the runtime tables and sinks see):
//   - effects: agent.Effect asks the replay runtime; only the effect named
//     for the replay applies, every other is skipped and counted;
//   - sinks: Topic.Send goes to a sink that drops the record and confirms it
//     at once (counted as suppressed), so history never re-sends
//     notifications and never writes to a topic;
//   - tables: each table is a scratch state over an in-memory store, empty at
//     the start and never flushed: the live Pebble stores and changelogs are
//     never opened, and a replay can run beside the live workers.
//
// This needs one field in the runtime and the agent.Effect type; the worker is
// not changed. A record the agent fails ends the replay (its offset stays
// uncommitted); a record it rejects is counted and passed (a replay writes no
// dead letters).
//
// Idempotent effects (docs/replay.md, "Idempotent effects"): Dedup is a table of event IDs with a
// TTL in a Pebble store under the data directory, and SQLOnce applies an
// effect once through a database/sql unique constraint. The version guard
// (NewVersionedTable, SetVersion, DeleteVersion) keeps an older event of an
// entity from overwriting a newer state: the table's values carry their
// business version, in the store and the changelog (docs/replay.md).
//
// replay must never commit an offset in the live group, never commit an
// offset before the effect of the records below it returned, and never report
// success for a range it did not cover.
package replay
