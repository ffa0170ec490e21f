package table_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

type host struct{ defs []table.Def }

func (h *host) AppID() string             { return "app" }
func (h *host) RegisterTable(d table.Def) { h.defs = append(h.defs, d) }

// event is a record of partition p being processed by the worker whose
// runtime is env; done collects the outcome of every bound write.
type event struct {
	evHandle
	p      int32
	env    *table.Env
	mu     sync.Mutex
	outs   []error
	failed error // the first failure of a write that returns no error
}

// evHandle links the event to its runtime as a worker's events are linked.
type evHandle = evbind.Handle[*table.Env]

// newEvent links e to its runtime (e.env) and returns it.
func newEvent(e *event) *event {
	e.evHandle = evbind.New[*table.Env](e)
	return e
}

func (e *event) Partition() int32 { return e.p }
func (e *event) Env() *table.Env  { return e.env }
func (e *event) BindPersist() (func(error), bool) {
	return func(err error) { e.mu.Lock(); e.outs = append(e.outs, err); e.mu.Unlock() }, true
}
func (e *event) Fail(err error) {
	e.mu.Lock()
	if e.failed == nil {
		e.failed = err
	}
	e.mu.Unlock()
}
func (e *event) Failed() error { e.mu.Lock(); defer e.mu.Unlock(); return e.failed }

// producer holds changelog records until the test acknowledges them, so the
// test controls the order of acknowledgements and follower batches.
type producer struct {
	mu   sync.Mutex
	sent []func(int64, error)
}

func (pr *producer) send(_ string, _ int32, _, _ []byte, _ []table.Header, done func(int64, error)) error {
	pr.mu.Lock()
	pr.sent = append(pr.sent, done)
	pr.mu.Unlock()
	return nil
}

func (pr *producer) ack(i int, off int64, err error) { pr.sent[i](off, err) }

const nparts = 3

func keyOf(p int32, i int) string {
	for n := 0; ; n++ {
		k := fmt.Sprintf("k%d-%d", i, n)
		if kafka.PartitionFor([]byte(k), nparts) == p {
			return k
		}
	}
}

// TestGlobalOwnWritesUntilApplied walks a global replica through the orders
// its inputs can arrive in: the worker's own write is read at once from the
// partition's write cache; its commit cycle sends it, and once acknowledged
// it stays visible while followers apply older records of its partition and
// retires when the follower applies its offset, whether the acknowledgement
// or the follower batch comes first; a failed cycle is dropped whole.
func TestGlobalOwnWritesUntilApplied(t *testing.T) {
	h := &host{}
	g := table.NewGlobal(h, "g", codec.String(), codec.DecimalInt64(), table.Partitions(nparts))
	st := stores.NewMemory()
	pr := &producer{}
	gs, err := table.NewGlobalState(g, nparts, st, pr.send)
	if err != nil {
		t.Fatal(err)
	}
	defer g.AttachReplica(gs)()
	env := &table.Env{Globals: map[string]*table.GlobalState{"g": gs}}
	ev := newEvent(&event{p: 1, env: env})
	k := keyOf(1, 0)
	if err := g.TryPut(ev, k, 1); !errors.Is(err, table.ErrNotActive) {
		t.Fatalf("Set before Activate: %v, want ErrNotActive", err)
	}
	if err := gs.Activate(1); err != nil {
		t.Fatal(err)
	}
	follower := gs.Store()
	apply := func(off int64, key string, v string) {
		t.Helper()
		b := &stores.Batch{Offset: off}
		b.Put([]byte(key), []byte(v))
		if err := follower.Apply(1, b); err != nil {
			t.Fatal(err)
		}
	}
	get := func(want int64, wantOK bool) {
		t.Helper()
		v, ok, err := g.Get(ev, k)
		if err != nil || ok != wantOK || v != want {
			t.Fatalf("Get(%s) = %d %v %v, want %d %v", k, v, ok, err, want, wantOK)
		}
		lv, lok, err := g.Lookup(context.Background(), k)
		if err != nil || lok != wantOK || lv != want {
			t.Fatalf("Lookup(%s) = %d %v %v, want %d %v", k, lv, lok, err, want, wantOK)
		}
	}
	// cycle cuts partition 1 and sends it; ack answers record i.
	cycle := func() table.Cycle {
		t.Helper()
		c := gs.Cut(1)
		if c == nil {
			t.Fatal("nothing to cut")
		}
		if err := c.Send(nil); err != nil {
			t.Fatal(err)
		}
		return c
	}
	finish := func(c table.Cycle) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.Apply(); err != nil {
			t.Fatal(err)
		}
	}

	// Ack first, then the follower.
	if err := g.TryPut(ev, k, 10); err != nil {
		t.Fatal(err)
	}
	get(10, true)
	if gs.Pending() != 0 {
		t.Fatalf("pending = %d before the cycle", gs.Pending())
	}
	c := cycle()
	get(10, true)    // read through the cycle being flushed
	apply(4, k, "3") // an older record of the previous owner
	get(10, true)
	pr.ack(0, 7, nil)
	finish(c)
	apply(6, "other", "1")
	if gs.Pending() != 1 {
		t.Fatalf("pending = %d before the follower reached offset 7", gs.Pending())
	}
	get(10, true)
	apply(7, k, "10")
	if gs.Pending() != 0 || gs.Applied(1) != 7 {
		t.Fatalf("pending %d applied %d after offset 7", gs.Pending(), gs.Applied(1))
	}
	get(10, true)

	// The follower first (it fetched the record before the ack arrived).
	if _, err := g.TryUpdate(ev, k, func(n int64) int64 { return n + 1 }); err != nil {
		t.Fatal(err)
	}
	get(11, true)
	c = cycle()
	apply(8, k, "11")
	get(11, true)
	pr.ack(1, 8, nil)
	finish(c)
	if gs.Pending() != 0 {
		t.Fatalf("pending = %d after ack of an applied offset", gs.Pending())
	}

	// A failed cycle is dropped; the replica's value shows again.
	if err := g.TryDelete(ev, k); err != nil {
		t.Fatal(err)
	}
	get(0, false)
	c = cycle()
	pr.ack(2, 0, errors.New("broker down"))
	if err := c.Wait(context.Background()); err == nil {
		t.Fatal("cycle with a failed record waited without error")
	}
	c.Drop()
	get(11, true)
	// A write dropped with the cache (a failed record's partition restarts)
	// is gone too.
	if err := g.TryPut(ev, k, 99); err != nil {
		t.Fatal(err)
	}
	get(99, true)
	gs.Drop(1)
	get(11, true)

	// A key of another partition is not the event's to write.
	if err := g.TryPut(ev, keyOf(2, 0), 1); !errors.Is(err, table.ErrNotCoPartitioned) {
		t.Fatalf("Set of a key of partition 2 from partition 1: %v, want ErrNotCoPartitioned", err)
	}
	// Reads of any partition are fine: the replica holds them all.
	b := &stores.Batch{Offset: 0}
	b.Put([]byte(keyOf(2, 0)), []byte("5"))
	if err := follower.Apply(2, b); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := g.Get(ev, keyOf(2, 0)); err != nil || !ok || v != 5 {
		t.Fatalf("Get of partition 2's key = %d %v %v", v, ok, err)
	}

	// WaitApplied returns once a follower batch reaches the offset.
	go func() { time.Sleep(20 * time.Millisecond); apply(12, "x", "1") }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gs.WaitApplied(ctx, 1, 12); err != nil {
		t.Fatal(err)
	}
	// A rebuild (DropPartition) resets the applied offset.
	if err := follower.DropPartition(1); err != nil {
		t.Fatal(err)
	}
	if gs.Applied(1) != stores.NoOffset {
		t.Fatalf("applied %d after DropPartition", gs.Applied(1))
	}
	short, cancel2 := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel2()
	if err := gs.WaitApplied(short, 1, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitApplied on an empty partition: %v", err)
	}
	gs.Deactivate(1)
	if err := g.TryPut(ev, k, 1); !errors.Is(err, table.ErrNotActive) {
		t.Fatalf("Set after Deactivate: %v, want ErrNotActive", err)
	}
}

// TestGlobalWithoutWorker: reads and writes outside a running worker fail
// with ErrNotRunning.
func TestGlobalWithoutWorker(t *testing.T) {
	g := table.NewGlobal(&host{}, "g", codec.String(), codec.String())
	if _, _, err := g.Lookup(context.Background(), "k"); !errors.Is(err, table.ErrNotRunning) {
		t.Fatalf("Lookup: %v", err)
	}
	if err := g.TryPut(newEvent(&event{}), "k", "v"); !errors.Is(err, table.ErrNotRunning) {
		t.Fatalf("Set: %v", err)
	}
	if b, err := g.QueryKey("abc"); err != nil || string(b) != "abc" {
		t.Fatalf("QueryKey = %q %v", b, err)
	}
	n := table.NewGlobal(&host{}, "n", codec.Int64(), codec.String())
	if _, err := n.QueryKey("nope"); err == nil {
		t.Fatal("QueryKey of a non-number for an int64 key succeeded")
	}
	if b, err := n.QueryKey("258"); err != nil || len(b) != 8 || b[6] != 1 || b[7] != 2 {
		t.Fatalf("QueryKey(258) = %v %v", b, err)
	}
}
