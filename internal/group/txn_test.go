package group

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// handedSource is a task source whose records up to next are handed out and
// resolved: a cycle's commit point is next.
type handedSource struct {
	topic string
	p     int32
	next  atomic.Int64
}

func (s *handedSource) Topic() string                              { return s.topic }
func (s *handedSource) Partition() int32                           { return s.p }
func (s *handedSource) Pause() int64                               { return s.next.Load() }
func (s *handedSource) Resume()                                    {}
func (s *handedSource) AwaitResolved(context.Context, int64) error { return nil }
func (s *handedSource) Committable(int64)                          {}
func (s *handedSource) Handed() int64                              { return s.next.Load() }

// taskList is TxnTasks over plain tasks, recording what the committer did
// to them.
type taskList struct {
	mu        sync.Mutex
	ts        []*task.Task
	abandoned []error // each Abandon's error
	counted   int     // Counted calls
}

func (l *taskList) All() []*task.Task {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*task.Task(nil), l.ts...)
}
func (l *taskList) Task(t *task.Task) *task.Task { return t }
func (l *taskList) Name(t *task.Task) string     { return fmt.Sprint(t.Partition) }
func (l *taskList) Abandon(t *task.Task, err error) {
	t.Abandon(err)
	l.mu.Lock()
	l.abandoned = append(l.abandoned, err)
	l.mu.Unlock()
}
func (l *taskList) Unresolved([]*task.Task) int64 { return 0 }
func (l *taskList) SkipControl(*task.Task)        {}
func (l *taskList) Counted([]*task.Task, task.Stats) {
	l.mu.Lock()
	l.counted++
	l.mu.Unlock()
}
func (l *taskList) Postponed([]*task.Task) {}

// set replaces the running tasks.
func (l *taskList) set(ts ...*task.Task) {
	l.mu.Lock()
	l.ts = ts
	l.mu.Unlock()
}

// TestTxnCommitterCommitsAbortsAndReopens runs the transaction committer on
// kfake with one task, without a worker: a cycle commits the sink record
// sent in the transaction with the source's offset (TxnOffsetCommit under
// the member's session); a cycle with nothing new commits nothing; an abort
// abandons every task with its cause, keeps the hand-out gate shut until
// the abandoned task closed, and its record never reaches a read_committed
// reader; a task abandoned on its own that leaves aborts the open
// transaction. The group's offset and the read_committed records are what
// they would not be if a step were skipped or doubled.
func TestTxnCommitterCommitsAbortsAndReopens(t *testing.T) {
	brokers := testbroker.Brokers(t)
	in, out := testbroker.Topic(t, "in"), testbroker.Topic(t, "out")
	testbroker.CreateTopic(t, brokers, in, 1, nil)
	testbroker.CreateTopic(t, brokers, out, 1, nil)
	groupID := testbroker.Topic(t, "g")
	sess := memberOf(t, brokers, groupID, in)

	var logs testbroker.LockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	p, err := kafka.NewTxnProducer(kafka.ProducerConfig{Brokers: brokers, ClientID: "txn-committer-test",
		TransactionalID: testbroker.Topic(t, "txn"), TransactionTimeout: 10 * time.Second,
		DeliveryTimeout: 30 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = p.Close() }()

	m := TxnMetrics{Commits: prometheus.NewCounter(prometheus.CounterOpts{Name: "commits"}),
		Aborts:   prometheus.NewCounter(prometheus.CounterOpts{Name: "aborts"}),
		TimedOut: prometheus.NewCounter(prometheus.CounterOpts{Name: "timed_out"}),
		Resent:   prometheus.NewCounter(prometheus.CounterOpts{Name: "resent"}),
		Seconds:  prometheus.NewHistogram(prometheus.HistogramOpts{Name: "seconds"}),
		Renewals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "renewals"}, []string{"reason"}),
		Cycle:    func(int, time.Duration) {}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Commits, m.Aborts)
	count := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}
	var fatal []error
	var commitMu sync.Mutex
	tasks := &taskList{}
	done := make(chan struct{})
	defer close(done)
	x := NewTxnCommitter(TxnConfig[*task.Task]{Producer: p, Tasks: tasks, Group: groupID,
		TransactionalID: "txn-committer-test", Timeout: 10 * time.Second, CommitInterval: time.Hour,
		CutBudget: time.Second, FlushBudget: 30 * time.Second, CommitMu: &commitMu, Log: log, Metrics: m,
		Fatal: func(err error) { fatal = append(fatal, err) }, Done: done})
	x.SetSession(sess)
	if err := x.Begin(); err != nil {
		t.Fatal(err)
	}

	newTask := func(next int64) (*task.Task, *handedSource) {
		src := &handedSource{topic: in}
		src.next.Store(next)
		tk := &task.Task{Partition: 0}
		tk.Add(src)
		tasks.set(tk)
		return tk, src
	}
	ctx := context.Background()
	// send hands out one sink record in the open transaction and returns
	// its offset in out.
	send := func(v string) int64 {
		t.Helper()
		release, ok := x.HandOut(ctx, nil)
		if !ok {
			t.Fatal("HandOut refused with a transaction open")
		}
		defer release()
		acked := make(chan int64, 1)
		if err := p.Send(&sarama.ProducerMessage{Topic: out, Partition: 0, Value: sarama.StringEncoder(v)},
			func(_ int32, off int64, err error) {
				if err != nil {
					t.Errorf("send %s: %v", v, err)
				}
				acked <- off
			}); err != nil {
			t.Fatal(err)
		}
		return <-acked
	}
	cycle := func(what string) {
		t.Helper()
		if err := x.Cycle(ctx, false); err != nil {
			t.Fatalf("%s: cycle: %v", what, err)
		}
	}
	committedIn := func() int64 { return testbroker.Committed(t, brokers, groupID, in)[0] }

	// A cycle commits the transaction: the sink record and offset 3.
	tk1, src1 := newTask(3)
	send("a")
	cycle("first cycle")
	if n := count("commits"); n != 1 {
		t.Fatalf("commits after the first cycle: %v, want 1", n)
	}
	if c := committedIn(); c != 3 {
		t.Fatalf("committed offset after the first cycle: %d, want 3", c)
	}
	// Nothing handed out since: no commit.
	cycle("idle cycle")
	if n := count("commits"); n != 1 {
		t.Fatalf("commits after a cycle with nothing new: %v, want 1", n)
	}

	// An abort abandons the task, and the gate stays shut until it closed.
	src1.next.Store(5)
	send("b")
	boom := errors.New("boom")
	x.Abort(boom)
	if n := count("aborts"); n != 1 {
		t.Fatalf("aborts: %v, want 1", n)
	}
	if !errors.Is(tk1.Err(), boom) || len(tasks.abandoned) != 1 {
		t.Fatalf("after the abort: task error %v, abandoned %v; want the abort's cause once", tk1.Err(), tasks.abandoned)
	}
	if x.IsOpen() {
		t.Fatal("a transaction opened while the aborted task was still running")
	}
	stop := make(chan struct{})
	close(stop)
	if _, ok := x.HandOut(ctx, stop); ok {
		t.Fatal("HandOut passed with no transaction open")
	}
	tasks.set()
	x.Closed(tk1)
	if !x.IsOpen() {
		t.Fatal("no transaction opened once the aborted task closed")
	}

	// The partition restarts from its committed offset.
	tk2, src2 := newTask(3)
	src2.next.Store(4)
	cOff := send("c")
	cycle("cycle after the abort")
	if c := committedIn(); c != 4 {
		t.Fatalf("committed offset after the abort: %d, want 4 (not the aborted 5)", c)
	}

	// A task abandoned on its own (a timer failed) that leaves aborts the
	// transaction holding what it sent.
	send("d")
	tk2.Abandon(errors.New("timer failed"))
	tasks.set()
	x.LeftAlone(tk2)
	if n := count("aborts"); n != 2 {
		t.Fatalf("aborts after a task left alone: %v, want 2", n)
	}
	if !strings.Contains(logs.String(), "task 0 abandoned alone in the worker's transaction: commit cycle abandoned: timer failed") {
		t.Fatalf("no abort for the task left alone in the logs:\n%s", logs.String())
	}
	if !x.IsOpen() {
		t.Fatal("no transaction opened after the abort with no task left")
	}
	if len(fatal) != 0 || tasks.counted != 3 {
		t.Fatalf("fatal %v, counted cycles %d; want none and 3 (the idle one too)", fatal, tasks.counted)
	}

	// A read_committed reader sees a and c, never b or d.
	sc := testbroker.SaramaConfig(t)
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	c, err := sarama.NewConsumer(brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	pc, err := c.ConsumePartition(out, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pc.Close() }()
	var got []string
	for len(got) == 0 || got[len(got)-1] != "c" {
		select {
		case msg := <-pc.Messages():
			got = append(got, string(msg.Value))
			if msg.Offset > cOff {
				t.Fatalf("read past c (offset %d): %q", cOff, got)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("read_committed read %q in 30 s, want [a c]", got)
		}
	}
	if strings.Join(got, ",") != "a,c" {
		t.Fatalf("read_committed read %q, want [a c]", got)
	}
}
