package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// transitions records the "task state" log lines of the workers of a test:
// per worker name and task, the sequence of states entered.
type transitions struct {
	slog.Handler
	mu  *sync.Mutex
	seq map[string][]string // "worker task" -> states entered, "created" first
}

func newTransitions() *transitions {
	return &transitions{Handler: testLogger().Handler(), mu: &sync.Mutex{}, seq: map[string][]string{}}
}

func (r *transitions) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Message == "task state" {
		var worker, task, from, to string
		rec.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "worker":
				worker = a.Value.String()
			case "task":
				task = a.Value.String()
			case "from":
				from = a.Value.String()
			case "to":
				to = a.Value.String()
			}
			return true
		})
		r.mu.Lock()
		k := worker + " " + task
		if len(r.seq[k]) == 0 || r.seq[k][len(r.seq[k])-1] != from {
			r.seq[k] = append(r.seq[k], from) // created, or a gap the next check shows
		}
		r.seq[k] = append(r.seq[k], to)
		r.mu.Unlock()
	}
	return r.Handler.Handle(ctx, rec)
}

func (r *transitions) WithAttrs(as []slog.Attr) slog.Handler {
	// The worker's attribute (its name) comes with every line: keep it.
	return &attrTransitions{transitions: r, attrs: as}
}

// attrTransitions is transitions with attributes added by Logger.With.
type attrTransitions struct {
	*transitions
	attrs []slog.Attr
}

func (a *attrTransitions) Handle(ctx context.Context, rec slog.Record) error {
	rec = rec.Clone()
	rec.AddAttrs(a.attrs...)
	return a.transitions.Handle(ctx, rec)
}

func (a *attrTransitions) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrTransitions{transitions: a.transitions, attrs: append(slices.Clone(a.attrs), as...)}
}

// of returns the states task p/parts of worker went through, joined by " ".
func (r *transitions) of(worker string, p int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.seq[fmt.Sprintf("%s %d/%d", worker, p, parts)], " ")
}

// TestTaskLifecycleHandOver asserts the sequence of states each task goes
// through on each worker while the partitions of a stateful app move: w0
// alone restores and runs all four tasks; w1 joins and takes two (w0 gives
// each up with a final cycle and follows it as a standby; w1 restores, or
// promotes its warm-up, and runs it, and follows the other two as standbys);
// w1 stops and w0 promotes its standbys back to running. Every line is a
// transition of internal/task's table (TestMain fails otherwise) and
// /api/status shows the same states.
func TestTaskLifecycleHandOver(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "lifecycle")
	rec := newTransitions()
	o0 := newOpsApp(t, id, app.WithLogger(slog.New(rec)))
	o1 := newOpsApp(t, id, app.WithLogger(slog.New(rec)))
	start := func(o *opsApp, name string) (*app.Worker, context.CancelFunc, chan error) {
		w, err := o.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir(), Name: name})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		return w, cancel, done
	}
	states := func(w *app.Worker) map[int32]string {
		m := map[int32]string{}
		for _, tk := range w.Tasks() {
			m[tk.Partition] = tk.State
		}
		return m
	}
	all := func(w *app.Worker, want map[int32]string) func() bool {
		return func() bool { return fmt.Sprint(states(w)) == fmt.Sprint(want) }
	}

	w0, stop0, done0 := start(o0, "w0")
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), o0.words.Name())
	var recs []kv
	for i := range 40 {
		recs = append(recs, kv{fmt.Sprintf("k%d", i), "v"})
	}
	send(t, brokers, o0.words.Name(), recs...)
	testbroker.WaitLag0(t, brokers, id, o0.words.Name())
	testbroker.Eventually(t, 30*time.Second, "w0 runs every task",
		all(w0, map[int32]string{0: app.TaskRunning, 1: app.TaskRunning, 2: app.TaskRunning, 3: app.TaskRunning}))
	for p := range parts {
		if got := rec.of("w0", p); got != "created restoring running" {
			t.Errorf("w0 task %d/%d: %q, want created restoring running", p, parts, got)
		}
	}

	w1, stop1, done1 := start(o1, "w1")
	var moved, kept []int
	testbroker.Eventually(t, 60*time.Second, "the tasks split between w0 and w1, each following the other's", func() bool {
		s0, s1 := states(w0), states(w1)
		moved, kept = nil, nil
		for p := range int32(parts) {
			switch {
			case s0[p] == app.TaskRunning && s1[p] == app.TaskStandby:
				kept = append(kept, int(p))
			case s1[p] == app.TaskRunning && s0[p] == app.TaskStandby:
				moved = append(moved, int(p))
			default:
				return false
			}
		}
		return len(moved) == parts/2
	})
	for _, p := range moved {
		// w0 gives the task up with a final cycle, then follows it.
		if got, want := rec.of("w0", p), "created restoring running suspending closed created standby"; got != want {
			t.Errorf("w0 task %d/%d (moved to w1): %q, want %q", p, parts, got, want)
		}
		// w1 restores it, directly or by promoting the warm-up it followed.
		got := rec.of("w1", p)
		if got != "created restoring running" && got != "created standby restoring running" {
			t.Errorf("w1 task %d/%d: %q, want created [standby] restoring running", p, parts, got)
		}
	}
	for _, p := range kept {
		if got, want := rec.of("w0", p), "created restoring running"; got != want {
			t.Errorf("w0 task %d/%d (kept): %q, want %q", p, parts, got, want)
		}
		if got, want := rec.of("w1", p), "created standby"; got != want {
			t.Errorf("w1 task %d/%d (standby): %q, want %q", p, parts, got, want)
		}
	}

	// Stop w1 alone: w0 promotes its standbys.
	stop1()
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	testbroker.Eventually(t, 60*time.Second, "w0 runs every task again",
		all(w0, map[int32]string{0: app.TaskRunning, 1: app.TaskRunning, 2: app.TaskRunning, 3: app.TaskRunning}))
	for _, p := range moved {
		if got, want := rec.of("w0", p), "created restoring running suspending closed created standby restoring running"; got != want {
			t.Errorf("w0 task %d/%d (back from w1): %q, want %q", p, parts, got, want)
		}
		if got := rec.of("w1", p); !strings.HasSuffix(got, "restoring running suspending closed") {
			t.Errorf("w1 task %d/%d (stopped): %q, want … restoring running suspending closed", p, parts, got)
		}
	}
	for _, p := range kept {
		if got, want := rec.of("w1", p), "created standby closed"; got != want {
			t.Errorf("w1 task %d/%d (standby, stopped): %q, want %q", p, parts, got, want)
		}
	}
	stop0()
	if err := <-done0; err != nil {
		t.Fatal(err)
	}
}
