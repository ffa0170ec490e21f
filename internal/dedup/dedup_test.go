package dedup

import (
	"fmt"
	"hash/fnv"
	"testing"

	"pgregory.net/rapid"
)

func TestStampRoundTrip(t *testing.T) {
	s := Stamp{Topic: "app-change-events", Partition: 7, Agent: "split-by-dir", Offset: 123456789, Index: 3,
		Run: 0xdeadbeefcafe0001, Base: 123450000, Seq: 42}
	got, err := Parse(s.Append(nil))
	if err != nil || got != s {
		t.Fatalf("Parse(Append(%+v)) = %+v, %v", s, got, err)
	}
	for _, bad := range [][]byte{nil, {2}, s.Append(nil)[:12], append(s.Append(nil), 0)} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%x) accepted", bad)
		}
	}
}

// TestFilterSkipsARunAgain: a run processes offsets 10..19 (one send each),
// is killed, and the next run starts at the committed offset 12 and sends
// 12..24: its 12..19 are skipped, 20..24 kept, and the mark moves to the
// new run.
func TestFilterSkipsARunAgain(t *testing.T) {
	f := NewFilter(0)
	r1 := Stamp{Topic: "in", Agent: "a", Run: 1, Base: 10}
	for o := int64(10); o < 20; o++ {
		r1.Offset, r1.Seq = o, uint32(o-10)
		if f.Offer(r1) {
			t.Fatalf("first run's %d skipped", o)
		}
	}
	r2 := Stamp{Topic: "in", Agent: "a", Run: 2, Base: 12}
	var skipped []int64
	for o := int64(12); o < 25; o++ {
		r2.Offset, r2.Seq = o, uint32(o-12)
		if f.Offer(r2) {
			skipped = append(skipped, o)
		}
	}
	if fmt.Sprint(skipped) != "[12 13 14 15 16 17 18 19]" {
		t.Fatalf("skipped %v, want 12..19", skipped)
	}
	if e := f.Entries()[Key{Topic: "in", Agent: "a"}]; e.MarkRun != 2 || e.MarkOffset != 24 {
		t.Fatalf("mark %+v, want run 2 at 24", e)
	}
}

// TestFilterGapFreezesMark: a run whose record 15 never arrived (a failed
// send) does not move the mark past 14, so the next run's 15..19 are kept.
func TestFilterGapFreezesMark(t *testing.T) {
	f := NewFilter(0)
	r1 := Stamp{Topic: "in", Agent: "a", Run: 1, Base: 10}
	for o := int64(10); o < 20; o++ {
		r1.Offset, r1.Seq = o, uint32(o-10)
		if o == 15 {
			continue
		}
		f.Offer(r1)
	}
	r2 := Stamp{Topic: "in", Agent: "a", Run: 2, Base: 10}
	var kept []int64
	for o := int64(10); o < 20; o++ {
		r2.Offset, r2.Seq = o, uint32(o-10)
		if !f.Offer(r2) {
			kept = append(kept, o)
		}
	}
	if fmt.Sprint(kept) != "[15 16 17 18 19]" {
		t.Fatalf("kept %v, want 15..19", kept)
	}
}

// TestFilterResetBelowRun: a run that starts below the mark's run (offsets
// reset by hand) is kept whole.
func TestFilterResetBelowRun(t *testing.T) {
	f := NewFilter(0)
	r1 := Stamp{Topic: "in", Agent: "a", Run: 1, Base: 100}
	for o := int64(100); o < 110; o++ {
		r1.Offset, r1.Seq = o, uint32(o-100)
		f.Offer(r1)
	}
	r2 := Stamp{Topic: "in", Agent: "a", Run: 2, Base: 0}
	for o := int64(0); o < 110; o++ {
		r2.Offset, r2.Seq = o, uint32(o)
		if f.Offer(r2) {
			t.Fatalf("record %d of a run starting below the mark's was skipped", o)
		}
	}
}

func TestEncodeDecode(t *testing.T) {
	f := NewFilter(0)
	for p := int32(0); p < 8; p++ {
		f.Offer(Stamp{Topic: "in", Partition: p, Agent: "a", Run: uint64(p + 1), Base: 5, Offset: 9, Index: 1, Seq: 0})
	}
	// A key whose mark is of an earlier run than the one read last.
	f.Offer(Stamp{Topic: "in", Partition: 9, Agent: "b", Run: 11, Base: 0, Offset: 3, Seq: 0})
	f.Offer(Stamp{Topic: "in", Partition: 9, Agent: "b", Run: 12, Base: 2, Offset: 4, Seq: 5})
	f.Seal(100)
	if e := f.Entries()[Key{Topic: "in", Partition: 9, Agent: "b"}]; e.MarkRun != 11 || e.Run != 12 || e.Whole {
		t.Fatalf("entry %+v, want the mark of run 11 and run 12 read last with a gap", e)
	}
	g := Decode(f.Encode(100, 2048), 100)
	if fmt.Sprint(g.Entries()) != fmt.Sprint(f.Entries()) {
		t.Fatalf("decoded %v\nwant %v", g.Entries(), f.Entries())
	}
	if s := f.Encode(100, 100); len(s) > 100 {
		t.Fatalf("Encode(max 100) wrote %d bytes", len(s))
	}
	if n := len(Decode(f.Encode(100, 100), 100).Entries()); n == 0 || n == 9 {
		t.Fatalf("Encode(max 100) kept %d of 9 entries", n)
	}
	if len(Decode("runnel-src:!!", 0).Entries()) != 0 || len(Decode("other", 0).Entries()) != 0 {
		t.Fatal("Decode of foreign metadata is not empty")
	}
}

// TestNoLossProperty runs a deterministic agent over one source partition in
// runs: each starts at the committed offset (which only moves forward, and
// only past records whose sends all landed), processes some records, has
// any of its sends fail (a failed send and everything after it may or may
// not land) and its agent fail a record part-way and go on (the sender then
// leaves a gap at its next send to each partition); a killed run's last
// sends may land after the next run's first ones. A reader per repartition partition offers what landed, commits at
// random points, inside a batch too (a seek back to a failed record, a
// mark at the watermark), crashes back to its last commit (state decoded
// from the encoded metadata, counts rolled back) and rewinds to any point
// since the last commit (the filter then falls back to an earlier seal). At
// the end a last run processes everything without failure and the readers
// read all:
// every (offset, index) the agent sends is counted at least once, and with
// no failed sends, no interleaved runs and no reader crash, exactly once.
func TestNoLossProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const parts = 3
		n := rapid.IntRange(1, 60).Draw(t, "records")
		sends := func(o int64) int { return int(hash(o, -1) % 3) }
		dest := func(o int64, i int) int { return int(hash(o, int64(i)) % parts) }
		type rec struct {
			s Stamp
			o int64
			i int
		}
		logs := make([][]rec, parts)
		committed := int64(0)
		failures := false
		runs := rapid.IntRange(0, 6).Draw(t, "runs")
		var zombie [parts][]rec // a killed run's sends still in flight
		for r := 0; r <= runs; r++ {
			last := r == runs
			run := uint64(r + 1)
			base := committed
			stop := int64(n)
			if !last {
				stop = base + int64(rapid.IntRange(0, n).Draw(t, "stop"))
				stop = min(stop, int64(n))
			}
			seq := [parts]uint32{}
			gap := [parts]bool{}
			var out [parts][]rec
			firstFail := int64(-1)
			for o := base; o < stop; o++ {
				// The agent fails o part-way and goes on with the next
				// records (restarted on the same subscription): the sender
				// leaves a gap at its next send to every partition.
				partial := sends(o)
				if !last && rapid.IntRange(0, 9).Draw(t, "agent fails") == 0 {
					partial = rapid.IntRange(0, sends(o)).Draw(t, "sent before failing")
					failures = true
					if firstFail < 0 {
						firstFail = o
					}
				}
				for i := range partial {
					p := dest(o, i)
					if gap[p] {
						seq[p]++
						gap[p] = false
					}
					s := Stamp{Topic: "in", Agent: "a", Offset: o, Index: uint32(i), Run: run, Base: base, Seq: seq[p]}
					seq[p]++
					landed := true
					if !last && rapid.IntRange(0, 9).Draw(t, "fail") == 0 {
						landed = false
						failures = true
						if firstFail < 0 {
							firstFail = o
						}
					}
					if landed {
						out[p] = append(out[p], rec{s: s, o: o, i: i})
					}
				}
				if partial < sends(o) {
					gap = [parts]bool{true, true, true}
				}
			}
			for p := range parts {
				// Interleave the previous run's in-flight tail with this run's sends.
				z, cur := zombie[p], out[p]
				for len(z) > 0 || len(cur) > 0 {
					if len(cur) == 0 || len(z) > 0 && rapid.Bool().Draw(t, "zombie first") {
						logs[p] = append(logs[p], z[0])
						z = z[1:]
					} else {
						logs[p] = append(logs[p], cur[0])
						cur = cur[1:]
					}
				}
				zombie[p] = nil
			}
			// Commit: only past records whose sends all landed.
			c := stop
			if firstFail >= 0 {
				c = firstFail
			}
			if !last && rapid.Bool().Draw(t, "commit") {
				c = base + int64(rapid.IntRange(0, int(c-base)).Draw(t, "commit at"))
			}
			if c > committed && (last || rapid.Bool().Draw(t, "committed")) {
				committed = c
			}
			if !last && rapid.Bool().Draw(t, "zombie") {
				failures = true // interleaved runs may count a record twice
				// The run is not dead yet: a few more of its sends land later.
				for o := stop; o < min(stop+3, int64(n)); o++ {
					for i := range sends(o) {
						p := dest(o, i)
						if gap[p] {
							seq[p]++
							gap[p] = false
						}
						zombie[p] = append(zombie[p], rec{s: Stamp{Topic: "in", Agent: "a", Offset: o, Index: uint32(i), Run: run, Base: base, Seq: seq[p]}, o: o, i: i})
						seq[p]++
					}
				}
			}
		}
		crashes := false
		for p := range parts {
			log := logs[p]
			f := NewFilter(0)
			var counts map[[2]int64]int
			commitAt, commitMeta := 0, ""
			commitCounts := map[[2]int64]int{}
			pos := 0
			kept := make([]bool, len(log)) // decision of each position read in this timeline
			countsAt := func(q int) map[[2]int64]int {
				c := clone(commitCounts)
				for j := commitAt; j < q; j++ {
					if kept[j] {
						c[[2]int64{log[j].o, int64(log[j].i)}]++
					}
				}
				return c
			}
			for pos < len(log) {
				end := min(pos+rapid.IntRange(1, 4).Draw(t, "batch"), len(log))
				for j, r := range log[pos:end] {
					kept[pos+j] = !f.Offer(r.s)
				}
				f.Seal(int64(end))
				pos = end
				// A point at or after the last commit, possibly inside a batch.
				q := commitAt + rapid.IntRange(0, pos-commitAt).Draw(t, "point")
				switch rapid.IntRange(0, 5).Draw(t, "reader") {
				case 0: // commit at q (a record below q all resolved)
					commitCounts = countsAt(q)
					commitMeta = f.Encode(int64(q), 4096)
					f.Commit(int64(q))
					commitAt = q
				case 1: // crash: back to the last commit
					crashes = true
					f = Decode(commitMeta, int64(commitAt))
					pos = commitAt
				case 2: // a failed record at q: rewind there, read again from q
					crashes = true
					f.Rewind(int64(q))
					pos = q
				}
			}
			counts = countsAt(len(log))
			for o := range int64(n) {
				for i := range sends(o) {
					if dest(o, i) != p {
						continue
					}
					got := counts[[2]int64{o, int64(i)}]
					if got == 0 {
						t.Fatalf("partition %d: record (%d, %d) lost\nlog %v", p, o, i, log)
					}
					if got > 1 && !failures && !crashes {
						// Without them every resend comes from a run that started
						// at or after the mark's run (runs start at committed
						// offsets) and lies at or below its mark.
						t.Fatalf("partition %d: record (%d, %d) counted %d times without failures", p, o, i, got)
					}
				}
			}
		}
	})
}

func clone(m map[[2]int64]int) map[[2]int64]int {
	c := make(map[[2]int64]int, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func hash(o, i int64) uint32 {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d", o, i)
	return h.Sum32()
}

// BenchmarkOfferHeader is the reader's cost per stamped record (parse and
// offer; the names interned).
func BenchmarkOfferHeader(b *testing.B) {
	f := NewFilter(0)
	hs := make([][]byte, 8)
	for p := range hs {
		hs[p] = Stamp{Topic: "app-change-events", Partition: int32(p), Agent: "split-by-dir", Offset: 1 << 20, Run: 7, Base: 1 << 19}.Append(nil)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f.OfferHeader(hs[i%len(hs)])
		if i%256 == 255 {
			f.Seal(int64(i + 1))
			f.Commit(int64(i + 1))
		}
	}
}
