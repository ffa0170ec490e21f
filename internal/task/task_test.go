package task_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// source is a task.Source whose records the test hands out and resolves.
type source struct {
	mu        sync.Mutex
	cond      *sync.Cond
	paused    bool
	next      int64 // offset after the last record handed out
	resolved  int64 // every record below it is resolved
	committed int64
	failed    bool
	part      int32
	topic     string // "in" when empty
}

func newSource() *source {
	s := &source{}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *source) Topic() string {
	if s.topic != "" {
		return s.topic
	}
	return "in"
}
func (s *source) Partition() int32 { return s.part }
func (s *source) Pause() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = true
	return s.next
}
func (s *source) Resume() {
	s.mu.Lock()
	s.paused = false
	s.cond.Broadcast()
	s.mu.Unlock()
}
func (s *source) AwaitResolved(ctx context.Context, b int64) error {
	stop := context.AfterFunc(ctx, func() { s.mu.Lock(); s.cond.Broadcast(); s.mu.Unlock() })
	defer stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.resolved < b {
		if s.failed {
			return errors.New("a record failed")
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.cond.Wait()
	}
	return nil
}
func (s *source) Handed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next
}

func (s *source) Committable(b int64) {
	s.mu.Lock()
	s.committed = max(s.committed, b)
	s.mu.Unlock()
}

// hand hands out one record (waiting while paused) and returns its offset.
func (s *source) hand() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.paused {
		s.cond.Wait()
	}
	s.next++
	return s.next - 1
}

func (s *source) resolve(upTo int64) {
	s.mu.Lock()
	s.resolved = upTo
	s.cond.Broadcast()
	s.mu.Unlock()
}

// event is a table.Event of partition 0.
type event struct {
	evbind.Handle[*table.Env]
	env *table.Env
}

// newEvent returns an event linked to env.
func newEvent(env *table.Env) *event {
	e := &event{env: env}
	e.Handle = evbind.New[*table.Env](e)
	return e
}

func (e *event) Partition() int32                 { return 0 }
func (e *event) BindPersist() (func(error), bool) { return func(error) {}, true }
func (e *event) Fail(error)                       {}
func (e *event) Failed() error                    { return nil }
func (e *event) Env() *table.Env                  { return e.env }

type host struct{}

func (host) AppID() string           { return "app" }
func (host) RegisterTable(table.Def) {}

// changelogLog is an in-memory changelog: offsets in order, answers after
// a delay, or an error for every record while fail is set.
type changelogLog struct {
	mu   sync.Mutex
	n    int64
	fail bool
	recs []string
}

func (l *changelogLog) send(topic string, p int32, key, value []byte, hs []table.Header, done func(int64, error)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail {
		go done(0, errors.New("broker says no"))
		return nil
	}
	off := l.n
	l.n++
	l.recs = append(l.recs, string(key)+"="+string(value))
	go func() { time.Sleep(time.Millisecond); done(off, nil) }()
	return nil
}

// commitFails makes the commit of setup's task fail.
var commitFails bool

func setup(t *testing.T) (*task.Task, *source, *table.Table[string, int64], *event, stores.Store, *changelogLog, *[]string) {
	t.Helper()
	st := stores.NewMemory()
	counts := table.New(host{}, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(1))
	log := &changelogLog{}
	state := table.NewState(counts, 1, st, log.send)
	if err := state.SetActive(0, true); err != nil {
		t.Fatal(err)
	}
	var order []string
	src := newSource()
	tk := &task.Task{Partition: 0, Tables: []table.Cutter{state}, Commit: func(_ context.Context, offs []task.Offset) error {
		// The commit comes after the acks and before the apply.
		v, _, _ := st.Get(0, []byte("a"))
		order = append(order, fmt.Sprintf("commit(%v, store a=%s)", offs, v))
		if commitFails {
			return errors.New("not the current generation")
		}
		return nil
	}}
	tk.Add(src)
	ev := newEvent(&table.Env{States: map[string]*table.State{"counts": state}})
	return tk, src, counts, ev, st, log, &order
}

func inc(t *testing.T, counts *table.Table[string, int64], ev *event, key string) {
	t.Helper()
	if _, err := counts.TryUpdate(ev, key, func(n int64) int64 { return n + 1 }); err != nil {
		t.Fatal(err)
	}
}

// A cycle waits for the records below its commit point, flushes one record
// per key, commits, then applies; reads see the cache throughout.
func TestCycleCutsAtResolvedCommitPoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { cycleCutsAtResolvedCommitPoint(t) })
}

// cycleCutsAtResolvedCommitPoint runs in a synctest bubble: synctest.Wait
// returns once every goroutine is blocked, so "not done yet" is checked
// without sleeping.
func cycleCutsAtResolvedCommitPoint(t *testing.T) {
	tk, src, counts, ev, st, log, order := setup(t)
	for range 3 {
		src.hand()
		inc(t, counts, ev, "a")
	}
	src.hand()
	inc(t, counts, ev, "b")
	src.resolve(3) // record 3 (b) not yet resolved: the cut must wait for it
	done := make(chan error, 1)
	go func() { _, err := tk.Cycle(context.Background(), 5*time.Second); done <- err }()
	synctest.Wait()
	select {
	case err := <-done:
		t.Fatalf("cycle ended (%v) with a record below its commit point unresolved", err)
	default:
	}
	// Paused: the next record is handed out only after the cut.
	handed := make(chan int64, 1)
	go func() { handed <- src.hand() }()
	synctest.Wait()
	if len(handed) != 0 {
		t.Fatal("a record was handed out while the cycle was cutting")
	}
	src.resolve(4)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	<-handed
	if src.committed != 4 {
		t.Fatalf("committable %d, want 4", src.committed)
	}
	if len(log.recs) != 2 {
		t.Fatalf("changelog %v, want one record per key", log.recs)
	}
	if want := []string{"commit([{in 0 4}], store a=)"}; len(*order) != 1 || (*order)[0] != want[0] {
		t.Fatalf("order %v, want %v (commit before apply)", *order, want)
	}
	v, _, _ := st.Get(0, []byte("a"))
	if string(v) != "3" {
		t.Fatalf("store a=%q after the cycle, want 3", v)
	}
	m, _ := st.Marks(0)
	if m["in/0"] != 3 || m[changelog.EpochMark] != 1 {
		t.Fatalf("marks %v, want in/0=3 (commit point 4 - 1) and epoch 1", m)
	}
	inc(t, counts, ev, "a") // read through the store now
	if got, _, _ := counts.Get(ev, "a"); got != 4 {
		t.Fatalf("a = %d, want 4", got)
	}
}

// A cut that cannot finish changes nothing; a failed flush abandons the task
// (caches dropped, later cycles refused) until Reset.
func TestCycleFailures(t *testing.T) {
	tk, src, counts, ev, st, log, _ := setup(t)
	src.hand()
	inc(t, counts, ev, "a")
	if _, err := tk.Cycle(context.Background(), 30*time.Millisecond); err == nil || errors.Is(err, task.ErrAbandoned) {
		t.Fatalf("cut with an unresolved record: %v, want a cut error that abandons nothing", err)
	}
	src.resolve(1)
	if _, err := tk.Cycle(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := st.Get(0, []byte("a")); string(v) != "1" {
		t.Fatalf("store a=%q, want the write kept across the failed cut", v)
	}

	src.hand()
	inc(t, counts, ev, "a")
	src.resolve(2)
	log.mu.Lock()
	log.fail = true
	log.mu.Unlock()
	_, err := tk.Cycle(context.Background(), time.Second)
	if !errors.Is(err, task.ErrAbandoned) || errors.Is(err, task.ErrStopped) {
		t.Fatalf("failed flush: %v, want ErrAbandoned", err)
	}
	if src.committed != 1 {
		t.Fatalf("committable %d after a failed flush, want 1", src.committed)
	}
	if got, _, _ := counts.Get(ev, "a"); got != 1 {
		t.Fatalf("a = %d after the abandoned cycle, want the store's 1", got)
	}
	if _, err := tk.Cycle(context.Background(), time.Second); !errors.Is(err, task.ErrStopped) {
		t.Fatalf("cycle of an abandoned task: %v, want ErrStopped", err)
	}
	log.mu.Lock()
	log.fail = false
	log.mu.Unlock()
	tk.Reset()
	inc(t, counts, ev, "a")
	if _, err := tk.Cycle(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := st.Get(0, []byte("a")); string(v) != "2" {
		t.Fatalf("store a=%q after reset and a new cycle, want 2", v)
	}

	// A failed commit (an evicted member) abandons the task before the
	// apply: the store never holds a cycle whose offsets were not committed.
	commitFails = true
	defer func() { commitFails = false }()
	src.hand()
	inc(t, counts, ev, "a")
	src.resolve(3)
	committed := src.committed
	if _, err := tk.Cycle(context.Background(), time.Second); !errors.Is(err, task.ErrAbandoned) {
		t.Fatalf("cycle with a failed commit: %v, want ErrAbandoned", err)
	}
	if src.committed != committed {
		t.Fatalf("committable %d after a failed commit, want %d: an offset the broker did not take must not be handed to the source", src.committed, committed)
	}
	if v, _, _ := st.Get(0, []byte("a")); string(v) != "2" {
		t.Fatalf("store a=%q after a failed commit, want 2 (not applied)", v)
	}
}

// OverLimit names the table whose write cache reached CacheLimit (bytes as
// table.State.CacheSize counts them) until a cycle cuts it, and nothing
// without a limit: the worker's sources hand out no record while it names
// one.
func TestOverLimit(t *testing.T) {
	tk, src, counts, ev, _, _, _ := setup(t)
	entry := len("k0") + len("1") + 64 // one key's cache entry
	tk.CacheLimit = 3 * entry
	for i := range 2 {
		src.hand()
		inc(t, counts, ev, fmt.Sprintf("k%d", i))
	}
	if got := tk.OverLimit(); got != "" {
		t.Fatalf("2 entries of a 3-entry limit: over %q", got)
	}
	inc(t, counts, ev, "k0") // an overwrite adds nothing
	if got := tk.OverLimit(); got != "" {
		t.Fatalf("after an overwrite: over %q", got)
	}
	src.hand()
	inc(t, counts, ev, "k2")
	if got := tk.OverLimit(); got != "counts" {
		t.Fatalf("3 entries of a 3-entry limit: over %q, want counts", got)
	}
	src.resolve(3)
	if _, err := tk.Cycle(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if got := tk.OverLimit(); got != "" {
		t.Fatalf("after the cycle cut the cache: over %q", got)
	}
	inc(t, counts, ev, "k3")
	inc(t, counts, ev, "k4")
	inc(t, counts, ev, "k5")
	tk.CacheLimit = 0
	if got := tk.OverLimit(); got != "" {
		t.Fatalf("no limit: over %q", got)
	}
}

// A source added while a cycle runs (the second co-partitioned claim of a
// task starting during the task's first cycle) waits for the cycle to end
// before it hands out a record: the cycle's cut must not hold effects of a
// source it did not pause, whose offsets it neither awaits nor commits and
// which its changelog stamp does not name. A chaos run on Kafka 4.4 double
// counted so: a first-record cycle stamped with one source cut the effects
// of the repartition claim added during it; a restore took them as
// committed while the group's offset of the repartition partition stayed
// behind them, and they were counted again.
func TestSourceAddedDuringCycleWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tk, src, counts, ev, _, log, order := setup(t)
		src.hand()
		inc(t, counts, ev, "a")
		done := make(chan error, 1)
		go func() { _, err := tk.Cycle(context.Background(), 5*time.Second); done <- err }()
		synctest.Wait() // the cycle paused src and awaits record 0
		second := newSource()
		second.topic = "repartition"
		added := make(chan struct{})
		go func() {
			tk.Add(second)
			close(added)
			second.hand()
			inc(t, counts, ev, "b")
			second.resolve(1)
		}()
		synctest.Wait()
		select {
		case <-added:
			t.Fatal("a source was added while a cycle was cutting")
		default:
		}
		src.resolve(1)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		<-added
		synctest.Wait()
		if len(log.recs) != 1 || log.recs[0] != "a=1" {
			t.Fatalf("first cycle wrote %v, want only a=1 (b is the added source's)", log.recs)
		}
		if _, err := tk.Cycle(context.Background(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if len(log.recs) != 2 || log.recs[1] != "b=1" {
			t.Fatalf("changelog %v, want b=1 in the second cycle", log.recs)
		}
		if want := "commit([{in 0 1} {repartition 0 1}], store a=1)"; len(*order) != 2 || (*order)[1] != want {
			t.Fatalf("commits %v, want the second %q", *order, want)
		}
	})
}
