package runneltest_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/runneltest"
	"github.com/runnel-dev/runnel/table"
)

// wordCount is the app under test: split re-keys each line's words through
// the topic words (rejecting empty lines), count counts them in word-counts.
type wordCount struct {
	app    *app.App
	lines  *agent.Topic[string, string]
	words  *agent.Topic[string, string]
	counts *table.Table[string, int64]
}

func buildWordCount(opts ...app.Option) *wordCount {
	a := app.New("wordcount-test", opts...)
	w := &wordCount{app: a}
	w.lines = app.Topic(a, "lines", codec.String(), codec.String(), app.Partitions(4))
	w.words = app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(4))
	w.counts = table.New(a, "word-counts", codec.String(), codec.DecimalInt64())
	agent.New(a, "split", w.lines, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if strings.TrimSpace(ev.Value) == "" {
				ev.Reject(errors.New("empty line"))
				continue
			}
			for _, word := range strings.Fields(ev.Value) {
				w.words.Send(ev, word, ev.Key)
			}
		}
		return s.Err()
	}, agent.SendsTo(w.words))
	agent.New(a, "count", w.words, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			w.counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(w.counts))
	return w
}

func start(t *testing.T, a *app.App, o runneltest.Options) *runneltest.Driver {
	t.Helper()
	d, err := runneltest.Start(a, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return d
}

// TestCountsAreExact sends 300 lines over 2 workers, 4 partitions and a
// repartition hop, and reads back every count: one record lost or counted
// twice anywhere on the path makes a count differ. The app names an HTTP
// address and a static instance ID, which two workers of one process cannot
// share: Start turns both off.
func TestCountsAreExact(t *testing.T) {
	w := buildWordCount(app.WithHTTPAddr("127.0.0.1:18089"), app.WithInstanceID("one"))
	d := start(t, w.app, runneltest.Options{Workers: 2})
	want := map[string]int64{}
	var in []runneltest.Record[string, string]
	for i := range 300 {
		line := fmt.Sprintf("w%d w%d w%d", i%7, i%11, i%13)
		for _, word := range strings.Fields(line) {
			want[word]++
		}
		in = append(in, runneltest.Record[string, string]{Key: fmt.Sprint(i), Value: line})
	}
	if err := runneltest.SendAll(d, w.lines, in); err != nil {
		t.Fatal(err)
	}
	for _, r := range in {
		if r.Partition < 0 || r.Partition >= 4 || r.Offset < 0 {
			t.Fatalf("record %s sent to [%d]@%d", r.Key, r.Partition, r.Offset)
		}
	}
	got, err := d.Table(w.counts)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Errorf("%d keys, want %d: %v", len(got), len(want), got)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("count of %s = %v, want %d", k, got[k], n)
		}
	}
	n, ok, err := runneltest.Get(d, w.counts, "w0")
	if err != nil || !ok || n != want["w0"] {
		t.Errorf("Get(w0) = %d, %v, %v; want %d", n, ok, err, want["w0"])
	}
	if _, ok, err := runneltest.Get(d, w.counts, "never-sent"); err != nil || ok {
		t.Errorf("Get(never-sent) = %v, %v; want absent", ok, err)
	}
	var processed int64
	for _, wk := range d.Workers() {
		processed += wk.Processed()
	}
	if want := int64(300 + 900); processed != want { // lines, then words
		t.Errorf("workers processed %d records, want %d", processed, want)
	}
}

// TestSinkRecordsAndDeadLetters checks the sink topic record by record (key,
// value, the partition a Java producer would choose) and that an empty line
// is a dead letter with its reason and source offset, and nothing else.
func TestSinkRecordsAndDeadLetters(t *testing.T) {
	w := buildWordCount()
	d := start(t, w.app, runneltest.Options{})
	if _, _, err := runneltest.Send(d, w.lines, "l1", "to be"); err != nil {
		t.Fatal(err)
	}
	p, off, err := runneltest.Send(d, w.lines, "l2", "   ")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := runneltest.Send(d, w.lines, "l3", "be"); err != nil {
		t.Fatal(err)
	}
	recs, err := runneltest.Records(d, w.words)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{} // word -> lines, sorted (two partitions of lines feed one of words)
	for _, r := range recs {
		got[r.Key] = append(got[r.Key], r.Value)
		slices.Sort(got[r.Key])
	}
	if len(recs) != 3 || fmt.Sprint(got["to"]) != "[l1]" || fmt.Sprint(got["be"]) != "[l1 l3]" {
		t.Errorf("words = %+v, want to:[l1] be:[l1 l3]", recs)
	}
	dls, err := d.DeadLetters("split")
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1: %+v", len(dls), dls)
	}
	dl := dls[0]
	if dl.Reason != "empty line" || string(dl.Key) != "l2" || dl.Partition != p || dl.Offset != off || dl.Agent != "split" {
		t.Errorf("dead letter %+v, want reason %q key l2 at [%d]@%d by split", dl, "empty line", p, off)
	}
	if dls, err := d.DeadLetters("count"); err != nil || len(dls) != 0 {
		t.Errorf("count's dead letters = %v, %v; want none", dls, err)
	}
	if _, err := d.DeadLetters("no-such-agent"); err == nil {
		t.Error("dead letters of an unknown agent: no error")
	}
}

// TestWaitBetweenBatches reads a count, sends more and reads again: each
// read sees exactly the records sent before it.
func TestWaitBetweenBatches(t *testing.T) {
	w := buildWordCount()
	d := start(t, w.app, runneltest.Options{})
	for round, want := range []int64{5, 12} {
		for i := range 5 + 2*round {
			if _, _, err := runneltest.Send(d, w.lines, fmt.Sprintf("%d-%d", round, i), "x"); err != nil {
				t.Fatal(err)
			}
		}
		n, _, err := runneltest.Get(d, w.counts, "x")
		if err != nil || n != want {
			t.Fatalf("round %d: count of x = %d, %v; want %d", round, n, err, want)
		}
	}
}

// TestEventAccessors: the agent sees the record's topic, partition, offset,
// timestamp (At: stream time, windows), headers (the last of a name wins)
// and raw key as Send produced them.
func TestEventAccessors(t *testing.T) {
	a := app.New("eventtime-test")
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(2))
	out := app.Topic(a, "out", codec.String(), codec.String(), app.Partitions(2))
	agent.New(a, "stamp", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			h, ok := ev.Header("h")
			v := fmt.Sprintf("%s[%d]@%d %s h=%s/%t headers=%d raw=%s", ev.Topic(), ev.Partition(), ev.Offset(),
				ev.Timestamp().UTC().Format(time.RFC3339), h, ok, len(ev.Headers()), ev.RawKey())
			out.Send(ev, ev.Key, v)
		}
		return s.Err()
	}, agent.SendsTo(out))
	d := start(t, a, runneltest.Options{})
	at := time.Date(2007, 2, 23, 12, 0, 0, 0, time.UTC)
	var want []string
	for i := range 2 {
		p, off, err := runneltest.Send(d, in, "k", "v", runneltest.At(at.Add(time.Duration(i)*time.Hour)),
			runneltest.Header("h", "1"), runneltest.Header("h", fmt.Sprint(i+2)))
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("%s[%d]@%d 2007-02-23T1%d:00:00Z h=%d/true headers=2 raw=k", in.Name(), p, off, 2+i, i+2))
	}
	recs, err := runneltest.Records(d, out)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Value != want[0] || recs[1].Value != want[1] {
		t.Errorf("out = %+v, want the values %q", recs, want)
	}
}

// TestAgentFailureIsReported: an agent that returns an error on every record
// and stops the worker makes Wait fail instead of hanging or passing.
func TestAgentFailureIsReported(t *testing.T) {
	a := app.New("failing-test")
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(1))
	agent.New(a, "fail", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for range s.Events() {
			return errors.New("boom")
		}
		return s.Err()
	}, agent.OnError(agent.StopWorker))
	d, err := runneltest.Start(a, runneltest.Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, _, err := runneltest.Send(d, in, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("Wait = %v, want the agent's error", err)
	}
}

// TestRestartRestoresTables: after Restart the workers' stores are gone and
// the table is restored from its changelog; counting goes on from the
// restored values, and the sources resume at the committed offsets (nothing
// counted twice).
func TestRestartRestoresTables(t *testing.T) {
	w := buildWordCount()
	d := start(t, w.app, runneltest.Options{Workers: 2})
	in := make([]runneltest.Record[string, string], 50)
	for i := range in {
		in[i] = runneltest.Record[string, string]{Key: fmt.Sprint(i), Value: "a b"}
	}
	if err := runneltest.SendAll(d, w.lines, in); err != nil {
		t.Fatal(err)
	}
	if err := d.Wait(); err != nil {
		t.Fatal(err)
	}
	if err := d.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := runneltest.SendAll(d, w.lines, in[:10]); err != nil {
		t.Fatal(err)
	}
	for word, want := range map[string]int64{"a": 60, "b": 60} {
		if n, _, err := runneltest.Get(d, w.counts, word); err != nil || n != want {
			t.Errorf("count of %s after the restart = %d, %v; want %d", word, n, err, want)
		}
	}
	var processed int64
	for _, wk := range d.Workers() {
		processed += wk.Processed()
	}
	if processed != 10+20 {
		t.Errorf("the restarted workers processed %d records, want 30 (10 lines, 20 words)", processed)
	}
}

// TestEmitOnClose: a windowed table's EmitOnClose sends each window's final
// value once the partition's stream time passes its end + grace, bound to
// the record that closed it; an open window is not sent.
func TestEmitOnClose(t *testing.T) {
	a := app.New("emit-on-close-test")
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(1))
	out := app.Topic(a, "hourly", codec.String(), codec.String(), app.Partitions(1))
	perHour := table.NewWindowed(a, "per-hour", codec.String(), codec.DecimalInt64(), table.Tumbling(time.Hour),
		table.Grace(5*time.Minute),
		table.EmitOnClose(func(ev table.Event, key string, w table.Window, n int64) error {
			return out.TrySend(ev, key, fmt.Sprintf("%s %d", w.Start.UTC().Format("15:04"), n))
		}))
	agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			perHour.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.SendsTo(out), agent.WritesTo(perHour))
	d := start(t, a, runneltest.Options{})
	day := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	for _, at := range []string{"10:05", "10:50", "11:02", "11:04", "11:06", "12:30"} {
		ts, _ := time.Parse("15:04", at)
		ts = day.Add(time.Duration(ts.Hour())*time.Hour + time.Duration(ts.Minute())*time.Minute)
		if _, _, err := runneltest.Send(d, in, "a", at, runneltest.At(ts)); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := runneltest.Records(d, out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.Key+" "+r.Value)
	}
	// 11:06 closes [10:00, 11:00) (end + grace 11:05); 12:30 closes
	// [11:00, 12:00); [12:00, 13:00) stays open.
	if want := []string{"a 10:00 2", "a 11:00 3"}; !slices.Equal(got, want) {
		t.Errorf("emitted %q, want %q", got, want)
	}
}

// TestCompute: Compute sees whether the key exists, keeps a new value, and
// deletes the key when fn says so; a delete of an absent key writes nothing.
func TestCompute(t *testing.T) {
	a := app.New("compute-test")
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(2))
	// Per user: the number of events since the first one, "-" at logout.
	open := table.New(a, "open", codec.String(), codec.String())
	agent.New(a, "sessions", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			_, _, err := open.TryCompute(ev, ev.Key, func(old string, found bool) (string, bool) {
				switch {
				case ev.Value == "logout":
					return "", false
				case !found:
					return "new", true
				default:
					return old + "+", true
				}
			})
			if err != nil {
				return err
			}
		}
		return s.Err()
	}, agent.WritesTo(open))
	d := start(t, a, runneltest.Options{})
	for _, kv := range [][2]string{{"a", "login"}, {"a", "click"}, {"b", "login"}, {"a", "logout"}, {"c", "logout"},
		{"b", "click"}, {"b", "click"}, {"a", "login"}} {
		if _, _, err := runneltest.Send(d, in, kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	got, err := d.Table(open)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"a": "new", "b": "new++"}; !maps.Equal(got, want) {
		t.Errorf("table open = %v, want %v", got, want)
	}
	for _, k := range []string{"a", "c"} {
		if v, found, err := runneltest.Get(d, open, k); err != nil || found != (k == "a") {
			t.Errorf("Get(%s) = %q, %t, %v", k, v, found, err)
		}
	}
}

// TestUndeclaredWriteAndSendAreRefused: an agent that writes a table it did
// not declare with agent.WritesTo, or sends to a topic it did not declare
// with agent.SendsTo, gets a *table.UndeclaredError naming the agent, the
// table or topic and the option to add; the worker stops on it (with the
// default error policy, which would otherwise retry), the record is neither
// dead-lettered nor committed, and nothing reaches the table or the topic.
func TestUndeclaredWriteAndSendAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		check      func(*table.UndeclaredError) bool
		write      bool
	}{
		{name: "write", write: true, want: "agent count writes table counts, which it did not declare: add agent.WritesTo(",
			check: func(e *table.UndeclaredError) bool { return e.Agent == "count" && e.Table == "counts" && e.Topic == "" }},
		{name: "send", want: "agent count sends to topic out, which it did not declare: add agent.SendsTo(",
			check: func(e *table.UndeclaredError) bool { return e.Agent == "count" && e.Topic == "out" && e.Table == "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := app.New("undeclared-" + tc.name)
			in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(1))
			out := app.Topic(a, "out", codec.String(), codec.String(), app.Partitions(1))
			counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
			agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
				for ev := range s.Events() {
					// The short forms fail the event with the error: the
					// stream ends and Err returns it.
					if tc.write {
						counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
					} else {
						out.Send(ev, ev.Key, ev.Value)
					}
				}
				return s.Err()
			}) // no agent.WritesTo(counts), no agent.SendsTo(out)
			d, err := runneltest.Start(a, runneltest.Options{Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if _, _, err := runneltest.Send(d, in, "k", "v"); err != nil {
				t.Fatal(err)
			}
			err = d.Wait()
			var ue *table.UndeclaredError
			if !errors.As(err, &ue) || !tc.check(ue) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Wait = %v (%+v), want an UndeclaredError: %s...", err, ue, tc.want)
			}
			for _, w := range d.Workers() {
				if n := w.DeadLettered(); n != 0 {
					t.Errorf("%d records dead-lettered, want none: the record waits for the fix", n)
				}
			}
		})
	}
}

// TestUndeclaredSendOfTimerIsRefused: a timer writes and sends as its
// agent, so a send to a topic the agent did not declare is refused there
// too, and stops the worker with the error naming the agent and the topic.
func TestUndeclaredSendOfTimerIsRefused(t *testing.T) {
	a := app.New("undeclared-timer")
	in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(1))
	ticks := app.Topic(a, "ticks", codec.String(), codec.String(), app.Partitions(1))
	agent.New(a, "ticker", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for range s.Events() {
		}
		return s.Err()
	}, agent.Every(20*time.Millisecond, agent.WallClock, func(ctx context.Context, tk *agent.Tick) error {
		ticks.Send(tk, "k", tk.Time.String()) // fails the firing with the error
		return nil
	})) // no agent.SendsTo(ticks)
	d, err := runneltest.Start(a, runneltest.Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, _, err := runneltest.Send(d, in, "k", "v"); err != nil {
		t.Fatal(err)
	}
	// The worker stops at the first firing, 20 ms or so after it started:
	// Wait returns nil until then (everything sent was processed).
	var ue *table.UndeclaredError
	deadline := time.Now().Add(20 * time.Second)
	for err = d.Wait(); err == nil && time.Now().Before(deadline); err = d.Wait() {
	}
	if !errors.As(err, &ue) || ue.Agent != "ticker" || ue.Topic != "ticks" || !strings.Contains(err.Error(), "add agent.SendsTo(") {
		t.Fatalf("Wait = %v, want the UndeclaredError of agent ticker's send to ticks", err)
	}
}
