package app

import (
	"errors"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestPprofOptIn checks that /debug/pprof/ is served only with WithPprof.
func TestPprofOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		w, err := New("pprof-app", WithPprof(on), WithDataDir(t.TempDir())).NewWorker(WorkerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(w.httpMux())
		code, body := get(t, srv.URL+"/debug/pprof/goroutine?debug=1")
		srv.Close()
		switch {
		case on && (code != http.StatusOK || !strings.Contains(body, "goroutine profile")):
			t.Errorf("WithPprof(true): %d %.200s", code, body)
		case !on && code != http.StatusNotFound:
			t.Errorf("WithPprof(false): %d, want 404", code)
		}
	}
}

// TestListenAddrLocalhost checks that an address without a host binds the
// loopback interface only, and a named host is kept.
func TestListenAddrLocalhost(t *testing.T) {
	for in, want := range map[string]string{":8080": "127.0.0.1:8080", "0.0.0.0:8080": "0.0.0.0:8080",
		"[::]:9": "[::]:9", "10.1.2.3:80": "10.1.2.3:80", "localhost:1": "localhost:1"} {
		if got := listenAddr(in); got != want {
			t.Errorf("listenAddr(%q) = %q, want %q", in, got, want)
		}
	}
	ln, err := net.Listen("tcp", listenAddr(":0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		t.Errorf(`":0" bound %v, want a loopback address`, ip)
	}
}

// TestAckTimeoutCounted checks that an agent stream failed by the ack
// timeout, as agent.Run reports it, is counted, and another failure is not.
func TestAckTimeoutCounted(t *testing.T) {
	w, err := New("ack-app", WithDataDir(t.TempDir())).NewWorker(WorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := w.metrics
	m.agentFailed("in", "a", &agent.Error{Agent: "a", Offset: -1, Stream: true,
		Err: &source.AckTimeoutError{Key: "in[0]", ID: "a", Offset: 7, Timeout: time.Second}})
	m.agentFailed("in", "a", &agent.Error{Agent: "a", Offset: 3, Err: errors.New("boom")})
	if n, samples := counterSum(t, m, "runnel_ack_timeouts_total"); n != 1 || samples != 1 {
		t.Errorf("runnel_ack_timeouts_total = %v in %d samples, want 1 sample of 1", n, samples)
	}
}

// counterSum gathers m and returns the sum of counter name over its label
// values, and how many samples it has.
func counterSum(t *testing.T, m *metrics, name string) (float64, int) {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	samples := 0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, s := range mf.GetMetric() {
				n += s.GetCounter().GetValue()
				samples++
			}
		}
	}
	return n, samples
}

// statusWorker is a worker of an app with table counts (3 partitions, a
// memory store) that was never run: no broker; its assignments are fed with
// onAssignment and its restores with the restorer's progress callback.
func statusWorker(t *testing.T) (*Worker, string) {
	t.Helper()
	ap := New("st", WithDataDir(t.TempDir()), WithLogger(slog.New(slog.DiscardHandler)))
	counts := table.New(ap, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(3))
	w, err := ap.NewWorker(WorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := stores.NewMemory()
	w.tables = append(w.tables, &tableRuntime{def: counts, parts: 3, store: st, state: tablestate.NewState(counts, 3, st, nil)})
	return w, counts.Changelog()
}

// restoredParts returns the partitions of table counts in s.Restores.
func restoredParts(s Status) []int32 {
	var ps []int32
	for _, r := range s.Restores {
		if r.Table == "counts" {
			ps = append(ps, r.Partition)
		}
	}
	return ps
}

// gaugeParts returns the partition label of every series of gauge name.
func gaugeParts(t *testing.T, m *metrics, name string) []string {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ps []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "partition" {
					ps = append(ps, l.GetValue())
				}
			}
		}
	}
	slices.Sort(ps)
	return ps
}

// A restore stays on the status page while this worker holds a copy of its
// partition (active, or kept as a standby) and leaves it, with its restore
// gauges, when the partition moved away: at the assignment that moves it,
// and also when the restore's last report arrives after that assignment.
func TestStatusRestoresLeaveWithTheirPartition(t *testing.T) {
	w, cl := statusWorker(t)
	report := w.metrics.restoreProgress(w.tableOfChangelog)
	w.onAssignment(assignor.Assignment{Generation: 1, MemberID: "m1", Actives: map[string][]int32{cl: {0, 1, 2}}})
	for p := range int32(3) {
		report(changelog.Progress{Topic: cl, Partition: p, Records: 10, Position: 10, Target: 10, Done: true})
	}
	if got := restoredParts(w.Status()); !slices.Equal(got, []int32{0, 1, 2}) {
		t.Fatalf("restores %v while active for 0-2, want [0 1 2]", got)
	}

	// Partition 1 moves away and stays here as a standby; partition 2 moves
	// away altogether.
	w.onAssignment(assignor.Assignment{Generation: 2, MemberID: "m1",
		Actives: map[string][]int32{cl: {0}}, Standbys: map[string][]int32{cl: {1}}})
	if got := restoredParts(w.Status()); !slices.Equal(got, []int32{0, 1}) {
		t.Errorf("restores %v after partition 2 moved away (1 kept as a standby), want [0 1]", got)
	}
	for _, g := range []string{"runnel_restore_remaining_records", "runnel_restore_rate_records_per_second"} {
		if got := gaugeParts(t, w.metrics, g); !slices.Equal(got, []string{"0", "1"}) {
			t.Errorf("%s has series of partitions %v, want [0 1]", g, got)
		}
	}

	// A report of partition 2's restore that arrives after the assignment
	// (the restore ran until its claim stopped) does not bring it back.
	report(changelog.Progress{Topic: cl, Partition: 2, Records: 4, Position: 4, Target: 30})
	if got := restoredParts(w.Status()); !slices.Equal(got, []int32{0, 1}) {
		t.Errorf("restores %v after a late report of moved partition 2, want [0 1]", got)
	}
	// The next assignment without it drops its entry and gauges.
	w.onAssignment(assignor.Assignment{Generation: 3, MemberID: "m1", Actives: map[string][]int32{cl: {0}}})
	if got := restoredParts(w.Status()); !slices.Equal(got, []int32{0}) {
		t.Errorf("restores %v after partition 1 left as a standby too, want [0]", got)
	}
	if got := gaugeParts(t, w.metrics, "runnel_restore_remaining_records"); !slices.Equal(got, []string{"0"}) {
		t.Errorf("runnel_restore_remaining_records has series of partitions %v, want [0]", got)
	}
}

// The rates are the counters' increase between the oldest and the newest
// sample of the last 10 s, over the time between them; a task's rate counts
// from 0 at the last sample taken before it (re)started: a sample without
// it, or one whose count is above the next one's.
func TestStatusRatesFromSamples(t *testing.T) {
	var r rateSampler
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	k1, k2, k3 := taskKey{4, 1}, taskKey{4, 2}, taskKey{4, 3}
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	if got := r.rates(); got.window != 0 || got.processed != 0 {
		t.Fatalf("rates of no samples %+v, want zero", got)
	}
	r.add(counterSample{at: at(0), processed: 1000, handed: map[taskKey]int64{k1: 500, k2: 900}}, rateWindow)
	if got := r.rates(); got.window != 0 || got.processed != 0 || len(got.handed) != 0 {
		t.Fatalf("rates of one sample %+v, want zero", got)
	}
	r.add(counterSample{at: at(5), processed: 1100, retried: 5, handed: map[taskKey]int64{k1: 550, k2: 10}}, rateWindow)
	r.add(counterSample{at: at(10), processed: 1300, retried: 5, deadLettered: 2,
		handed: map[taskKey]int64{k1: 700, k2: 60, k3: 5}}, rateWindow)
	got := r.rates()
	want := rates{window: 10 * time.Second, processed: 30, retried: 0.5, deadLettered: 0.2,
		handed: map[taskKey]float64{k1: 20, k2: 6, k3: 1}} // k2 restarted after 0 s: 60/10; k3 started after 5 s: 5/5
	if got.window != want.window || got.processed != want.processed || got.retried != want.retried ||
		got.deadLettered != want.deadLettered || !maps.Equal(got.handed, want.handed) {
		t.Fatalf("rates over 0-10 s = %+v, want %+v", got, want)
	}
	// At 12 s the sample of 0 s is out of the window: 5-12 s.
	r.add(counterSample{at: at(12), processed: 1440, retried: 5, deadLettered: 2,
		handed: map[taskKey]int64{k1: 756, k2: 60, k3: 25}}, rateWindow)
	got = r.rates()
	if got.window != 7*time.Second || got.processed != 340.0/7 || got.retried != 0 || got.deadLettered != 2.0/7 ||
		got.handed[k1] != 206.0/7 || got.handed[k2] != 50.0/7 || got.handed[k3] != 25.0/7 {
		t.Fatalf("rates over 5-12 s = %+v, want window 7 s, processed 340/7, dead-lettered 2/7, tasks 206/7, 50/7, 25/7", got)
	}
}

// A member's HTTP address links to its status page when it names a host.
func TestStatusMemberHref(t *testing.T) {
	for addr, want := range map[string]string{
		"10.0.0.5:8080":            "http://10.0.0.5:8080/",
		"[::1]:9":                  "http://[::1]:9/",
		"https://w1.example:8443":  "https://w1.example:8443/",
		"http://w1.example/runnel": "http://w1.example/runnel",
		":8080":                    "",
		"":                         "",
		"javascript:alert(1)":      "",
		"ftp://w1.example/":        "",
	} {
		if got := memberHref(addr); got != want {
			t.Errorf("memberHref(%q) = %q, want %q", addr, got, want)
		}
	}
}

// The status page of a worker that is not running is rendered by the server
// (no script needed to see it) and says why it has no members; ?part=main
// is its main element alone, which the page's script swaps in.
func TestStatusPageServerRendered(t *testing.T) {
	w, cl := statusWorker(t)
	w.onAssignment(assignor.Assignment{Generation: 4, MemberID: "m1", Actives: map[string][]int32{cl: {0, 2}}})
	srv := httptest.NewServer(w.httpMux())
	defer srv.Close()
	code, page := get(t, srv.URL+"/")
	for _, want := range []string{
		"<title>Runnel worker · st</title>",
		`<h1>Runnel app <span id="app">st</span></h1>`,
		`<span id="generation">4</span>`,
		`<td>active</td><td>` + cl + `</td><td>0,2</td>`,
		"none (describe group st: worker not running)",
		`<td class="n">0</td><td class="n">?</td><td class="n bad">?</td>`, // counts[0]: restored 0, end offset unknown
		`setInterval(refresh, 2000)`,
	} {
		if code != http.StatusOK || !strings.Contains(page, want) {
			t.Errorf("GET /: %d, lacks %q", code, want)
		}
	}
	if external := regexp.MustCompile(`(?i)\ssrc=|<link|@import|url\(`).FindString(page); external != "" {
		t.Errorf("the page loads a resource (%q); it must be self-contained", external)
	}
	code, part := get(t, srv.URL+"/?part=main")
	if code != http.StatusOK || !strings.HasPrefix(part, `<main id="main">`) || !strings.HasSuffix(part, "</main>") ||
		!strings.Contains(part, `<span id="generation">4</span>`) {
		t.Errorf("GET /?part=main: %d %.300q, want the main element alone", code, part)
	}
	if code, _ := get(t, srv.URL+"/?part=nav"); code != http.StatusBadRequest {
		t.Errorf("GET /?part=nav: %d, want 400", code)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("page:\n%s", page)
	}
}

// The broker answers are asked again only when older than brokerFresh or
// missing a copy asked for, one refresh at a time; a Status waits for a
// refresh at most brokerWait from its start and otherwise gets the previous
// answers with the refresh's age; a stopped cache asks nothing.
func TestStatusBrokerAnswersCache(t *testing.T) {
	k0, k1 := restoreKey{"cl", 0}, restoreKey{"cl", 1}
	var asks atomic.Int32
	var gate chan struct{} // nil: answer at once
	var mu sync.Mutex
	b := &brokerAnswers{}
	b.ask = func(started time.Time, want []restoreKey) *brokerSnapshot {
		n := asks.Add(1)
		mu.Lock()
		g := gate
		mu.Unlock()
		if g != nil {
			<-g
		}
		s := &brokerSnapshot{started: started, asked: map[restoreKey]bool{}, ends: map[restoreKey]int64{}}
		for _, k := range want {
			s.asked[k], s.ends[k] = true, int64(100*n)+int64(k.p)
		}
		return s
	}
	b.setOpen(true)
	hw := func(v brokerView, k restoreKey) int64 {
		t.Helper()
		off, err := v.snap.highwater(k.table, k.p)
		if err != nil {
			t.Fatalf("highwater of %v: %v", k, err)
		}
		return off
	}

	if v := b.get([]restoreKey{k0}); asks.Load() != 1 || hw(v, k0) != 100 || !v.refreshing.IsZero() {
		t.Fatalf("first get: %d asks, view %+v; want 1 ask answered at once", asks.Load(), v)
	}
	if v := b.get([]restoreKey{k0}); asks.Load() != 1 || hw(v, k0) != 100 {
		t.Fatalf("get of fresh answers: %d asks; want still 1", asks.Load())
	}
	if v := b.get([]restoreKey{k0, k1}); asks.Load() != 2 || hw(v, k1) != 201 {
		t.Fatalf("get with a new copy: %d asks, view %+v; want a second ask that covers it", asks.Load(), v)
	}

	// The broker stalls: answers 2 s old are served after brokerWait.
	mu.Lock()
	gate = make(chan struct{})
	mu.Unlock()
	b.mu.Lock()
	b.last = &brokerSnapshot{started: time.Now().Add(-2 * time.Second), asked: b.last.asked, ends: b.last.ends}
	b.mu.Unlock()
	start := time.Now()
	v := b.get([]restoreKey{k0, k1})
	took := time.Since(start)
	if asks.Load() != 3 || took < brokerWait-50*time.Millisecond || took > time.Second || hw(v, k1) != 201 || v.refreshing.IsZero() {
		t.Fatalf("get of stale answers with a stalled broker: %d asks, %v, view %+v; want 3 asks, the old answers after ~%v, refreshing",
			asks.Load(), took, v, brokerWait)
	}
	if a := answersOf(v, time.Now()); a.AgeMS < 2000 || a.RefreshingMS < float64(brokerWait.Milliseconds())-50 || a.Error != "" {
		t.Errorf("answers while the refresh waits: %+v; want over 2 s old, a refresh under way for about %v", a, brokerWait)
	}
	start = time.Now()
	if v := b.get([]restoreKey{k0, k1}); asks.Load() != 3 || time.Since(start) > 100*time.Millisecond || v.refreshing.IsZero() {
		t.Fatalf("second get while the refresh waits: %d asks after %v; want no new ask, no wait", asks.Load(), time.Since(start))
	}
	close(gate)
	for deadline := time.Now().Add(10 * time.Second); ; {
		v := b.get([]restoreKey{k0, k1})
		if v.refreshing.IsZero() && hw(v, k0) == 300 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stalled refresh's answers never arrived: %+v", v)
		}
		time.Sleep(10 * time.Millisecond)
	}

	b.setOpen(false)
	b.mu.Lock()
	b.last = &brokerSnapshot{started: time.Now().Add(-time.Minute)}
	b.mu.Unlock()
	n := asks.Load()
	if v := b.get([]restoreKey{k0}); asks.Load() != n || !v.closed {
		t.Fatalf("get after stop: %d asks, view %+v; want no ask", asks.Load()-n, v)
	}
}
