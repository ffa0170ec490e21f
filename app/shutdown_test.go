package app_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// jsonLines decodes every line of a JSON log; a line that is not a JSON
// object fails the test (the log must stay machine-readable to the end).
func jsonLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q (%v)\nlog:\n%s", l, err, log)
		}
		out = append(out, m)
	}
	return out
}

// A worker asked to stop (SIGTERM cancels the command's context) exits 0
// after its last session ended, also when the coordinator refuses its
// LeaveGroup (NOT_COORDINATOR, as after a coordinator move): leaving only
// spares the group a session timeout, so the failure is a warning in the
// worker's log (JSON under --log-format json), not the run's error (issue
// #26: exit status 1 and a plain-text "error: 1 error occurred: * kafka
// server: ...").
func TestWorkerStopExitsZeroWhenLeaveGroupFails(t *testing.T) {
	if testbroker.Real() {
		t.Skip("fails LeaveGroup through kfake's control functions")
	}
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	brokers := b.Addrs()
	var leaves atomic.Int32
	b.Cluster().ControlKey(int16(kmsg.LeaveGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.Cluster().KeepControl()
		leaves.Add(1)
		resp := req.ResponseKind().(*kmsg.LeaveGroupResponse)
		resp.ErrorCode = kerr.NotCoordinator.Code
		return resp, nil, true
	})

	c := newCountApp(t, testbroker.Topic(t, "app"))
	var stderr testbroker.LockedBuffer
	ctx, sigterm := context.WithCancel(context.Background())
	defer sigterm()
	exit := make(chan int, 1)
	go func() {
		exit <- app.Execute(ctx, c.app, &stderr, "worker", "--log-format", "json",
			"--brokers", strings.Join(brokers, ","), "--data-dir", t.TempDir())
	}()
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), c.words.Name())
	send(t, brokers, c.words.Name(), kv{"a", "x"}, kv{"b", "y"})
	testbroker.WaitLag0(t, brokers, c.app.ID(), c.words.Name())
	sigterm()
	select {
	case code := <-exit:
		if code != 0 {
			t.Errorf("exit status %d after a requested stop, want 0\nstderr:\n%s", code, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the worker did not stop within 60 s")
	}
	if leaves.Load() == 0 {
		t.Fatal("the worker sent no LeaveGroup: the test did not fail one")
	}
	var warned bool
	for _, l := range jsonLines(t, stderr.String()) {
		if l["level"] == "ERROR" {
			t.Errorf("error logged on a requested stop: %v", l)
		}
		if l["level"] == "WARN" && strings.Contains(l["msg"].(string), "leaving the group failed") {
			warned = true
			if err, _ := l["err"].(string); !strings.Contains(err, sarama.ErrNotCoordinatorForConsumer.Error()) {
				t.Errorf("leave warning without the broker's error: %v", l)
			}
		}
	}
	if !warned {
		t.Errorf("no warning that leaving the group failed:\n%s", stderr.String())
	}
}

// The error that ends a command goes through the app's logger: one JSON
// object under --log-format json, one slog text line otherwise, never a bare
// "error: ..." line nor a multierror's "1 error occurred" around one error
// (issue #26).
func TestFinalErrorIsLogged(t *testing.T) {
	c := newCountApp(t, testbroker.Topic(t, "app"))
	var stderr testbroker.LockedBuffer
	code := app.Execute(context.Background(), c.app, &stderr, "worker", "--log-format", "json",
		"--brokers", "embedded", "--data-dir", t.TempDir())
	if code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	lines := jsonLines(t, stderr.String())
	last := lines[len(lines)-1]
	if last["level"] != "ERROR" || last["msg"] != "command failed" || !strings.HasSuffix(last["command"].(string), " worker") {
		t.Errorf("last log line %v, want the command's error", last)
	}
	if err, _ := last["err"].(string); !strings.Contains(err, `brokers "embedded"`) || strings.Contains(err, "error occurred") {
		t.Errorf("logged error %q", err)
	}

	var text testbroker.LockedBuffer
	if code := app.Execute(context.Background(), c.app, &text, "worker", "--log-format", "text",
		"--brokers", "embedded", "--data-dir", t.TempDir()); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	if out := text.String(); !strings.Contains(out, `level=ERROR msg="command failed"`) || strings.HasPrefix(out, "error:") {
		t.Errorf("text log:\n%s", out)
	}
}
