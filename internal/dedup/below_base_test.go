package dedup

import "testing"

// Found by review: Encode's cache answered a point below baseAt with the base (the
// state at baseAt, later than the point). Latent: the app never asks below
// the last committed point.
func TestEncodeBelowBaseAt(t *testing.T) {
	f := NewFilter(0)
	f.Offer(Stamp{Topic: "in", Agent: "a", Run: 1, Base: 0, Offset: 5, Seq: 0})
	f.Seal(10)
	f.Commit(10) // baseAt 10, no deltas
	f.Offer(Stamp{Topic: "in", Agent: "a", Run: 1, Base: 0, Offset: 20, Seq: 1})
	f.Seal(30)
	if got := f.Encode(12, 2900); got == "" {
		t.Fatal("state at 12 empty")
	}
	if want := f.encode(8, 2900); want != "" {
		t.Fatalf("uncached state at 8 = %q, want empty", want)
	}
	if got := f.Encode(8, 2900); got != "" {
		t.Errorf("Encode(8) below baseAt 10 = %q (the cached state at 10), want \"\"", got)
	}
}

// Found by review: Rewind below baseAt kept the old base; a later Seal and Commit
// fold it into a base labelled at an earlier offset. Latent as above.
func TestRewindBelowBaseAt(t *testing.T) {
	f := NewFilter(0)
	k := Key{Topic: "in", Agent: "a"}
	for o := int64(0); o < 10; o++ {
		f.Offer(Stamp{Topic: "in", Agent: "a", Run: 1, Base: 0, Offset: o, Seq: uint32(o)})
	}
	f.Seal(10)
	f.Commit(10)
	f.Rewind(4) // below baseAt
	f.Offer(Stamp{Topic: "other", Agent: "a", Run: 2, Base: 0, Offset: 0, Seq: 0})
	f.Seal(6)
	f.Commit(6)
	g := Decode(f.Encode(6, 2900), 6)
	if e, ok := g.Entries()[k]; ok && e.HasMark && e.MarkOffset >= 6 {
		t.Errorf("state at 6 holds a mark at %d, from the state at 10", e.MarkOffset)
	}
}
