// Package table provides typed, partitioned key/value tables backed by a local
// store (package stores) and a compacted Kafka changelog topic (package changelog).
//
// A table write is always bound to the event being processed, so that the source
// record is not committed before the changelog record is acknowledged.
//
// This package is what an app author uses: declaring tables (New, NewWindowed,
// NewGlobal, Join) and their options, reading and writing them with an event,
// and the errors a write can meet. The runtime that runs them on a worker
// (the write caches and commit cycles, global replicas, the worker's
// environment) is in internal/tablestate, and the methods of the table types
// that only the worker calls are reached through a link that is no part of
// this API: called from an app they would cut, own or flush a partition out
// of turn and break the ack accounting, and each change to the runtime would
// be a breaking change.
//
// table must never expose a runtime type or a method that only the worker
// may call.
package table
