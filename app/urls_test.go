package app_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// TestQueriesWithoutURLMap (issue #13, assignments that stay small): with
// the URL map left out of every assignment (WithURLMapBudget(-1): the
// leader's Assignment.URLsOmitted), a worker asked for a key whose
// partition another worker owns derives the owner from the group's
// description: it names the owner (forward=0) and forwards the query to it.
func TestQueriesWithoutURLMap(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "urls")
	type worker struct {
		w    *app.Worker
		addr string
		done chan error
	}
	var topic string
	start := func(name string) *worker {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		a := app.New(id,
			app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
			app.WithCommitInterval(200*time.Millisecond), app.WithLogger(testLogger()),
			app.WithTopicPrefix(id+"-"), app.WithHTTPAddr(addr), app.WithURLMapBudget(-1))
		in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(gparts))
		topic = in.Name()
		counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
		agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				counts.Update(ev, ev.Key, func(c int64) int64 { return c + 1 })
			}
			return s.Err()
		}, agent.WritesTo(counts))
		w, err := a.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir(), Name: name})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		rw := &worker{w: w, addr: addr, done: make(chan error, 1)}
		go func() { rw.done <- w.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-rw.done })
		return rw
	}
	w1 := start("w1")
	w2 := start("w2")
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, topic)
	pr := newGProducer(t, brokers, topic)
	keys := make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%02d", i)
		pr.send(keys[i])
		pr.send(keys[i])
	}
	// Both workers ready on one generation, each with actives.
	for deadline := time.Now().Add(30 * time.Second); ; {
		a1, a2 := w1.w.Assignment(), w2.w.Assignment()
		if w1.w.Ready() && w2.w.Ready() && a1.Generation == a2.Generation && len(a1.Actives[topic]) > 0 && len(a2.Actives[topic]) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers never ready with actives each: %v, %v", a1.Actives, a2.Actives)
		}
		time.Sleep(20 * time.Millisecond)
	}
	testbroker.WaitLag0(t, brokers, id, topic)
	a1 := w1.w.Assignment()
	if !a1.URLsOmitted || len(a1.URLs[topic]) != 0 {
		t.Fatalf("assignment URL map: omitted %v, %d partitions; want it left out", a1.URLsOmitted, len(a1.URLs[topic]))
	}
	var checked int
	for _, k := range keys {
		p := kafka.PartitionFor([]byte(k), gparts)
		if slices.Contains(a1.Actives[topic], p) {
			continue
		}
		// w2 owns k: w1 names it and forwards to it.
		var code int
		var ans app.TableAnswer
		for deadline := time.Now().Add(10 * time.Second); ; {
			code, ans = getJSON(t, "http://"+w1.addr+"/api/tables/counts/"+k+"?forward=0")
			if ans.Reason != app.ReasonRebalancing || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if code != http.StatusServiceUnavailable || ans.Reason != app.ReasonNotOwner || ans.Owner != w2.addr {
			t.Fatalf("GET counts/%s?forward=0 on w1 = %d %+v, want 503 not-owner with owner %s", k, code, ans, w2.addr)
		}
		code, ans = getJSON(t, "http://"+w1.addr+"/api/tables/counts/"+k)
		if code != http.StatusOK || fmt.Sprint(ans.Value) != strconv.Itoa(2) {
			t.Fatalf("GET counts/%s on w1 (forwarded) = %d %+v, want 200 value 2", k, code, ans)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("w1 owns every key; the test needs keys owned by w2")
	}
	t.Logf("%d keys owned by w2 answered through w1 with the derived URL map", checked)
}
