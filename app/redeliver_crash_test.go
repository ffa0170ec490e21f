package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// Environment of the crash child: a worker process the crash test starts by
// re-executing the test binary (the init below turns it into the worker).
const (
	envCrashChild   = "RUNNEL_ACK_CRASH_CHILD"   // app id; non-empty makes the binary a worker
	envCrashBrokers = "RUNNEL_ACK_CRASH_BROKERS" // comma-separated
	envCrashDir     = "RUNNEL_ACK_CRASH_DIR"     // data dir, kept across restarts
	envCrashBlock   = "RUNNEL_ACK_CRASH_BLOCK"   // value whose second effect never happens
)

func init() {
	if id := os.Getenv(envCrashChild); id != "" {
		os.Exit(crashChild(id))
	}
}

// crashApp declares the crash test's app: agent "twice" writes two derived
// records per input, "<v>-a" then "<v>-b", to the sink; on the value block it
// stops between the two, so that the first is acknowledged and the second
// never sent.
func crashApp(id string, brokers []string, block string) (*App, *agent.Topic[string, string], *agent.Topic[string, string]) {
	a := New(id, WithBrokers(brokers...), WithTopicPrefix(id+"-"),
		WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		WithCommitInterval(50*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	in := Topic(a, "in", codec.String(), codec.String(), Partitions(1))
	sink := Topic(a, "sink", codec.String(), codec.String(), Partitions(1))
	agent.New(a, "twice", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			sink.Send(ev, ev.Key, ev.Value+"-a")
			if ev.Value == block {
				<-ctx.Done() // the process is killed here
				return ctx.Err()
			}
			sink.Send(ev, ev.Key, ev.Value+"-b")
		}
		return s.Err()
	}, agent.SendsTo(sink))
	return a, in, sink
}

func crashChild(id string) int {
	a, _, _ := crashApp(id, strings.Split(os.Getenv(envCrashBrokers), ","), os.Getenv(envCrashBlock))
	return runChildWorker(a, os.Getenv(envCrashDir))
}

// runChildWorker runs a worker of a on dir until it stops, in a child process
// a test started (startChild); it returns the child's exit status.
func runChildWorker(a *App, dir string) int {
	w, err := a.NewWorker(WorkerOptions{DataDir: dir})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := w.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startChild starts the test binary again with env added (an init turns it
// into a worker), its output on the test's stderr.
func startChild(t *testing.T, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// A worker process is killed (SIGKILL) while one record's first derived record
// is acknowledged and its second is not, with later records fanned out but
// unprocessed. A new process on the same data dir loses no input record,
// processes again every record whose effects were not all acknowledged, and
// does not reprocess records below the offset committed before the kill.
func TestCrashRedeliversUnacknowledged(t *testing.T) {
	brokers := testbroker.Brokers(t)
	f := newAckFixture(t, brokers)
	id := f.app.id
	_, in, sink := crashApp(id, brokers, "")
	f.in, f.sink = in, sink
	dir := t.TempDir()
	const n, block = 30, 12
	vals := make([]string, n)
	for i := range vals {
		vals[i] = "v" + strconv.Itoa(i)
	}
	child := func(blockAt string) *exec.Cmd {
		return startChild(t, envCrashChild+"="+id, envCrashBrokers+"="+strings.Join(brokers, ","),
			envCrashDir+"="+dir, envCrashBlock+"="+blockAt)
	}
	first := child(vals[block])
	t.Cleanup(func() { _ = first.Process.Kill(); _ = first.Wait() })
	f.produce(vals...)
	f.eventually(30*time.Second, "the blocked record's first effect", func() bool { return f.values(sink.Name())[vals[block]+"-a"] == 1 })
	f.eventually(10*time.Second, "records before the blocked one committed", func() bool { return f.committed() == block })
	time.Sleep(200 * time.Millisecond) // commit ticks: the committed offset must stay put
	before := f.committed()
	if before != block {
		t.Fatalf("committed %d past the unresolved record %d", before, block)
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()

	second := child("")
	t.Cleanup(func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() })
	f.eventually(30*time.Second, "every record committed after the restart", func() bool { return f.committed() == n })
	got := f.values(sink.Name())
	for i, v := range vals {
		if got[v+"-b"] < 1 {
			t.Fatalf("input %s lost: no %s-b in the sink", v, v)
		}
		if int64(i) < before && (got[v+"-a"] != 1 || got[v+"-b"] != 1) {
			t.Fatalf("%s was committed before the crash but processed again: %d/%d", v, got[v+"-a"], got[v+"-b"])
		}
	}
	if got[vals[block]+"-a"] != 2 || got[vals[block]+"-b"] != 1 {
		t.Fatalf("the half-acknowledged record %s: -a %d times, -b %d times; want 2 and 1", vals[block], got[vals[block]+"-a"], got[vals[block]+"-b"])
	}
}
