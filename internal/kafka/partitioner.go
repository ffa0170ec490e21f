package kafka

import "github.com/runnel-dev/runnel/partition"

// Murmur2 is the 32-bit murmur2 hash of Kafka's Java client
// (partition.Murmur2, which package client shares with the workers).
func Murmur2(data []byte) int32 { return partition.Murmur2(data) }

// PartitionFor returns the partition Kafka's default partitioner gives a record
// with a non-null key: toPositive(murmur2(key)) % partitions (partition.For).
func PartitionFor(key []byte, partitions int32) int32 { return partition.For(key, partitions) }
