package stores

import (
	"bytes"
	"maps"
	"os"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// storeModel runs random operation sequences against Pebble and Memory (the
// model) and checks they answer every read alike. Reopen closes and reopens
// Pebble on the same directory, so durability across Close is part of the
// property. Failing sequences are shrunk and printed by rapid, with the seed
// to rerun them (-rapid.seed).
type storeModel struct {
	dir    string
	pebble *Pebble
	memory *Memory
}

var (
	modelParts = []int32{0, 1, 255, 256, 65536}
	// Short keys over a tiny alphabet so that puts, deletes and gets collide,
	// and keys are often prefixes of each other.
	modelKey   = rapid.SliceOfN(rapid.ByteRange('a', 'c'), 0, 3)
	modelValue = rapid.SliceOfN(rapid.Byte(), 0, 8)
	// Mark names include "" and names that are prefixes of each other.
	modelMark = rapid.SampledFrom([]string{"", "t/0", "t/1", "t/10", "u/0"})
)

func (m *storeModel) Apply(t *rapid.T) {
	p := rapid.SampledFrom(modelParts).Draw(t, "partition")
	b := &Batch{Offset: rapid.Int64Range(NoOffset, 1000).Draw(t, "offset")}
	for range rapid.IntRange(0, 6).Draw(t, "ops") {
		k := modelKey.Draw(t, "key")
		if rapid.Bool().Draw(t, "delete") {
			b.Delete(k)
		} else {
			b.Put(k, modelValue.Draw(t, "value"))
		}
	}
	for range rapid.IntRange(0, 3).Draw(t, "marks") {
		b.Mark(modelMark.Draw(t, "mark"), rapid.Int64Range(-2, 1000).Draw(t, "mark offset"))
	}
	if err := m.pebble.Apply(p, b); err != nil {
		t.Fatal(err)
	}
	if err := m.memory.Apply(p, b); err != nil {
		t.Fatal(err)
	}
}

func (m *storeModel) Drop(t *rapid.T) {
	p := rapid.SampledFrom(modelParts).Draw(t, "partition")
	if err := m.pebble.DropPartition(p); err != nil {
		t.Fatal(err)
	}
	if err := m.memory.DropPartition(p); err != nil {
		t.Fatal(err)
	}
}

func (m *storeModel) Get(t *rapid.T) {
	p := rapid.SampledFrom(modelParts).Draw(t, "partition")
	k := modelKey.Draw(t, "key")
	gv, gok, err := m.pebble.Get(p, k)
	if err != nil {
		t.Fatal(err)
	}
	wv, wok, err := m.memory.Get(p, k)
	if err != nil {
		t.Fatal(err)
	}
	if gok != wok || !bytes.Equal(gv, wv) {
		t.Fatalf("Get(%d, %q): pebble %q, %v; memory %q, %v", p, k, gv, gok, wv, wok)
	}
}

func (m *storeModel) Iterate(t *rapid.T) {
	p := rapid.SampledFrom(modelParts).Draw(t, "partition")
	collect := func(s Store) [][2]string {
		var out [][2]string
		if err := s.Iterate(p, func(k, v []byte) error {
			out = append(out, [2]string{string(k), string(v)})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got, want := collect(m.pebble), collect(m.memory); !slices.Equal(got, want) {
		t.Fatalf("Iterate(%d): pebble %q; memory %q", p, got, want)
	}
}

func (m *storeModel) Reopen(t *rapid.T) {
	if rapid.Bool().Draw(t, "sync first") {
		if err := m.pebble.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.pebble.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := OpenPebble(m.dir, PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.pebble = s
}

// Check runs after every action: partitions, offsets and marks agree.
func (m *storeModel) Check(t *rapid.T) {
	gp, err := m.pebble.Partitions()
	if err != nil {
		t.Fatal(err)
	}
	wp, err := m.memory.Partitions()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gp, wp) {
		t.Fatalf("Partitions: pebble %v; memory %v", gp, wp)
	}
	for _, p := range modelParts {
		go_, err := m.pebble.Offset(p)
		if err != nil {
			t.Fatal(err)
		}
		wo, err := m.memory.Offset(p)
		if err != nil {
			t.Fatal(err)
		}
		if go_ != wo {
			t.Fatalf("Offset(%d): pebble %d; memory %d", p, go_, wo)
		}
		gm, err := m.pebble.Marks(p)
		if err != nil {
			t.Fatal(err)
		}
		wm, err := m.memory.Marks(p)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(gm, wm) {
			t.Fatalf("Marks(%d): pebble %v; memory %v", p, gm, wm)
		}
	}
}

func TestPebbleMatchesMemory(t *testing.T) {
	base := t.TempDir()
	rapid.Check(t, func(t *rapid.T) {
		dir, err := os.MkdirTemp(base, "model")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		s, err := OpenPebble(dir, PebbleOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m := &storeModel{dir: dir, pebble: s, memory: NewMemory()}
		defer func() { _ = m.pebble.Close() }()
		t.Repeat(rapid.StateMachineActions(m))
	})
}
