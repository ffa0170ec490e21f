package app_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// runCLI runs the app's command line with args against brokers and returns
// its stdout.
func runCLI(t *testing.T, a *app.App, brokers []string, args ...string) string {
	t.Helper()
	cmd := a.Command()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append(args, "--brokers", strings.Join(brokers, ",")))
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, errOut.String())
	}
	return out.String()
}

// total returns the sum of topic's highwaters.
func total(t *testing.T, client sarama.Client, topic string) int64 {
	t.Helper()
	if err := client.RefreshMetadata(topic); err != nil {
		t.Fatal(err)
	}
	ps, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, p := range ps {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		n += hw
	}
	return n
}

// runUntilLag0 runs a worker of o until the group consumed the words topic.
func runUntilLag0(t *testing.T, o *opsApp, brokers []string, dir string, before func()) *app.Worker {
	t.Helper()
	w, err := o.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	stop := testbroker.Start(t, w)
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), o.words.Name())
	if before != nil {
		before()
	}
	testbroker.WaitLag0(t, brokers, o.app.ID(), o.words.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestDeadLetterCommands dead-letters 3 of 40 records, then checks `dlq
// list`, `dlq tail`, a dry-run replay (sends nothing), a replay after the
// fix (the 3 records back on their source partitions, processed by a fixed
// worker into the sink, no new dead letters) and that a second replay sends
// nothing.
func TestDeadLetterCommands(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	o := newOpsApp(t, id)
	dir := t.TempDir()
	client := testbroker.Client(t, brokers)
	var sentAt [][2]int64
	w := runUntilLag0(t, o, brokers, dir, func() {
		var recs []kv
		for i := range 40 {
			v := "ok"
			if i%13 == 5 {
				v = "bad"
			}
			recs = append(recs, kv{"k" + string(rune('a'+i%10)), v})
		}
		sentAt = send(t, brokers, o.words.Name(), recs...)
	})
	if w.DeadLettered() != 3 {
		t.Fatalf("worker dead-lettered %d, want 3", w.DeadLettered())
	}
	dlqTopic := id + "-fwd-dlq"

	list := runCLI(t, o.app, brokers, "dlq", "list")
	if !strings.Contains(list, "fwd    "+dlqTopic+"    3") || !strings.Contains(list, "count  "+id+"-count-dlq") {
		t.Errorf("dlq list:\n%s", list)
	}
	if f := strings.Fields(strings.Split(list, "\n")[2]); len(f) != 4 || f[2] != "3" || f[3] != "3" {
		t.Errorf("dlq list, fwd line: %q, want 3 records, 3 not replayed", f)
	}

	// The bad records are i = 5, 18, 31; partitions are processed
	// concurrently, so they reach the dead-letter topic in any order.
	from := func(i int) string {
		return "from " + o.words.Name() + "[" + itoa(sentAt[i][0]) + "]@" + itoa(sentAt[i][1]) + " "
	}
	tail := runCLI(t, o.app, brokers, "dlq", "tail", "fwd")
	for _, i := range []int{5, 18, 31} {
		if strings.Count(tail, from(i)) != 1 {
			t.Errorf("dlq tail shows %q %d times, want once:\n%s", from(i), strings.Count(tail, from(i)), tail)
		}
	}
	if strings.Count(tail, "reason: value is bad") != 3 || strings.Count(tail, `value: "bad"`) != 3 {
		t.Errorf("dlq tail:\n%s", tail)
	}
	tail2 := runCLI(t, o.app, brokers, "dlq", "tail", "fwd", "-n", "2")
	if !strings.HasSuffix(tail, tail2) || strings.Count(tail2, "from ") != 2 {
		t.Errorf("dlq tail -n 2 is not the last 2 of dlq tail:\n%s\n---\n%s", tail2, tail)
	}

	before := total(t, client, o.words.Name())
	dry := runCLI(t, o.app, brokers, "dlq", "replay", "fwd", "--dry-run")
	if n := strings.Count(dry, " -> "+o.words.Name()); n != 3 {
		t.Errorf("dry run lists %d records, want 3:\n%s", n, dry)
	}
	if after := total(t, client, o.words.Name()); after != before {
		t.Fatalf("dry run produced %d records", after-before)
	}

	// The fix: fwd forwards "bad" records now. Replay, then run the fixed
	// worker over the replayed records.
	o.fixed.Store(true)
	runCLI(t, o.app, brokers, "dlq", "replay", "fwd")
	if after := total(t, client, o.words.Name()); after != before+3 {
		t.Fatalf("replay produced %d records, want 3", after-before)
	}
	// Each replayed record went back to its source partition.
	grew := map[int64]int64{}
	for _, i := range []int{5, 18, 31} {
		grew[sentAt[i][0]]++
	}
	for p, n := range grew {
		last := int64(-1)
		for _, at := range sentAt {
			if at[0] == p {
				last = max(last, at[1])
			}
		}
		hw, err := client.GetOffset(o.words.Name(), int32(p), sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		if hw != last+1+n {
			t.Errorf("partition %d: highwater %d, want %d + %d replayed", p, hw, last+1, n)
		}
	}
	w2 := runUntilLag0(t, o, brokers, dir, nil)
	if w2.DeadLettered() != 0 || w2.Processed() != 3 {
		t.Errorf("fixed worker: processed %d, dead-lettered %d; want 3, 0", w2.Processed(), w2.DeadLettered())
	}
	if n := total(t, client, o.out.Name()); n != 40 {
		t.Errorf("sink holds %d records, want 37 + 3 replayed", n)
	}
	if n := total(t, client, dlqTopic); n != 3 {
		t.Errorf("dead-letter topic holds %d records, want 3", n)
	}
	if f := strings.Fields(strings.Split(runCLI(t, o.app, brokers, "dlq", "list"), "\n")[2]); len(f) != 4 || f[3] != "0" {
		t.Errorf("dlq list after the replay, fwd line: %q, want 0 not replayed", f)
	}
	if again := runCLI(t, o.app, brokers, "dlq", "replay", "fwd"); again != "" {
		t.Errorf("second replay sent:\n%s", again)
	}
	if after := total(t, client, o.words.Name()); after != before+3 {
		t.Errorf("second replay produced %d records", after-before-3)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestDevSummary checks the line dev prints before the tables: 10 input
// records processed by one worker, 2 of them dead-lettered.
func TestDevSummary(t *testing.T) {
	o := newOpsApp(t, "dev-summary")
	input := filepath.Join(t.TempDir(), "in.jsonl")
	var lines []string
	for i := range 10 {
		v := "ok"
		if i == 3 || i == 7 {
			v = "bad"
		}
		lines = append(lines, fmt.Sprintf(`{"key": "k%d", "v": %q}`, i%4, v))
	}
	if err := os.WriteFile(input, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := o.app.Dev(context.Background(), app.DevOptions{Workers: 1, Input: input, InputTopic: "words", KeyField: "key", Out: &out, DataDir: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(out.String(), "\n")
	if want := "processed 10 records, retried 0, dead-lettered 2 "; !strings.HasPrefix(first, want) {
		t.Errorf("dev summary %q, want it to start with %q", first, want)
	}
	if !strings.Contains(out.String(), "counts (4 keys)") {
		t.Errorf("dev output:\n%s", out.String())
	}
}
