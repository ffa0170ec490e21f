package table_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// TestOwnedWrites: with OwnedWrites (the worker's tables), an active
// partition accepts writes only while a task owns it, one task at a time,
// and a reset in place (deactivate, activate) keeps the owner. A write that
// no task's cycle would cut must fail: it would wait in a cache no cycle
// flushes while its record's offset commits, a lost update.
func TestOwnedWrites(t *testing.T) {
	h := &host{}
	counts := table.New(h, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(nparts))
	s := table.NewState(counts, nparts, stores.NewMemory(), (&producer{}).send)
	s.OwnedWrites = true
	env := &table.Env{States: map[string]*table.State{"counts": s}}
	const p = 1
	ev := newEvent(&event{p: p, env: env})
	inc := func() error {
		_, err := counts.TryUpdate(ev, keyOf(p, 0), func(n int64) int64 { return n + 1 })
		return err
	}
	if err := inc(); !errors.Is(err, table.ErrNotActive) {
		t.Fatalf("write to an inactive partition: %v, want ErrNotActive", err)
	}
	if err := s.SetActive(p, true); err != nil {
		t.Fatal(err)
	}
	if err := inc(); !errors.Is(err, table.ErrNotOwned) || !errors.Is(err, table.ErrNotActive) {
		t.Fatalf("write to an active partition no task owns: %v, want ErrNotOwned (an ErrNotActive)", err)
	}
	if err := s.Own(p); err != nil {
		t.Fatal(err)
	}
	if err := s.Own(p); !errors.Is(err, table.ErrOwned) {
		t.Fatalf("a second owner: %v, want ErrOwned", err)
	}
	if err := inc(); err != nil {
		t.Fatalf("write by the owner: %v", err)
	}
	// A failed record's partition resets in place: its owner stays.
	if err := s.SetActive(p, false); err != nil {
		t.Fatal(err)
	}
	if err := s.SetActive(p, true); err != nil {
		t.Fatal(err)
	}
	if err := inc(); err != nil {
		t.Fatalf("write after a reset in place: %v", err)
	}
	if c := s.Cut(p); c == nil || c.Records() != 1 {
		t.Fatalf("the owner's cycle cuts %v, want 1 record", c)
	}
	s.Disown(p)
	if err := inc(); !errors.Is(err, table.ErrNotOwned) {
		t.Fatalf("write after the owner left: %v, want ErrNotActive", err)
	}
	// Without OwnedWrites (replay's scratch tables), an active partition is
	// writable as before.
	s.OwnedWrites = false
	if err := inc(); err != nil {
		t.Fatalf("write without OwnedWrites: %v", err)
	}
}

// TestWriteFromOtherPartitionCount: an event of a topic with another
// partition count than the table's may not write it, even when its key
// hashes to the event's partition in both counts (murmur2 mod 8 = p < 4
// implies mod 4 = p): the write would go to the cache of partition p of
// another task, whose cycles never commit the writer's offsets.
func TestWriteFromOtherPartitionCount(t *testing.T) {
	h := &host{}
	counts := table.New(h, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(nparts))
	s := table.NewState(counts, nparts, stores.NewMemory(), (&producer{}).send)
	const p = 1
	if err := s.SetActive(p, true); err != nil {
		t.Fatal(err)
	}
	key := keyOf(p, 0)
	for _, n := range []int32{0, nparts} {
		ev := newEvent(&event{p: p, env: &table.Env{States: map[string]*table.State{"counts": s}, Partitions: n}})
		if _, err := counts.TryUpdate(ev, key, func(v int64) int64 { return v + 1 }); err != nil {
			t.Fatalf("source with %d partitions (0: unchecked): %v", n, err)
		}
	}
	ev := newEvent(&event{p: p, env: &table.Env{States: map[string]*table.State{"counts": s}, Partitions: 2 * nparts}})
	if _, err := counts.TryUpdate(ev, key, func(v int64) int64 { return v + 1 }); !errors.Is(err, table.ErrNotCoPartitioned) {
		t.Fatalf("source with %d partitions writing a %d-partition table: %v, want ErrNotCoPartitioned", 2*nparts, nparts, err)
	}
}

// TestComputeWrites: Compute writes a value when fn keeps the key, a
// tombstone when it drops a present key, and nothing when it drops an absent
// one; fn sees whether the key exists.
func TestComputeWrites(t *testing.T) {
	h := &host{}
	counts := table.New(h, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(nparts))
	s := table.NewState(counts, nparts, stores.NewMemory(), (&producer{}).send)
	const p = 1
	if err := s.SetActive(p, true); err != nil {
		t.Fatal(err)
	}
	ev := newEvent(&event{p: p, env: &table.Env{States: map[string]*table.State{"counts": s}}})
	k, absent := keyOf(p, 0), keyOf(p, 1)
	var seen []bool
	compute := func(key string, keep bool) (int64, bool) {
		v, ok, err := counts.TryCompute(ev, key, func(n int64, found bool) (int64, bool) {
			seen = append(seen, found)
			return n + 1, keep
		})
		if err != nil {
			t.Fatal(err)
		}
		return v, ok
	}
	if v, ok := compute(k, true); v != 1 || !ok {
		t.Fatalf("first Compute = %d, %t; want 1, true", v, ok)
	}
	if v, ok := compute(k, true); v != 2 || !ok {
		t.Fatalf("second Compute = %d, %t; want 2, true", v, ok)
	}
	if c := s.Cut(p); c == nil || c.Records() != 1 {
		t.Fatalf("cut %v, want one record (the key's latest value)", c)
	}
	if v, ok := compute(absent, false); v != 0 || ok {
		t.Fatalf("drop of an absent key = %d, %t; want 0, false", v, ok)
	}
	if c := s.Cut(p); c != nil && c.Records() != 0 {
		t.Fatalf("dropping an absent key wrote %d records, want none", c.Records())
	}
	if v, ok := compute(k, false); v != 0 || ok {
		t.Fatalf("drop of a present key = %d, %t; want 0, false", v, ok)
	}
	if c := s.Cut(p); c == nil || c.Records() != 1 {
		t.Fatalf("cut %v, want one record (the tombstone)", c)
	}
	if _, found, err := counts.Get(ev, k); err != nil || found {
		t.Fatalf("Get after the drop: found %t, %v", found, err)
	}
	if want := []bool{false, true, false, true}; !slices.Equal(seen, want) {
		t.Fatalf("fn saw found = %v, want %v", seen, want)
	}
}
