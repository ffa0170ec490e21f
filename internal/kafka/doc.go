// Package kafka is the Sarama plumbing shared by Runnel packages: client
// configuration, Kafka's default (murmur2) partitioner, a producer with
// per-record delivery callbacks, and topic administration.
package kafka
