package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// queryApp is one process's instance of an app whose agent counts records
// per key into "counts" (3 partitions, like the input); "ids" is an
// int64-keyed table nothing writes, there for keys the codec cannot parse.
type queryApp struct {
	app    *app.App
	in     *agent.Topic[string, string]
	counts *table.Table[string, int64]
	addr   string
}

func newQueryApp(t *testing.T, id string) *queryApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	q := &queryApp{addr: addr, app: app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200*time.Millisecond),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id+"-"),
		app.WithHTTPAddr(addr))}
	q.in = app.Topic(q.app, "in", codec.String(), codec.String(), app.Partitions(gparts))
	q.counts = table.New(q.app, "counts", codec.String(), codec.DecimalInt64())
	table.New(q.app, "ids", codec.DecimalInt64(), codec.String(), table.Partitions(gparts))
	agent.New(q.app, "count", q.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			q.counts.Update(ev, ev.Key, func(c int64) int64 { return c + 1 })
		}
		return s.Err()
	}, agent.WritesTo(q.counts))
	return q
}

type queryWorker struct {
	q      *queryApp
	w      *app.Worker
	cancel context.CancelFunc
	done   chan error
}

func startQueryWorker(t *testing.T, brokers []string, id, dir, name string) *queryWorker {
	t.Helper()
	q := newQueryApp(t, id)
	w, err := q.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: dir, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	qw := &queryWorker{q: q, w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { qw.done <- w.Run(ctx) }()
	t.Cleanup(qw.stop)
	return qw
}

func (qw *queryWorker) stop() {
	if qw.cancel == nil {
		return
	}
	qw.cancel()
	<-qw.done
	qw.cancel = nil
}

// answer is one reply to GET /api/tables/…: status, headers, body.
type answer struct {
	code int
	h    http.Header
	app.TableAnswer
}

func (a answer) String() string {
	return fmt.Sprintf("%d role=%s partition=%s generation=%s lag=%s retry-after=%s %+v", a.code, a.h.Get(app.RoleHeader),
		a.h.Get(app.PartitionHeader), a.h.Get(app.GenerationHeader), a.h.Get(app.LagHeader), a.h.Get("Retry-After"), a.TableAnswer)
}

// queryTable GETs /api/tables/{path} on addr with header h; err is a
// transport error (the worker is down).
func queryTable(addr, path string, h http.Header) (answer, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/api/tables/"+path, nil)
	if err != nil {
		return answer{}, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	a := answer{code: resp.StatusCode, h: resp.Header}
	if err := json.NewDecoder(resp.Body).Decode(&a.TableAnswer); err != nil {
		return a, fmt.Errorf("GET %s: status %d: %w", path, resp.StatusCode, err)
	}
	return a, nil
}

func mustQuery(t *testing.T, addr, path string, h http.Header) answer {
	t.Helper()
	a, err := queryTable(addr, path, h)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// handOverPoller asks the workers in addrs for every key, over and over, and
// checks the rule of issue #26 on every answer: a key that exists is never
// answered 404; an answer is its value (within [lo, hi], the counts the test
// allows at that moment) or a typed, retryable refusal with Retry-After.
type handOverPoller struct {
	t      *testing.T
	keys   []string
	mu     sync.Mutex
	addrs  []string
	lo, hi int64
	seen   map[string]int // "200", "503 restoring", … -> answers
	stop   chan struct{}
	done   chan struct{}
}

func (hp *handOverPoller) set(addrs []string, lo, hi int64) {
	hp.mu.Lock()
	hp.addrs, hp.lo, hp.hi = slices.Clone(addrs), lo, hi
	hp.mu.Unlock()
}

func (hp *handOverPoller) run() {
	defer close(hp.done)
	for i := 0; ; i++ {
		select {
		case <-hp.stop:
			return
		default:
		}
		hp.mu.Lock()
		addrs, lo, hi := hp.addrs, hp.lo, hp.hi
		hp.mu.Unlock()
		if len(addrs) == 0 {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		k := hp.keys[i%len(hp.keys)]
		a, err := queryTable(addrs[i%len(addrs)], "counts/"+k, nil)
		if err != nil {
			time.Sleep(5 * time.Millisecond) // a worker stopping or starting
			continue
		}
		label := strconv.Itoa(a.code)
		switch {
		case a.code == http.StatusOK:
			if v, ok := a.Value.(float64); !ok || int64(v) < lo || int64(v) > hi {
				hp.t.Errorf("hand-over: %s = %s, want a value in [%d, %d]", k, a, lo, hi)
			}
		case a.code == http.StatusNotFound:
			hp.t.Errorf("hand-over: existing key %s answered %s", k, a)
		case (a.code == http.StatusServiceUnavailable || a.code == http.StatusBadGateway) &&
			slices.Contains([]string{app.ReasonRestoring, app.ReasonRebalancing, app.ReasonNotOwner}, a.Reason) &&
			a.h.Get("Retry-After") != "":
			label += " " + a.Reason
		default:
			hp.t.Errorf("hand-over: %s answered %s; want 200 or a typed 503/502 with Retry-After", k, a)
		}
		hp.mu.Lock()
		hp.seen[label]++
		hp.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
}

// TestTableQueryHandOver (issue #26, issue #27 item 2): table queries through
// a worker's HTTP API during every phase of a hand-over. One worker answers
// its keys as the active, with the partition, generation and role headers;
// an absent key is a 404 with no reason, an unknown table a 404 with one, a
// key or option that does not parse a 400. A second worker joins: queries
// to either are answered (forwarded once to the owner), forward=0 or a used
// hop names the owner with a 503, and a standby answers consistency=any
// within its lag bound. The first worker leaves, the second takes every
// partition and processes more records; then the first comes back alone on
// its old data dir with its restores held: every query is a 503 "restoring"
// with Retry-After and restore progress (never 404, also for an absent key),
// consistency=any answers from the restoring copy (the old value, with its
// lag) only when the bound allows it, "stale-beyond-bound" otherwise, and
// /api/status lists the partitions as restoring with their offsets. Released,
// the worker answers the new values. A poller checks throughout that no
// existing key is ever answered 404.
func TestTableQueryHandOver(t *testing.T) {
	var holding atomic.Bool
	t.Cleanup(app.HoldRestores(holding.Load)) // removed after every worker stopped (cleanups run last-in first-out)
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "qho")
	dir1, dir2 := t.TempDir(), t.TempDir()
	keys := make([]string, 30)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%02d", i)
	}
	partOf := func(k string) int32 { return kafka.PartitionFor([]byte(k), gparts) }

	w1 := startQueryWorker(t, brokers, id, dir1, "w1")
	client := testbroker.Client(t, brokers)
	topic := w1.q.in.Name()
	changelogTopic := w1.q.counts.Changelog()
	testbroker.WaitTopic(t, client, topic)
	pr := newGProducer(t, brokers, topic)
	for i := 0; i < 10*len(keys); i++ {
		pr.send(keys[i%len(keys)])
	}
	testbroker.WaitLag0(t, brokers, id, topic)
	waitQueryReady(t, w1, gparts)

	// One worker, active for every partition.
	gen := strconv.Itoa(int(w1.w.Assignment().Generation))
	for _, k := range keys {
		a := mustQuery(t, w1.q.addr, "counts/"+k, nil)
		if a.code != http.StatusOK || !a.Found || a.Value != float64(10) || a.h.Get(app.RoleHeader) != app.RoleActive ||
			a.h.Get(app.PartitionHeader) != strconv.Itoa(int(partOf(k))) || a.Partition != partOf(k) ||
			a.h.Get(app.GenerationHeader) != gen || a.h.Get(app.LagHeader) != "0" {
			t.Fatalf("GET counts/%s on the active = %s; want 200 value 10, role active, partition %d, generation %s, lag 0", k, a, partOf(k), gen)
		}
	}
	if a := mustQuery(t, w1.q.addr, "counts/nobody", nil); a.code != http.StatusNotFound || a.Found || a.Reason != "" || a.Error != "" || a.h.Get(app.RoleHeader) != app.RoleActive {
		t.Fatalf("GET counts/nobody (absent) = %s; want 404 found=false with no reason", a)
	}
	if a := mustQuery(t, w1.q.addr, "nosuchtable/"+keys[0], nil); a.code != http.StatusNotFound || a.Reason != app.ReasonUnknownTable || a.Error == "" {
		t.Fatalf("GET nosuchtable/%s = %s; want 404 reason %s", keys[0], a, app.ReasonUnknownTable)
	}
	for _, c := range []struct{ path, reason string }{
		{"ids/seven", app.ReasonBadKey},
		{"counts/" + keys[0] + "?consistency=strong", app.ReasonBadRequest},
		{"counts/" + keys[0] + "?consistency=any&maxLag=-5", app.ReasonBadRequest},
		{"counts/" + keys[0] + "?consistency=any", app.ReasonBadRequest},
	} {
		if a := mustQuery(t, w1.q.addr, c.path, nil); a.code != http.StatusBadRequest || a.Reason != c.reason || a.Error == "" {
			t.Fatalf("GET %s = %s; want 400 reason %s", c.path, a, c.reason)
		}
	}

	hp := &handOverPoller{t: t, keys: keys, seen: map[string]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go hp.run()
	defer func() {
		select {
		case <-hp.stop:
		default:
			close(hp.stop)
		}
		<-hp.done
	}()

	// A second worker joins.
	w2 := startQueryWorker(t, brokers, id, dir2, "w2")
	hp.set([]string{w1.q.addr, w2.q.addr}, 10, 10)
	ws := []*queryWorker{w1, w2}
	owner := func(k string) *queryWorker {
		for _, qw := range ws {
			if slices.Contains(qw.w.Assignment().Actives[changelogTopic], partOf(k)) {
				return qw
			}
		}
		return nil
	}
	// Settled: both active, every partition has one owner and one standby.
	deadline := time.Now().Add(60 * time.Second)
	for {
		a1, a2 := w1.w.Assignment(), w2.w.Assignment()
		all := append(slices.Clone(a1.Actives[changelogTopic]), a2.Actives[changelogTopic]...)
		sb := append(slices.Clone(a1.Standbys[changelogTopic]), a2.Standbys[changelogTopic]...)
		slices.Sort(all)
		slices.Sort(sb)
		if w1.w.Ready() && w2.w.Ready() && len(a1.Actives[changelogTopic]) > 0 && len(a2.Actives[changelogTopic]) > 0 &&
			slices.Equal(all, []int32{0, 1, 2}) && slices.Equal(sb, []int32{0, 1, 2}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("two workers never settled: w1 %+v, w2 %+v", a1, a2)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, k := range keys {
		ow := owner(k)
		other := w1
		if ow == w1 {
			other = w2
		}
		// Through the other worker: forwarded once, answered by the owner.
		a := mustQuery(t, other.q.addr, "counts/"+k, nil)
		if a.code != http.StatusOK || a.Value != float64(10) || a.h.Get(app.RoleHeader) != app.RoleActive || a.h.Get(app.ServedByHeader) != ow.q.addr {
			t.Fatalf("GET counts/%s through the non-owner = %s; want 200 value 10 from %s", k, a, ow.q.addr)
		}
		// forward=0, or a query that used its hop: the non-owner names the
		// owner, 503 not-owner (the key may exist: never 404).
		for _, h := range []http.Header{nil, {app.HopsHeader: {"1"}}} {
			path := "counts/" + k
			if h == nil {
				path += "?forward=0"
			}
			a := mustQuery(t, other.q.addr, path, h)
			if a.code != http.StatusServiceUnavailable || a.Reason != app.ReasonNotOwner || a.Owner != ow.q.addr ||
				a.h.Get("Retry-After") == "" || a.h.Get(app.RoleHeader) != app.RoleStandby || a.h.Get(app.ServedByHeader) != "" {
				t.Fatalf("GET %s on the non-owner (hops header %v) = %s; want 503 not-owner, owner %s, role standby, not forwarded", path, h, a, ow.q.addr)
			}
		}
		// consistency=any within the bound: the standby answers itself,
		// once it applied the committed records (a commit interval).
		for deadline := time.Now().Add(20 * time.Second); ; {
			a = mustQuery(t, other.q.addr, "counts/"+k+"?consistency=any&maxLag=0&forward=0", nil)
			if a.code == http.StatusOK || time.Now().After(deadline) {
				break
			}
			if a.Reason != app.ReasonStaleBeyondBound || a.Lag == nil || *a.Lag <= 0 {
				t.Fatalf("GET counts/%s?consistency=any&maxLag=0&forward=0 on the standby = %s; want 200 or 503 stale-beyond-bound with its lag", k, a)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if a.code != http.StatusOK || a.Value != float64(10) || a.h.Get(app.RoleHeader) != app.RoleStandby || a.h.Get(app.LagHeader) != "0" ||
			a.h.Get(app.ServedByHeader) != "" || a.h.Get(app.GenerationHeader) != strconv.Itoa(int(other.w.Assignment().Generation)) {
			t.Fatalf("GET counts/%s?consistency=any&maxLag=0 on the standby = %s; want 200 value 10 from the standby itself, lag 0", k, a)
		}
	}

	// The first worker leaves; the second takes every partition and counts
	// five more records per key.
	w1.stop()
	hp.set([]string{w2.q.addr}, 10, 15)
	waitQueryReady(t, w2, gparts)
	for i := 0; i < 5*len(keys); i++ {
		pr.send(keys[i%len(keys)])
	}
	testbroker.WaitLag0(t, brokers, id, topic)
	for _, k := range keys {
		if a := mustQuery(t, w2.q.addr, "counts/"+k, nil); a.code != http.StatusOK || a.Value != float64(15) {
			t.Fatalf("GET counts/%s on w2 after the take-over = %s; want 200 value 15", k, a)
		}
	}

	// The first worker comes back alone on its data dir (every key at 10,
	// the changelog has the records that made them 15), its restores held.
	holding.Store(true)
	w2.stop()
	w1 = startQueryWorker(t, brokers, id, dir1, "w1")
	hp.set([]string{w1.q.addr}, 10, 15)
	for deadline := time.Now().Add(60 * time.Second); len(w1.w.Assignment().Actives[changelogTopic]) != gparts; {
		if time.Now().After(deadline) {
			t.Fatalf("restarted w1 never got every partition: %+v", w1.w.Assignment())
		}
		time.Sleep(20 * time.Millisecond)
	}
	gen = strconv.Itoa(int(w1.w.Assignment().Generation))
	for _, k := range append(slices.Clone(keys), "nobody") {
		a := mustQuery(t, w1.q.addr, "counts/"+k, nil)
		if a.code != http.StatusServiceUnavailable || a.Reason != app.ReasonRestoring || a.Found || a.h.Get("Retry-After") == "" ||
			a.h.Get(app.RoleHeader) != app.RoleRestoring || a.h.Get(app.GenerationHeader) != gen || a.Restore == nil ||
			a.Restore.RestoredOffset <= 0 || a.Restore.EndOffset <= a.Restore.RestoredOffset {
			t.Fatalf("GET counts/%s while restoring = %s; want 503 restoring, Retry-After, role restoring, generation %s, restored offset below the end", k, a, gen)
		}
		if k == "nobody" {
			continue
		}
		a = mustQuery(t, w1.q.addr, "counts/"+k+"?consistency=any&maxLag=0", nil)
		if a.code != http.StatusServiceUnavailable || a.Reason != app.ReasonStaleBeyondBound || a.Lag == nil || *a.Lag <= 0 ||
			a.h.Get(app.LagHeader) != strconv.FormatInt(*a.Lag, 10) || a.h.Get("Retry-After") == "" {
			t.Fatalf("GET counts/%s?consistency=any&maxLag=0 while restoring = %s; want 503 stale-beyond-bound with the lag", k, a)
		}
		a = mustQuery(t, w1.q.addr, "counts/"+k+"?consistency=any&maxLag=1000000", nil)
		if a.code != http.StatusOK || a.Value != float64(10) || a.h.Get(app.RoleHeader) != app.RoleRestoring || a.Lag == nil || *a.Lag <= 0 || a.Restore == nil {
			t.Fatalf("GET counts/%s?consistency=any&maxLag=1000000 while restoring = %s; want 200 with the copy's value 10 (the changelog has 15), role restoring and its lag", k, a)
		}
	}
	st := w1.w.Status()
	var restoring int
	for _, tp := range st.TablePartitions {
		if tp.Table == "counts" {
			if tp.Role != app.RoleRestoring || tp.RestoredOffset <= 0 || tp.EndOffset <= tp.RestoredOffset || tp.Lag != tp.EndOffset-tp.RestoredOffset {
				t.Fatalf("status while restoring: %+v; want role restoring, restored offset below the end offset", tp)
			}
			restoring++
		}
	}
	if restoring != gparts || st.Ready {
		t.Fatalf("status while restoring: %d counts partitions restoring, ready %v; want %d, false (%+v)", restoring, st.Ready, gparts, st.TablePartitions)
	}

	// Released: the restore completes and the active answers the new values.
	holding.Store(false)
	waitQueryReady(t, w1, gparts)
	hp.set([]string{w1.q.addr}, 15, 15)
	for _, k := range keys {
		if a := mustQuery(t, w1.q.addr, "counts/"+k, nil); a.code != http.StatusOK || a.Value != float64(15) || a.h.Get(app.RoleHeader) != app.RoleActive {
			t.Fatalf("GET counts/%s after the restore = %s; want 200 value 15 from the active", k, a)
		}
	}
	for _, tp := range w1.w.Status().TablePartitions {
		if tp.Table == "counts" && (tp.Role != app.RoleActive || tp.Lag != 0) {
			t.Fatalf("status after the restore: %+v; want active, lag 0", tp)
		}
	}
	time.Sleep(100 * time.Millisecond)
	close(hp.stop)
	<-hp.done
	hp.mu.Lock()
	defer hp.mu.Unlock()
	t.Logf("answers during the hand-overs: %v", hp.seen)
	if hp.seen["200"] == 0 || hp.seen["503 "+app.ReasonRestoring] == 0 {
		t.Fatalf("the poller saw %v; want values and 503 restoring answers", hp.seen)
	}
}

// waitQueryReady waits until qw is ready and active for n partitions.
func waitQueryReady(t *testing.T, qw *queryWorker, n int) {
	t.Helper()
	cl := qw.q.counts.Changelog()
	for deadline := time.Now().Add(60 * time.Second); !qw.w.Ready() || len(qw.w.Assignment().Actives[cl]) != n; {
		if time.Now().After(deadline) {
			t.Fatalf("worker never ready with %d partitions: %+v", n, qw.w.Assignment())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
