package app_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// A daily Cron timer ("0 9 * * *", UTC) fires once per partition at 09:00,
// on the worker that owns the partition. Its missed runs are run once: a
// worker started three days later (on an empty data dir: the last firing
// comes back from the cron table's changelog) fires each partition once at
// start, for the latest missed 09:00, and a later restart with nothing
// missed fires nothing; a new schedule fires nothing at its first start.
// The cron clock is set to those days with WithCronClock.
func TestCronTimerRunsMissedOnce(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "cron")
	var ahead atomic.Int64 // the cron clock's lead over the real one, ns
	setClock := func(now time.Time) { ahead.Store(int64(time.Until(now))) }
	clock := func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }

	a := streamsApp(id, app.WithCronClock(clock))
	in := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(parts))
	reports := app.Topic(a, "reports", codec.String(), codec.String(), app.Partitions(parts))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	made := table.New(a, "reports-made", codec.String(), codec.DecimalInt64())
	key := wordPerPartition("r")
	agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.Cron("0 9 * * *", func(ctx context.Context, tk *agent.Tick) error {
		p := tk.Partition()
		made.Update(tk, key[p], func(n int64) int64 { return n + 1 })
		return reports.TrySend(tk, key[p], tk.Time.UTC().Format(time.RFC3339))
	}), agent.WritesTo(counts, made), agent.SendsTo(reports))
	if g, err := a.Topology(); err != nil || !strings.Contains(fmt.Sprint(g.Agents), "cron 0 9 * * * (UTC)") {
		t.Fatalf("topology %+v, %v: the cron timer is not shown", g.Agents, err)
	}
	client := testbroker.Client(t, brokers)
	// reportsAre waits until the reports topic holds n records, then
	// checks that partition p holds want (the firing times) in order.
	reportsAre := func(n int, want ...string) {
		t.Helper()
		waitUntil(t, 60*time.Second, fmt.Sprintf("%d reports", n), func() bool {
			got := 0
			for _, ms := range readAll(t, client, reports.Name()) {
				got += len(ms)
			}
			return got >= n
		})
		for p, ms := range readAll(t, client, reports.Name()) {
			var got []string
			for _, m := range ms {
				if string(m.Key) != key[p] {
					t.Fatalf("partition %d: report keyed %q", p, m.Key)
				}
				got = append(got, string(m.Value))
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Fatalf("partition %d: reports at %v, want %v", p, got, want)
			}
		}
	}
	recs, _ := words(200, wordPerPartition("w")...)

	// The firings' records carry their tick's time (Kafka Streams forwards
	// at the punctuation's time), so the days are in the recent past: Kafka
	// 4 refuses a record stamped more than an hour ahead of the broker
	// (log.message.timestamp.after.max.ms), and its retention (7 days)
	// deletes older ones. day1 is the 09:00 UTC five days ago.
	now := time.Now().UTC()
	day1 := time.Date(now.Year(), now.Month(), now.Day(), 9, 0, 0, 0, time.UTC).AddDate(0, 0, -5)
	firing1, firing4 := day1.Format(time.RFC3339), day1.AddDate(0, 0, 3).Format(time.RFC3339)
	// The schedule is new: the first start arms it (one row per partition
	// in the cron table, committed by the next cycle) and fires nothing.
	setClock(day1.Add(-23 * time.Hour))
	_, stop := goWorker(t, a, brokers, t.TempDir())
	testbroker.WaitTopic(t, client, in.Name())
	cronChangelog := id + "-" + agent.CronTable("count") + "-changelog"
	waitUntil(t, 60*time.Second, "the schedule armed on every partition", func() bool {
		return client.RefreshMetadata(cronChangelog) == nil && len(readAll(t, client, cronChangelog)) == parts
	})
	send(t, brokers, in.Name(), recs...)
	testbroker.WaitLag0(t, brokers, id, in.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// Two seconds before 09:00: it fires at 09:00, or at the start when
	// joining the group took longer (then 09:00 was missed): once either way.
	setClock(day1.Add(-2 * time.Second))
	_, stop = goWorker(t, a, brokers, t.TempDir())
	reportsAre(parts, firing1)
	testbroker.WaitLag0(t, brokers, id, in.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Down for three days: day 2, 3 and 4 at 09:00 missed; run once, for day 4.
	setClock(day1.Add(3*24*time.Hour + time.Hour))
	dir := t.TempDir()
	_, stop = goWorker(t, a, brokers, dir)
	reportsAre(2*parts, firing1, firing4)
	send(t, brokers, in.Name(), recs...)
	testbroker.WaitLag0(t, brokers, id, in.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	lastMS := strconv.FormatInt(day1.Add(3*24*time.Hour).UnixMilli(), 10)
	cron := storeTable(t, dir, agent.CronTable("count"))
	if len(cron) != parts {
		t.Fatalf("cron table %v: want one row per partition", cron)
	}
	for k, v := range cron {
		if v != lastMS {
			t.Fatalf("cron table row %q = %s, want the day 4 firing %s", k, v, lastMS)
		}
	}
	for p, k := range key {
		if got := storeTable(t, dir, "reports-made")[k]; got != "2" {
			t.Fatalf("partition %d: the table counts %s firings, want 2", p, got)
		}
	}

	// Restarted five minutes later: nothing missed, nothing fired. The
	// records sent after the start and counted are the point after which
	// a firing at start would have been seen.
	setClock(day1.Add(3*24*time.Hour + time.Hour + 5*time.Minute))
	_, stop = goWorker(t, a, brokers, dir)
	send(t, brokers, in.Name(), recs...)
	testbroker.WaitLag0(t, brokers, id, in.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	reportsAre(2*parts, firing1, firing4)
	_, want := words(600, wordPerPartition("w")...) // three batches of 200
	wantCounts(t, storeTable(t, dir, "counts"), want)
}
