package nats

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/internal/testtool"
)

// startServer starts a real nats-server (Debian package nats-server) with
// JetStream in a temporary directory on a free loopback port. A missing
// binary skips the test unless RUNNEL_REQUIRE_NATS_SERVER=1 (CI) fails it.
func startServer(t *testing.T) string {
	t.Helper()
	bin := testtool.LookPath(t, "nats-server", "nats-server", "apt-get install nats-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", t.TempDir())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Server is ready") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("nats-server did not become ready")
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", port)
}

// clean -> acked once; rejected -> terminated, never redelivered; failed ->
// redelivered (after the Nak delay), then acked.
func TestJetStreamAckTermNak(t *testing.T) {
	url := startServer(t)
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
