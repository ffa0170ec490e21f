package nats

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/internal/testtool"
)

// clean -> acked once; rejected -> terminated, never redelivered; failed ->
// redelivered (after the Nak delay), then acked.
func TestJetStreamAckTermNak(t *testing.T) {
	url := testtool.NATSServer(t)
	nc, err := natsgo.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "AUDIT", Subjects: []string{"audit.>"}}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "AUDIT", jetstream.ConsumerConfig{Durable: "runnel", AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: 30 * time.Second, MaxDeliver: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct{ subj, data string }{{"audit.a", "ok"}, {"audit.b", "reject"}, {"audit.c", "fail"}, {"audit.a", "ok2"}} {
		if _, err := js.Publish(ctx, m.subj, []byte(m.data)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := source.NewManager(source.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer m.StopAll()
	sub, err := m.Subscribe("nats:AUDIT/runnel", "auditor", Factory(Config{Consumer: cons, NakDelay: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); {
		dctx, dcancel := context.WithTimeout(ctx, 700*time.Millisecond)
		d, err := sub.Next(dctx)
		dcancel()
		if errors.Is(err, context.DeadlineExceeded) {
			break // quiet for 700 ms: 14 Nak delays, nothing more is coming
		}
		if err != nil {
			t.Fatal(err)
		}
		v := string(d.Record.Value)
		seen[v]++
		switch {
		case v == "reject":
			d.Reject(errors.New("not auditable"))
		case v == "fail" && seen[v] == 1:
			d.Fail(errors.New("transient"))
		}
	}
	want := map[string]int{"ok": 1, "reject": 1, "fail": 2, "ok2": 1}
	for k, n := range want {
		if seen[k] != n {
			t.Fatalf("deliveries %v, want %v", seen, want)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.AckFloor.Stream == 4 && info.NumRedelivered == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("consumer not fully acked: pending %d, ack floor %d, redelivered %d", info.NumAckPending, info.AckFloor.Stream, info.NumRedelivered)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
