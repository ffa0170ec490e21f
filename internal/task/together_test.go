package task_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// part is one task of a Together test: its own table, store, changelog and
// source (partition i of topic "in").
type part struct {
	tk     *task.Task
	src    *source
	counts *table.Table[string, int64]
	ev     *event
	st     stores.Store
	log    *changelogLog
}

func parts(t *testing.T, n int) []*part {
	t.Helper()
	var out []*part
	for i := range n {
		tk, src, counts, ev, st, log, _ := setup(t)
		src.part = int32(i)
		tk.Commit = nil // Together commits through its own committer
		out = append(out, &part{tk: tk, src: src, counts: counts, ev: ev, st: st, log: log})
	}
	return out
}

func tasksOf(ps []*part) []*task.Task {
	var out []*task.Task
	for _, p := range ps {
		out = append(out, p.tk)
	}
	return out
}

// commits records each call of a Together committer.
type commits struct {
	calls []string
	fail  bool
}

func (c *commits) commit(_ context.Context, offs []task.Offset, flushed bool) error {
	c.calls = append(c.calls, fmt.Sprintf("%v flushed=%v", offs, flushed))
	if c.fail {
		return errors.New("transaction aborted")
	}
	return nil
}

// Together cycles many tasks with one commit: every source's offset goes to
// the one commit, sorted, after every task's changelog records were
// acknowledged; each store gets its own cycle only after the commit; a cycle
// that wrote nothing still commits (the sends of a stateless task).
func TestTogetherOneCommitForEveryTask(t *testing.T) {
	ps := parts(t, 3)
	// Task 2 writes nothing; tasks 0 and 1 write and resolve their records.
	for i, p := range ps[:2] {
		for range i + 1 {
			p.src.hand()
			inc(t, p.counts, p.ev, "k")
		}
		p.src.resolve(int64(i + 1))
	}
	ps[2].src.hand()
	ps[2].src.resolve(1)
	var c commits
	reversed := tasksOf(ps)
	slices.Reverse(reversed) // any order
	st, err := task.Together(context.Background(), reversed, time.Second, c.commit)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"[{in 0 1} {in 1 2} {in 2 1}] flushed=true"}
	if !slices.Equal(c.calls, want) {
		t.Fatalf("commits %v, want %v (one, every source, sorted)", c.calls, want)
	}
	if st.Records != 2 {
		t.Fatalf("cycle wrote %d changelog records, want 2 (one per dirty key and task)", st.Records)
	}
	for i, p := range ps {
		v, _, _ := p.st.Get(0, []byte("k"))
		want := map[int]string{0: "1", 1: "2", 2: ""}[i]
		if string(v) != want {
			t.Errorf("task %d: store k=%q, want %q", i, v, want)
		}
		if p.src.committed != int64(map[int]int{0: 1, 1: 2, 2: 1}[i]) {
			t.Errorf("task %d: committable %d", i, p.src.committed)
		}
	}
	// Nothing written anywhere: the commit still runs (flushed=false).
	c.calls = nil
	if _, err := task.Together(context.Background(), tasksOf(ps), time.Second, c.commit); err != nil {
		t.Fatal(err)
	}
	if want := []string{"[{in 0 1} {in 1 2} {in 2 1}] flushed=false"}; !slices.Equal(c.calls, want) {
		t.Fatalf("idle cycle commits %v, want %v", c.calls, want)
	}
}

// A failed commit abandons every task of the cycle and applies nothing; a
// task abandoned before the cycle is left out of it (its source neither
// paused nor committed) while the others commit.
func TestTogetherFailures(t *testing.T) {
	ps := parts(t, 2)
	for _, p := range ps {
		p.src.hand()
		inc(t, p.counts, p.ev, "k")
		p.src.resolve(1)
	}
	c := commits{fail: true}
	if _, err := task.Together(context.Background(), tasksOf(ps), time.Second, c.commit); !errors.Is(err, task.ErrAbandoned) {
		t.Fatalf("failed commit: %v, want ErrAbandoned", err)
	}
	for i, p := range ps {
		if v, _, _ := p.st.Get(0, []byte("k")); len(v) != 0 {
			t.Errorf("task %d: store k=%q after a failed commit, want nothing applied", i, v)
		}
		if !errors.Is(p.tk.Err(), task.ErrAbandoned) {
			t.Errorf("task %d not abandoned: %v", i, p.tk.Err())
		}
		if p.src.committed != 0 {
			t.Errorf("task %d: committable %d after a failed commit", i, p.src.committed)
		}
	}

	ps = parts(t, 2)
	ps[0].tk.Abandon(errors.New("its timer failed"))
	for _, p := range ps {
		p.src.hand()
		inc(t, p.counts, p.ev, "k")
		p.src.resolve(1)
	}
	c = commits{}
	if _, err := task.Together(context.Background(), tasksOf(ps), time.Second, c.commit); err != nil {
		t.Fatal(err)
	}
	if want := []string{"[{in 1 1}] flushed=true"}; !slices.Equal(c.calls, want) {
		t.Fatalf("commits %v, want %v (the abandoned task left out)", c.calls, want)
	}
	if ps[0].src.committed != 0 {
		t.Fatal("the abandoned task's source was made committable")
	}
	if v, _, _ := ps[1].st.Get(0, []byte("k")); string(v) != "1" {
		t.Fatalf("live task: store k=%q, want 1", v)
	}
}

// Punctuate holds the cycle token: a cycle that comes due while fn runs
// waits for it (checked with synctest: every goroutine blocked, the cycle
// not done), and fn's writes belong to that next cycle; an abandoned task
// does not call fn; an ended context ends the wait for the token.
func TestPunctuate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tk, _, counts, ev, st, _, _ := setup(t)
		inFn, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- tk.Punctuate(context.Background(), func() error {
				close(inFn)
				<-release
				inc(t, counts, ev, "tick")
				return nil
			})
		}()
		<-inFn
		cycleDone := make(chan error, 1)
		go func() {
			_, err := tk.Cycle(context.Background(), time.Second)
			cycleDone <- err
		}()
		synctest.Wait()
		select {
		case err := <-cycleDone:
			t.Fatalf("a cycle ran (%v) while Punctuate held the token", err)
		default:
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := <-cycleDone; err != nil {
			t.Fatal(err)
		}
		if v, _, _ := st.Get(0, []byte("tick")); string(v) != "1" {
			t.Fatalf("store tick=%q, want 1: the punctuation's write belongs to the cycle that waited for it", v)
		}

		tk.Abandon(errors.New("a flush failed"))
		called := false
		err := tk.Punctuate(context.Background(), func() error { called = true; return nil })
		if !errors.Is(err, task.ErrStopped) || called {
			t.Fatalf("Punctuate on an abandoned task: %v (fn called %v), want ErrStopped without fn", err, called)
		}

		tk.Reset()
		holding, hold := make(chan struct{}), make(chan struct{})
		go func() { _ = tk.Punctuate(context.Background(), func() error { close(holding); <-hold; return nil }) }()
		<-holding
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := tk.Punctuate(ctx, func() error { return nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("Punctuate with an ended context while the token is held: %v, want context.Canceled", err)
		}
		close(hold)
	})
}
