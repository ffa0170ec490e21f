package table_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/runneltest"
	"github.com/runnel-dev/runnel/table"
)

// A table of running totals per account: the agent updates the account's
// row with each deposit (a read-modify-write bound to the record), and the
// test reads the table back once the records are processed.
func ExampleNew() {
	a := app.New("balances")
	deposits := app.Topic(a, "deposits", codec.String(), codec.DecimalInt64(), app.Partitions(2))
	balances := table.New(a, "balances", codec.String(), codec.DecimalInt64())
	agent.New(a, "sum", deposits, func(ctx context.Context, s *agent.Stream[string, int64]) error {
		for ev := range s.Events() {
			balances.Update(ev, ev.Key, func(old int64) int64 { return old + ev.Value })
		}
		return s.Err()
	}, agent.WritesTo(balances))

	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	for _, dep := range []struct {
		account string
		amount  int64
	}{{"alice", 30}, {"bob", 5}, {"alice", 12}} {
		if _, _, err := runneltest.Send(d, deposits, dep.account, dep.amount); err != nil {
			log.Fatal(err)
		}
	}
	for _, account := range []string{"alice", "bob", "carol"} {
		n, ok, err := runneltest.Get(d, balances, account)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(account, n, ok)
	}
	// Output:
	// alice 42 true
	// bob 5 true
	// carol 0 false
}

// A windowed count: clicks per user per minute (tumbling windows) in event
// time, the records' timestamps. The agent sends the current window's count
// to a topic after each update.
func ExampleNewWindowed() {
	a := app.New("clicks")
	clicks := app.Topic(a, "clicks", codec.String(), codec.String(), app.Partitions(1))
	counts := app.Topic(a, "click-counts", codec.String(), codec.String(), app.Partitions(1))
	perMinute := table.NewWindowed(a, "clicks-per-minute", codec.String(), codec.DecimalInt64(), table.Tumbling(time.Minute))
	agent.New(a, "count", clicks, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			perMinute.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			n, w, _, err := perMinute.Current(ev, ev.Key)
			if err != nil {
				return err
			}
			counts.Send(ev, ev.Key, fmt.Sprintf("%s: %d", w.Start.Format("15:04"), n))
		}
		return s.Err()
	}, agent.WritesTo(perMinute), agent.SendsTo(counts))

	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	base := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	for _, s := range []int{10, 40, 70} { // two clicks in 09:00, one in 09:01
		if _, _, err := runneltest.Send(d, clicks, "alice", "/home", runneltest.At(base.Add(time.Duration(s)*time.Second))); err != nil {
			log.Fatal(err)
		}
	}
	recs, err := runneltest.Records(d, counts)
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range recs {
		fmt.Println(r.Key, r.Value)
	}
	// Output:
	// alice 09:00: 1
	// alice 09:00: 2
	// alice 09:01: 1
}

// A global table: every worker holds all of it, so an agent reads any key
// from it whatever the record's partition (here: the exchange rate of an
// order's currency). Rates are written by their own agent, keyed by
// currency; orders are keyed by order id.
func ExampleNewGlobal() {
	a := app.New("orders")
	rateUpdates := app.Topic(a, "rates", codec.String(), codec.DecimalInt64(), app.Partitions(2))
	orders := app.Topic(a, "orders", codec.String(), codec.String(), app.Partitions(2))
	rates := table.NewGlobal(a, "rates", codec.String(), codec.DecimalInt64()) // cents per unit
	priced := table.New(a, "priced-orders", codec.String(), codec.DecimalInt64())
	agent.New(a, "rates", rateUpdates, func(ctx context.Context, s *agent.Stream[string, int64]) error {
		for ev := range s.Events() {
			rates.Put(ev, ev.Key, ev.Value)
		}
		return s.Err()
	}, agent.WritesTo(rates))
	agent.New(a, "price", orders, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			rate, ok, err := rates.Get(ev, ev.Value) // any currency, from any partition
			if err != nil {
				return err
			}
			if !ok {
				ev.Reject(fmt.Errorf("no rate for %s", ev.Value))
				continue
			}
			priced.Put(ev, ev.Key, rate)
		}
		return s.Err()
	}, agent.WritesTo(priced))

	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	for cur, rate := range map[string]int64{"EUR": 108, "GBP": 127} {
		if _, _, err := runneltest.Send(d, rateUpdates, cur, rate); err != nil {
			log.Fatal(err)
		}
	}
	if err := d.Wait(); err != nil { // the rates are in before the orders come
		log.Fatal(err)
	}
	for id, cur := range map[string]string{"o-1": "EUR", "o-2": "GBP"} {
		if _, _, err := runneltest.Send(d, orders, id, cur); err != nil {
			log.Fatal(err)
		}
	}
	for _, id := range []string{"o-1", "o-2"} {
		rate, _, err := runneltest.Get(d, priced, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(id, rate)
	}
	// Output:
	// o-1 108
	// o-2 127
}

// A table-table join: the joined table holds, for every user, their name and
// their city, recomputed in the same commit cycle as every write to either
// side. With LeftJoin a user without a city is kept (right.OK is false).
func ExampleJoin() {
	a := app.New("profiles")
	names := app.Topic(a, "names", codec.String(), codec.String(), app.Partitions(2))
	cities := app.Topic(a, "cities", codec.String(), codec.String(), app.Partitions(2))
	nameOf := table.New(a, "name-of", codec.String(), codec.String())
	cityOf := table.New(a, "city-of", codec.String(), codec.String())
	profiles := table.Join(a, "profiles", table.LeftJoin, nameOf, cityOf, codec.String(),
		func(name table.Side[string], city table.Side[string]) string {
			if !city.OK {
				return name.Value + " (no city)"
			}
			return name.Value + " in " + city.Value
		})
	copyTo := func(t *table.Table[string, string]) agent.Func[string, string] {
		return func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				t.Put(ev, ev.Key, ev.Value)
			}
			return s.Err()
		}
	}
	agent.New(a, "names", names, copyTo(nameOf), agent.WritesTo(nameOf))
	agent.New(a, "cities", cities, copyTo(cityOf), agent.WritesTo(cityOf))

	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	for id, name := range map[string]string{"u1": "Ada", "u2": "Grace"} {
		if _, _, err := runneltest.Send(d, names, id, name); err != nil {
			log.Fatal(err)
		}
	}
	if _, _, err := runneltest.Send(d, cities, "u1", "London"); err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"u1", "u2"} {
		p, _, err := runneltest.Get(d, profiles.Table, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(id, p)
	}
	// Output:
	// u1 Ada in London
	// u2 Grace (no city)
}
