// Package partition is Kafka's default partitioner for keyed records, as
// Runnel uses it for sources, tables and their changelogs. It depends on the
// standard library only, so a service that reads tables over HTTP (package
// client) computes a key's partition exactly as the workers do.
package partition

// Murmur2 is the 32-bit murmur2 hash that Apache Kafka's Java client uses to pick
// a record's partition (org.apache.kafka.common.utils.Utils.murmur2, seed
// 0x9747b28c). Using the same hash keeps Runnel co-partitioned with topics written
// by Kafka Streams, franz-go and librdkafka's "murmur2_random" partitioner.
func Murmur2(data []byte) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := n &^ 3
	switch n % 4 {
	case 3:
		h ^= uint32(data[tail+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[tail+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[tail])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// For returns the partition, in [0, partitions), that Kafka's default
// partitioner gives a record with the non-null encoded key:
// toPositive(murmur2(key)) % partitions. partitions must be > 0 (it panics
// on 0, as a division by zero).
func For(key []byte, partitions int32) int32 {
	return (Murmur2(key) & 0x7fffffff) % partitions
}
