package table

import (
	"bytes"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestStartsContainingProperty checks the window arithmetic against the
// definition: a window [s, s+size) with s = offset + n·advance contains t
// exactly when s <= t < s+size; the result lists all of them, ascending.
func TestStartsContainingProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		adv := rapid.Int64Range(1, 50).Draw(rt, "advance")
		size := adv * rapid.Int64Range(1, 5).Draw(rt, "mult")
		if rapid.Bool().Draw(rt, "ragged") {
			size += rapid.Int64Range(0, adv-1).Draw(rt, "extra") // size not a multiple of advance
		}
		off := rapid.Int64Range(-100, 100).Draw(rt, "offset")
		ts := rapid.Int64Range(-1000, 1000).Draw(rt, "t")
		ws := Hopping(time.Duration(size)*time.Millisecond, time.Duration(adv)*time.Millisecond).WithOffset(time.Duration(off) * time.Millisecond)
		if err := ws.validate(); err != nil {
			rt.Fatal(err)
		}
		var want []int64
		for s := ts - size - 2*adv; s <= ts+adv; s++ {
			if (s-off)%adv == 0 && s <= ts && ts < s+size {
				want = append(want, s)
			}
		}
		got := ws.startsContaining(ts)
		if len(got) != len(want) {
			rt.Fatalf("starts containing %d (size %d, advance %d, offset %d) = %v, want %v", ts, size, adv, off, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				rt.Fatalf("starts containing %d = %v, want %v", ts, got, want)
			}
		}
		if first := ws.startAtOrAfter(ts); first < ts || first-adv >= ts || (first-off)%adv != 0 {
			rt.Fatalf("startAtOrAfter(%d) = %d", ts, first)
		}
	})
}

func TestISOWeekAlignment(t *testing.T) {
	week := Tumbling(7 * 24 * time.Hour).WithOffset(4 * 24 * time.Hour)
	for _, s := range []string{"2005-04-07T15:13:13-07:00", "2024-12-30T00:00:00Z", "2024-12-29T23:59:59.999Z", "1969-12-31T12:00:00Z"} {
		ts, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		ws := week.Containing(ts)
		if len(ws) != 1 {
			t.Fatalf("%s: %d windows", s, len(ws))
		}
		u := ts.UTC()
		monday := time.Date(u.Year(), u.Month(), u.Day()-(int(u.Weekday())+6)%7, 0, 0, 0, 0, time.UTC)
		if !ws[0].Start.Equal(monday) || !ws[0].End.Equal(monday.AddDate(0, 0, 7)) {
			t.Fatalf("%s: window %v, want the ISO week from %v", s, ws[0], monday)
		}
	}
}

// TestWindowKeyOrder checks that a key's stored windows sort by start, also
// across negative (pre-1970) starts, and that keys decode back.
func TestWindowKeyOrder(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		kb := rapid.SliceOf(rapid.Byte()).Draw(rt, "key")
		a := rapid.Int64().Draw(rt, "a")
		b := rapid.Int64().Draw(rt, "b")
		ka, kb2 := windowKey(kb, a), windowKey(kb, b)
		if c := bytes.Compare(ka, kb2); (c < 0) != (a < b) || (c == 0) != (a == b) {
			rt.Fatalf("order of starts %d, %d: bytes compare %d", a, b, c)
		}
		gk, gs, ok := decodeWindowKey(ka)
		if !ok || !bytes.Equal(gk, kb) || gs != a {
			rt.Fatalf("decode(%x) = %x %d %v", ka, gk, gs, ok)
		}
		if _, ok := decodeMetaKey(ka); ok {
			rt.Fatalf("window key %x decodes as a watermark key", ka)
		}
	})
}

func TestWindowsValidate(t *testing.T) {
	for _, ws := range []Windows{Tumbling(0), Hopping(time.Minute, 2*time.Minute), Tumbling(time.Microsecond), Tumbling(time.Minute).WithOffset(time.Microsecond)} {
		if ws.validate() == nil {
			t.Errorf("%+v validated", ws)
		}
	}
}
