// Package kafka is the Kafka plumbing shared by Runnel packages: Sarama
// client configuration for the consumer group, restores and admin, Kafka's
// default (murmur2) partitioner, topic administration, and the producer of
// every derived record behind a small API with per-record delivery reports:
// NewProducer, idempotent, a producer-only franz-go kgo client
// (at-least-once); NewTxnProducer, Sarama's transactional producer
// (exactly-once, until transactions move to kgo).
//
// It must never decide what a record or an offset means: it sends, reports
// and classifies errors (Permanent); what to retry, commit or
// dead-letter is the caller's.
package kafka
