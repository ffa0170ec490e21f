package table_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// countingStore counts Get calls.
type countingStore struct {
	stores.Store
	gets atomic.Int64
}

func (s *countingStore) Get(p int32, key []byte) ([]byte, bool, error) {
	s.gets.Add(1)
	return s.Store.Get(p, key)
}

// stampLog records each changelog record's key, value and before-image.
type stampLog struct{ recs map[string]string }

func (l *stampLog) send(_ string, _ int32, key, value []byte, hs []table.Header, done func(int64, error)) error {
	before := "?"
	for _, h := range hs {
		if string(h.Key) == changelog.HeaderStamp {
			st, err := changelog.ParseStamp(h.Value)
			if err != nil {
				return err
			}
			switch {
			case st.Before == nil:
				before = "absent"
			default:
				before = string(st.Before)
			}
		}
	}
	l.recs[string(key)] = string(value) + " before " + before
	done(int64(len(l.recs)), nil)
	return nil
}

// cycle cuts, flushes, applies and drops partition p's cycle.
func cycle(t *testing.T, s *table.State, p int32) {
	t.Helper()
	f := s.Cut(p)
	if f == nil {
		return
	}
	if err := f.Send(nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(); err != nil {
		t.Fatal(err)
	}
	f.Drop()
}

// A key updated in a cycle is read from the store once: the read that
// missed the caches is its before-image, and the flush does not read the
// store again (issue #28). The before-image stays the store's value before
// the cycle in every order of reads, writes and cycles: a read kept from
// before another write and cycle of the key is never used.
func TestBeforeImageReadOnce(t *testing.T) {
	h := &host{}
	counts := table.New(h, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(nparts))
	st := &countingStore{Store: stores.NewMemory()}
	log := &stampLog{recs: map[string]string{}}
	s := table.NewState(counts, nparts, st, log.send)
	const p = 1
	if err := s.SetActive(p, true); err != nil {
		t.Fatal(err)
	}
	ev := newEvent(&event{p: p, env: &table.Env{States: map[string]*table.State{"counts": s}}})
	k, k2 := keyOf(p, 0), keyOf(p, 1)
	inc := func(key string) {
		t.Helper()
		if _, err := counts.TryUpdate(ev, key, func(n int64) int64 { return n + 1 }); err != nil {
			t.Fatal(err)
		}
	}

	// Cycle 1: k absent; two updates read the store once (the second hits
	// the cache), the flush reads it no more.
	inc(k)
	inc(k)
	before := st.gets.Load()
	cycle(t, s, p)
	if got := st.gets.Load() - before; got != 0 {
		t.Errorf("the flush read the store %d times, want 0 (the update's read is the before-image)", got)
	}
	if got, want := log.recs[k], "2 before absent"; got != want {
		t.Errorf("cycle 1: %s = %q, want %q", k, got, want)
	}

	// Cycle 2: k is 2 in the store.
	inc(k)
	cycle(t, s, p)
	if got, want := log.recs[k], "3 before 2"; got != want {
		t.Errorf("cycle 2: %s = %q, want %q", k, got, want)
	}

	// A read of k2 that missed, then a blind write and a whole cycle of k2,
	// then another blind write of k2: that write's before-image is the
	// applied value, not the read from before the cycle.
	if _, _, err := counts.Get(ev, k2); err != nil { // miss: absent
		t.Fatal(err)
	}
	if err := counts.TryPut(ev, k2, 7); err != nil {
		t.Fatal(err)
	}
	cycle(t, s, p)
	if got, want := log.recs[k2], "7 before absent"; got != want {
		t.Errorf("cycle 3: %s = %q, want %q", k2, got, want)
	}
	if err := counts.TryPut(ev, k2, 8); err != nil {
		t.Fatal(err)
	}
	cycle(t, s, p)
	if got, want := log.recs[k2], "8 before 7"; got != want {
		t.Errorf("cycle 4: %s = %q, want %q (a read kept from before cycle 3 was used)", k2, got, want)
	}

	// A read that missed while k2 was being flushed is not kept either: the
	// key was cut into the flushing layer after the read's lookup.
	if _, _, err := counts.Get(ev, k); err != nil { // miss: 3 in the store
		t.Fatal(err)
	}
	if err := counts.TryPut(ev, k, 10); err != nil { // takes the read: before 3
		t.Fatal(err)
	}
	f := s.Cut(p)                                    // k flushing
	if err := counts.TryPut(ev, k, 11); err != nil { // k in the flushing layer: no before kept
		t.Fatal(err)
	}
	if err := f.Send(nil); err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := log.recs[k], "10 before 3"; got != want {
		t.Errorf("cycle 5: %s = %q, want %q", k, got, want)
	}
	if err := f.Apply(); err != nil {
		t.Fatal(err)
	}
	f.Drop()
	cycle(t, s, p)
	if got, want := log.recs[k], "11 before 10"; got != want {
		t.Errorf("cycle 6: %s = %q, want %q", k, got, want)
	}
}
