package agent_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/runneltest"
	"github.com/runnel-dev/runnel/table"
)

// refusing is a string codec whose Encode refuses the value "poison" while
// refuse says so (a value codec that fails on one value).
type refusing struct {
	refuse  func() bool
	refused atomic.Int32
}

var errPoison = errors.New("value refused")

func (c *refusing) Encode(v string) ([]byte, error) {
	if v == "poison" && c.refuse() {
		c.refused.Add(1)
		return nil, errPoison
	}
	return []byte(v), nil
}
func (c *refusing) Decode(b []byte) (string, error) { return string(b), nil }
func (c *refusing) Name() string                    { return "refusing" }

// keyIn returns a key of partition p of a topic with parts partitions.
func keyIn(prefix string, p, parts int32) string {
	for i := 0; ; i++ {
		if k := fmt.Sprintf("%s%d", prefix, i); kafka.PartitionFor([]byte(k), parts) == p {
			return k
		}
	}
}

// writeApp stores each record's value in last (whose codec refuses
// "poison"), counts it in counts and sends it to out, all with the short
// forms; a record "stale" writes with the previous event instead (outside
// its window). Its agent ignores s.Err() and returns nil: a failed write must
// fail the run anyway.
type writeApp struct {
	app    *app.App
	in     *agent.Topic[string, string]
	out    *agent.Topic[string, string]
	last   *table.Table[string, string]
	counts *table.Table[string, int64]
	codec  *refusing

	runs       atomic.Int32 // agent function calls
	afterFail  atomic.Int32 // events yielded while s.Err() was set
	noPrevious atomic.Int32 // "stale" first in its run (the scenario is broken)
	mu         sync.Mutex
	errs       []error // s.Err() of every run a write failed
}

func newWriteApp(id string, policy agent.ErrorPolicy, refuse func() bool) *writeApp {
	w := &writeApp{app: app.New(id), codec: &refusing{refuse: refuse}}
	w.in = app.Topic(w.app, "in", codec.String(), codec.String(), app.Partitions(2))
	w.out = app.Topic(w.app, "out", codec.String(), codec.String(), app.Partitions(2))
	w.last = table.New(w.app, "last", codec.String(), codec.Codec[string](w.codec))
	w.counts = table.New(w.app, "counts", codec.String(), codec.DecimalInt64())
	agent.New(w.app, "write", w.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		w.runs.Add(1)
		var prev, cur *agent.Event[string, string]
		for ev := range s.Events() {
			cur = ev
			if s.Err() != nil {
				w.afterFail.Add(1)
			}
			if ev.Value == "stale" {
				if prev == nil {
					w.noPrevious.Add(1)
					continue
				}
				w.last.Put(prev, prev.Key, "stale-write") // ErrOutsideWindow: fails this event
				continue
			}
			w.last.Put(ev, ev.Key, ev.Value)
			w.counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 }) // refused after a failed Put
			w.out.Send(ev, ev.Key, ev.Value)                                  // likewise
			prev = ev
		}
		// A write failure leaves the event the agent is on open (the
		// worker resolves it by the error policy); a stream that failed
		// (the restart of a partition after a failed record) leaves none.
		if err := s.Err(); err != nil && cur != nil && cur.InWindow() {
			w.mu.Lock()
			w.errs = append(w.errs, err)
			w.mu.Unlock()
		}
		return nil
	}, agent.OnError(policy), agent.WritesTo(w.last, w.counts), agent.SendsTo(w.out))
	return w
}

func (w *writeApp) runErrs() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.errs)
}

func sendAll(t *testing.T, d *runneltest.Driver, topic *agent.Topic[string, string], kvs ...string) map[string][2]int64 {
	t.Helper()
	at := map[string][2]int64{} // value -> partition, offset
	for i := 0; i < len(kvs); i += 2 {
		p, off, err := runneltest.Send(d, topic, kvs[i], kvs[i+1])
		if err != nil {
			t.Fatal(err)
		}
		at[kvs[i+1]] = [2]int64{int64(p), off}
	}
	return at
}

func startDriver(t *testing.T, a *app.App) *runneltest.Driver {
	t.Helper()
	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return d
}

func wantTable(t *testing.T, d *runneltest.Driver, def table.Def, want map[string]any) {
	t.Helper()
	got, err := d.Table(def)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("table %s = %v, want %v", def.Name(), got, want)
	}
}

// Under DeadLetter, a Put the value codec refuses and a Put with the
// previous event (outside its window) each fail their record although the
// agent returns nil: the stream ends there, s.Err() names the table and the
// key, the record is dead-lettered with that reason, and the event's later
// writes and sends are refused, so the tables and the sink hold exactly the
// other records.
func TestFailedWriteDeadLettersTheRecord(t *testing.T) {
	w := newWriteApp("writefail-dl", agent.DeadLetter, func() bool { return true })
	d := startDriver(t, w.app)
	a, b := keyIn("a", 0, 2), keyIn("b", 1, 2)
	at := sendAll(t, d, w.in, a, "a1", a, "a2", a, "poison", a, "a3", b, "b1", b, "b2", b, "stale", b, "b3", a, "a4")

	wantTable(t, d, w.counts, map[string]any{a: int64(4), b: int64(3)})
	wantTable(t, d, w.last, map[string]any{a: "a4", b: "b3"})
	recs, err := runneltest.Records(d, w.out)
	if err != nil {
		t.Fatal(err)
	}
	var sent []string
	for _, r := range recs {
		sent = append(sent, r.Value)
	}
	if fmt.Sprint(sent) != "[a1 a2 a3 a4 b1 b2 b3]" {
		t.Errorf("sink records %v, want a1..a4 and b1..b3 once each", sent)
	}
	dls, err := d.DeadLetters("write")
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want 2 (poison, stale): %+v", len(dls), dls)
	}
	for _, dl := range dls {
		want, reason := at["poison"], fmt.Sprintf("table last: encode value (key %s): %v", a, errPoison)
		if string(dl.Key) == b {
			want, reason = at["stale"], table.ErrOutsideWindow.Error()
		}
		if int64(dl.Partition) != want[0] || dl.Offset != want[1] || !strings.Contains(dl.Reason, reason) {
			t.Errorf("dead letter %s at [%d]@%d, reason %q; want [%d]@%d, reason with %q", dl.Key, dl.Partition, dl.Offset, dl.Reason, want[0], want[1], reason)
		}
	}
	errs := w.runErrs()
	if len(errs) != 2 {
		t.Fatalf("runs ended on %d errors, want 2: %v", len(errs), errs)
	}
	var codecErr, windowErr int
	for _, err := range errs {
		switch {
		case errors.Is(err, errPoison) && strings.Contains(err.Error(), "(key "+a+")"):
			codecErr++
		case errors.Is(err, table.ErrOutsideWindow) && strings.Contains(err.Error(), "table last"):
			windowErr++
		}
	}
	if codecErr != 1 || windowErr != 1 {
		t.Errorf("s.Err() of the failed runs: %v; want the codec's (naming key %s) and ErrOutsideWindow once each", errs, a)
	}
	if n := w.afterFail.Load(); n != 0 {
		t.Errorf("%d events yielded after a write failed", n)
	}
	if n := w.noPrevious.Load(); n != 0 {
		t.Fatalf("the stale record came first in its run %d times: the scenario did not run", n)
	}
	if n := w.runs.Load(); n < 4 {
		t.Errorf("agent ran %d times, want 2 partitions + 2 restarts after the failures at least", n)
	}
}

// Under Restart, a Put that fails once fails its record although the agent
// returns nil: the partition goes back to its last commit point and the
// record is processed again, so the tables count every record exactly once
// and no record is dead-lettered.
func TestFailedWriteRedeliversTheRecord(t *testing.T) {
	var once atomic.Bool
	w := newWriteApp("writefail-restart", agent.Restart, func() bool { return once.CompareAndSwap(false, true) })
	d := startDriver(t, w.app)
	a, b := keyIn("a", 0, 2), keyIn("b", 1, 2)
	sendAll(t, d, w.in, a, "a1", b, "b1", a, "a2", a, "poison", a, "a3", b, "b2", a, "a4")

	wantTable(t, d, w.counts, map[string]any{a: int64(5), b: int64(2)})
	wantTable(t, d, w.last, map[string]any{a: "a4", b: "b2"})
	if dls, err := d.DeadLetters("write"); err != nil || len(dls) != 0 {
		t.Errorf("dead letters %+v, %v; want none", dls, err)
	}
	if n := w.codec.refused.Load(); n != 1 {
		t.Errorf("codec refused %d values, want 1", n)
	}
	errs := w.runErrs()
	if len(errs) != 1 || !errors.Is(errs[0], errPoison) || !strings.Contains(errs[0].Error(), "table last") {
		t.Errorf("s.Err() of the failed runs: %v; want the codec's error once, naming table last", errs)
	}
	if n := w.afterFail.Load(); n != 0 {
		t.Errorf("%d events yielded after a write failed", n)
	}
	// The records sent after the last commit point are sent again
	// (at-least-once), the failed one's included: each value at least once.
	recs, err := runneltest.Records(d, w.out)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		seen[r.Value] = true
	}
	for _, v := range []string{"a1", "a2", "poison", "a3", "a4", "b1", "b2"} {
		if !seen[v] {
			t.Errorf("sink lacks %s: %v", v, recs)
		}
	}
}

// TryPut returns the error and leaves the event alone: the stream goes on,
// s.Err() stays nil, the event's other writes are made, and nothing is
// redelivered or dead-lettered.
func TestTryPutReturnsTheErrorAndTheStreamGoesOn(t *testing.T) {
	a := app.New("writefail-try")
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(2))
	rc := &refusing{refuse: func() bool { return true }}
	last := table.New(a, "last", codec.String(), codec.Codec[string](rc))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	var runs, afterTry, errSet atomic.Int32
	var mu sync.Mutex
	var tryErrs []error
	agent.New(a, "write", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		runs.Add(1)
		failed := false
		for ev := range s.Events() {
			if failed {
				afterTry.Add(1)
			}
			if err := last.TryPut(ev, ev.Key, ev.Value); err != nil {
				failed = true
				mu.Lock()
				tryErrs = append(tryErrs, err)
				mu.Unlock()
			}
			if s.Err() != nil {
				errSet.Add(1)
			}
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.OnError(agent.DeadLetter), agent.WritesTo(last, counts))
	d := startDriver(t, a)
	k := keyIn("a", 0, 2)
	sendAll(t, d, in, k, "a1", k, "poison", k, "a2", k, "a3")

	wantTable(t, d, counts, map[string]any{k: int64(4)})
	wantTable(t, d, last, map[string]any{k: "a3"})
	if dls, err := d.DeadLetters("write"); err != nil || len(dls) != 0 {
		t.Errorf("dead letters %+v, %v; want none", dls, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tryErrs) != 1 || !errors.Is(tryErrs[0], errPoison) || !strings.Contains(tryErrs[0].Error(), "(key "+k+")") {
		t.Errorf("TryPut errors %v, want the codec's once, naming key %s", tryErrs, k)
	}
	if n := afterTry.Load(); n != 2 {
		t.Errorf("%d events after the failed TryPut, want 2 (a2, a3)", n)
	}
	if n := errSet.Load(); n != 0 {
		t.Errorf("s.Err() set %d times after a TryPut", n)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("agent ran %d times, want 2 (one per partition, no restart)", n)
	}
}
