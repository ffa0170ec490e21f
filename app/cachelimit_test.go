package app_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// TestWriteCacheBoundedWhileCutBlocked holds one record unresolved (its
// agent bound a derived record to it and answers it only when the test
// releases it, as a sink whose ack is late) while 3000 more records with
// distinct keys arrive: every cut waits for the held record, so no cycle
// empties the write cache. The source stops handing out records once the
// cache reached its hard limit (twice WithCacheBytes: 4096 bytes, 59
// entries of 70 bytes here), and while two more cycles try to cut and fail,
// neither the records handed out nor the cache move (memory flat). The
// cache stays within the documented bound: the limit plus the writes of
// the records in flight (the agent's queue, 1024, and one fetched batch,
// 256). Without the limit the agent would process all 3001 records into
// the cache (210 070 bytes). After the release everything drains, every
// key is counted exactly once, and the waits are counted and timed.
//
// The limit is one of four brakes, and which one stops the source first is
// a race (on real Kafka under -race fetches come in small batches; on kfake
// in large ones): the limit, the cut window (the records handed out and not
// resolved are capped, group.CutWindow, and the held one never resolves),
// the source's in-flight byte bound (every record behind the held one stays
// in flight: about 1,000 of these; reached first when a CPU-starved agent
// lags four fetched batches behind the poll loop, as in a CI run) or, under
// ExactlyOnce, the cycle a full cache wakes, whose cut holds the
// transaction's hand-out gate. TaskStatus.Waiting names it; the test
// asserts the bound and the flatness whichever it is, and the limit's own
// details when it was the limit.
//
// Under ExactlyOnce the worker-wide cycle's cut waits for the held record up
// to the transaction's cut deadline (45 s here: the transaction timeout is
// raised to 60 s) instead of being postponed every cut budget: the test
// releases the record once the source stands still, without the two
// failed cuts.
func TestWriteCacheBoundedWhileCutBlocked(t *testing.T) {
	t.Run("at_least_once", func(t *testing.T) { testWriteCacheBounded(t, app.AtLeastOnce, false) })
	t.Run("exactly_once", func(t *testing.T) { testWriteCacheBounded(t, app.ExactlyOnce, false) })
	// The agent stops after the held record until the source waits for
	// its in-flight bytes: the brake a CPU-starved agent meets (a CI run
	// under -race on Kafka 4.4 stood there with TaskStatus.Waiting empty).
	t.Run("at_least_once_slow_agent", func(t *testing.T) { testWriteCacheBounded(t, app.AtLeastOnce, true) })
}

// testWriteCacheBounded runs TestWriteCacheBoundedWhileCutBlocked under g;
// slowAgent makes the agent wait after the held record until the source
// stands still at its in-flight byte bound.
func testWriteCacheBounded(t *testing.T, g app.Guarantee, slowAgent bool) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	const (
		cacheBytes = 2048
		limit      = 2 * cacheBytes // WithWriteCacheLimit's default
		n          = 3000
		entry      = len("k0000") + len("1") + 64 // one key's cache entry (State.CacheSize)
		inFlight   = 1024 + 256 + 1               // queue, fetched batch, open window
		bound      = limit + inFlight*entry
	)
	if g == app.ExactlyOnce {
		// The held record must not outlive the transaction: its deadline
		// would abort it and the task would redo the records.
		t.Cleanup(app.SetMinTxnTimeout(60 * time.Second))
	}
	addr := freeAddr(t)
	interval, idle := 200*time.Millisecond, time.Duration(0)
	if slowAgent {
		// No cycle until the source stood still: a failed cut would
		// narrow the cut window, which would then stop the source first.
		interval, idle = 3*time.Second, -1
	}
	a := app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(interval),
		app.WithIdleCommit(idle),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id+"-"),
		app.WithHTTPAddr(addr),
		app.WithCacheBytes(cacheBytes),
		app.WithGuarantee(g))
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(1))
	seen := table.New(a, "seen", codec.String(), codec.DecimalInt64())
	held := make(chan func(error), 1)
	var processed atomic.Int64
	var bound1 atomic.Bool // the record is held once (not again if a transaction aborted)
	gate := make(chan struct{})
	var gateOnce sync.Once
	openGate := func() { gateOnce.Do(func() { close(gate) }) }
	if !slowAgent {
		openGate()
	}
	agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if ev.Key == "hold" && bound1.CompareAndSwap(false, true) {
				// A derived record bound to the event and answered late:
				// the record stays unresolved after the agent moved on.
				done, ok := evbind.Of[*tablestate.Env](ev).BindPersist()
				if !ok {
					return errors.New("could not bind to the held record")
				}
				held <- done
				<-gate
			}
			seen.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			processed.Add(1)
		}
		return s.Err()
	}, agent.WritesTo(seen))
	dir := t.TempDir()
	w, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, in.Name())

	sendHeldAndKeys(t, brokers, in.Name(), n)
	release := once(<-held)
	// A failing test still answers the held record, before the worker
	// stops (cleanups run last-registered first): a stop that waits for
	// it would otherwise wait until the test binary's timeout.
	t.Cleanup(func() {
		openGate()
		release(errors.New("the test ended with the record held"))
	})

	task := func() app.TaskStatus {
		t.Helper()
		ts := w.Tasks()
		if len(ts) != 1 {
			t.Fatalf("tasks %+v, want 1", ts)
		}
		return ts[0]
	}
	// The source stands still: at the cache limit, at the cut window (the
	// held record stays unresolved) or, under ExactlyOnce, behind the
	// blocked cycle; the agent then finishes what it was handed.
	stopped := func(ts app.TaskStatus) bool {
		switch ts.Waiting {
		case app.WaitWriteCache, app.WaitWindow, app.WaitInFlight:
			return true
		case app.WaitCycle:
			return g == app.ExactlyOnce
		}
		return false
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ts := task()
		if stopped(ts) || processed.Load() == n+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the source did not stand still in 60 s (nor was every record processed): %+v, processed %d", ts, processed.Load())
		}
	}
	before := task()
	if slowAgent {
		if before.Waiting != app.WaitInFlight {
			t.Fatalf("the agent waits and the source stands still waiting for %q, want %q", before.Waiting, app.WaitInFlight)
		}
		openGate()
	}
	// What went out to the agents: every record handed out, but when the
	// source waits for in-flight bytes the rest of its batch waits inside
	// the source group's emit, counted in Handed and not yet delivered.
	// The agent then settles with one cache entry per record it took.
	out := before.Handed
	if before.Waiting == app.WaitInFlight {
		var last int64 = -1
		testbroker.Eventually(t, 30*time.Second, "the agent settled", func() bool {
			p := processed.Load()
			settled := p == last && task().CacheEntries == int(p)
			last = p
			time.Sleep(300 * time.Millisecond)
			return settled
		})
		out = last
	}
	testbroker.Eventually(t, 30*time.Second, "the agent processed every record handed out", func() bool { return processed.Load() == out })
	blocked := task()
	t.Logf("blocked: waiting for %q, handed %d of %d, cache %d entries, %d bytes (limit %d, bound %d), postponed cycles %d",
		blocked.Waiting, blocked.Handed, n+1, blocked.CacheEntries, blocked.CacheBytes, limit, bound, blocked.Postponed)
	if blocked.CacheBytes > bound || blocked.Handed >= n {
		t.Fatalf("cache %d entries, %d bytes, %d of %d records handed out, waiting for %q: want at most %d bytes (limit %d + %d records in flight of %d bytes)",
			blocked.CacheEntries, blocked.CacheBytes, blocked.Handed, n+1, blocked.Waiting, bound, limit, inFlight, entry)
	}
	if blocked.Handed != before.Handed || !stopped(blocked) {
		t.Fatalf("handed %d → %d, waiting for %q: the source moved while it stood still", before.Handed, blocked.Handed, blocked.Waiting)
	}
	atLimit := blocked.Waiting == app.WaitWriteCache
	if atLimit && (blocked.CacheBytes < limit || blocked.CacheEntries != int(blocked.Handed)) {
		t.Fatalf("the source waits with %d entries, %d bytes cached after %d records (one key each): want every record's key cached, at least the limit %d",
			blocked.CacheEntries, blocked.CacheBytes, blocked.Handed, limit)
	}
	if g == app.ExactlyOnce {
		release(nil)
		drain(t, w, a, brokers, in.Name(), addr, stop, dir, n, atLimit, false)
		return
	}
	// Memory flat: two more cycles try to cut and fail (the held record is
	// below their commit point), and nothing moves meanwhile.
	testbroker.Eventually(t, 60*time.Second, "two more cycles postponed", func() bool { return task().Postponed >= blocked.Postponed+2 })
	still := task()
	if still.Handed != blocked.Handed || still.CacheEntries != blocked.CacheEntries || still.CacheBytes != blocked.CacheBytes ||
		processed.Load() != out || still.Waiting == "" {
		t.Fatalf("while blocked: handed %d → %d, cache %d → %d entries, %d → %d bytes, processed %d, waiting for %q; want all unchanged, waiting",
			blocked.Handed, still.Handed, blocked.CacheEntries, still.CacheEntries, blocked.CacheBytes, still.CacheBytes, processed.Load(), still.Waiting)
	}
	body := httpGet(t, "http://"+addr+"/metrics")
	if v, _ := sample(body, "runnel_write_cache_waits_total", "table=seen"); atLimit && v < 1 {
		t.Errorf("runnel_write_cache_waits_total{table=seen} = %v while a source waits, want at least 1", v)
	}

	release(nil)
	drain(t, w, a, brokers, in.Name(), addr, stop, dir, n, atLimit, atLimit)
}

// drain waits until the worker of a processed every record of topic, stops
// it and checks that the store of table "seen" counts "hold" and each of
// the n keys once. atLimit: the source waited at the cache limit; waited:
// it waited there through two failed cuts.
func drain(t *testing.T, w *app.Worker, a *app.App, brokers []string, topic, addr string, stop func() error, dir string, n int, atLimit, waited bool) {
	t.Helper()
	testbroker.WaitLag0(t, brokers, a.ID(), topic)
	for _, ts := range w.Tasks() {
		t.Logf("drained: handed %d, cycles %d, postponed %d", ts.Handed, ts.Cycles, ts.Postponed)
	}
	body := httpGet(t, "http://"+addr+"/metrics")
	waits, _ := sample(body, "runnel_write_cache_waits_total", "table=seen")
	secs, _ := sample(body, "runnel_write_cache_wait_seconds_total", "table=seen")
	t.Logf("waits %v, %.2f s waiting", waits, secs)
	if atLimit && waits < 1 {
		t.Errorf("runnel_write_cache_waits_total{table=seen} = %v, want at least 1", waits)
	}
	if waited && secs < 1 {
		// The source waited at least through the two postponed cuts,
		// each a cut budget of 1 s.
		t.Errorf("runnel_write_cache_wait_seconds_total{table=seen} = %v, want at least 1", secs)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	checkSeenOnce(t, dir, n)
}

// once returns f called at most once.
func once(f func(error)) func(error) {
	var o sync.Once
	return func(err error) { o.Do(func() { f(err) }) }
}

// sendHeldAndKeys produces, to partition 0 of topic, a record keyed "hold"
// and then n records keyed k0000, k0001, ..., every value "x".
func sendHeldAndKeys(t *testing.T, brokers []string, topic string, n int) {
	t.Helper()
	msgs := []*sarama.ProducerMessage{{Topic: topic, Key: sarama.StringEncoder("hold"), Value: sarama.StringEncoder("x")}}
	for i := range n {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("k%04d", i)), Value: sarama.StringEncoder("x")})
	}
	prod := testbroker.SyncProducer(t, brokers)
	defer prod.Close()
	if err := prod.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
}

// checkSeenOnce checks that the store of table "seen" in dir counts "hold"
// and each of the n keys sendHeldAndKeys sends exactly once.
func checkSeenOnce(t *testing.T, dir string, n int) {
	t.Helper()
	got := storeTable(t, dir, "seen")
	if len(got) != n+1 || got["hold"] != "1" {
		t.Fatalf("store holds %d keys (hold=%q), want %d, each 1", len(got), got["hold"], n+1)
	}
	for i := range n {
		if k := fmt.Sprintf("k%04d", i); got[k] != "1" {
			t.Fatalf("%s = %q, want 1", k, got[k])
		}
	}
}
