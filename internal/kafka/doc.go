// Package kafka is the Kafka plumbing shared by Runnel packages: Sarama
// client configuration for the consumer group, restores and admin, Kafka's
// default (murmur2) partitioner, topic administration, and the producer of
// every derived record under both guarantees: a producer-only franz-go kgo
// client behind a small API with per-record delivery reports (NewProducer,
// idempotent; NewTxnProducer, transactional with the offsets of a Sarama
// consumer group, KIP-447).
//
// It must never decide what a record or an offset means: it sends, reports
// and classifies errors (Permanent, Fenced); what to retry, commit or
// dead-letter is the caller's.
package kafka
