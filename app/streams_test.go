package app_test

import (
	"bytes"
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// streamsApp declares an app with the test settings of newCountApp.
func streamsApp(id string, opts ...app.Option) *app.App {
	return app.New(id, append([]app.Option{
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200 * time.Millisecond),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id + "-"),
	}, opts...)...)
}

// timedKV is a record to produce with its timestamp.
type timedKV struct {
	k, v string
	ts   time.Time
}

// sendTimed produces recs to topic (partitioned as the app does) with their
// timestamps.
func sendTimed(t *testing.T, brokers []string, topic string, recs ...timedKV) {
	t.Helper()
	prod := testbroker.SyncProducer(t, brokers)
	defer prod.Close()
	for _, r := range recs {
		p := kafka.PartitionFor([]byte(r.k), parts)
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: p, Key: sarama.StringEncoder(r.k),
			Value: sarama.StringEncoder(r.v), Timestamp: r.ts}); err != nil {
			t.Fatal(err)
		}
	}
}

// readAll returns every record of topic up to its highwaters, per partition
// in offset order.
func readAll(t *testing.T, client sarama.Client, topic string) map[int32][]*sarama.ConsumerMessage {
	t.Helper()
	if err := client.RefreshMetadata(topic); err != nil {
		t.Fatal(err)
	}
	ps, err := client.Partitions(topic)
	if err != nil {
		t.Fatal(err)
	}
	c, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := map[int32][]*sarama.ConsumerMessage{}
	for _, p := range ps {
		hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		if hw == 0 {
			continue
		}
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			t.Fatal(err)
		}
	read:
		for {
			select {
			case m, ok := <-pc.Messages():
				if !ok {
					// The partition consumer ended on an error (Sarama
					// closes its channel): fail with what was read.
					start, _ := client.GetOffset(topic, p, sarama.OffsetOldest)
					t.Fatalf("read %s[%d]: the partition consumer ended after %d records, highwater %d, log start %d", topic, p, len(out[p]), hw, start)
				}
				out[p] = append(out[p], m)
				if m.Offset >= hw-1 {
					break read
				}
			case <-time.After(30 * time.Second):
				// Records deleted meanwhile (retention) never come: fail
				// rather than wait for the test binary's timeout.
				start, _ := client.GetOffset(topic, p, sarama.OffsetOldest)
				pc.Close()
				t.Fatalf("read %s[%d]: %d records in 30 s, highwater %d, log start %d", topic, p, len(out[p]), hw, start)
			}
		}
		pc.Close()
	}
	return out
}

// GroupBy re-keys a stream through "<app>-<name>-repartition", created with
// the source's partition count, and the counts by the new key are exact; a
// Repartition that maps one record to several (a flat map, another value
// type) too. Re-keyed records keep their source record's timestamp, and
// describe shows the internal topics.
func TestGroupByAndRepartitionCountExactly(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "grp")
	a := streamsApp(id, app.WithRepartitionPurge(-1)) // the test reads the repartition topic back
	in := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(parts))
	colorCounts := table.New(a, "color-counts", codec.String(), codec.DecimalInt64())
	letterCounts := table.New(a, "letter-counts", codec.String(), codec.DecimalInt64())
	// value "red#17": the color is the new key.
	byColor := agent.GroupBy(a, "by-color", in, codec.String(), func(ev *agent.Event[string, string]) (string, error) {
		return strings.SplitN(ev.Value, "#", 2)[0], nil
	})
	letters := agent.Repartition(a, "letters", in, codec.String(), codec.DecimalInt64())
	agent.New(a, "count-colors", byColor, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			colorCounts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(colorCounts))
	agent.New(a, "split-letters", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			for _, r := range strings.SplitN(ev.Value, "#", 2)[0] {
				letters.Send(ev, string(r), 1)
			}
		}
		return s.Err()
	}, agent.SendsTo(letters))
	agent.New(a, "count-letters", letters, func(ctx context.Context, s *agent.Stream[string, int64]) error {
		for ev := range s.Events() {
			letterCounts.Update(ev, ev.Key, func(n int64) int64 { return n + ev.Value })
		}
		return s.Err()
	}, agent.WritesTo(letterCounts))

	g, err := a.Topology()
	if err != nil {
		t.Fatal(err)
	}
	var desc bytes.Buffer
	if err := g.WriteText(&desc); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("%s-by-color-repartition", id),
		fmt.Sprintf("(internal: repartition of %s-words)", id),
		fmt.Sprintf("%s-letters-repartition", id),
	} {
		if !strings.Contains(desc.String(), want) {
			t.Fatalf("describe lacks %q:\n%s", want, desc.String())
		}
	}
	if byColor.Name() != id+"-by-color-repartition" || byColor.Partitions() != parts {
		t.Fatalf("repartition topic %s with %d partitions", byColor.Name(), byColor.Partitions())
	}

	colors := []string{"red", "green", "blue", "cyan", "magenta", "yellow", "black"}
	// Recent timestamps: the input topic has the broker's time-based
	// retention (kfake applies it too).
	base := time.Now().Add(-3 * time.Hour).Truncate(time.Second)
	var recs []timedKV
	wantColors, wantLetters := map[string]int{}, map[string]int{}
	for i := range 1500 {
		c := colors[(i*i+3*i)%len(colors)]
		recs = append(recs, timedKV{k: fmt.Sprintf("k%d", i%97), v: fmt.Sprintf("%s#%d", c, i), ts: base.Add(time.Duration(i) * time.Second)})
		wantColors[c]++
		for _, r := range c {
			wantLetters[string(r)]++
		}
	}

	dir := t.TempDir()
	_, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, in.Name())
	sendTimed(t, brokers, in.Name(), recs...)
	// The source offsets are committed only after the re-keyed records were
	// acknowledged: then the repartition topics are complete.
	testbroker.WaitLag0(t, brokers, id, in.Name())
	testbroker.WaitLag0(t, brokers, id, byColor.Name(), letters.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, storeTable(t, dir, "color-counts"), wantColors)
	wantCounts(t, storeTable(t, dir, "letter-counts"), wantLetters)

	ps, err := client.Partitions(byColor.Name())
	if err != nil || len(ps) != parts {
		t.Fatalf("%s has partitions %v (%v), want %d", byColor.Name(), ps, err, parts)
	}
	n := 0
	for p, ms := range readAll(t, client, byColor.Name()) {
		for _, m := range ms {
			n++
			color, i, _ := strings.Cut(string(m.Value), "#")
			if string(m.Key) != color || kafka.PartitionFor(m.Key, parts) != p {
				t.Fatalf("%s[%d]: key %q for value %q", byColor.Name(), p, m.Key, m.Value)
			}
			seq, _ := strconv.Atoi(i)
			if want := base.Add(time.Duration(seq) * time.Second); !m.Timestamp.Equal(want) {
				t.Fatalf("re-keyed record %q has timestamp %v, want its source's %v", m.Value, m.Timestamp, want)
			}
		}
	}
	if n != len(recs) {
		t.Fatalf("%s holds %d records, want one per source record (%d)", byColor.Name(), n, len(recs))
	}
}

// A wall-clock timer runs on every partition inside the task: what it writes
// to a table and what it sends are committed like a record's. At a clean
// stop, the count of firings in its table equals the firings it sent, in
// order, and its last snapshot of each partition's count is exact.
func TestWallClockTimerWritesAndSends(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "wall")
	a := streamsApp(id)
	in := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(parts))
	firings := app.Topic(a, "firings", codec.String(), codec.DecimalInt64(), app.Partitions(parts))
	snapshots := app.Topic(a, "snapshots", codec.String(), codec.DecimalInt64(), app.Partitions(parts))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	ticks := table.New(a, "ticks", codec.String(), codec.DecimalInt64())
	word := wordPerPartition("w")
	tickKey := wordPerPartition("tick")
	agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.Every(20*time.Millisecond, agent.WallClock, func(ctx context.Context, tk *agent.Tick) error {
		p := tk.Partition()
		n, err := ticks.TryUpdate(tk, tickKey[p], func(n int64) int64 { return n + 1 })
		if err != nil {
			return err
		}
		firings.Send(tk, tickKey[p], n)
		c, ok, err := counts.Get(tk, word[p])
		if err != nil || !ok {
			return err
		}
		return snapshots.TrySend(tk, word[p], c)
	}), agent.WritesTo(counts, ticks), agent.SendsTo(firings, snapshots))
	if g, err := a.Topology(); err != nil || !strings.Contains(fmt.Sprint(g.Agents), "every 20ms wall-clock") {
		t.Fatalf("topology %+v, %v: the timer is not shown", g.Agents, err)
	}
	recs, want := words(800, word...)

	dir := t.TempDir()
	w, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, in.Name())
	send(t, brokers, in.Name(), recs...)
	testbroker.WaitLag0(t, brokers, id, in.Name())
	// Each partition's timer fired after its last record was counted.
	waitUntil(t, 30*time.Second, "snapshots of the final counts", func() bool {
		last := map[string]int64{}
		for _, ms := range readAll(t, client, snapshots.Name()) {
			for _, m := range ms {
				last[string(m.Key)], _ = strconv.ParseInt(string(m.Value), 10, 64)
			}
		}
		for k, n := range want {
			if last[k] != int64(n) {
				return false
			}
		}
		return true
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	stored := storeTable(t, dir, "ticks")
	sent := readAll(t, client, firings.Name())
	for p := range int32(parts) {
		var seq []string
		for _, m := range sent[p] {
			if string(m.Key) != tickKey[p] {
				t.Fatalf("firing of partition %d sent under key %q", p, m.Key)
			}
			seq = append(seq, string(m.Value))
		}
		if len(seq) == 0 {
			t.Fatalf("partition %d: no firing", p)
		}
		for i, v := range seq {
			if v != strconv.Itoa(i+1) {
				t.Fatalf("partition %d: firings sent %v, want 1..%d in order", p, seq, len(seq))
			}
		}
		if stored[tickKey[p]] != seq[len(seq)-1] {
			t.Fatalf("partition %d: the table holds %s firings, the timer sent %d", p, stored[tickKey[p]], len(seq))
		}
	}
	_ = w
}

// A stream-time timer fires at the first record of its partition, for the
// interval the record falls in, and then for every multiple of its
// interval the partition's record timestamps pass, each once and in order,
// however fast the records come; what it wrote to its table is the last
// firing, and each record it sent carries its firing's stream time (Kafka
// Streams forwards at the punctuation's time), not the wall clock.
func TestStreamTimeTimerFiresEveryInterval(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "stime")
	a := streamsApp(id)
	events := app.Topic(a, "events", codec.String(), codec.String(), app.Partitions(parts))
	fired := app.Topic(a, "fired", codec.String(), codec.String(), app.Partitions(parts))
	last := table.New(a, "last-fired", codec.String(), codec.String())
	word := wordPerPartition("w")
	agent.New(a, "watch", events, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for range s.Events() {
		}
		return s.Err()
	}, agent.Every(time.Hour, agent.StreamTime, func(ctx context.Context, tk *agent.Tick) error {
		at := tk.Time.UTC().Format(time.RFC3339)
		last.Put(tk, word[tk.Partition()], at)
		return fired.TrySend(tk, word[tk.Partition()], at)
	}), agent.WritesTo(last), agent.SendsTo(fired))

	// Partition p's records start at 07 past an hour and go 10 minutes
	// apart (partition 3 out of order by one step), over p+3 hours.
	base := time.Now().Add(-12 * time.Hour).Truncate(time.Hour).Add(7 * time.Minute)
	var recs []timedKV
	wantFired := map[int32][]string{}
	for p := range int32(parts) {
		n := int(p+3) * 6
		var max time.Time
		var seen []string
		for i := range n {
			j := i
			if p == 3 && i%5 == 1 {
				j = i - 1 // not after the previous record: the stream time stays
			}
			ts := base.Add(time.Duration(j) * 10 * time.Minute)
			recs = append(recs, timedKV{k: word[p], v: strconv.Itoa(i), ts: ts})
			if ts.After(max) {
				max = ts
			}
			b := max.Truncate(time.Hour).Format(time.RFC3339)
			if !slices.Contains(seen, b) {
				seen = append(seen, b)
			}
		}
		wantFired[p] = seen
	}

	dir := t.TempDir()
	_, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, events.Name())
	sendTimed(t, brokers, events.Name(), recs...)
	testbroker.WaitLag0(t, brokers, id, events.Name())
	// Wait for every firing (or the deadline: the comparison below says
	// what is missing).
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		got, all := readAll(t, client, fired.Name()), true
		for p, want := range wantFired {
			all = all && len(got[p]) >= len(want)
		}
		if all {
			break
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, client, fired.Name())
	stored := storeTable(t, dir, "last-fired")
	for p, want := range wantFired {
		var seq []string
		for _, m := range got[p] {
			seq = append(seq, string(m.Value))
			if at := m.Timestamp.UTC().Format(time.RFC3339); at != string(m.Value) {
				t.Errorf("partition %d: the record of the firing at %s is stamped %s", p, m.Value, at)
			}
		}
		if !slices.Equal(seq, want) {
			t.Fatalf("partition %d fired %v, want %v", p, seq, want)
		}
		if stored[word[p]] != want[len(want)-1] {
			t.Fatalf("partition %d: table holds %q, want the last firing %q", p, stored[word[p]], want[len(want)-1])
		}
	}
}

// A timer whose function fails restarts the partition from its committed
// offsets, as a failed record does: the records are processed again and
// the counts stay exact.
func TestFailingTimerRestartsPartition(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "tfail")
	a := streamsApp(id, app.WithRedelivery(app.Redelivery{Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}))
	in := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(parts))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	word := wordPerPartition("w")
	var failures atomic.Int32 // the timer of partition 0 fails twice, once it saw a count
	agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.Every(20*time.Millisecond, agent.WallClock, func(ctx context.Context, tk *agent.Tick) error {
		if tk.Partition() != 0 || failures.Load() >= 2 {
			return nil
		}
		if n, ok, err := counts.Get(tk, word[0]); err != nil || !ok || n == 0 {
			return err
		}
		// A write the failure must drop with the cache.
		counts.Put(tk, word[0], -1000)
		return fmt.Errorf("timer failure %d", failures.Add(1))
	}), agent.WritesTo(counts))
	recs, want := words(600, word...)
	dir := t.TempDir()
	_, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, in.Name())
	send(t, brokers, in.Name(), recs...)
	waitUntil(t, 60*time.Second, "two timer failures", func() bool { return failures.Load() == 2 })
	testbroker.WaitLag0(t, brokers, id, in.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
}

// Lookups and joins are checked for co-partitioning when the App is built;
// global tables need no check; a timer needs a positive interval.
func TestStreamsDeclarationChecks(t *testing.T) {
	a := app.New("checks")
	events := app.Topic(a, "events", codec.String(), codec.String(), app.Partitions(8))
	small := table.New(a, "small", codec.String(), codec.String(), table.Partitions(4))
	same := table.New(a, "same", codec.String(), codec.String())
	global := table.NewGlobal(a, "everywhere", codec.String(), codec.String())
	nop := func(ctx context.Context, s *agent.Stream[string, string]) error { return nil }
	agent.New(a, "enrich", events, nop, agent.Lookup(small, same, global))
	agent.New(a, "tick", events, nop, agent.Every(0, agent.WallClock, func(context.Context, *agent.Tick) error { return nil }))
	table.Join(a, "joined", table.InnerJoin, same, small, codec.String(),
		func(l table.Side[string], r table.Side[string]) string { return l.Value + r.Value })
	_, err := a.Topology()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"agent enrich: looks up table small (4 partitions) by the key of events (8 partitions): not co-partitioned",
		"agent tick: wall-clock timer: interval must be positive",
		"table joined (8 partitions): joins table small (4 partitions)",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	for _, bad := range []string{"table same", "everywhere"} {
		if strings.Contains(err.Error(), "looks up table "+bad) {
			t.Errorf("error names %s:\n%v", bad, err)
		}
	}
}

// The records of a repartition topic below the group's committed offsets are
// deleted (DeleteRecords) every purge interval; the topic is created with
// retention.ms=-1, so nothing is deleted before it was committed.
func TestRepartitionPurgesCommittedRecords(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "purge")
	a := streamsApp(id, app.WithRepartitionPurge(50*time.Millisecond))
	in := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(parts))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
	byValue := agent.GroupBy(a, "by-value", in, codec.String(), func(ev *agent.Event[string, string]) (string, error) { return ev.Value, nil })
	agent.New(a, "count", byValue, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(counts))
	var recs []kv
	want := map[string]int{}
	for i := range 300 {
		v := fmt.Sprintf("v%d", i%13)
		recs = append(recs, kv{fmt.Sprintf("k%d", i), v})
		want[v]++
	}
	dir := t.TempDir()
	_, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, in.Name())
	send(t, brokers, in.Name(), recs...)
	testbroker.WaitLag0(t, brokers, id, in.Name())
	testbroker.WaitLag0(t, brokers, id, byValue.Name())
	hws := testbroker.Highwaters(t, client, byValue.Name())
	waitUntil(t, 30*time.Second, "committed repartition records deleted", func() bool {
		for p, hw := range hws {
			oldest, err := client.GetOffset(byValue.Name(), p, sarama.OffsetOldest)
			if err != nil || oldest != hw {
				return false
			}
		}
		return true
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	res, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: byValue.Name(), ConfigNames: []string{"retention.ms"}}},
		sarama.DescribeConfigsOptions{})
	if err != nil || len(res) != 1 || len(res[0].Configs) != 1 || res[0].Configs[0].Value != "-1" {
		t.Fatalf("retention.ms of %s: %+v, %v; want -1", byValue.Name(), res, err)
	}
}

// A table-table join is kept equal to the join of its tables' final values,
// for inner, left and outer joins, with deletes on either side (a key the
// join no longer keeps is deleted: a tombstone in its changelog), whatever
// the interleaving of the two topics that write the tables.
func TestTableTableJoin(t *testing.T) {
	// The test reads the inner join's changelog whole, tombstones included:
	// kfake's cleaner ignores min.compaction.lag.ms and, every second by
	// default, compacted it under the read (the head record gone, the
	// consumer's offset out of range); Kafka keeps it for Runnel's 10 min lag.
	brokers := testbroker.BrokersWith(t, embedded.Options{CleanerBackoff: time.Hour})
	id := testbroker.Topic(t, "join")
	a := streamsApp(id)
	leftIn := app.Topic(a, "left-in", codec.String(), codec.String(), app.Partitions(parts))
	rightIn := app.Topic(a, "right-in", codec.String(), codec.String(), app.Partitions(parts))
	left := table.New(a, "left", codec.String(), codec.String())
	right := table.New(a, "right", codec.String(), codec.String())
	joiner := func(l table.Side[string], r table.Side[string]) string {
		out := "-"
		if l.OK {
			out = l.Value
		}
		if r.OK {
			return out + "|" + r.Value
		}
		return out + "|-"
	}
	table.Join(a, "inner", table.InnerJoin, left, right, codec.String(), joiner)
	table.Join(a, "lefty", table.LeftJoin, left, right, codec.String(), joiner)
	table.Join(a, "outer", table.OuterJoin, left, right, codec.String(), joiner)
	agent.New(a, "set-left", leftIn, setOrDelete(left), agent.WritesTo(left))
	agent.New(a, "set-right", rightIn, setOrDelete(right), agent.WritesTo(right))
	if g, err := a.Topology(); err != nil || !strings.Contains(fmt.Sprintf("%+v", g.Tables), "JoinOf:[left right] JoinKind:inner") {
		t.Fatalf("topology %+v, %v: the join is not shown", g.Tables, err)
	}

	// The model: the last value of each key on each side.
	var lrecs, rrecs []kv
	lm, rm := map[string]string{}, map[string]string{}
	for i := range 600 {
		k := fmt.Sprintf("k%d", (i*7)%41)
		lv, rv := fmt.Sprintf("l%d", i), fmt.Sprintf("r%d", i)
		if i%5 == 0 {
			lv = "del"
		}
		if i%3 == 0 {
			rv = "del"
		}
		if i%2 == 0 {
			lrecs = append(lrecs, kv{k, lv})
			if lv == "del" {
				delete(lm, k)
			} else {
				lm[k] = lv
			}
		} else {
			rrecs = append(rrecs, kv{k, rv})
			if rv == "del" {
				delete(rm, k)
			} else {
				rm[k] = rv
			}
		}
	}
	want := map[string]map[string]string{"inner": {}, "lefty": {}, "outer": {}}
	for _, k := range append(slices.Collect(mapKeys(lm)), slices.Collect(mapKeys(rm))...) {
		l, lok := lm[k]
		r, rok := rm[k]
		v := joiner(table.Side[string]{Value: l, OK: lok}, table.Side[string]{Value: r, OK: rok})
		if lok && rok {
			want["inner"][k] = v
		}
		if lok {
			want["lefty"][k] = v
		}
		want["outer"][k] = v
	}

	dir := t.TempDir()
	_, stop := goWorker(t, a, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, leftIn.Name())
	testbroker.WaitTopic(t, client, rightIn.Name())
	done := make(chan struct{})
	go func() { defer close(done); send(t, brokers, leftIn.Name(), lrecs...) }()
	send(t, brokers, rightIn.Name(), rrecs...)
	<-done
	testbroker.WaitLag0(t, brokers, id, leftIn.Name(), rightIn.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for name, w := range want {
		got := storeTable(t, dir, name)
		if !maps.Equal(got, w) {
			t.Fatalf("join %s = %v\nwant %v", name, got, w)
		}
	}
	// A key the inner join dropped has a tombstone in its changelog.
	tombstones := 0
	for _, ms := range readAll(t, client, id+"-inner-changelog") {
		for _, m := range ms {
			if m.Value == nil {
				tombstones++
			}
		}
	}
	if tombstones == 0 {
		t.Fatal("the inner join's changelog holds no tombstone")
	}
}

func mapKeys(m map[string]string) iter.Seq[string] { return maps.Keys(m) }

// setOrDelete is an agent that writes each record's value to tb under its
// key, or deletes the key when the value is "del".
func setOrDelete(tb *table.Table[string, string]) agent.Func[string, string] {
	return func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			var err error
			if ev.Value == "del" {
				err = tb.TryDelete(ev, ev.Key)
			} else {
				err = tb.TryPut(ev, ev.Key, ev.Value)
			}
			if err != nil {
				return err
			}
		}
		return s.Err()
	}
}
