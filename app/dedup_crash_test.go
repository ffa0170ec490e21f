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

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// Environment of the two-hop crash child (TestKilledFirstHopIsNotCountedTwice).
const (
	envHopChild   = "RUNNEL_HOP_CRASH_CHILD" // app id; non-empty makes the binary a worker
	envHopBrokers = "RUNNEL_HOP_CRASH_BROKERS"
	envHopDir     = "RUNNEL_HOP_CRASH_DIR"
	envHopDet     = "RUNNEL_HOP_CRASH_DETERMINISTIC" // "1": the first hop's agent is agent.Deterministic
)

func init() {
	if id := os.Getenv(envHopChild); id != "" {
		os.Exit(hopChild(id))
	}
}

// hopApp declares a two-hop app: "split" sends each input record to the
// repartition topic "by" (one record each), "count" counts each of those in
// a table and sends its value to the sink. The first hop's offsets are
// committed only every 30 s (it writes no table, and no task of the second
// hop holds its partition); the second hop's tasks commit as soon as they
// are idle.
func hopApp(id string, brokers []string, deterministic bool) (*App, *agent.Topic[string, string], *agent.Topic[string, string], *agent.Topic[string, string]) {
	a := New(id, WithBrokers(brokers...), WithTopicPrefix(id+"-"),
		WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		WithCommitInterval(30*time.Second),
		WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))))
	in := Topic(a, "in", codec.String(), codec.String(), Partitions(1))
	sink := Topic(a, "sink", codec.String(), codec.String(), Partitions(1))
	// Two partitions: the first hop's input (one) is then in no task of
	// the second hop, whose tasks commit as soon as they are idle.
	by := agent.Repartition(a, "by", in, codec.String(), codec.String(), agent.Partitions(2))
	counts := table.New(a, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(2))
	opts := []agent.Option{agent.SendsTo(by)}
	if deterministic {
		opts = append(opts, agent.Deterministic())
	}
	agent.New(a, "split", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			by.Send(ev, ev.Value, ev.Value)
		}
		return s.Err()
	}, opts...)
	agent.New(a, "count", by, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			sink.Send(ev, ev.Key, ev.Value)
		}
		return s.Err()
	}, agent.WritesTo(counts), agent.SendsTo(sink))
	return a, in, by, sink
}

func hopChild(id string) int {
	a, _, _, _ := hopApp(id, strings.Split(os.Getenv(envHopBrokers), ","), os.Getenv(envHopDet) == "1")
	return runChildWorker(a, os.Getenv(envHopDir))
}

// A worker process running both hops is killed (SIGKILL) after the second
// hop committed every repartition record and before the first hop committed
// its input: the next process processes the whole input again and sends
// every repartition record a second time. With the first hop's agent
// agent.Deterministic, the second hop skips all of them (every input value
// reaches the sink once, and later input once); without it, each is counted
// twice (the test checks the control too, so that it shows what the stamps
// change).
func TestKilledFirstHopIsNotCountedTwice(t *testing.T) {
	brokers := testbroker.Brokers(t)
	for _, det := range []bool{true, false} {
		t.Run(fmt.Sprintf("deterministic=%v", det), func(t *testing.T) {
			f := newAckFixture(t, brokers)
			id := f.app.id
			_, in, by, sink := hopApp(id, brokers, det)
			f.in, f.sink = in, sink
			dir := t.TempDir()
			child := func() *exec.Cmd {
				env := []string{envHopChild + "=" + id, envHopBrokers + "=" + strings.Join(brokers, ","), envHopDir + "=" + dir}
				if det {
					env = append(env, envHopDet+"=1")
				}
				return startChild(t, env...)
			}
			const n = 100
			vals := make([]string, n)
			for i := range vals {
				vals[i] = "v" + strconv.Itoa(i)
			}
			first := child()
			t.Cleanup(func() { _ = first.Process.Kill(); _ = first.Wait() })
			f.produce(vals...)
			f.eventually(60*time.Second, "the second hop committed every repartition record", func() bool {
				return f.committedOf(by.Name(), 2) == n
			})
			if c := f.committed(); c > 0 {
				t.Fatalf("the first hop committed %d before the kill; the test needs it uncommitted", c)
			}
			if err := first.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = first.Wait()

			second := child()
			t.Cleanup(func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() })
			// Later input, behind the records sent again on both repartition
			// partitions: its writes make the second hop's cycles commit (a
			// cycle that wrote nothing only marks its offsets for the
			// session's commit, every 30 s here).
			more := make([]string, 20)
			for i := range more {
				more[i] = "w" + strconv.Itoa(i)
			}
			f.produce(more...)
			f.eventually(60*time.Second, "the second hop committed the records sent again and the later input", func() bool {
				return f.committedOf(by.Name(), 2) == int64(2*n+len(more))
			})
			got := f.values(sink.Name())
			want := 1
			if !det {
				want = 2
			}
			for _, v := range vals {
				if got[v] != want {
					t.Fatalf("%s reached the sink %d times, want %d (deterministic %v)", v, got[v], want, det)
				}
			}
			for _, v := range more {
				if got[v] != 1 {
					t.Fatalf("later input %s reached the sink %d times, want 1", v, got[v])
				}
			}
		})
	}
}

// committedOf returns the sum of the group's committed offsets of the
// first parts partitions of topic (a partition without one counts 0).
func (f *ackFixture) committedOf(topic string, parts int32) int64 {
	f.t.Helper()
	om, err := sarama.NewOffsetManagerFromClient(f.app.id, f.client)
	if err != nil {
		return -1
	}
	defer om.Close()
	sum := int64(0)
	for p := range parts {
		pom, err := om.ManagePartition(topic, p)
		if err != nil {
			return -1
		}
		off, _ := pom.NextOffset()
		pom.AsyncClose()
		sum += max(off, 0)
	}
	return sum
}
