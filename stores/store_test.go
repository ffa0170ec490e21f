package stores

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// impl opens a fresh store of one implementation for a test.
type impl struct {
	name string
	open func(t *testing.T) Store
}

func impls() []impl {
	return []impl{
		{"memory", func(t *testing.T) Store { return NewMemory() }},
		{"pebble", func(t *testing.T) Store {
			s, err := OpenPebble(t.TempDir(), PebbleOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
	}
}

// forEach runs test against a fresh store of every implementation and closes
// the store afterwards unless the test already did.
func forEach(t *testing.T, test func(t *testing.T, s Store)) {
	for _, im := range impls() {
		t.Run(im.name, func(t *testing.T) {
			s := im.open(t)
			defer func() {
				if err := s.Close(); err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("close: %v", err)
				}
			}()
			test(t, s)
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// dump returns the partition's entries as "key=value" strings in Iterate order.
func dump(t *testing.T, s Store, partition int32) []string {
	t.Helper()
	var out []string
	must(t, s.Iterate(partition, func(k, v []byte) error {
		out = append(out, string(k)+"="+string(v))
		return nil
	}))
	return out
}

func wantGet(t *testing.T, s Store, partition int32, key, want string, wantOK bool) {
	t.Helper()
	v, ok, err := s.Get(partition, []byte(key))
	must(t, err)
	if ok != wantOK || string(v) != want {
		t.Fatalf("Get(%d, %q) = %q, %v; want %q, %v", partition, key, v, ok, want, wantOK)
	}
}

func wantOffset(t *testing.T, s Store, partition int32, want int64) {
	t.Helper()
	got, err := s.Offset(partition)
	must(t, err)
	if got != want {
		t.Fatalf("Offset(%d) = %d; want %d", partition, got, want)
	}
}

func wantPartitions(t *testing.T, s Store, want ...int32) {
	t.Helper()
	got, err := s.Partitions()
	must(t, err)
	if !slices.Equal(got, want) {
		t.Fatalf("Partitions() = %v; want %v", got, want)
	}
}

func TestPutGetDelete(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		wantGet(t, s, 0, "a", "", false)
		wantOffset(t, s, 0, NoOffset)

		var b Batch
		b.Put([]byte("a"), []byte("1"))
		b.Put([]byte("b"), []byte("2"))
		b.Put([]byte("empty"), nil)
		b.Offset = 10
		must(t, s.Apply(0, &b))
		wantGet(t, s, 0, "a", "1", true)
		wantGet(t, s, 0, "b", "2", true)
		v, ok, err := s.Get(0, []byte("empty"))
		must(t, err)
		if !ok || v == nil || len(v) != 0 {
			t.Fatalf("Get(empty) = %#v, %v; want non-nil empty slice, true", v, ok)
		}
		wantOffset(t, s, 0, 10)

		// Overwrite and tombstone in one batch; ops apply in order, so the
		// key put after its delete survives and the one deleted after its put
		// does not.
		b = Batch{Offset: 12}
		b.Put([]byte("a"), []byte("1b"))
		b.Delete([]byte("b"))
		b.Put([]byte("b"), []byte("2b"))
		b.Put([]byte("c"), []byte("3"))
		b.Delete([]byte("c"))
		b.Delete([]byte("never-existed"))
		must(t, s.Apply(0, &b))
		wantGet(t, s, 0, "a", "1b", true)
		wantGet(t, s, 0, "b", "2b", true)
		wantGet(t, s, 0, "c", "", false)
		wantOffset(t, s, 0, 12)
		if got, want := dump(t, s, 0), []string{"a=1b", "b=2b", "empty="}; !slices.Equal(got, want) {
			t.Fatalf("Iterate = %v; want %v", got, want)
		}

		// A batch with NoOffset leaves the offset alone.
		b = Batch{Offset: NoOffset}
		b.Delete([]byte("a"))
		must(t, s.Apply(0, &b))
		wantGet(t, s, 0, "a", "", false)
		wantOffset(t, s, 0, 12)

		// An offset-only batch moves the offset (a changelog stretch of
		// records compacted away or transaction markers).
		must(t, s.Apply(0, &Batch{Offset: 20}))
		wantOffset(t, s, 0, 20)
		if got, want := dump(t, s, 0), []string{"b=2b", "empty="}; !slices.Equal(got, want) {
			t.Fatalf("Iterate = %v; want %v", got, want)
		}
		must(t, s.Apply(0, nil))
		wantOffset(t, s, 0, 20)
	})
}

// The caller may reuse its slices after Apply and may keep or modify slices
// it got back without changing the store.
func TestSliceOwnership(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		k, v := []byte("key"), []byte("value")
		var b Batch
		b.Put(k, v)
		must(t, s.Apply(3, &b))
		copy(k, "XXX")
		copy(v, "XXXXX")
		wantGet(t, s, 3, "key", "value", true)

		got, _, err := s.Get(3, []byte("key"))
		must(t, err)
		got[0] = 'Z'
		wantGet(t, s, 3, "key", "value", true)

		var kept [][]byte
		must(t, s.Iterate(3, func(k, v []byte) error {
			kept = append(kept, k, v)
			return nil
		}))
		kept[0][0], kept[1][0] = 'Z', 'Z'
		wantGet(t, s, 3, "key", "value", true)
		if string(kept[0]) != "Zey" || string(kept[1]) != "Zalue" {
			t.Fatalf("kept = %q", kept)
		}
	})
}

func TestInvalidArguments(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		_, _, err := s.Get(-1, []byte("a"))
		if !errors.Is(err, ErrInvalidPartition) {
			t.Errorf("Get(-1) err = %v", err)
		}
		if err := s.Apply(-1, &Batch{Offset: 1}); !errors.Is(err, ErrInvalidPartition) {
			t.Errorf("Apply(-1) err = %v", err)
		}
		if err := s.Apply(0, &Batch{Offset: -2}); !errors.Is(err, ErrInvalidOffset) {
			t.Errorf("Apply offset -2 err = %v", err)
		}
		if _, err := s.Offset(-5); !errors.Is(err, ErrInvalidPartition) {
			t.Errorf("Offset(-5) err = %v", err)
		}
		if err := s.Iterate(-1, func(k, v []byte) error { return nil }); !errors.Is(err, ErrInvalidPartition) {
			t.Errorf("Iterate(-1) err = %v", err)
		}
		if err := s.DropPartition(-1); !errors.Is(err, ErrInvalidPartition) {
			t.Errorf("DropPartition(-1) err = %v", err)
		}
		wantPartitions(t, s)
	})
}

// Keys of one partition never show in another, including user keys that are
// prefixes of each other, the empty key, keys holding bytes that look like a
// partition prefix, and partitions whose numbers differ only in one byte
// (255/256, 0/65536, 1/16777217).
func TestPartitionIsolation(t *testing.T) {
	parts := []int32{0, 1, 2, 255, 256, 257, 65535, 65536, 1 << 24, 1<<24 + 1, 1<<31 - 1}
	keys := []string{"", "a", "aa", "a\x00", "a\xff", "b", "\x00\x00\x01\x00", "\xff\xff\xff\xff"}
	forEach(t, func(t *testing.T, s Store) {
		for i, p := range parts {
			var b Batch
			for _, k := range keys {
				b.Put([]byte(k), []byte(fmt.Sprintf("%d/%q", p, k)))
			}
			b.Offset = int64(100 + i)
			must(t, s.Apply(p, &b))
		}
		wantPartitions(t, s, parts...)
		sorted := slices.Clone(keys)
		slices.Sort(sorted)
		for i, p := range parts {
			var want []string
			for _, k := range sorted {
				want = append(want, k+"="+fmt.Sprintf("%d/%q", p, k))
			}
			if got := dump(t, s, p); !slices.Equal(got, want) {
				t.Fatalf("partition %d: Iterate = %q; want %q", p, got, want)
			}
			for _, k := range keys {
				wantGet(t, s, p, k, fmt.Sprintf("%d/%q", p, k), true)
			}
			wantOffset(t, s, p, int64(100+i))
		}
		// Neighbouring partitions stay empty.
		for _, p := range []int32{3, 254, 258, 65534, 65537, 1<<24 - 1, 1<<31 - 2} {
			if got := dump(t, s, p); got != nil {
				t.Fatalf("partition %d: Iterate = %q; want nothing", p, got)
			}
			wantGet(t, s, p, "a", "", false)
			wantOffset(t, s, p, NoOffset)
		}

		// Dropping 255 leaves 256 (and everything else) intact.
		must(t, s.DropPartition(255))
		if got := dump(t, s, 255); got != nil {
			t.Fatalf("partition 255 after drop: %q", got)
		}
		wantOffset(t, s, 255, NoOffset)
		wantGet(t, s, 256, "a", `256/"a"`, true)
		wantGet(t, s, 254, "a", "", false)
		if got := len(dump(t, s, 256)); got != len(keys) {
			t.Fatalf("partition 256 after dropping 255 has %d keys; want %d", got, len(keys))
		}
		want := slices.DeleteFunc(slices.Clone(parts), func(p int32) bool { return p == 255 })
		wantPartitions(t, s, want...)
	})
}

func TestIterateOrderAndStop(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		var b Batch
		for _, k := range []string{"b", "a", "ab", "", "\xff", "a\x00", "B"} {
			b.Put([]byte(k), []byte("v"+k))
		}
		must(t, s.Apply(7, &b))
		var keys []string
		must(t, s.Iterate(7, func(k, v []byte) error {
			if string(v) != "v"+string(k) {
				t.Errorf("key %q has value %q", k, v)
			}
			keys = append(keys, string(k))
			return nil
		}))
		if want := []string{"", "B", "a", "a\x00", "ab", "b", "\xff"}; !slices.Equal(keys, want) {
			t.Fatalf("order = %q; want %q", keys, want)
		}

		stop := errors.New("stop")
		n := 0
		err := s.Iterate(7, func(k, v []byte) error {
			n++
			if n == 3 {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) || n != 3 {
			t.Fatalf("Iterate stop: err %v after %d calls; want stop after 3", err, n)
		}

		// The callback may write to the store; it iterates the snapshot taken
		// when Iterate started.
		n = 0
		must(t, s.Iterate(7, func(k, v []byte) error {
			n++
			var b Batch
			b.Put(append(k, "-copy"...), v)
			return s.Apply(7, &b)
		}))
		if n != 7 {
			t.Fatalf("Iterate with writes saw %d keys; want the 7 of the snapshot", n)
		}
		if got := len(dump(t, s, 7)); got != 14 {
			t.Fatalf("after copying, partition has %d keys; want 14", got)
		}
	})
}

func TestDropPartitionAndPartitions(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		wantPartitions(t, s)
		// Offset only, data only, both.
		must(t, s.Apply(4, &Batch{Offset: 7}))
		b := Batch{Offset: NoOffset} // the zero Batch would set offset 0
		b.Put([]byte("k"), []byte("v"))
		must(t, s.Apply(2, &b))
		b.Offset = 3
		must(t, s.Apply(9, &b))
		wantPartitions(t, s, 2, 4, 9)

		// A partition whose keys are all deleted and that has no offset holds
		// nothing, and is not listed.
		b = Batch{Offset: NoOffset}
		b.Delete([]byte("k"))
		must(t, s.Apply(2, &b))
		wantPartitions(t, s, 4, 9)

		must(t, s.DropPartition(9))
		wantPartitions(t, s, 4)
		wantGet(t, s, 9, "k", "", false)
		wantOffset(t, s, 9, NoOffset)
		must(t, s.DropPartition(9)) // dropping an absent partition is fine
		must(t, s.DropPartition(4))
		wantPartitions(t, s)

		// A dropped partition can be written again from scratch.
		b = Batch{Offset: 0}
		b.Put([]byte("new"), []byte("1"))
		must(t, s.Apply(9, &b))
		if got, want := dump(t, s, 9), []string{"new=1"}; !slices.Equal(got, want) {
			t.Fatalf("after re-create: %q; want %q", got, want)
		}
		wantOffset(t, s, 9, 0)
		wantPartitions(t, s, 9)
	})
}

func wantMarks(t *testing.T, s Store, partition int32, want map[string]int64) {
	t.Helper()
	got, err := s.Marks(partition)
	must(t, err)
	if got == nil || !maps.Equal(got, want) {
		t.Fatalf("Marks(%d) = %v; want %v", partition, got, want)
	}
}

// TestMarks: marks are per partition, the last write of a name wins (within a
// batch and across batches), a batch of marks only is applied and lists its
// partition, and DropPartition clears them with the data.
func TestMarks(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		wantMarks(t, s, 0, map[string]int64{})
		b := Batch{Offset: 5}
		b.Put([]byte("k"), []byte("v"))
		b.Mark("in/0", 10)
		b.Mark("in/1", 3)
		b.Mark("in/0", 12) // last write wins within the batch
		must(t, s.Apply(0, &b))
		wantMarks(t, s, 0, map[string]int64{"in/0": 12, "in/1": 3})
		wantMarks(t, s, 1, map[string]int64{})

		// Across batches, last write wins too (lower offsets included); names
		// that are prefixes of each other stay apart.
		b = Batch{Offset: NoOffset}
		b.Mark("in/1", 2)
		b.Mark("in/10", 7)
		b.Mark("", -1)
		must(t, s.Apply(0, &b))
		wantMarks(t, s, 0, map[string]int64{"in/0": 12, "in/1": 2, "in/10": 7, "": -1})
		wantOffset(t, s, 0, 5)
		if got := dump(t, s, 0); !slices.Equal(got, []string{"k=v"}) {
			t.Fatalf("data after a marks-only batch: %q", got)
		}

		// A partition with marks only is listed; 255 and 256 differ in one
		// prefix byte.
		b = Batch{Offset: NoOffset}
		b.Mark("x/0", 1)
		must(t, s.Apply(256, &b))
		b = Batch{Offset: NoOffset}
		b.Mark("x/0", 2)
		must(t, s.Apply(255, &b))
		wantPartitions(t, s, 0, 255, 256)
		wantMarks(t, s, 255, map[string]int64{"x/0": 2})
		wantMarks(t, s, 256, map[string]int64{"x/0": 1})

		must(t, s.DropPartition(0))
		wantMarks(t, s, 0, map[string]int64{})
		wantOffset(t, s, 0, NoOffset)
		must(t, s.DropPartition(256))
		wantPartitions(t, s, 255)
		wantMarks(t, s, 255, map[string]int64{"x/0": 2})

		if _, err := s.Marks(-1); !errors.Is(err, ErrInvalidPartition) {
			t.Fatalf("Marks(-1): %v", err)
		}
		must(t, s.Close())
		if _, err := s.Marks(0); !errors.Is(err, ErrClosed) {
			t.Fatalf("Marks after Close: %v", err)
		}
	})
}

func TestErrClosed(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		var b Batch
		b.Put([]byte("k"), []byte("v"))
		b.Offset = 1
		must(t, s.Apply(0, &b))
		must(t, s.Sync())
		must(t, s.Close())
		checks := map[string]error{
			"Close":        s.Close(),
			"Apply":        s.Apply(0, &b),
			"Apply(empty)": s.Apply(0, &Batch{Offset: NoOffset}),
			"Iterate": s.Iterate(0, func(k, v []byte) error {
				return errors.New("called")
			}),
			"DropPartition": s.DropPartition(0),
			"Sync":          s.Sync(),
		}
		_, _, checks["Get"] = s.Get(0, []byte("k"))
		_, checks["Offset"] = s.Offset(0)
		_, checks["Partitions"] = s.Partitions()
		for name, err := range checks {
			if !errors.Is(err, ErrClosed) {
				t.Errorf("%s after Close: err = %v; want ErrClosed", name, err)
			}
		}
	})
}

// Writers on distinct partitions and readers on all of them run at once (run
// with -race). Each partition ends with exactly its writer's data and offset,
// and a reader never sees an applied offset whose batch's data is missing:
// every value is the offset of the batch that wrote it, so after reading
// Offset = off, a later Iterate must find some value >= off.
func TestConcurrentUse(t *testing.T) {
	const writers, batches, perBatch = 4, 100, 20
	forEach(t, func(t *testing.T, s Store) {
		var wg sync.WaitGroup
		errs := make(chan error, writers*2+1)
		done := make(chan struct{})
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := int32(w)
				for n := range batches {
					var b Batch
					for i := range perBatch {
						b.Put([]byte(fmt.Sprintf("k%03d", (n*perBatch+i)%300)), []byte(fmt.Sprint(n)))
					}
					if n%10 == 9 {
						b.Delete([]byte(fmt.Sprintf("k%03d", n)))
					}
					b.Offset = int64(n)
					if err := s.Apply(p, &b); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		var readers sync.WaitGroup
		for w := range writers {
			readers.Add(1)
			go func() {
				defer readers.Done()
				p := int32(w)
				for {
					select {
					case <-done:
						return
					default:
					}
					off, err := s.Offset(p)
					if err != nil {
						errs <- err
						return
					}
					maxSeen := int64(-1)
					if err := s.Iterate(p, func(k, v []byte) error {
						var n int64
						if _, err := fmt.Sscan(string(v), &n); err != nil {
							return err
						}
						maxSeen = max(maxSeen, n)
						return nil
					}); err != nil {
						errs <- err
						return
					}
					if maxSeen < off {
						errs <- fmt.Errorf("partition %d: offset %d read before data whose newest batch is %d", p, off, maxSeen)
						return
					}
					if _, err := s.Partitions(); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(done)
		readers.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// Rebuild the expected state of one writer sequentially in a Memory
		// store and compare every partition.
		want := NewMemory()
		for n := range batches {
			var b Batch
			for i := range perBatch {
				b.Put([]byte(fmt.Sprintf("k%03d", (n*perBatch+i)%300)), []byte(fmt.Sprint(n)))
			}
			if n%10 == 9 {
				b.Delete([]byte(fmt.Sprintf("k%03d", n)))
			}
			b.Offset = int64(n)
			must(t, want.Apply(0, &b))
		}
		for w := range writers {
			if got, exp := dump(t, s, int32(w)), dump(t, want, 0); !slices.Equal(got, exp) {
				t.Fatalf("partition %d: %d entries, want %d", w, len(got), len(exp))
			}
			wantOffset(t, s, int32(w), batches-1)
		}
		wantPartitions(t, s, 0, 1, 2, 3)
	})
}

// Close waits for a running Iterate, and calls after Close fail with ErrClosed
// rather than touching a closed database.
func TestCloseDuringUse(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		var b Batch
		for i := range 100 {
			b.Put([]byte(fmt.Sprintf("k%03d", i)), []byte("v"))
		}
		must(t, s.Apply(0, &b))
		inside := make(chan struct{})
		closed := make(chan error)
		iterErr := make(chan error)
		go func() {
			first := true
			iterErr <- s.Iterate(0, func(k, v []byte) error {
				if first {
					first = false
					close(inside)
					go func() { closed <- s.Close() }()
				}
				// A call from inside the callback after Close began must
				// not deadlock; it may see ErrClosed.
				if _, _, err := s.Get(0, k); err != nil && !errors.Is(err, ErrClosed) {
					return err
				}
				return nil
			})
		}()
		<-inside
		if err := <-iterErr; err != nil {
			t.Fatalf("Iterate: %v", err)
		}
		if err := <-closed; err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, _, err := s.Get(0, []byte("k000")); !errors.Is(err, ErrClosed) {
			t.Fatalf("Get after Close: %v", err)
		}
	})
}

func TestPebbleReopenKeepsDataAndOffset(t *testing.T) {
	dir := t.TempDir()
	cache := pebble.NewCache(16 << 20)
	defer cache.Unref()
	s, err := OpenPebble(dir, PebbleOptions{Cache: cache, MemTableSize: 1 << 20})
	must(t, err)
	// Enough data to flush several memtables into sstables, so the reopened
	// store reads from both the WAL and sstables.
	val := bytes.Repeat([]byte("x"), 100)
	for n := range 50 {
		var b Batch
		for i := range 1000 {
			b.Put([]byte(fmt.Sprintf("%06d", n*1000+i)), val)
		}
		b.Offset = int64(n)
		must(t, s.Apply(int32(n%3), &b))
	}
	must(t, s.DropPartition(2))
	var b Batch
	b.Delete([]byte("000000"))
	b.Offset = 1000
	b.Mark("src/0", 77)
	must(t, s.Apply(0, &b))
	must(t, s.Close())

	s2, err := OpenPebble(dir, PebbleOptions{Cache: cache})
	must(t, err)
	defer s2.Close()
	wantPartitions(t, s2, 0, 1)
	wantOffset(t, s2, 0, 1000)
	wantOffset(t, s2, 1, 49)
	wantOffset(t, s2, 2, NoOffset)
	wantMarks(t, s2, 0, map[string]int64{"src/0": 77})
	wantGet(t, s2, 0, "000000", "", false)
	wantGet(t, s2, 0, "000001", string(val), true)
	wantGet(t, s2, 1, "049999", string(val), true)
	wantGet(t, s2, 2, "002000", "", false)
	for p, want := range map[int32]int{0: 17*1000 - 1, 1: 17 * 1000, 2: 0} {
		n := 0
		must(t, s2.Iterate(p, func(k, v []byte) error { n++; return nil }))
		if n != want {
			t.Errorf("partition %d has %d keys after reopen; want %d", p, n, want)
		}
	}

	// A second store on the same directory is refused while the first is open.
	if s3, err := OpenPebble(dir, PebbleOptions{}); err == nil {
		s3.Close()
		t.Fatal("second OpenPebble on a locked directory succeeded")
	}
}

// IterateFrom starts at the first key >= start, within the partition only.
func TestIterateFrom(t *testing.T) {
	forEach(t, func(t *testing.T, s Store) {
		sk, ok := s.(Seeker)
		if !ok {
			t.Fatalf("%T does not implement Seeker", s)
		}
		for p, ks := range map[int32][]string{6: {"zz"}, 7: {"b", "a", "ab", "", "\xff", "a\x00"}, 8: {"aa"}} {
			var b Batch
			for _, k := range ks {
				b.Put([]byte(k), []byte("v"+k))
			}
			must(t, s.Apply(p, &b))
		}
		for _, c := range []struct {
			start string
			want  []string
		}{
			{"", []string{"", "a", "a\x00", "ab", "b", "\xff"}},
			{"a", []string{"a", "a\x00", "ab", "b", "\xff"}},
			{"a\x01", []string{"ab", "b", "\xff"}},
			{"c", []string{"\xff"}},
			{"\xff\x00", nil},
		} {
			var keys []string
			must(t, sk.IterateFrom(7, []byte(c.start), func(k, v []byte) error {
				if string(v) != "v"+string(k) {
					t.Errorf("key %q has value %q", k, v)
				}
				keys = append(keys, string(k))
				return nil
			}))
			if !slices.Equal(keys, c.want) {
				t.Errorf("IterateFrom(7, %q) = %q; want %q", c.start, keys, c.want)
			}
		}
	})
}
