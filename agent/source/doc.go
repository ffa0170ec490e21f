// Package source is the ack-mode shared-source manager: the part of Runnel that
// turns "every subscriber moved past a record and everything it derived is
// durable" into a safe broker advance (an offset commit for Kafka).
//
// One group exists per key (a Kafka topic partition, or a user producer). A
// group owns one poll loop (Producer.Open), one advance pump and one ack-timeout
// scanner. Each record the producer emits is fanned out to the subscribers
// registered at that moment (the snapshot); the record is resolved when every
// snapshot member resolved it (acked, failed or rejected), and the producer is
// asked to Advance the longest contiguous resolved prefix of each lane, in
// fan-out order, never two Advance calls at a time. A BatchProducer hands
// over the records it has at hand in one emit (one group lock and one clock
// read per batch); the outcome is that of one emit per record.
//
// The semantics follow Apache Airflow's shared-stream triggers with a
// producer-side ack channel (v3, airflow-core/src/airflow/triggers/shared_stream.py);
// docs/design.md §3 is the behaviour reference, in Runnel's words (a source
// for a shared stream, a subscriber for a trigger). Deliberate deviations from
// the reference, each pinned by a scenario in testdata/deviations:
//
//  1. Stop and cancel are reported: Subscription.Next returns ErrGroupStopped
//     (the reference injects nothing and relies on task cancellation).
//  2. A stale Delivery (its window closed) can neither Bind nor Reject (the
//     reference lets a task that copied the context flip a pending entry).
//  3. Unsubscribe with a non-nil cause counts the open window FAILED (the
//     reference counts it ACKED, committing a record the subscriber crashed on).
//  4. Token.Fail fails the (record, subscriber) pair at once on a delivery
//     error (the reference waits for the ack timeout).
//  5. NewManager validates QueueSize > 0 and AckTimeout > 0.
//
// Kafka sources use the Backpressure overflow policy (docs/design.md §3.2): emit
// blocks while a subscriber queue is full instead of failing the subscriber,
// and while the group's records in flight count Config.MaxInFlightBytes or
// more (never with nothing in flight).
//
// source must never advance a record before every member of its snapshot
// resolved it, and never call Advance after Close.
package source
