// Package table provides typed, partitioned key/value tables backed by a local
// store (package stores) and a compacted Kafka changelog topic (package changelog).
//
// A table write is always bound to the event being processed, so that the source
// record is not committed before the changelog record is acknowledged.
package table
