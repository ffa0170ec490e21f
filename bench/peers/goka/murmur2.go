package main

import "hash"

// murmur2 is Kafka's default partitioner hash (the Java client's
// Utils.murmur2, seed 0x9747b28c) as a hash.Hash32 for goka.WithHasher.
// Goka writes a table update to the partition its hasher picks for the key
// (Sarama's custom hash partitioner: Sum32 as int32 modulo the partitions),
// and restores table partition p for input partition p, so the hasher must
// agree with the partitioner of the input. Goka's default (FNV-1a) does not
// agree with Kafka's, which the harness and every other system use: the
// table values then land in other partitions and a restore misses them.
// Sum32 returns murmur2 & 0x7fffffff so that Sarama's int32 modulo equals
// Kafka's toPositive(murmur2) % partitions.
type murmur2 struct{ buf []byte }

func newMurmur2() hash.Hash32 { return &murmur2{} }

func (m *murmur2) Write(p []byte) (int, error) { m.buf = append(m.buf, p...); return len(p), nil }
func (m *murmur2) Sum(b []byte) []byte {
	s := m.Sum32()
	return append(b, byte(s>>24), byte(s>>16), byte(s>>8), byte(s))
}
func (m *murmur2) Reset()         { m.buf = m.buf[:0] }
func (m *murmur2) Size() int      { return 4 }
func (m *murmur2) BlockSize() int { return 4 }
func (m *murmur2) Sum32() uint32  { return uint32(kafkaMurmur2(m.buf)) & 0x7fffffff }

func kafkaMurmur2(data []byte) int32 {
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
