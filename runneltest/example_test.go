package runneltest_test

import (
	"context"
	"fmt"
	"log"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/runneltest"
	"github.com/runnel-dev/runnel/table"
)

// An app counting page views per user and forwarding each view to a sink
// topic, run on the embedded broker: send three records, read the table and
// the sink back.
func Example() {
	a := app.New("page-views")
	views := app.Topic(a, "views", codec.String(), codec.String(), app.Partitions(4))
	audit := app.Topic(a, "views-audit", codec.String(), codec.String(), app.Partitions(1))
	perUser := table.New(a, "views-per-user", codec.String(), codec.DecimalInt64())
	agent.New(a, "count", views, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			perUser.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			audit.Send(ev, ev.Key, ev.Value)
		}
		return s.Err()
	}, agent.WritesTo(perUser), agent.SendsTo(audit))

	d, err := runneltest.Start(a, runneltest.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	for _, v := range [][2]string{{"alice", "/home"}, {"bob", "/home"}, {"alice", "/about"}} {
		if _, _, err := runneltest.Send(d, views, v[0], v[1]); err != nil {
			log.Fatal(err)
		}
	}
	n, ok, err := runneltest.Get(d, perUser, "alice") // waits until all three are processed
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("alice:", n, ok)
	recs, err := runneltest.Records(d, audit)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("audit records:", len(recs))
	// Output:
	// alice: 2 true
	// audit records: 3
}
