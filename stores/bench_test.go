package stores

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"
)

// Benchmarks of the Pebble store. Numbers and the machine they ran on are in
// docs/stores.md. Run with:
//
//	go test -run '^$' -bench . -benchtime 2000x ./stores
const (
	benchBatchRecords = 1000 // records per Apply, like a restore batch
	benchValueBytes   = 100
)

// benchKey writes the 16-byte key of record i: a mixed 8-byte prefix (so keys
// arrive in random order, as in a changelog) followed by i (so keys are unique).
func benchKey(dst []byte, i uint64, random bool) {
	h := i
	if random {
		// splitmix64 finaliser.
		h += 0x9e3779b97f4a7c15
		h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9
		h = (h ^ (h >> 27)) * 0x94d049bb133111eb
		h ^= h >> 31
	}
	binary.BigEndian.PutUint64(dst[:8], h)
	binary.BigEndian.PutUint64(dst[8:16], i)
}

// BenchmarkPebbleApplyRestore applies restore-like batches (1000 puts of 100-byte
// values and 16-byte keys, plus the offset) and syncs at the end; one
// iteration is one batch. records/s is the restore rate into the store alone
// (no Kafka fetch or decoding).
func BenchmarkPebbleApplyRestore(b *testing.B) {
	for _, mem := range []uint64{4 << 20, DefaultPebbleMemTableSize, 64 << 20} {
		for _, random := range []bool{false, true} {
			order := "sequential"
			if random {
				order = "random"
			}
			b.Run(fmt.Sprintf("memtable=%dMiB/keys=%s", mem>>20, order), func(b *testing.B) {
				s, err := OpenPebble(b.TempDir(), PebbleOptions{MemTableSize: mem})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				batch := &Batch{Ops: make([]Op, benchBatchRecords)}
				keys := make([]byte, 16*benchBatchRecords)
				value := make([]byte, benchValueBytes)
				for i := range value {
					value[i] = byte(i)
				}
				for j := range batch.Ops {
					batch.Ops[j] = Op{Key: keys[16*j : 16*j+16], Value: value}
				}
				b.SetBytes(benchBatchRecords * (16 + benchValueBytes))
				var n uint64
				start := time.Now()
				for b.Loop() {
					for j := range batch.Ops {
						benchKey(batch.Ops[j].Key, n, random)
						n++
					}
					batch.Offset = int64(n - 1)
					if err := s.Apply(3, batch); err != nil {
						b.Fatal(err)
					}
				}
				if err := s.Sync(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(n)/time.Since(start).Seconds(), "records/s")
			})
		}
	}
}

// BenchmarkPebbleGet reads present keys in scattered order from a store
// holding 500 000 records of 100 bytes (58 MB of keys and values), reopened
// before reading, with the default 8 MiB block cache (mostly misses: block
// read and snappy decompression per Get) and with a 128 MiB cache that holds
// the whole data set once warm.
func BenchmarkPebbleGet(b *testing.B) {
	const records = 500_000
	dir := b.TempDir()
	s, err := OpenPebble(dir, PebbleOptions{})
	if err != nil {
		b.Fatal(err)
	}
	value := make([]byte, benchValueBytes)
	var n uint64
	for n < records {
		var batch Batch
		for range benchBatchRecords {
			k := make([]byte, 16)
			benchKey(k, n, true)
			batch.Put(k, value)
			n++
		}
		batch.Offset = int64(n - 1)
		if err := s.Apply(0, &batch); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	for _, cache := range []int64{DefaultPebbleCacheSize, 128 << 20} {
		b.Run(fmt.Sprintf("cache=%dMiB", cache>>20), func(b *testing.B) {
			s, err := OpenPebble(dir, PebbleOptions{CacheSize: cache})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			benchGets(b, s, records)
		})
	}
}

func benchGets(b *testing.B, s *Pebble, records uint64) {
	b.Run("serial", func(b *testing.B) {
		k := make([]byte, 16)
		var i uint64
		start, gets := time.Now(), 0
		for b.Loop() {
			benchKey(k, (i*7919)%records, true)
			i++
			if _, ok, err := s.Get(0, k); err != nil || !ok {
				b.Fatalf("Get: ok %v err %v", ok, err)
			}
			gets++
		}
		b.ReportMetric(float64(gets)/time.Since(start).Seconds(), "gets/s")
	})
	b.Run("parallel", func(b *testing.B) {
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			k := make([]byte, 16)
			var i uint64
			for pb.Next() {
				benchKey(k, (i*7919)%records, true)
				i++
				if _, ok, err := s.Get(0, k); err != nil || !ok {
					b.Errorf("Get: ok %v err %v", ok, err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "gets/s")
	})
}
