package app

import (
	"context"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/internal/testbroker"
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
	v := kversion.Stable()
	v.SetMaxKeyVersion(int16(kmsg.EndTxn), 4)
	v.SetMaxKeyVersion(int16(kmsg.TxnOffsetCommit), 4)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.TransactionalID(f.app.id+"-other"), kgo.MaxVersions(v))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	pid, epoch, err := cl.ProducerID(rctx)
	if err != nil {
		t.Fatal(err)
	}
	txnID := f.app.id + "-other"
	commitOffset := func(off int64) {
		t.Helper()
		add := kmsg.NewPtrAddOffsetsToTxnRequest()
		add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, pid, epoch, f.app.id
		resp, err := add.RequestWith(rctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			t.Fatalf("AddOffsetsToTxn: %v", err)
		}
		req := kmsg.NewPtrTxnOffsetCommitRequest()
		req.TransactionalID, req.Group, req.ProducerID, req.ProducerEpoch = txnID, f.app.id, pid, epoch
		req.Generation, req.MemberID = -1, "" // a commit outside the group's generations
		rt := kmsg.NewTxnOffsetCommitRequestTopic()
		rt.Topic = f.in.Name()
		rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch = 0, off, -1
		rt.Partitions = append(rt.Partitions, rp)
		req.Topics = append(req.Topics, rt)
		cresp, err := req.RequestWith(rctx, cl)
		if err == nil {
			for _, rt := range cresp.Topics {
				for _, rp := range rt.Partitions {
					if e := kerr.ErrorForCode(rp.ErrorCode); e != nil {
						err = e
					}
				}
			}
		}
		if err != nil {
			t.Fatalf("TxnOffsetCommit: %v", err)
		}
	}
	endTxn := func(commit bool) {
		t.Helper()
		req := kmsg.NewPtrEndTxnRequest()
		req.TransactionalID, req.ProducerID, req.ProducerEpoch, req.Commit = txnID, pid, epoch, commit
		resp, err := req.RequestWith(rctx, cl)
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err != nil {
			t.Fatalf("EndTxn(commit=%v): %v", commit, err)
		}
	}
	type answer struct {
		off int64
		err error
	}
	fetch := func() <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			m, err := w.committedOffsets()
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
		endTxn(commit)
		select {
		case a := <-ch:
			return a
		case <-time.After(20 * time.Second):
			t.Fatal("committed offsets did not answer after the transaction ended")
		}
		return answer{}
	}

	commitOffset(15)
	if a := waitOpen(true); a.err != nil || a.off != 15 {
		t.Fatalf("after the transaction committed offset 15: got %d (err %v), want 15", a.off, a.err)
	}
	commitOffset(20)
	if a := waitOpen(false); a.err != nil || a.off != 15 {
		t.Fatalf("after a transaction with offset 20 aborted: got %d (err %v), want 15", a.off, a.err)
	}
}
