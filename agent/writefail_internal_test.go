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
