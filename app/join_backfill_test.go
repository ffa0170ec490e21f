package app_test

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// joinSides declares the two tables of TestJoinBackfill, fed from two
// topics ("del" deletes the key), and returns them.
func joinSides(a *app.App) (leftIn, rightIn *agent.Topic[string, string], left, right *table.Table[string, string]) {
	leftIn = app.Topic(a, "left-in", codec.String(), codec.String(), app.Partitions(parts))
	rightIn = app.Topic(a, "right-in", codec.String(), codec.String(), app.Partitions(parts))
	left = table.New(a, "left", codec.String(), codec.String())
	right = table.New(a, "right", codec.String(), codec.String())
	agent.New(a, "set-left", leftIn, setOrDelete(left), agent.WritesTo(left))
	agent.New(a, "set-right", rightIn, setOrDelete(right), agent.WritesTo(right))
	return
}

// recordCount returns how many records topic holds (read back whole).
func recordCount(t *testing.T, client sarama.Client, topic string) int64 {
	t.Helper()
	var n int64
	for _, ms := range readAll(t, client, topic) {
		n += int64(len(ms))
	}
	return n
}

// A join declared on tables that already hold data is backfilled when each
// partition's task starts: a worker on an empty data dir restores the two
// tables, fills the three joined tables from them, and then keeps them up to
// date from new writes; the result equals the join of the final tables,
// keys written only before the join existed included. A restart with the
// joined tables already equal writes nothing to their changelogs.
func TestJoinBackfill(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "backfill")
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
	// The model: the last value of each key on each side. Before the join:
	// 40 keys, some deleted; after it, writes to 10 of them only.
	lm, rm := map[string]string{}, map[string]string{}
	record := func(i, keys int) (lrec, rrec kv) {
		k := fmt.Sprintf("k%d", (i*7)%keys)
		lv, rv := fmt.Sprintf("l%d", i), fmt.Sprintf("r%d", i)
		if i%5 == 0 {
			lv = "del"
		}
		if i%3 == 0 {
			rv = "del"
		}
		for _, s := range []struct {
			m map[string]string
			v string
		}{{lm, lv}, {rm, rv}} {
			if s.v == "del" {
				delete(s.m, k)
			} else {
				s.m[k] = s.v
			}
		}
		return kv{k, lv}, kv{k, rv}
	}
	var before, after [2][]kv
	for i := range 400 {
		l, r := record(i, 40)
		before[0], before[1] = append(before[0], l), append(before[1], r)
	}
	for i := 400; i < 500; i++ {
		l, r := record(i, 10)
		after[0], after[1] = append(after[0], l), append(after[1], r)
	}
	want := map[string]map[string]string{"inner": {}, "lefty": {}, "outer": {}}
	for _, m := range []map[string]string{lm, rm} {
		for k := range m {
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
	}

	// Before: the tables alone.
	a := streamsApp(id)
	leftIn, rightIn, _, _ := joinSides(a)
	client := testbroker.Client(t, brokers)
	_, stop := goWorker(t, a, brokers, t.TempDir())
	testbroker.WaitTopic(t, client, leftIn.Name())
	testbroker.WaitTopic(t, client, rightIn.Name())
	send(t, brokers, leftIn.Name(), before[0]...)
	send(t, brokers, rightIn.Name(), before[1]...)
	testbroker.WaitLag0(t, brokers, id, leftIn.Name(), rightIn.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// The same app with the joins, on an empty data dir.
	withJoins := func() *app.App {
		a := streamsApp(id)
		_, _, left, right := joinSides(a)
		table.Join(a, "inner", table.InnerJoin, left, right, codec.String(), joiner)
		table.Join(a, "lefty", table.LeftJoin, left, right, codec.String(), joiner)
		table.Join(a, "outer", table.OuterJoin, left, right, codec.String(), joiner)
		return a
	}
	dir := t.TempDir()
	_, stop = goWorker(t, withJoins(), brokers, dir)
	send(t, brokers, leftIn.Name(), after[0]...)
	send(t, brokers, rightIn.Name(), after[1]...)
	testbroker.WaitLag0(t, brokers, id, leftIn.Name(), rightIn.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	changelogs := map[string]int64{}
	for name, w := range want {
		if got := storeTable(t, dir, name); !maps.Equal(got, w) {
			t.Fatalf("join %s = %v\nwant %v", name, got, w)
		}
		changelogs[name] = recordCount(t, client, id+"-"+name+"-changelog")
	}

	// Restarted: the backfill finds the joined tables equal and writes nothing.
	_, stop = goWorker(t, withJoins(), brokers, dir)
	testbroker.WaitLag0(t, brokers, id, leftIn.Name(), rightIn.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for name, w := range want {
		if got := storeTable(t, dir, name); !maps.Equal(got, w) {
			t.Fatalf("after the restart, join %s = %v\nwant %v", name, got, w)
		}
		if n := recordCount(t, client, id+"-"+name+"-changelog"); n != changelogs[name] {
			t.Fatalf("join %s: the restart wrote %d changelog records, want 0", name, n-changelogs[name])
		}
	}
}

// A stream-table lookup (Kafka Streams' stream-table join) reads the table
// as restored: records waiting in the topic when a worker with an empty data
// dir starts are processed only after the table's partition was restored
// from its changelog, so each finds its row. A record whose row does not
// exist yet gets ok=false: the inner join drops it, the left join emits it
// with no right side (Kafka Streams' answers); once the row is written, the
// next record of the key joins it.
func TestLookupAfterRestoreAndBeforeRow(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "lookup")
	a := streamsApp(id)
	profilesIn := app.Topic(a, "profiles-in", codec.String(), codec.String(), app.Partitions(parts))
	events := app.Topic(a, "events", codec.String(), codec.String(), app.Partitions(parts))
	inner := app.Topic(a, "enriched-inner", codec.String(), codec.String(), app.Partitions(parts))
	left := app.Topic(a, "enriched-left", codec.String(), codec.String(), app.Partitions(parts))
	profiles := table.New(a, "profiles", codec.String(), codec.String())
	agent.New(a, "set-profile", profilesIn, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			profiles.Put(ev, ev.Key, ev.Value)
		}
		return s.Err()
	}, agent.WritesTo(profiles))
	agent.New(a, "enrich", events, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			p, ok, err := profiles.Lookup(ev, ev.Key)
			if err != nil {
				return err
			}
			if ok {
				inner.Send(ev, ev.Key, ev.Value+"|"+p)
			} else {
				p = "-"
			}
			left.Send(ev, ev.Key, ev.Value+"|"+p)
		}
		return s.Err()
	}, agent.Lookup(profiles), agent.SendsTo(inner, left))

	users := func(from, to int, f func(i int) kv) []kv {
		var out []kv
		for i := from; i < to; i++ {
			out = append(out, f(i))
		}
		return out
	}
	profile := func(i int) kv { return kv{fmt.Sprintf("u%d", i), fmt.Sprintf("p%d", i)} }
	event := func(n int) func(i int) kv {
		return func(i int) kv { return kv{fmt.Sprintf("u%d", i), fmt.Sprintf("e%d", n)} }
	}
	client := testbroker.Client(t, brokers)
	_, stop := goWorker(t, a, brokers, t.TempDir())
	testbroker.WaitTopic(t, client, profilesIn.Name())
	send(t, brokers, profilesIn.Name(), users(0, 20, profile)...)
	testbroker.WaitLag0(t, brokers, id, profilesIn.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Events for u0..u29 wait in the topic; u20..u29 have no profile.
	send(t, brokers, events.Name(), users(0, 30, event(1))...)
	_, stop = goWorker(t, a, brokers, t.TempDir())
	testbroker.WaitLag0(t, brokers, id, events.Name(), profilesIn.Name())
	send(t, brokers, profilesIn.Name(), users(20, 30, profile)...)
	testbroker.WaitLag0(t, brokers, id, profilesIn.Name())
	send(t, brokers, events.Name(), users(20, 30, event(2))...)
	testbroker.WaitLag0(t, brokers, id, events.Name())
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	got := func(topic string) map[string]string {
		out := map[string]string{}
		for _, ms := range readAll(t, client, topic) {
			for _, m := range ms {
				k := string(m.Key)
				if out[k] != "" {
					out[k] += " "
				}
				out[k] += string(m.Value)
			}
		}
		return out
	}
	wantInner, wantLeft := map[string]string{}, map[string]string{}
	for i := range 30 {
		u, p := fmt.Sprintf("u%d", i), fmt.Sprintf("p%d", i)
		if i < 20 {
			wantInner[u] = "e1|" + p
			wantLeft[u] = "e1|" + p
		} else {
			wantInner[u] = "e2|" + p
			wantLeft[u] = "e1|- e2|" + p
		}
	}
	if g := got(inner.Name()); !maps.Equal(g, wantInner) {
		t.Fatalf("inner join output %v\nwant %v", g, wantInner)
	}
	if g := got(left.Name()); !maps.Equal(g, wantLeft) {
		t.Fatalf("left join output %v\nwant %v", g, wantLeft)
	}
}
