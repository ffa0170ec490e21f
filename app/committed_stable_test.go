package app

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"
)

// The committed offsets a restore works from are stable ones (KIP-447), as
// the claim's start is: while a transaction that committed the group's
// offset of the input partition (15, over the 10 the group had) is open, the
// worker's fetch waits for it to end instead of answering 10, and then
// answers what the transaction's outcome made of the offset: 15 after a
// commit, 15 still after a later transaction (offset 20) aborted. Read
// without RequireStable, the fetch answered 10 at once while the
// transaction was open.
func TestCommittedOffsetsWaitForOpenTransaction(t *testing.T) {
	brokers := testbroker.Brokers(t)
	f := newAckFixture(t, brokers, WithGuarantee(ExactlyOnce))
	agent.New(f.app, "drain", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for range s.Events() {
		}
		return s.Err()
	})
	w, err := f.app.NewWorker(WorkerOptions{MemoryStores: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("worker did not stop")
		}
	}()
	f.produce("a", "b", "c", "d", "e", "f", "g", "h", "i", "j")
	// Ready orders the test's reads of the worker's clients after Run set them.
	f.eventually(60*time.Second, "offset 10 committed, worker ready", func() bool { return f.committed() == 10 && w.Ready() })

	// Another transactional producer commits the group's offset of in[0] in
	// a transaction it leaves open (a previous owner's last transaction
	// between its TxnOffsetCommit and its EndTxn).
	o := newOffsetTxn(t, brokers, f.app.id, f.in.Name())
	type answer struct {
		off int64
		err error
	}
	fetch := func() <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			m, err := w.committedOffsets(context.Background())
			ch <- answer{m[f.in.Name()][0], err}
		}()
		return ch
	}
	// waitOpen checks that a fetch started while the transaction is open
	// does not answer before it ends, ends it, and returns the answer.
	waitOpen := func(commit bool) answer {
		t.Helper()
		ch := fetch()
		select {
		case a := <-ch:
			t.Fatalf("committed offsets answered %d (err %v) while a transaction holding the group's offset was open", a.off, a.err)
		case <-time.After(time.Second):
		}
		o.end(commit)
		select {
		case a := <-ch:
			return a
		case <-time.After(20 * time.Second):
			t.Fatal("committed offsets did not answer after the transaction ended")
		}
		return answer{}
	}

	o.commitOffset(15)
	if a := waitOpen(true); a.err != nil || a.off != 15 {
		t.Fatalf("after the transaction committed offset 15: got %d (err %v), want 15", a.off, a.err)
	}
	o.commitOffset(20)
	if a := waitOpen(false); a.err != nil || a.off != 15 {
		t.Fatalf("after a transaction with offset 20 aborted: got %d (err %v), want 15", a.off, a.err)
	}
}

// The claim's start is stable too (Sarama's fetch sets RequireStable under
// read_committed), so a restore can never work from an offset older than
// the claim's: a worker counted input records 0..9 (offset 10 committed) and
// stopped; another producer committed the group's offset 15 in a
// transaction it keeps open for 3 s (an owner that died between its
// TxnOffsetCommit and its EndTxn, or was paused there) while a new worker
// starts and records 10..19 arrive. The new worker's claim cannot start
// while the transaction is open (its session restarts on
// UNSTABLE_OFFSET_COMMIT; the worker does not exit), and once it commits the
// claim starts at 15: the count ends at 15 (records 15..19 on top of 10),
// not at 20, which a claim started at 10 would give.
func TestClaimStartWaitsForOpenTransaction(t *testing.T) {
	brokers := testbroker.Brokers(t)
	f := newAckFixture(t, brokers, WithGuarantee(ExactlyOnce))
	counts := table.New(f.app, "counts", codec.String(), codec.DecimalInt64())
	agent.New(f.app, "count", f.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			counts.Update(ev, "x", func(n int64) int64 { return n + 1 })
		}
		return s.Err()
	}, agent.WritesTo(counts))
	run := func() (*Worker, func()) {
		w, err := f.app.NewWorker(WorkerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		return w, func() {
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
	vals := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, "v"+strconv.Itoa(i))
		}
		return out
	}
	last := func() string {
		var v string
		for _, m := range f.readCommittedRecords(counts.Changelog()) {
			if string(m.Key) == "x" {
				v = string(m.Value)
			}
		}
		return v
	}

	_, stop := run()
	f.produce(vals(0, 10)...)
	f.eventually(60*time.Second, "count 10", func() bool { return f.committed() == 10 && last() == "10" })
	stop()

	o := newOffsetTxn(t, brokers, f.app.id, f.in.Name())
	o.commitOffset(15)
	w, stop := run()
	defer stop()
	f.produce(vals(10, 20)...)
	time.Sleep(3 * time.Second)
	if got := last(); got != "10" {
		t.Fatalf("count[x] = %s while the transaction holding offset 15 was open, want 10 (nothing processed)", got)
	}
	o.end(true)
	f.eventually(60*time.Second, "committed offset 20", func() bool { return f.committed() == 20 })
	deadline := time.Now().Add(30 * time.Second)
	for last() != "15" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if got := last(); got != "15" {
		t.Fatalf("count[x] = %s, want 15: records 15..19 on top of the 10 counted before (the claim starts at the transaction's offset)", got)
	}
	if n, _ := counterSum(t, w.metrics, "runnel_claim_start_mismatches_total"); n != 0 {
		t.Fatalf("start mismatches counted: %v, want 0 (restore and claim read the same stable offset)", n)
	}
}

// offsetTxn is another transactional producer of a test's broker that
// commits a group's offset of one partition in transactions it ends when told
// (AddOffsetsToTxn, TxnOffsetCommit with no generation, EndTxn).
type offsetTxn struct {
	t            *testing.T
	cl           *kgo.Client
	ctx          context.Context
	id           string
	pid          int64
	epoch        int16
	group, topic string
}

func newOffsetTxn(t *testing.T, brokers []string, group, topic string) *offsetTxn {
	t.Helper()
	// Transaction version 1 (as internal/kafka speaks it): the epoch stays
	// the same across EndTxn.
	v := kversion.Stable()
	v.SetMaxKeyVersion(int16(kmsg.EndTxn), 4)
	v.SetMaxKeyVersion(int16(kmsg.TxnOffsetCommit), 4)
	id := group + "-other"
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(id), kgo.MaxVersions(v))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(func() {
		cancel()
		cl.Close()
	})
	pid, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &offsetTxn{t: t, cl: cl, ctx: ctx, id: id, pid: pid, epoch: epoch, group: group, topic: topic}
}

// commitOffset commits off as the group's offset of partition 0 of the
// topic in the producer's transaction, which stays open.
func (o *offsetTxn) commitOffset(off int64) {
	o.t.Helper()
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = o.id, o.pid, o.epoch, o.group
	// Kafka answers CONCURRENT_TRANSACTIONS until the previous
	// transaction's markers are written (EndTxn returns before): retried,
	// as a client does (seen in CI on Kafka 4.4 right after a commit).
	for {
		resp, err := add.RequestWith(o.ctx, o.cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err == nil {
			break
		}
		if !kerr.IsRetriable(err) && !errors.Is(err, kerr.ConcurrentTransactions) || o.ctx.Err() != nil {
			o.t.Fatalf("AddOffsetsToTxn: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = o.id, o.group, o.pid, o.epoch
	req.Generation, req.MemberID = -1, "" // a commit outside the group's generations
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic = o.topic
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset, rp.LeaderEpoch = 0, off, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	for {
		cresp, err := req.RequestWith(o.ctx, o.cl)
		if err == nil {
			for _, rt := range cresp.Topics {
				for _, rp := range rt.Partitions {
					if e := kerr.ErrorForCode(rp.ErrorCode); e != nil {
						err = e
					}
				}
			}
		}
		if err == nil {
			return
		}
		if !kerr.IsRetriable(err) && !errors.Is(err, kerr.ConcurrentTransactions) || o.ctx.Err() != nil {
			o.t.Fatalf("TxnOffsetCommit: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// end commits or aborts the open transaction.
func (o *offsetTxn) end(commit bool) {
	o.t.Helper()
	req := kmsg.NewPtrEndTxnRequest()
	req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = o.id, o.pid, o.epoch, commit
	resp, err := req.RequestWith(o.ctx, o.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		o.t.Fatalf("EndTxn(commit=%v): %v", commit, err)
	}
}
