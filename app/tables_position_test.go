package app_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/client"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// rywSleep is how long the agent of rywApp sleeps before it counts a record
// whose value is "slow": a read right after the produce runs before the
// record's effect, whatever the machine's load.
const rywSleep = 1500 * time.Millisecond

// rywApp counts records per key into "counts" (3 partitions, one standby
// replica) and per key and minute of record time into the windowed table
// "per-minute"; a record valued "slow" is counted after rywSleep.
type rywApp struct {
	app       *app.App
	in        *agent.Topic[string, string]
	other     *agent.Topic[string, string] // a source of the same tasks whose agent writes no table
	counts    *table.Table[string, int64]
	perMinute *table.Windowed[string, int64]
	addr      string
}

func newRYWApp(t *testing.T, id string) *rywApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r := &rywApp{addr: addr, app: app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200*time.Millisecond),
		app.WithReplicas(1),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id+"-"),
		app.WithHTTPAddr(addr))}
	r.in = app.Topic(r.app, "in", codec.String(), codec.String(), app.Partitions(gparts))
	r.counts = table.New(r.app, "counts", codec.String(), codec.DecimalInt64())
	r.perMinute = table.NewWindowed(r.app, "per-minute", codec.String(), codec.DecimalInt64(), table.Tumbling(time.Minute),
		table.Grace(time.Hour))
	agent.New(r.app, "count", r.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if ev.Value == "slow" {
				time.Sleep(rywSleep)
			}
			r.counts.Update(ev, ev.Key, func(c int64) int64 { return c + 1 })
			r.perMinute.Update(ev, ev.Key, func(c int64) int64 { return c + 1 })
		}
		return s.Err()
	}, agent.WritesTo(r.counts), agent.WritesTo(r.perMinute))
	r.other = app.Topic(r.app, "other", codec.String(), codec.String(), app.Partitions(gparts))
	agent.New(r.app, "ignore", r.other, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for range s.Events() {
		}
		return s.Err()
	})
	return r
}

type rywWorker struct {
	r *rywApp
	w *app.Worker
}

func startRYWWorker(t *testing.T, brokers []string, id, name string) *rywWorker {
	t.Helper()
	r := newRYWApp(t, id)
	w, err := r.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir(), Name: name})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker %s: %v", name, err)
		}
	})
	return &rywWorker{r: r, w: w}
}

// rywProducer sends records with explicit timestamps and returns where the
// broker put them.
type rywProducer struct {
	t     *testing.T
	topic string
	prod  sarama.SyncProducer
}

func newRYWProducer(t *testing.T, brokers []string, topic string) *rywProducer {
	prod := testbroker.SyncProducer(t, brokers)
	t.Cleanup(func() { prod.Close() })
	return &rywProducer{t: t, topic: topic, prod: prod}
}

func (p *rywProducer) send(key, value string, at time.Time) app.SourcePosition {
	p.t.Helper()
	part, off, err := p.prod.SendMessage(&sarama.ProducerMessage{Topic: p.topic, Partition: kafka.PartitionFor([]byte(key), gparts),
		Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(value), Timestamp: at})
	if err != nil {
		p.t.Fatal(err)
	}
	return app.SourcePosition{Topic: p.topic, Partition: part, Offset: off}
}

// settleRYW waits until both workers hold one generation, every partition of
// the counts changelog is active on one and standby on the other, and both
// are ready.
func settleRYW(t *testing.T, w1, w2 *rywWorker) {
	t.Helper()
	changelog := w1.w.Tables()[0].Changelog
	for _, ti := range w1.w.Tables() {
		if ti.Name == "counts" {
			changelog = ti.Changelog
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		a1, a2 := w1.w.Assignment(), w2.w.Assignment()
		act := append(slices.Clone(a1.Actives[changelog]), a2.Actives[changelog]...)
		sb := append(slices.Clone(a1.Standbys[changelog]), a2.Standbys[changelog]...)
		slices.Sort(act)
		slices.Sort(sb)
		if w1.w.Ready() && w2.w.Ready() && a1.Generation == a2.Generation && len(a1.Pending) == 0 && len(a2.Pending) == 0 &&
			slices.Equal(act, []int32{0, 1, 2}) && slices.Equal(sb, []int32{0, 1, 2}) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers did not settle: %+v / %+v", a1, a2)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReadYourWrites (issue #27, read-your-writes): a record whose agent
// takes 1.5 s is produced, and the key is read right after the produce.
// Without a bound the active answers the old count (the read runs before
// the effect); with ?position= the answer waits for the record's effect
// and shows the new count, or, when the wait is shorter than the agent's
// sleep, is a 503 position-not-reached with Retry-After and the position
// the active reached. A standby read (consistency=any) with the bound is
// forwarded to the active instead of answering the standby's older value;
// with forward=0 it is refused. The Go client's AtLeast does the same.
// Bad positions and waits are 400s; a bound of another partition does not
// hold a read back.
func TestReadYourWrites(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "ryw")
	w1 := startRYWWorker(t, brokers, id, "w1")
	w2 := startRYWWorker(t, brokers, id, "w2")
	topic := w1.r.in.Name()
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), topic)
	pr := newRYWProducer(t, brokers, topic)
	now := time.Now()
	pr.send("k", "x", now)
	testbroker.WaitLag0(t, brokers, id, topic)
	settleRYW(t, w1, w2)

	p := kafka.PartitionFor([]byte("k"), gparts)
	changelog := ""
	for _, ti := range w1.w.Tables() {
		if ti.Name == "counts" {
			changelog = ti.Changelog
		}
	}
	owner, other := w1, w2
	if !slices.Contains(w1.w.Assignment().Actives[changelog], p) {
		owner, other = w2, w1
	}
	if !slices.Contains(other.w.Assignment().Standbys[changelog], p) {
		t.Fatalf("the other worker holds no standby of partition %d", p)
	}
	// The standby has applied the first count (committed, then followed).
	deadline := time.Now().Add(20 * time.Second)
	for {
		a := mustQuery(t, other.r.addr, "counts/k?consistency=any&maxLag=0", nil)
		if a.code == http.StatusOK && a.Value == float64(1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("standby read: %v", a)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The bound on the active.
	pos := pr.send("k", "slow", now)
	if pos.Partition != p {
		t.Fatalf("record went to partition %d, want %d", pos.Partition, p)
	}
	bound := "position=" + pos.String()
	if a := mustQuery(t, owner.r.addr, "counts/k", nil); a.code != http.StatusOK || a.Value != float64(1) {
		t.Fatalf("read without a bound right after the produce: %v, want the old count 1 (the agent sleeps %v)", a, rywSleep)
	}
	a := mustQuery(t, owner.r.addr, "counts/k?"+bound+"&wait=50ms", nil)
	if a.code != http.StatusServiceUnavailable || a.Reason != app.ReasonPositionNotReached || a.h.Get("Retry-After") != "1" ||
		a.Role != app.RoleActive || !strings.HasPrefix(a.Position, topic+":"+strconv.Itoa(int(p))+":") {
		t.Fatalf("read with a 50 ms wait: %v, want 503 %s with Retry-After 1 and the active's position", a, app.ReasonPositionNotReached)
	}
	if reached, _ := app.ParsePosition(a.Position); len(reached) != 1 || reached[0].Offset >= pos.Offset {
		t.Fatalf("refusal's position %q: want one entry below offset %d", a.Position, pos.Offset)
	}
	// The standby, asked with the bound, forwards to the active (which
	// waits) rather than answer its own older count.
	start := time.Now()
	a = mustQuery(t, other.r.addr, "counts/k?consistency=any&maxLag=1000&"+bound+"&wait=3s", nil)
	if a.code != http.StatusOK || a.Value != float64(2) || a.Role != app.RoleActive || a.h.Get(app.ServedByHeader) != owner.r.addr {
		t.Fatalf("standby read with the bound: %v, want 200 with 2 from the active %s", a, owner.r.addr)
	}
	if reached, _ := app.ParsePosition(a.Position); len(reached) != 1 || reached[0].Offset < pos.Offset {
		t.Fatalf("answer's position %q: want offset >= %d", a.Position, pos.Offset)
	}
	t.Logf("bounded read answered after %v (agent sleep %v)", time.Since(start).Round(time.Millisecond), rywSleep)

	// Another slow record: the standby with forward=0 refuses; the client
	// with AtLeast reads the new count, without it the old one.
	pos = pr.send("k", "slow", now)
	bound = "position=" + pos.String()
	a = mustQuery(t, other.r.addr, "counts/k?consistency=any&maxLag=1000&forward=0&"+bound, nil)
	if a.code != http.StatusServiceUnavailable || a.Reason != app.ReasonPositionNotReached || a.Role != app.RoleStandby {
		t.Fatalf("standby read with the bound and forward=0: %v, want 503 %s from the standby", a, app.ReasonPositionNotReached)
	}
	c := client.New(w1.r.addr, w2.r.addr)
	ctx := context.Background()
	v, found, err := c.Query(ctx, "counts", "k")
	if err != nil || !found || string(v) != "2" {
		t.Fatalf("client read without a bound: %s %v %v, want the old count 2", v, found, err)
	}
	_, _, err = c.Query(ctx, "counts", "k", client.AtLeast(client.Position{Topic: pos.Topic, Partition: pos.Partition, Offset: pos.Offset}),
		client.WaitFor(10*time.Millisecond))
	var re *client.RetryableError
	if !errors.As(err, &re) || re.Reason != app.ReasonPositionNotReached || re.RetryAfter != time.Second {
		t.Fatalf("client read with a 10 ms wait: %v, want a RetryableError %s", err, app.ReasonPositionNotReached)
	}
	v, found, err = c.Query(ctx, "counts", "k", client.AtLeast(client.Position{Topic: pos.Topic, Partition: pos.Partition, Offset: pos.Offset}),
		client.WaitFor(3*time.Second))
	if err != nil || !found || string(v) != "3" {
		t.Fatalf("client read with the bound: %s %v %v, want 3", v, found, err)
	}

	// A bound of another partition does not hold the read back; bad input
	// is a 400 naming the problem.
	q := (p + 1) % gparts
	start = time.Now()
	a = mustQuery(t, owner.r.addr, "counts/k?position="+topic+":"+strconv.Itoa(int(q))+":999999", nil)
	if a.code != http.StatusOK || a.Value != float64(3) || time.Since(start) > 400*time.Millisecond {
		t.Fatalf("bound of partition %d: %v after %v, want 3 at once", q, a, time.Since(start))
	}
	for _, bad := range []struct{ query, want string }{
		{"position=" + topic + ":0", "want topic:partition:offset"},
		{"position=" + topic + ":x:1", "partition"},
		{"position=" + topic + ":0:-1", "offset"},
		{"position=nope:0:1", "not a source topic"},
		{"position=" + owner.r.other.Name() + ":0:1", "no agent of"},
		{"position=" + topic + ":7:1", "out of [0, 3)"},
		{bound + "&wait=10s", "want a duration"},
		{bound + "&wait=soon", "want a duration"},
		{"wait=1s", "with a position only"},
	} {
		a := mustQuery(t, owner.r.addr, "counts/k?"+bad.query, nil)
		if a.code != http.StatusBadRequest || a.Reason != app.ReasonBadRequest || !strings.Contains(a.Error, bad.want) {
			t.Errorf("?%s: %v, want 400 %s saying %q", bad.query, a, app.ReasonBadRequest, bad.want)
		}
	}
	_, _, err = c.Query(ctx, "counts", "k", client.AtLeast(client.Position{Topic: "nope", Offset: 1}))
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest {
		t.Errorf("client read with a bad bound: %v, want a 400 *client.Error", err)
	}
}

// TestWindowedLookup (issue #27, windowed lookups): records of key "w" fall
// in four minutes (two in the first); GET /api/tables/per-minute/w/windows
// lists the windows whose start is in [from, to] with their counts, through
// either worker (the other forwards), RFC 3339 or Unix-ms bounds, a limit
// with more=true, a neighbour key "w2" never mixed in; a window written
// right now is listed under a position bound (the read sees the write
// cache). The client's Windows reads the owner directly. Bad input is a 400
// naming the problem; an unknown table a 404.
func TestWindowedLookup(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "wlook")
	w1 := startRYWWorker(t, brokers, id, "w1")
	w2 := startRYWWorker(t, brokers, id, "w2")
	topic := w1.r.in.Name()
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), topic)
	pr := newRYWProducer(t, brokers, topic)
	// Recent minutes: a record older than the input topic's time
	// retention may be deleted before it is processed.
	m0 := time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
	for _, at := range []time.Duration{0, 10 * time.Second, 70 * time.Second, 130 * time.Second, 190 * time.Second} {
		pr.send("w", "x", m0.Add(at))
	}
	pr.send("w2", "x", m0.Add(70*time.Second))
	testbroker.WaitLag0(t, brokers, id, topic)
	settleRYW(t, w1, w2)

	type win struct {
		start time.Time
		n     float64
	}
	list := func(addr, query string) (answer, []win) {
		t.Helper()
		a := mustQuery(t, addr, "per-minute/w/windows?"+query, nil)
		var got []win
		for _, it := range a.Windows {
			if it.End.Sub(it.Start) != time.Minute {
				t.Fatalf("window [%v, %v): want a minute", it.Start, it.End)
			}
			got = append(got, win{it.Start, it.Value.(float64)})
		}
		return a, got
	}
	all := []win{{m0, 2}, {m0.Add(time.Minute), 1}, {m0.Add(2 * time.Minute), 1}, {m0.Add(3 * time.Minute), 1}}
	for _, qw := range []*rywWorker{w1, w2} {
		a, got := list(qw.r.addr, "")
		if a.code != http.StatusOK || !slices.Equal(got, all) || a.More || !a.Found {
			t.Fatalf("all windows via %s: %v %v, want %v", qw.r.addr, a, got, all)
		}
		a, got = list(qw.r.addr, "from="+m0.Add(30*time.Second).Format(time.RFC3339)+"&to="+strconv.FormatInt(m0.Add(2*time.Minute).UnixMilli(), 10))
		if a.code != http.StatusOK || !slices.Equal(got, all[1:3]) {
			t.Fatalf("windows starting in [m0+30s, m0+2m] via %s: %v %v, want %v", qw.r.addr, a, got, all[1:3])
		}
		a, got = list(qw.r.addr, "limit=3")
		if a.code != http.StatusOK || !slices.Equal(got, all[:3]) || !a.More {
			t.Fatalf("limit=3 via %s: %v %v, want the first 3 and more", qw.r.addr, a, got)
		}
		a, got = list(qw.r.addr, "from="+m0.Add(5*time.Minute).Format(time.RFC3339))
		if a.code != http.StatusOK || len(got) != 0 || a.Found {
			t.Fatalf("no windows after m0+5m via %s: %v", qw.r.addr, a)
		}
	}
	c := client.New(w1.r.addr, w2.r.addr)
	ctx := context.Background()
	ws, err := c.Windows(ctx, "per-minute", "w", m0, m0.Add(time.Hour))
	if err != nil || len(ws) != 4 || string(ws[0].Value) != "2" || !ws[3].Start.Equal(m0.Add(3*time.Minute)) {
		t.Fatalf("client Windows: %+v %v", ws, err)
	}
	ws, err = c.Windows(ctx, "per-minute", "w2", m0, m0.Add(time.Hour))
	if err != nil || len(ws) != 1 || !ws[0].Start.Equal(m0.Add(time.Minute)) {
		t.Fatalf("client Windows of w2: %+v %v", ws, err)
	}

	// A new window, read at once with a bound: the active's write cache.
	pos := pr.send("w", "x", m0.Add(4*time.Minute))
	ws, err = c.Windows(ctx, "per-minute", "w", m0.Add(4*time.Minute), m0.Add(4*time.Minute),
		client.AtLeast(client.Position{Topic: pos.Topic, Partition: pos.Partition, Offset: pos.Offset}), client.WaitFor(3*time.Second))
	if err != nil || len(ws) != 1 || string(ws[0].Value) != "1" {
		t.Fatalf("client Windows with a bound: %+v %v", ws, err)
	}

	for _, bad := range []struct {
		path string
		code int
		want string
	}{
		{"per-minute/w/windows?from=yesterday", 400, "want Unix milliseconds or an RFC 3339 time"},
		{"per-minute/w/windows?from=2000&to=1000", 400, "is before from"},
		{"per-minute/w/windows?limit=0", 400, "limit"},
		{"per-minute/w/windows?limit=5000", 400, "limit"},
		{"per-minute/w/windows?at=5", 400, "unknown parameter"},
		{"counts/w/windows", 400, "not windowed"},
		{"per-minute/w", 400, "is windowed"},
		{"per-hour/w/windows", 404, "no table"},
	} {
		a := mustQuery(t, w1.r.addr, bad.path, nil)
		if a.code != bad.code || !strings.Contains(a.Error, bad.want) {
			t.Errorf("%s: %v, want %d saying %q", bad.path, a, bad.code, bad.want)
		}
	}
	if _, err := c.Windows(ctx, "counts", "w", m0, m0); err == nil {
		t.Errorf("client Windows of a plain table: no error")
	}
}
