package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/internal/testtool"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// statusCluster runs two workers of one opsApp (two declarations of the same
// app ID, each with its own HTTP address) until the test ends.
func statusCluster(t *testing.T) (id string, apps [2]*opsApp, workers [2]*app.Worker, brokers []string) {
	t.Helper()
	brokers = testbroker.Brokers(t)
	id = testbroker.Topic(t, "app")
	ctx, cancel := context.WithCancel(context.Background())
	var dones []chan error
	t.Cleanup(func() {
		cancel()
		for _, d := range dones {
			if err := <-d; err != nil {
				t.Error(err)
			}
		}
	})
	for i := range apps {
		apps[i] = newOpsApp(t, id)
		w, err := apps[i].app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir(), Name: fmt.Sprintf("w%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		workers[i] = w
		done := make(chan error, 1)
		dones = append(dones, done)
		go func() { done <- w.Run(ctx) }()
	}
	return id, apps, workers, brokers
}

func getStatus(t *testing.T, addr string) (app.Status, map[string]any) {
	t.Helper()
	body := httpGet(t, "http://"+addr+"/api/status")
	var s app.Status
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	return s, raw
}

// taskParts returns the partitions of a status's tasks in state.
func taskParts(s app.Status, state string) []int32 {
	var ps []int32
	for _, tk := range s.Tasks {
		if tk.State == state {
			ps = append(ps, tk.Partition)
		}
	}
	return ps
}

// settled reports whether the two statuses show a stable 2-member group: the
// same generation, both ready, every partition a running task on exactly
// one worker and a standby task on the other, whose changelog it follows.
func settled(ss [2]app.Status) bool {
	var running, standby []int32
	for _, s := range ss {
		if !s.Ready || len(s.Members) != 2 || s.Assignment.Generation != ss[0].Assignment.Generation || len(s.Tasks) != parts {
			return false
		}
		r, sb := taskParts(s, app.TaskRunning), taskParts(s, app.TaskStandby)
		if len(r) == 0 || len(r)+len(sb) != parts || len(s.StandbyLag) != len(sb) {
			return false
		}
		running, standby = append(running, r...), append(standby, sb...)
	}
	slices.Sort(running)
	slices.Sort(standby)
	return slices.Equal(running, []int32{0, 1, 2, 3}) && slices.Equal(standby, []int32{0, 1, 2, 3})
}

var snake = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// checkSnake fails on a JSON object key that is not snake_case, below the
// objects whose keys are data (topic names, partitions).
func checkSnake(t *testing.T, path string, v any) {
	t.Helper()
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if !snake.MatchString(k) {
				t.Errorf("JSON key %s.%s is not snake_case", path, k)
			}
			switch k {
			case "actives", "standbys", "warmups", "globals", "pending", "urls", "partitions":
				continue // topic -> partitions
			}
			checkSnake(t, path+"."+k, c)
		}
	case []any:
		for _, c := range x {
			checkSnake(t, path+"[]", c)
		}
	}
}

// TestStatusTwoWorkers runs a 2-worker cluster on the test broker, sends 40
// records (3 dead-lettered by agent fwd) and checks what /api/status and the
// status page at / show on both workers: both members, the partitions split
// between their tasks, lag 0 on each worker's claims, the other worker's
// partitions as standbys caught up, the latest rebalance, dead-letter counts
// that add up to 3, processed counts that add up to 40 and processed rates
// that account for the 40 (checkRates). The page as curl gets it (no script)
// shows the same, with the other worker's page as a link (curlPage); then it
// is loaded in headless Chromium (Debian chromium; .ci/run installs it), its
// DOM after the script's refreshes checked and a screenshot kept (go test
// -artifacts).
func TestStatusTwoWorkers(t *testing.T) {
	id, apps, workers, brokers := statusCluster(t)
	var ss [2]app.Status
	for deadline := time.Now().Add(60 * time.Second); ; {
		up := true
		for i, o := range apps {
			resp, err := http.Get("http://" + o.addr + "/api/status")
			if err != nil {
				up = false // not listening yet
				continue
			}
			ss[i] = app.Status{}
			err = json.NewDecoder(resp.Body).Decode(&ss[i])
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		if up && settled(ss) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("group never settled: %+v\n%+v", ss[0], ss[1])
		}
		time.Sleep(200 * time.Millisecond)
	}
	gen := ss[0].Assignment.Generation
	var recs []kv
	for i := range 40 {
		v := "ok"
		if i%13 == 5 {
			v = "bad"
		}
		recs = append(recs, kv{fmt.Sprintf("w%d", i%10), v})
	}
	sent := time.Now()
	send(t, brokers, apps[0].words.Name(), recs...)
	testbroker.WaitLag0(t, brokers, id, apps[0].words.Name())
	checkRates(t, apps, sent, 40)
	// Standbys apply a changelog record once its source offset is committed
	// (lag 0 above): wait for them to catch up.
	var raws [2]map[string]any
	for deadline := time.Now().Add(30 * time.Second); ; {
		caught := true
		for i, o := range apps {
			ss[i], raws[i] = getStatus(t, o.addr)
			for _, sl := range ss[i].StandbyLag {
				caught = caught && sl.Lag == 0 && sl.Highwater > 0
			}
		}
		if caught {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("standbys never caught up: %+v / %+v", ss[0].StandbyLag, ss[1].StandbyLag)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ss[0].Assignment.Generation != gen || ss[1].Assignment.Generation != gen {
		t.Fatalf("a rebalance happened while records were processed (generation %d, now %d/%d): counts below are not per worker",
			gen, ss[0].Assignment.Generation, ss[1].Assignment.Generation)
	}
	var processed, dead int64
	for i, s := range ss {
		checkSnake(t, "status", raws[i])
		if s.App != id {
			t.Errorf("worker %d: app %q, want %q", i, s.App, id)
		}
		self := 0
		for _, m := range s.Members {
			if m.Self {
				self++
				if m.MemberID != s.Assignment.MemberID {
					t.Errorf("worker %d: member %s marked self, assignment member %s", i, m.MemberID, s.Assignment.MemberID)
				}
				if got := m.Partitions[apps[0].words.Name()]; !slices.Equal(got, taskParts(s, app.TaskRunning)) {
					t.Errorf("worker %d: member partitions %v, tasks %v", i, got, taskParts(s, app.TaskRunning))
				}
			}
		}
		if self != 1 {
			t.Errorf("worker %d: %d members marked self, want 1: %+v", i, self, s.Members)
		}
		var lagParts []int32
		for _, l := range s.Lag {
			lagParts = append(lagParts, l.Partition)
			if l.Lag != 0 {
				t.Errorf("worker %d: lag %+v after the group consumed everything", i, l)
			}
		}
		if !slices.Equal(lagParts, taskParts(s, app.TaskRunning)) {
			t.Errorf("worker %d: lag of partitions %v, tasks of %v", i, lagParts, taskParts(s, app.TaskRunning))
		}
		if len(s.Rebalances) == 0 || s.Rebalances[0].Generation != gen {
			t.Errorf("worker %d: rebalances %+v, want the latest of generation %d first", i, s.Rebalances, gen)
		}
		for _, d := range s.DeadLetters {
			if d.Agent == "fwd" {
				dead += d.Written
				if d.Topic != id+"-fwd-dlq" {
					t.Errorf("worker %d: dead-letter topic %q", i, d.Topic)
				}
			} else if d.Written != 0 {
				t.Errorf("worker %d: %+v, want no dead letters of agent count", i, d)
			}
		}
		if s.DeadLettered != workers[i].DeadLettered() {
			t.Errorf("worker %d: dead_lettered %d, Worker.DeadLettered %d", i, s.DeadLettered, workers[i].DeadLettered())
		}
		processed += s.Processed
	}
	if dead != 3 || processed != 40 {
		t.Errorf("dead letters %d and processed %d over both workers; want 3 and 40", dead, processed)
	}
	for i := range apps {
		curlPage(t, apps[i].addr, apps[1-i].addr, ss[i])
	}
	checkSnake(t, "assignment", func() any {
		var v any
		_ = json.Unmarshal([]byte(httpGet(t, "http://"+apps[1].addr+"/api/assignment")), &v)
		return v
	}())

	chromiumPage(t, apps[1].addr, ss[1])
}

// checkRates waits until the workers' rates over their sampled windows
// account for the n records sent at sent and processed since: the sum over
// both workers of processed_per_second times rate_window_ms is n once both
// sampled their counters after the last record, while the window still
// reaches back before the send (10 s). Each running task that handed out
// records has a handed rate. Too late to see the whole burst (a machine so
// loaded that the records took over 9 s), it only checks that some rate was
// seen.
func checkRates(t *testing.T, apps [2]*opsApp, sent time.Time, n int) {
	t.Helper()
	var last [2]app.Status
	seen := false
	for {
		var inWindow float64
		for i, o := range apps {
			last[i], _ = getStatus(t, o.addr)
			s := last[i]
			inWindow += s.ProcessedPerSecond * s.RateWindowMS / 1000
			if s.ProcessedPerSecond < 0 || s.RateWindowMS > 10_500 || (s.ProcessedPerSecond > 0 && s.RateWindowMS <= 0) {
				t.Fatalf("worker %d: processed %.1f/s over %.0f ms: want a rate >= 0 over a window of at most 10 s", i, s.ProcessedPerSecond, s.RateWindowMS)
			}
		}
		seen = seen || inWindow > 0
		if math.Round(inWindow) > float64(n) {
			t.Fatalf("rates account for %.1f records in their windows, more than the %d sent: %+v / %+v", inWindow, n, last[0], last[1])
		}
		if math.Round(inWindow) == float64(n) {
			break
		}
		if time.Since(sent) > 9*time.Second {
			if !seen {
				t.Fatalf("no processed rate seen within 9 s of sending %d records", n)
			}
			t.Logf("the burst left the rate window before both workers sampled it (%v since the send); rates not checked exactly", time.Since(sent))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i, s := range last {
		if s.RetriedPerSecond != 0 || s.DeadLetteredPerSecond*s.RateWindowMS/1000 > 3.5 {
			t.Errorf("worker %d: retried %.2f/s, dead-lettered %.2f/s over %.0f ms: want no retries and at most the 3 dead letters",
				i, s.RetriedPerSecond, s.DeadLetteredPerSecond, s.RateWindowMS)
		}
		for _, tk := range s.Tasks {
			if tk.State == app.TaskRunning && tk.Handed > 0 && tk.HandedPerSecond <= 0 {
				t.Errorf("worker %d: task %d handed out %d records in the burst, handed_per_second %v", i, tk.Partition, tk.Handed, tk.HandedPerSecond)
			}
		}
	}
}

// curlPage checks the status page of addr as curl sees it, without running
// its script: it was rendered by the worker from s, with the app, every
// member with this worker's row marked and the other worker's page as a
// link, a row per task, and the totals.
func curlPage(t *testing.T, addr, other string, s app.Status) {
	t.Helper()
	page := httpGet(t, "http://"+addr+"/")
	want := []string{
		"<title>Runnel worker · " + s.App + "</title>",
		`<h1>Runnel app <span id="app">` + s.App + `</span></h1>`,
		fmt.Sprintf(`<span id="generation">%d</span>`, s.Assignment.Generation),
		`<span id="ready" class="ok">ready</span>`,
		fmt.Sprintf(`<b id="processed">%d</b>`, s.Processed),
		fmt.Sprintf(`<b id="dead_lettered">%d</b>`, s.DeadLettered),
		`<tr class="self"><td class="ok">` + s.Assignment.MemberID + ` (this worker)</td>`,
		`<a href="http://` + other + `/">` + other + `</a>`,
		`<a href="http://` + addr + `/">` + addr + `</a>`,
	}
	for _, m := range s.Members {
		if !m.Self {
			want = append(want, "<tr><td>"+m.MemberID+"</td>")
		}
	}
	for _, p := range taskParts(s, app.TaskRunning) {
		want = append(want, fmt.Sprintf(`<tr><td>%d/%d</td><td class="ok">running</td><td></td>`, p, parts))
	}
	for _, p := range taskParts(s, app.TaskStandby) {
		want = append(want, fmt.Sprintf(`<tr><td>%d/%d</td><td class="ok">standby</td><td class="n">0</td>`, p, parts))
	}
	for _, w := range want {
		if !strings.Contains(page, w) {
			t.Errorf("GET http://%s/ (no script run) lacks %q", addr, w)
		}
	}
	if strings.Count(page, "(this worker)") != 1 {
		t.Errorf("GET http://%s/: %d rows marked as this worker, want 1", addr, strings.Count(page, "(this worker)"))
	}
	if t.Failed() {
		t.Logf("page of %s:\n%s", addr, page)
	}
}

// chromiumPage loads the status page of addr in headless Chromium for 4 s
// (virtual time) and checks what it shows: the rendering of s by the worker,
// swapped in by the page's script at least once (data-refreshes) without a
// refresh error; the dead-letter total, both members with this worker
// marked, and a task row per partition of the worker.
func chromiumPage(t *testing.T, addr string, s app.Status) {
	t.Helper()
	bin := testtool.LookPath(t, "chromium", "chromium", "apt-get install chromium")
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000"}
	url := "http://" + addr + "/"
	run := func(extra ...string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append(append(slices.Clone(args), extra...), url)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", extra, err, stderr.String())
		}
		return string(out)
	}
	dom := run("--dump-dom")
	if n := regexp.MustCompile(`<body data-refreshes="(\d+)">`).FindStringSubmatch(dom); n == nil || n[1] == "0" {
		t.Errorf("the page's script never replaced the main element (body %v)", n)
	}
	want := []string{
		`<div id="refresh" class="bad"></div>`,
		fmt.Sprintf(`<b id="dead_lettered">%d</b>`, s.DeadLettered),
		fmt.Sprintf(`<b id="processed">%d</b>`, s.Processed),
		s.Assignment.MemberID + " (this worker)",
		fmt.Sprintf(`<span id="generation">%d</span>`, s.Assignment.Generation),
	}
	for _, m := range s.Members {
		want = append(want, m.MemberID)
	}
	for _, p := range taskParts(s, app.TaskRunning) {
		want = append(want, fmt.Sprintf("<td>%d/%d</td><td class=\"ok\">running</td><td></td>", p, parts))
	}
	for _, p := range taskParts(s, app.TaskStandby) {
		want = append(want, fmt.Sprintf("<td>%d/%d</td><td class=\"ok\">standby</td><td class=\"n\">0</td>", p, parts))
	}
	for _, w := range want {
		if !strings.Contains(dom, w) {
			t.Errorf("rendered status page lacks %q", w)
		}
	}
	if t.Failed() {
		t.Logf("rendered DOM:\n%s", dom)
	}
	shot := filepath.Join(t.ArtifactDir(), "status.png")
	run("--screenshot="+shot, "--window-size=1280,1400", "--hide-scrollbars")
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 10_000 {
		t.Errorf("screenshot %s: %v (%v)", shot, fi, err)
	}
	t.Logf("screenshot: %s", shot)
}

// timedGet gets url and returns the body and how long the answer took; a
// client timeout of 20 s turns a page that waits for the stalled broker
// into a failure instead of a hung test.
func timedGet(t *testing.T, url string) (string, time.Duration) {
	t.Helper()
	start := time.Now()
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("GET %s after %v: %v", url, time.Since(start), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b), took
}

// The status page and /api/status answer within 1 s while the broker takes
// 6 s for every DescribeGroups and ListOffsets (kfake holds them): they show
// the answers cached before the stall, their age and the refresh waiting for
// the broker, and fresh answers once the broker answers again.
func TestStatusAnswersWhileBrokerStalls(t *testing.T) {
	if testbroker.Real() {
		t.Skip("stalls requests through kfake's control functions")
	}
	const stall, bound = 6 * time.Second, time.Second
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	brokers, c := b.Addrs(), b.Cluster()
	id := testbroker.Topic(t, "app")
	o := newOpsApp(t, id)
	w, err := o.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	release := make(chan struct{})
	var releaseOnce sync.Once
	t.Cleanup(func() {
		releaseOnce.Do(func() { close(release) }) // the refresh under way returns at once
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	base := "http://" + o.addr
	send(t, brokers, o.words.Name(), kv{"a", "x"}, kv{"b", "y"}, kv{"c", "z"})
	testbroker.WaitLag0(t, brokers, id, o.words.Name())
	var before app.Status
	for deadline := time.Now().Add(testbroker.WaitTimeout); ; {
		resp, err := http.Get(base + "/api/status")
		if err == nil {
			before = app.Status{}
			err = json.NewDecoder(resp.Body).Decode(&before)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if before.Ready && len(before.Members) == 1 && len(before.TablePartitions) == parts && before.Broker.Error == "" &&
				before.Broker.AgeMS < 1000 && endsKnown(before) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker never showed 1 member and every table partition with its end offset: %+v", before)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var stalled atomic.Int32
	var stalling atomic.Bool
	stalling.Store(true)
	for _, k := range []kmsg.Key{kmsg.DescribeGroups, kmsg.ListOffsets} {
		c.ControlKey(int16(k), func(kmsg.Request) (kmsg.Response, error, bool) {
			if stalling.Load() {
				stalled.Add(1)
				c.SleepControl(func() {
					select {
					case <-release:
					case <-time.After(stall):
					}
				})
			}
			return nil, nil, false // kept (not handled); answered normally after the stall
		})
	}
	stallStart := time.Now()
	time.Sleep(1100 * time.Millisecond) // the cached answers are older than their 1 s freshness: each request asks again

	var slowest time.Duration
	var during app.Status
	var page string
	for i := range 6 { // 6 requests over ~3 s, all within the first 6 s stall
		var took time.Duration
		if i%2 == 0 {
			var body string
			body, took = timedGet(t, base+"/api/status")
			during = app.Status{}
			if err := json.Unmarshal([]byte(body), &during); err != nil {
				t.Fatal(err)
			}
		} else {
			page, took = timedGet(t, base+"/")
		}
		t.Logf("request %d during the stall: %v", i, took)
		slowest = max(slowest, took)
		time.Sleep(400 * time.Millisecond)
	}
	if stalled.Load() == 0 {
		t.Fatal("no DescribeGroups or ListOffsets reached the broker during the stall: the test stalled nothing")
	}
	if slowest >= bound {
		t.Errorf("the slowest answer during the stall took %v, want under %v", slowest, bound)
	}
	// The answers shown are those from before the stall, aged, with the
	// refresh waiting for the broker.
	if len(during.Members) != 1 || during.Members[0].MemberID != before.Members[0].MemberID || !endsKnown(during) ||
		during.Broker.AgeMS < 1000 || during.Broker.RefreshingMS < 500 {
		t.Errorf("status during the stall: members %+v, broker %+v (stall began %v ago); want the member and end offsets "+
			"from before, over 1 s old, and a refresh waiting for the broker", during.Members, during.Broker, time.Since(stallStart))
	}
	for _, want := range []string{`<div id="broker" class="bad">`, "a refresh has waited", before.Members[0].MemberID + " (this worker)"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page during the stall lacks %q", want)
		}
	}

	// The broker answers again: the next requests get fresh answers.
	stalling.Store(false)
	releaseOnce.Do(func() { close(release) })
	for deadline := time.Now().Add(testbroker.WaitTimeout); ; {
		s, _ := getStatus(t, o.addr)
		if s.Broker.AgeMS < 1000 && s.Broker.RefreshingMS == 0 && s.Broker.Error == "" && len(s.Members) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("answers never fresh again after the stall: %+v", s.Broker)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// endsKnown reports whether every table partition of s has its end offset.
func endsKnown(s app.Status) bool {
	for _, tp := range s.TablePartitions {
		if tp.Lag < 0 {
			return false
		}
	}
	return len(s.TablePartitions) > 0
}
