package table_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

const (
	parts    = 4
	dataFile = "../examples/changeaudit/testdata/git-history.jsonl.gz"
	week     = 7 * 24 * time.Hour
)

func testLogger() *slog.Logger {
	if os.Getenv("RUNNEL_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func appOptions(id string) []app.Option {
	return []app.Option{
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200 * time.Millisecond),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id + "-"),
	}
}

// wkey names one window of one key: the key and the window start (Unix ms).
type wkey struct {
	key   string
	start int64
}

// closeLog records every OnClose call.
type closeLog struct {
	mu     sync.Mutex
	finals map[wkey][]int64 // every final value reported per window, in call order
	n      atomic.Int64
}

func newCloseLog() *closeLog { return &closeLog{finals: map[wkey][]int64{}} }

func (c *closeLog) onClose(k string, w table.Window, final int64) {
	c.mu.Lock()
	c.finals[wkey{k, w.Start.UnixMilli()}] = append(c.finals[wkey{k, w.Start.UnixMilli()}], final)
	c.mu.Unlock()
	c.n.Add(1)
}

// weekApp counts records per actor and ISO week (Monday 00:00 UTC) with a
// tumbling window; event time is the record timestamp (the default).
type weekApp struct {
	app     *app.App
	changes *agent.Topic[string, string]
	weeks   *table.Windowed[string, int64]
}

func newWeekApp(id string, grace time.Duration, closes *closeLog) *weekApp {
	w := &weekApp{app: app.New(id, appOptions(id)...)}
	w.changes = app.Topic(w.app, "changes", codec.String(), codec.String(), app.Partitions(parts))
	w.weeks = table.NewWindowed(w.app, "weekly", codec.String(), codec.DecimalInt64(),
		table.Tumbling(week).WithOffset(4*24*time.Hour), table.Grace(grace), table.OnClose(closes.onClose))
	agent.New(w.app, "count", w.changes, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			w.weeks.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(w.weeks))
	return w
}

// change is one line of the data file, as the test reads it.
type change struct {
	actor string
	at    time.Time
}

func readChanges(t *testing.T, limit int) []change {
	t.Helper()
	var out []change
	for _, line := range testbroker.GzipLines(t, dataFile, limit) {
		var c struct {
			Actor      string `json:"actor"`
			OccurredAt string `json:"occurred_at"`
		}
		if err := json.Unmarshal(line, &c); err != nil {
			t.Fatal(err)
		}
		at, err := time.Parse(time.RFC3339, c.OccurredAt)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, change{c.Actor, at})
	}
	return out
}

// produce sends the changes keyed by actor, with the record timestamp set to
// the change's occurred_at, in order (the idempotent producer keeps each
// partition's order).
func produce(t *testing.T, brokers []string, topic string, cs []change) {
	t.Helper()
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	testbroker.WaitTopic(t, client, topic)
	p, err := kafka.NewProducer(kafka.ProducerConfigOf(client))
	if err != nil {
		t.Fatal(err)
	}
	var failed atomic.Value
	for _, c := range cs {
		m := &sarama.ProducerMessage{Topic: topic, Partition: kafka.PartitionFor([]byte(c.actor), parts),
			Key: sarama.StringEncoder(c.actor), Value: sarama.StringEncoder(c.at.Format(time.RFC3339)), Timestamp: c.at}
		if err := p.Send(m, func(_ int32, _ int64, err error) {
			if err != nil {
				failed.Store(err)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
}

// createSource creates the source topic before the worker does, without
// time retention: its records carry timestamps from 2005 on, which the
// default retention.ms (7 days, by record timestamp) would delete before the
// worker reads them.
func createSource(t *testing.T, brokers []string, topic string) {
	t.Helper()
	testbroker.CreateTopic(t, brokers, topic, parts, map[string]string{"retention.ms": "-1"})
}

// startWorker runs a worker of a on dir; stop cancels it and returns Run's error.
func startWorker(t *testing.T, a *app.App, brokers []string, dir string) (stop func() error) {
	t.Helper()
	w, err := a.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return testbroker.Start(t, w)
}

// readWindows reads the table's changelog (latest value per stored key,
// tombstones removed) into key@start -> value, without the watermarks, and
// returns the watermarks separately.
func readWindows(t *testing.T, brokers []string, d table.Def) (rows map[string]any, marks map[string]any) {
	t.Helper()
	client, err := app.Dial(context.Background(), brokers)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	all, err := app.ReadTable(context.Background(), client, d)
	if err != nil {
		t.Fatal(err)
	}
	rows, marks = map[string]any{}, map[string]any{}
	for k, v := range all {
		if strings.HasPrefix(k, "~closed-up-to[") {
			marks[k] = v
		} else {
			rows[k] = v
		}
	}
	return rows, marks
}

// isoWeekStart is the Monday 00:00 UTC starting t's ISO week, computed from
// the calendar (not from epoch arithmetic like the table).
func isoWeekStart(t time.Time) time.Time {
	u := t.UTC()
	return time.Date(u.Year(), u.Month(), u.Day()-(int(u.Weekday())+6)%7, 0, 0, 0, 0, time.UTC)
}

// weekModel is the reference: per partition, stream time is the largest
// occurred_at seen; a record whose week ended (plus grace) at or before stream
// time is late and dropped; a week closes when stream time reaches its end
// plus grace.
type weekModel struct {
	grace  time.Duration
	st     map[int32]time.Time
	counts map[wkey]int64
	open   map[int32]map[wkey]bool
	closed map[wkey]int64
	late   int64
}

func newWeekModel(grace time.Duration) *weekModel {
	return &weekModel{grace: grace, st: map[int32]time.Time{}, counts: map[wkey]int64{}, open: map[int32]map[wkey]bool{}, closed: map[wkey]int64{}}
}

func (m *weekModel) add(c change) {
	p := kafka.PartitionFor([]byte(c.actor), parts)
	if c.at.After(m.st[p]) {
		m.st[p] = c.at
	}
	start := isoWeekStart(c.at)
	k := wkey{c.actor, start.UnixMilli()}
	if !start.AddDate(0, 0, 7).Add(m.grace).After(m.st[p]) {
		m.late++
		return
	}
	m.counts[k]++
	if m.open[p] == nil {
		m.open[p] = map[wkey]bool{}
	}
	m.open[p][k] = true
	for o := range m.open[p] {
		if !time.UnixMilli(o.start).AddDate(0, 0, 7).Add(m.grace).After(m.st[p]) {
			m.closed[o] = m.counts[o]
			delete(m.open[p], o)
		}
	}
}

func (m *weekModel) openRows() map[string]int64 {
	out := map[string]int64{}
	for _, ws := range m.open {
		for k := range ws {
			out[k.key+"@"+time.UnixMilli(k.start).UTC().Format(time.RFC3339Nano)] = m.counts[k]
		}
	}
	return out
}

// checkCloses asserts that OnClose ran exactly once for every window the
// model closed, with the model's final count, and for no other window.
func checkCloses(t *testing.T, m *weekModel, got map[wkey][]int64) {
	t.Helper()
	// OnClose runs at least once: a window closed by a cycle that was then
	// abandoned (under load: the member evicted) closes again when its
	// records are processed again, with the same final value.
	bad, again := 0, 0
	for k, want := range m.closed {
		g := got[k]
		ok := len(g) >= 1
		for _, v := range g {
			ok = ok && v == want
		}
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("OnClose(%s, week of %v): finals %v, want [%d] (repeats of it allowed)", k.key, time.UnixMilli(k.start).UTC(), g, want)
			}
		} else if len(g) > 1 {
			again++
		}
	}
	if again > 0 {
		t.Logf("%d windows closed again with the same value after reprocessing", again)
	}
	for k, g := range got {
		if _, ok := m.closed[k]; !ok {
			if bad++; bad <= 5 {
				t.Errorf("OnClose(%s, week of %v) = %v for a window that must still be open", k.key, time.UnixMilli(k.start).UTC(), g)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d windows closed wrongly (%d expected closes, %d closed)", bad, len(m.closed), len(got))
	}
}

func checkOpenRows(t *testing.T, m *weekModel, rows map[string]any) {
	t.Helper()
	want := m.openRows()
	if len(rows) != len(want) {
		t.Errorf("changelog holds %d windows, want the %d open ones", len(rows), len(want))
	}
	bad := 0
	for k, n := range want {
		if g, ok := rows[k].(int64); !ok || g != n {
			if bad++; bad <= 5 {
				t.Errorf("window %s = %v, want %d", k, rows[k], n)
			}
		}
	}
	if bad > 0 || len(rows) != len(want) {
		t.FailNow()
	}
}

// TestTumblingWeeksRealData counts the real change history per actor and ISO
// week through a worker on the test broker, with event time = occurred_at (the
// record timestamp). The history is out of order (author dates), so with a
// four-week grace many records are late; every expectation comes from the
// reference model above: the late count, one OnClose per closed week with
// its final count, and the changelog holding exactly the open weeks (closed
// ones are deleted at close: retention = size + grace).
func TestTumblingWeeksRealData(t *testing.T) {
	const grace = 28 * 24 * time.Hour
	cs := readChanges(t, 1<<30) // the whole file
	m := newWeekModel(grace)
	for _, c := range cs {
		m.add(c)
	}
	if m.late == 0 || len(m.closed) == 0 || len(m.openRows()) == 0 {
		t.Fatalf("scenario too weak: late %d, closed %d, open %d", m.late, len(m.closed), len(m.openRows()))
	}
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "weeks")
	closes := newCloseLog()
	w := newWeekApp(id, grace, closes)
	createSource(t, brokers, w.changes.Name())
	stop := startWorker(t, w.app, brokers, t.TempDir())
	start := time.Now()
	produce(t, brokers, w.changes.Name(), cs)
	testbroker.WaitLag0(t, brokers, id, w.changes.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records, %d windows closed, %d open, %d late in %v", len(cs), len(m.closed), len(m.openRows()), m.late, time.Since(start))
	// LateRecords counts in this process, at least once: records the worker
	// processes again (a cycle abandoned under load, the member evicted)
	// count again, so only fewer than the model's is wrong.
	if got := w.weeks.LateRecords(); got < m.late {
		t.Errorf("LateRecords = %d, want %d", got, m.late)
	} else if got > m.late {
		t.Logf("LateRecords = %d, %d of them counted again after reprocessing", got, got-m.late)
	}
	checkCloses(t, m, closes.finals)
	// ExpiredWindows counts in this process too, at least once: a window
	// closed again after reprocessing (as checkCloses allows) expires again.
	if got := w.weeks.ExpiredWindows(); got < int64(len(m.closed)) {
		t.Errorf("ExpiredWindows = %d, want %d (retention = size + grace deletes at close)", got, len(m.closed))
	} else if got > int64(len(m.closed)) {
		t.Logf("ExpiredWindows = %d, %d of them expired again after reprocessing", got, got-int64(len(m.closed)))
	}
	rows, marks := readWindows(t, brokers, w.weeks)
	checkOpenRows(t, m, rows)
	if len(marks) != parts {
		t.Errorf("watermarks %v, want one per partition", marks)
	}
}

// TestWindowsCloseOnceAcrossRestart stops the worker in the middle of the
// stream (after the first half of the records, long before the end) and
// restarts it on the same data dir with a fresh declaration of the app
// (nothing in memory survives), then produces the second half: the expiry
// index is rebuilt from the Pebble store, windows closed before the stop never
// close again, the others close once, with final counts that include the
// records processed before the stop. Then more records come and a worker with
// an empty data dir takes over: it restores the store from the changelog
// (watermarks included) and rebuilds the index from it.
//
// The stop comes once the first half is processed and committed (lag 0): a
// clean stop whose drain does not finish within its budget abandons the
// records since the last commit cycle, and their windows close again after
// the restart (OnClose is at least once across such a stop; docs/tables.md).
func TestWindowsCloseOnceAcrossRestart(t *testing.T) {
	const grace = 28 * 24 * time.Hour
	all := readChanges(t, 25000)
	cs, more := all[:20000], all[20000:]
	m := newWeekModel(grace)
	for _, c := range cs {
		m.add(c)
	}
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "restart")
	dir := t.TempDir()
	closes := newCloseLog()
	first := newWeekApp(id, grace, closes)
	createSource(t, brokers, first.changes.Name())
	stop := startWorker(t, first.app, brokers, dir)
	produce(t, brokers, first.changes.Name(), cs[:len(cs)/2])
	testbroker.WaitLag0(t, brokers, id, first.changes.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	before := closes.n.Load()
	if before == 0 || before >= int64(len(m.closed)) {
		t.Fatalf("the first worker closed %d of %d windows before it stopped; the test needs a stop mid-stream", before, len(m.closed))
	}

	second := newWeekApp(id, grace, closes)
	stop = startWorker(t, second.app, brokers, dir)
	produce(t, brokers, second.changes.Name(), cs[len(cs)/2:])
	testbroker.WaitLag0(t, brokers, id, second.changes.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("closed %d windows before the stop, %d after (of %d)", before, closes.n.Load()-before, len(m.closed))
	checkCloses(t, m, closes.finals)
	if late := first.weeks.LateRecords() + second.weeks.LateRecords(); late != m.late {
		t.Errorf("late records %d, want %d", late, m.late)
	}
	rows, _ := readWindows(t, brokers, second.weeks)
	checkOpenRows(t, m, rows)

	for _, c := range more {
		m.add(c)
	}
	beforeFresh := closes.n.Load()
	third := newWeekApp(id, grace, closes)
	stop = startWorker(t, third.app, brokers, t.TempDir())
	produce(t, brokers, third.changes.Name(), more)
	testbroker.WaitLag0(t, brokers, id, third.changes.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("a fresh worker closed %d more windows (of %d in all)", closes.n.Load()-beforeFresh, len(m.closed))
	if closes.n.Load() == beforeFresh {
		t.Fatal("the fresh worker closed nothing; the scenario needs closes after the restore")
	}
	checkCloses(t, m, closes.finals)
	rows, _ = readWindows(t, brokers, third.weeks)
	checkOpenRows(t, m, rows)
}

// hopApp keeps counts per key in hopping windows of 10 minutes every 5
// minutes with 2 minutes of grace; a record's value is its event time in
// minutes after base ("13"), or "probe:<minutes>" to read the table at that
// event time instead of updating it.
type hopApp struct {
	app    *app.App
	topic  *agent.Topic[string, string]
	counts *table.Windowed[string, int64]

	mu     sync.Mutex
	probes []string
}

var base = time.Date(2009, 1, 1, 0, 0, 0, 0, time.UTC) // years before the wall clock

func minutes(v string) (time.Time, error) {
	n, err := strconv.Atoi(strings.TrimPrefix(v, "probe:"))
	if err != nil {
		return time.Time{}, fmt.Errorf("value %q: %w", v, err)
	}
	return base.Add(time.Duration(n) * time.Minute), nil
}

func newHopApp(id string, closes *closeLog) *hopApp {
	h := &hopApp{app: app.New(id, appOptions(id)...)}
	h.topic = app.Topic(h.app, "hops", codec.String(), codec.String(), app.Partitions(parts))
	h.counts = table.NewWindowed(h.app, "hops", codec.String(), codec.DecimalInt64(),
		table.Hopping(10*time.Minute, 5*time.Minute), table.Grace(2*time.Minute), table.OnClose(closes.onClose),
		table.EventTime(func(ev table.Event) (time.Time, error) {
			return minutes(ev.(*agent.Event[string, string]).Value)
		}))
	agent.New(h.app, "count", h.topic, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if !strings.HasPrefix(ev.Value, "probe:") {
				h.counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
				continue
			}
			h.probe(ev)
		}
		return s.Err()
	}, agent.WritesTo(h.counts))
	return h
}

func (h *hopApp) probe(ev *agent.Event[string, string]) {
	var out []string
	rng, err := h.counts.Range(ev, ev.Key, base.Add(-10*time.Minute), base.Add(60*time.Minute))
	for _, wv := range rng {
		out = append(out, fmt.Sprintf("%s=%d", wv.Window.Start.Sub(base), wv.Value))
	}
	cur, cw, ok, err2 := h.counts.Current(ev, ev.Key)
	at, aw, ok2, err3 := h.counts.At(ev, ev.Key, base.Add(13*time.Minute))
	d, dw, ok3, err4 := h.counts.Delta(ev, ev.Key, 10*time.Minute)
	st, err5 := h.counts.StreamTime(ev)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.probes = append(h.probes,
		fmt.Sprintf("range %v err %v", out, err),
		fmt.Sprintf("current %s=%d %v err %v", cw.Start.Sub(base), cur, ok, err2),
		fmt.Sprintf("at 13m %s=%d %v err %v", aw.Start.Sub(base), at, ok2, err3),
		fmt.Sprintf("delta 10m %s=%d %v err %v", dw.Start.Sub(base), d, ok3, err4),
		fmt.Sprintf("stream time %s err %v", st.Sub(base), err5))
}

// TestHoppingGraceLateAndStreamTime walks hopping windows through a worker on
// the test broker with hand-computed expectations: an update goes to every
// window containing its time; windows close when stream time reaches end +
// grace, each once with its final value; a record for closed windows is
// dropped (late); the views read the windows; and windows of 2009 stay open
// although the wall clock is years past them, because no record moved
// stream time past them.
func TestHoppingGraceLateAndStreamTime(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "hop")
	closes := newCloseLog()
	h := newHopApp(id, closes)
	stop := startWorker(t, h.app, brokers, t.TempDir())
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), h.topic.Name())
	prod := testbroker.SyncProducer(t, brokers)
	defer prod.Close()
	// Minutes after base. Windows start every 5 minutes and last 10; grace 2.
	//   1  -> [-5,5)=1 [0,10)=1                        stream time 1
	//   7  -> [0,10)=2 [5,15)=1                        stream time 7
	//   16 -> [10,20)=1 [15,25)=1; closes [-5,5)=1 and [0,10)=2 (end+2 <= 16)
	//   4  -> late for [-5,5) and [0,10): dropped, 2 late updates
	//   13 -> [5,15)=2 (closes at 17 > 16) [10,20)=2
	//   probe at 16
	//   30 -> [25,35)=1 [30,40)=1; closes [5,15)=2 [10,20)=2 [15,25)=1
	for _, v := range []string{"1", "7", "16", "4", "13", "probe:16", "30"} {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: h.topic.Name(), Partition: kafka.PartitionFor([]byte("k"), parts),
			Key: sarama.StringEncoder("k"), Value: sarama.StringEncoder(v)}); err != nil {
			t.Fatal(err)
		}
	}
	testbroker.WaitLag0(t, brokers, id, h.topic.Name())
	// The worker stays up a while: nothing may close by the wall clock.
	time.Sleep(500 * time.Millisecond)
	closes.mu.Lock()
	got := map[string][]int64{}
	for k, f := range closes.finals {
		got[time.UnixMilli(k.start).Sub(base).String()] = f
	}
	closes.mu.Unlock()
	want := map[string][]int64{"-5m0s": {1}, "0s": {2}, "5m0s": {2}, "10m0s": {2}, "15m0s": {1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("OnClose finals per window start %v, want %v", got, want)
	}
	if n := h.counts.LateRecords(); n != 2 {
		t.Errorf("LateRecords = %d, want 2", n)
	}
	h.mu.Lock()
	probes := strings.Join(h.probes, "\n")
	h.mu.Unlock()
	wantProbes := strings.Join([]string{
		"range [5m0s=2 10m0s=2 15m0s=1] err <nil>",
		"current 15m0s=1 true err <nil>",
		"at 13m 10m0s=2 true err <nil>",
		"delta 10m 5m0s=2 true err <nil>",
		"stream time 16m0s err <nil>",
	}, "\n")
	if probes != wantProbes {
		t.Errorf("probe at 16m:\n%s\nwant\n%s", probes, wantProbes)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rows, marks := readWindows(t, brokers, h.counts)
	var keys []string
	for k, v := range rows {
		keys = append(keys, fmt.Sprintf("%s=%v", k, v))
	}
	sort.Strings(keys)
	wantRows := []string{"k@2009-01-01T00:25:00Z=1", "k@2009-01-01T00:30:00Z=1"}
	if fmt.Sprint(keys) != fmt.Sprint(wantRows) {
		t.Errorf("changelog windows %v, want the open ones %v", keys, wantRows)
	}
	p := kafka.PartitionFor([]byte("k"), parts)
	if mk := marks[fmt.Sprintf("~closed-up-to[%d]", p)]; mk != "2009-01-01T00:30:00Z" || len(marks) != 1 {
		t.Errorf("watermarks %v, want partition %d closed up to 00:30", marks, p)
	}
}
