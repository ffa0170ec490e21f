package table_test

import (
	"testing"

	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// TestCacheSize: a partition's write cache is measured as CacheBytes is
// compared with (key + value + 64 bytes per entry, one entry per key, an
// overwrite replacing the old value's bytes, a delete counting its key), the
// cycle being flushed is not counted, and a cut or a drop empties it. The
// worker's backpressure (task.Task.OverLimit) reads this measure: a count
// that only grew, or that missed overwrites, would hold the sources back for
// ever or let the cache grow past the limit.
func TestCacheSize(t *testing.T) {
	h := &host{}
	counts := table.New(h, "counts", codec.String(), codec.String(), table.Partitions(nparts))
	s := table.NewState(counts, nparts, stores.NewMemory(), (&producer{}).send)
	env := &table.Env{States: map[string]*table.State{"counts": s}}
	const p = 2
	ev := newEvent(&event{p: p, env: env})
	want := func(what string, entries, bytes int) {
		t.Helper()
		if e, b := s.CacheSize(p); e != entries || b != bytes {
			t.Fatalf("%s: CacheSize = %d entries, %d bytes; want %d, %d", what, e, b, entries, bytes)
		}
	}
	want("inactive partition", 0, 0)
	if err := s.SetActive(p, true); err != nil {
		t.Fatal(err)
	}
	k0, k1 := keyOf(p, 0), keyOf(p, 1)
	set := func(k, v string) {
		t.Helper()
		if err := counts.TryPut(ev, k, v); err != nil {
			t.Fatal(err)
		}
	}
	set(k0, "abc")
	want("one write", 1, len(k0)+3+64)
	set(k1, "x")
	want("two keys", 2, len(k0)+3+64+len(k1)+1+64)
	set(k0, "abcdefgh") // an overwrite replaces the old value's bytes
	want("overwrite", 2, len(k0)+8+64+len(k1)+1+64)
	if err := counts.TryDelete(ev, k1); err != nil {
		t.Fatal(err)
	}
	want("delete", 2, len(k0)+8+64+len(k1)+64)
	f := s.Cut(p)
	if f == nil || f.Records() != 2 {
		t.Fatalf("cut %v, want 2 records", f)
	}
	want("after the cut (the flushing cycle is not counted)", 0, 0)
	set(k1, "yy")
	want("a write after the cut", 1, len(k1)+2+64)
	f.Drop()
	s.Drop(p)
	want("after Drop", 0, 0)

	// A global table's replica measures its caches the same way.
	g := table.NewGlobal(h, "g", codec.String(), codec.String(), table.Partitions(nparts))
	gs, err := table.NewGlobalState(g, nparts, stores.NewMemory(), (&producer{}).send)
	if err != nil {
		t.Fatal(err)
	}
	defer g.AttachReplica(gs)()
	gev := newEvent(&event{p: p, env: &table.Env{Globals: map[string]*table.GlobalState{"g": gs}}})
	if e, b := gs.CacheSize(p); e != 0 || b != 0 {
		t.Fatalf("global, inactive: %d entries, %d bytes", e, b)
	}
	if err := gs.Activate(p); err != nil {
		t.Fatal(err)
	}
	if err := g.TryPut(gev, k0, "abc"); err != nil {
		t.Fatal(err)
	}
	if e, b := gs.CacheSize(p); e != 1 || b != len(k0)+3+64 {
		t.Fatalf("global, one write: %d entries, %d bytes; want 1, %d", e, b, len(k0)+3+64)
	}
	if gs.Cut(p) == nil {
		t.Fatal("global cut: nothing")
	}
	if e, b := gs.CacheSize(p); e != 0 || b != 0 {
		t.Fatalf("global, after the cut: %d entries, %d bytes", e, b)
	}
}
