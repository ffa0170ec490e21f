package app

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A rejected record is dead-lettered once, also when a later record's
// failure restarts the partition from its last commit cycle, which lies
// before the rejected record: the agent sees it again and rejects it again,
// and the dead letter is not written a second time (issue #26: under
// at-least-once every bad record was dead-lettered twice, and `dlq replay`
// sent it back twice). The agent writes a table (so the partition has a
// task, on Pebble, and restarts revert to its last cycle); no cycle runs
// before the failure (a one-minute interval, no idle commit).
func TestRejectedRecordDeadLetteredOnceAcrossRestart(t *testing.T) {
	f := newAckFixture(t, testbroker.Brokers(t), WithCommitInterval(time.Minute), WithIdleCommit(-1))
	counts := table.New(f.app, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(1))
	var seen counter
	agent.New(f.app, "a", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			n := seen.inc(ev.Value)
			switch {
			case ev.Value == "bad1":
				ev.Reject(errors.New("bad value"))
				continue
			case ev.Value == "fail3" && n == 1:
				return errors.New("transient") // redelivered: the partition restarts
			}
			counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(counts))
	w, err := f.app.NewWorker(WorkerOptions{}) // Pebble stores in the fixture's data dir
	if err != nil {
		t.Fatal(err)
	}
	stop := testbroker.Start(t, w)
	f.produce("v0", "bad1", "v2", "fail3", "v4")
	// The second delivery of fail3 comes after the restart handed out bad1
	// again and resolved it (the cycle before the failed record waits for
	// it), so a second dead letter would be acknowledged by now.
	f.eventually(20*time.Second, "fail3 delivered again", func() bool { return seen.get("fail3") >= 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := seen.get("bad1"); n != 2 {
		t.Fatalf("bad1 handed out %d times, want 2 (the restart must go back before it for this test)", n)
	}
	dlq := f.read(f.app.DeadLetterTopic("a"))
	if len(dlq) != 1 || string(dlq[0].Value) != "bad1" || header(dlq[0], HeaderOffset) != "1" {
		var offs []string
		for _, m := range dlq {
			offs = append(offs, header(m, HeaderOffset))
		}
		t.Fatalf("dead-letter topic holds %d records (source offsets %v), want bad1@1 once", len(dlq), offs)
	}
	if w.DeadLettered() != 1 {
		t.Errorf("worker counted %d dead letters, want 1", w.DeadLettered())
	}
}

// deadLettered keeps an (offset, agent) pair until the marked offset passes
// it; a nil set (ExactlyOnce) records nothing.
func TestDeadLetteredPrunesBelowMarked(t *testing.T) {
	var d deadLettered
	d.add(4, "a", "dlq-a", 0)
	d.add(4, "b", "dlq-b", 0)
	d.add(9, "a", "dlq-a", 1)
	if !d.has(4, "a") || !d.has(4, "b") || d.has(4, "c") || !d.has(9, "a") {
		t.Fatalf("set %v", d.m)
	}
	d.prune(4) // 4 is the next offset to read: not behind the mark yet
	if !d.has(4, "a") {
		t.Fatal("pruned the offset at the mark")
	}
	d.prune(5)
	if d.has(4, "a") || d.has(4, "b") || !d.has(9, "a") {
		t.Fatalf("after prune(5): %v", d.m)
	}
	var none *deadLettered
	none.add(1, "a", "dlq-a", 0)
	none.prune(0)
	if none.has(1, "a") || none.metadata(0) != "" {
		t.Fatal("a nil set remembered a dead letter")
	}
}

// The commit metadata of a marked offset names, per dead-letter topic, the
// lowest dead letter of a record at or after it, else where the next one can
// go at the earliest (the floor read at the claim's start, or one past the
// claim's last dead letter there).
func TestDeadLetteredMetadata(t *testing.T) {
	var d deadLettered
	if m := d.metadata(0); m != "" {
		t.Fatalf("empty set: metadata %q", m)
	}
	d.setFloor("dlq-a", 7)
	d.setFloor("dlq-b", 3)
	if m := d.metadata(0); m != "runnel-dlq:dlq-a=7,dlq-b=3" {
		t.Fatalf("floors only: %q", m)
	}
	d.add(10, "a", "dlq-a", 12)
	d.add(11, "a", "dlq-a", 15)
	d.add(11, "b", "dlq-b", 4)
	// Every dead letter is of a record at or after 10: the lowest of each topic.
	if m := d.metadata(10); m != "runnel-dlq:dlq-a=12,dlq-b=4" {
		t.Fatalf("marked 10: %q", m)
	}
	// 10 is behind the mark: dlq-a's lowest is 11's; dlq-b keeps 11's.
	if m := d.metadata(11); m != "runnel-dlq:dlq-a=15,dlq-b=4" {
		t.Fatalf("marked 11: %q", m)
	}
	// None left: one past the last written (above the floors).
	if m := d.metadata(12); m != "runnel-dlq:dlq-a=16,dlq-b=5" {
		t.Fatalf("marked 12: %q", m)
	}
	got := parseDLQMetadata(d.metadata(12))
	if len(got) != 2 || got["dlq-a"] != 16 || got["dlq-b"] != 5 {
		t.Fatalf("parsed %v", got)
	}
	for _, s := range []string{"", "other", "runnel-dlq:", "runnel-dlq:x", "runnel-dlq:x=-1", "runnel-dlq:=4"} {
		if got := parseDLQMetadata(s); len(got) != 0 {
			t.Errorf("parseDLQMetadata(%q) = %v, want nothing", s, got)
		}
	}
	if got := parseDLQMetadata("runnel-dlq:x=y,z=2"); len(got) != 1 || got["z"] != 2 {
		t.Errorf("a malformed pair must not hide the others: %v", got)
	}
	var big deadLettered
	long := strings.Repeat("t", 600)
	big.setFloor(long+"1", 1)
	big.setFloor(long+"2", 2)
	if m := big.metadata(0); m != "runnel-dlq:"+long+"1=1" {
		t.Errorf("metadata of %d bytes, want the first topic only (at most %d bytes)", len(m), maxDLQMetadata)
	}
}

// A record dead-lettered by a worker that stopped before its source offset
// was committed (a crash, a kill, a revoke whose final commit failed: here
// the coordinator refuses every offset commit after the first) is not
// dead-lettered again by the next owner, which processes it again: the
// committed offset's metadata names where in the dead-letter topic to look,
// and the next owner finds the dead letter there (issue #26: one dead letter
// per failed source record under at-least-once).
//
// Stateful: the agent also counts every value into a table, so the offsets
// are committed by the task's commit cycles (with the dead-letter metadata
// of commitMetadata), not by the session's marks.
func TestRejectedRecordDeadLetteredOnceAcrossOwners(t *testing.T) {
	t.Run("stateless", func(t *testing.T) { testDeadLetteredOnceAcrossOwners(t, false) })
	t.Run("stateful", func(t *testing.T) { testDeadLetteredOnceAcrossOwners(t, true) })
}

func testDeadLetteredOnceAcrossOwners(t *testing.T, stateful bool) {
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	f := newAckFixture(t, b.Addrs())
	var seen counter
	var counts *table.Table[string, int64]
	var opts []agent.Option
	if stateful {
		counts = table.New(f.app, "counts", codec.String(), codec.DecimalInt64(), table.Partitions(1))
		opts = append(opts, agent.WritesTo(counts))
	}
	agent.New(f.app, "a", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if seen.inc(ev.Value); ev.Value == "bad" {
				ev.Reject(errors.New("bad value"))
				continue
			}
			if counts != nil {
				counts.Update(ev, ev.Value, func(n int64) int64 { return n + 1 })
			}
		}
		return s.Err()
	}, opts...)
	run := func() (stop func()) {
		w, err := f.app.NewWorker(WorkerOptions{MemoryStores: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		return func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("worker: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("worker did not stop")
			}
		}
	}

	stop1 := run()
	f.produce("v0")
	f.eventually(20*time.Second, "v0 committed", func() bool { return f.committed() == 1 })
	// Refused as a coordinator that is loading (retried: the session's
	// marks ride it out) or, stateful, as for a member the group expelled
	// (a task's cycles retry a loading coordinator within their 30 s
	// budget, so the first worker would take that long to stop).
	code := kerr.CoordinatorLoadInProgress.Code
	if stateful {
		code = kerr.UnknownMemberID.Code
	}
	var refused atomic.Int32
	var refuse atomic.Bool
	refuse.Store(true)
	c := b.Cluster()
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !refuse.Load() {
			return nil, nil, false
		}
		refused.Add(1)
		r := req.(*kmsg.OffsetCommitRequest)
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	f.produce("bad", "v2")
	dlqTopic := f.app.DeadLetterTopic("a")
	f.eventually(20*time.Second, "bad dead-lettered and v2 processed", func() bool {
		return seen.get("v2") == 1 && len(f.read(dlqTopic)) == 1
	})
	stop1()
	if refused.Load() == 0 || f.committed() != 1 {
		t.Fatalf("commits refused %d, committed %d: want the first worker's commits after v0 refused", refused.Load(), f.committed())
	}

	refuse.Store(false)
	metaAtStart2 := f.committedMetadata()
	stop2 := run()
	f.eventually(30*time.Second, "v2 processed again and committed", func() bool { return seen.get("v2") == 2 && f.committed() == 3 })
	stop2()
	if n := seen.get("bad"); n != 2 {
		t.Fatalf("bad processed %d times, want 2 (the second owner must process it again for this test)", n)
	}
	dlq := f.read(dlqTopic)
	if len(dlq) != 1 || string(dlq[0].Value) != "bad" || header(dlq[0], HeaderOffset) != "1" {
		var offs []string
		for _, m := range dlq {
			offs = append(offs, header(m, HeaderOffset))
		}
		t.Fatalf("dead-letter topic holds %d records (source offsets %v), want bad@1 once (commit metadata at the second owner's start: %q)", len(dlq), offs, metaAtStart2)
	}
}

// A dead letter keeps its source record's timestamp (a replay puts the
// record back at its event time), so under a time-based retention a dead
// letter of an old record was deleted as soon as the broker enforced it,
// together with every younger dead letter before it in the segment (issue
// #30: `dlq list` showed 0 after a record of a year before was rejected).
// Dead-letter topics Runnel creates keep their records without time limit
// (retention.ms=-1, as its repartition topics); the broker's retention
// pass (Kafka's default of seven days here) leaves both dead letters.
func TestDeadLetterOfOldRecordOutlivesRetention(t *testing.T) {
	b, err := embedded.Start(embedded.Options{Retention: 7 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	f := newAckFixture(t, b.Addrs())
	agent.New(f.app, "a", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if strings.HasPrefix(ev.Value, "bad") {
				ev.Reject(errors.New("bad value"))
			}
		}
		return s.Err()
	})
	f.start()
	f.waitTopic(f.in.Name())
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(f.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, m := range []struct {
		v  string
		ts time.Time
	}{{"bad-new", time.Now()}, {"bad-old", time.Now().AddDate(-1, 0, 0)}} {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: f.in.Name(), Partition: 0, Key: sarama.StringEncoder(m.v),
			Value: sarama.StringEncoder(m.v), Timestamp: m.ts}); err != nil {
			t.Fatal(err)
		}
	}
	dlqTopic := f.app.DeadLetterTopic("a")
	f.eventually(20*time.Second, "both records dead-lettered", func() bool { return len(f.read(dlqTopic)) == 2 })
	b.Cluster().ApplyRetention()
	if got := f.read(dlqTopic); len(got) != 2 {
		t.Fatalf("after the broker's retention pass the dead-letter topic holds %d records, want both", len(got))
	}
}
