package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/table"
)

type tableHost struct{}

func (tableHost) AppID() string           { return "app" }
func (tableHost) RegisterTable(table.Def) {}

// A failed write fails a timer's firing although its function returns nil,
// and the firing's later sends are refused (ErrEventFailed) and never reach
// the producer.
func TestFailedWriteFailsTheFiring(t *testing.T) {
	counts := table.New(tableHost{}, "counts", codec.String(), codec.DecimalInt64())
	out := &Topic[string, string]{name: "out", partitions: 1, kc: codec.String(), vc: codec.String()}
	sent := 0
	env := &table.Env{Send: func(string, int32, []byte, []byte, table.Acker) error { sent++; return nil }}
	var tryErr error
	tm := Timer{Interval: time.Second, Clock: WallClock, Fn: func(ctx context.Context, tk *Tick) error {
		counts.Put(tk, "k", 1) // no counts on this worker: ErrNotRunning fails the firing
		out.Send(tk, "k", "v")
		tryErr = out.TrySend(tk, "k", "v")
		return nil
	}}
	err := tm.Fire(context.Background(), 0, env, time.UnixMilli(0))
	if !errors.Is(err, table.ErrNotRunning) || !strings.Contains(err.Error(), "table counts") {
		t.Errorf("Fire = %v, want the Put's ErrNotRunning naming table counts", err)
	}
	if !errors.Is(tryErr, table.ErrEventFailed) || !errors.Is(tryErr, table.ErrNotRunning) {
		t.Errorf("TrySend after the failure = %v, want ErrEventFailed wrapping ErrNotRunning", tryErr)
	}
	if sent != 0 {
		t.Errorf("%d records sent after the firing failed", sent)
	}
}

// A firing whose function returns another error after a failed write fails
// with both, the write's first.
func TestFailedWriteJoinsTheReturnedError(t *testing.T) {
	counts := table.New(tableHost{}, "counts", codec.String(), codec.DecimalInt64())
	other := errors.New("later")
	tm := Timer{Interval: time.Second, Clock: WallClock, Fn: func(ctx context.Context, tk *Tick) error {
		counts.Delete(tk, "k")
		return other
	}}
	err := tm.Fire(context.Background(), 0, &table.Env{}, time.UnixMilli(0))
	if !errors.Is(err, table.ErrNotRunning) || !errors.Is(err, other) {
		t.Errorf("Fire = %v, want the Delete's error and the returned one", err)
	}
	if i, j := strings.Index(err.Error(), "table counts"), strings.Index(err.Error(), "later"); i < 0 || j < i {
		t.Errorf("Fire = %q: the write's error must come first", err)
	}
}

// An event no worker made has no run to fail: the Try… variants return
// ErrNotRunning, the short forms panic rather than drop the write.
func TestWriteWithHandMadeEvent(t *testing.T) {
	counts := table.New(tableHost{}, "counts", codec.String(), codec.DecimalInt64())
	ev := &Event[string, string]{Key: "k"}
	if err := counts.TryPut(ev, "k", 1); !errors.Is(err, table.ErrNotRunning) {
		t.Errorf("TryPut = %v, want ErrNotRunning", err)
	}
	defer func() {
		r := recover()
		if msg := fmt.Sprint(r); !strings.Contains(msg, "no worker made") || !strings.Contains(msg, "table counts") {
			t.Errorf("Put with a hand-made event: recovered %v, want a panic naming the table", r)
		}
	}()
	counts.Put(ev, "k", 1)
}

// Every write method that returns no error fails the firing with the write's
// error, naming the table or topic (here: no runtime for them on this worker).
func TestEveryShortFormFailsTheFiring(t *testing.T) {
	h := tableHost{}
	tb := table.New(h, "plain", codec.String(), codec.DecimalInt64())
	gt := table.NewGlobal(h, "global", codec.String(), codec.DecimalInt64())
	wt := table.NewWindowed(h, "windowed", codec.String(), codec.DecimalInt64(), table.Tumbling(time.Minute))
	out := &Topic[string, string]{name: "out", partitions: 1, kc: codec.String(), vc: codec.String()}
	inc := func(n int64) int64 { return n + 1 }
	keep := func(n int64, _ bool) (int64, bool) { return n + 1, true }
	for _, c := range []struct {
		name, names string
		write       func(tk *Tick)
	}{
		{"Table.Put", "table plain", func(tk *Tick) { tb.Put(tk, "k", 1) }},
		{"Table.Update", "table plain", func(tk *Tick) { tb.Update(tk, "k", inc) }},
		{"Table.Compute", "table plain", func(tk *Tick) { tb.Compute(tk, "k", keep) }},
		{"Table.Delete", "table plain", func(tk *Tick) { tb.Delete(tk, "k") }},
		{"GlobalTable.Put", "table global", func(tk *Tick) { gt.Put(tk, "k", 1) }},
		{"GlobalTable.Update", "table global", func(tk *Tick) { gt.Update(tk, "k", inc) }},
		{"GlobalTable.Compute", "table global", func(tk *Tick) { gt.Compute(tk, "k", keep) }},
		{"GlobalTable.Delete", "table global", func(tk *Tick) { gt.Delete(tk, "k") }},
		{"Windowed.Update", "table windowed", func(tk *Tick) { wt.Update(tk, "k", inc) }},
		{"Windowed.UpdateAt", "table windowed", func(tk *Tick) { wt.UpdateAt(tk, "k", tk.Time, inc) }},
		{"Topic.Send", "send to out", func(tk *Tick) { out.Send(tk, "k", "v") }},
	} {
		tm := Timer{Interval: time.Second, Clock: WallClock, Fn: func(ctx context.Context, tk *Tick) error {
			c.write(tk)
			return nil
		}}
		err := tm.Fire(context.Background(), 0, &table.Env{}, time.UnixMilli(0))
		if !errors.Is(err, table.ErrNotRunning) || !strings.Contains(err.Error(), c.names) {
			t.Errorf("%s: Fire = %v, want ErrNotRunning naming %q", c.name, err, c.names)
		}
	}
}
