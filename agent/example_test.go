package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/runneltest"
	"github.com/runnel-dev/runnel/table"
)

// An agent over a topic: it upper-cases each record's value into a sink
// topic and dead-letters a record it cannot handle (Event.Reject), which is
// then committed, never retried. Everything it derives from a record is
// bound to the record: its offset commits only after the broker acknowledged
// the sink record.
func ExampleNew() {
	a := app.New("shout")
	in := app.Topic(a, "words", codec.String(), codec.String(), app.Partitions(1))
	out := app.Topic(a, "loud-words", codec.String(), codec.String(), app.Partitions(1))
	agent.New(a, "shout", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if ev.Value == "" {
				ev.Reject(errors.New("empty word"))
				continue
			}
			out.Send(ev, ev.Key, strings.ToUpper(ev.Value))
		}
		return s.Err()
	}, agent.SendsTo(out))

	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	for _, w := range []string{"hello", "", "world"} {
		if _, _, err := runneltest.Send(d, in, "k", w); err != nil {
			log.Fatal(err)
		}
	}
	recs, err := runneltest.Records(d, out)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range recs {
		fmt.Println(r.Value)
	}
	dls, err := d.DeadLetters("shout")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("dead letters:", len(dls))
	// Output:
	// HELLO
	// WORLD
	// dead letters: 1
}

// GroupBy re-keys a stream through a repartition topic so that an agent can
// keep a table by the new key: page views arrive keyed by session, and are
// counted per page.
func ExampleGroupBy() {
	a := app.New("pages")
	views := app.Topic(a, "views", codec.String(), codec.String(), app.Partitions(2)) // session -> page
	byPage := agent.GroupBy(a, "by-page", views, codec.String(), func(ev *agent.Event[string, string]) (string, error) {
		return ev.Value, nil
	})
	perPage := table.New(a, "views-per-page", codec.String(), codec.DecimalInt64())
	agent.New(a, "count", byPage, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			perPage.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(perPage))

	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	for _, v := range [][2]string{{"s1", "/home"}, {"s2", "/home"}, {"s3", "/about"}, {"s1", "/home"}} {
		if _, _, err := runneltest.Send(d, views, v[0], v[1]); err != nil {
			log.Fatal(err)
		}
	}
	for _, page := range []string{"/home", "/about"} {
		n, _, err := runneltest.Get(d, perPage, page)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(page, n)
	}
	// Output:
	// /home 3
	// /about 1
}

// A stream-time timer: it fires on each partition when the partition's
// stream time (the highest record timestamp seen) passes a multiple of the
// interval, and at the partition's first record for the interval that
// record falls in. Its sends are bound to the firing as a record's are to
// the record.
func ExampleEvery() {
	a := app.New("hourly")
	readings := app.Topic(a, "readings", codec.String(), codec.DecimalInt64(), app.Partitions(1))
	marks := app.Topic(a, "hour-marks", codec.String(), codec.String(), app.Partitions(1))
	agent.New(a, "sensor", readings, func(ctx context.Context, s *agent.Stream[string, int64]) error {
		for range s.Events() {
		}
		return s.Err()
	}, agent.Every(time.Hour, agent.StreamTime, func(ctx context.Context, tick *agent.Tick) error {
		marks.Send(tick, "mark", tick.Time.Format(time.RFC3339))
		return nil
	}), agent.SendsTo(marks))

	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	base := time.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)
	for _, m := range []int{5, 50, 70} { // 70 minutes in: stream time passes the next hour
		if _, _, err := runneltest.Send(d, readings, "s1", int64(m), runneltest.At(base.Add(time.Duration(m)*time.Minute))); err != nil {
			log.Fatal(err)
		}
	}
	// Timers fire beside the records, not with them: wait for both marks.
	var recs []runneltest.Record[string, string]
	for deadline := time.Now().Add(10 * time.Second); len(recs) < 2 && time.Now().Before(deadline); {
		if recs, err = runneltest.Records(d, marks); err != nil {
			log.Fatal(err)
		}
	}
	for _, r := range recs {
		at, err := time.Parse(time.RFC3339, r.Value)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("tick at base +", at.Sub(base))
	}
	// Output:
	// tick at base + 0s
	// tick at base + 1h0m0s
}
