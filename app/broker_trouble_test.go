package app_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A fault arms a broker fault on c for window: requests it matches are
// answered with an error Kafka marks retriable until the window ends. It
// returns how many requests it answered so.
type fault struct {
	name string
	// eosOnly: the requests exist only under exactly-once.
	eosOnly bool
	window  time.Duration
	arm     func(c *kfake.Cluster, names faultNames, until time.Time) *atomic.Int32
}

// faultNames are the topics of the worker under test, with their topic IDs
// (Produce v13 names a topic by its ID alone).
type faultNames struct {
	changelog, sink string
	ids             map[string][16]byte
}

// topicIDs returns the topic IDs of topics from a Metadata request.
func topicIDs(t *testing.T, brokers []string, topics ...string) map[string][16]byte {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	for _, tp := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(tp)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][16]byte{}
	for _, rt := range resp.Topics {
		if rt.ErrorCode != 0 || rt.Topic == nil {
			t.Fatalf("metadata of %v: %v", rt.Topic, kerr.ErrorForCode(rt.ErrorCode))
		}
		ids[*rt.Topic] = rt.TopicID
	}
	return ids
}

// refuseProduceTo answers every Produce request holding a partition of
// topic with code for each of its partitions (the request's other topics
// too: one request carries every partition a broker leads, and kfake cannot
// pass part of one on), until until.
func refuseProduceTo(topic string, code int16) func(c *kfake.Cluster, n faultNames, until time.Time) *atomic.Int32 {
	return func(c *kfake.Cluster, n faultNames, until time.Time) *atomic.Int32 {
		var refused atomic.Int32
		name := map[string]string{"changelog": n.changelog, "sink": n.sink}[topic]
		c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if time.Now().After(until) {
				return nil, nil, false
			}
			pr := req.(*kmsg.ProduceRequest)
			var hit bool
			for _, tp := range pr.Topics {
				hit = hit || tp.Topic == name || tp.TopicID == n.ids[name]
			}
			if !hit {
				return nil, nil, false
			}
			refused.Add(1)
			resp := pr.ResponseKind().(*kmsg.ProduceResponse)
			for _, tp := range pr.Topics {
				rt := kmsg.NewProduceResponseTopic()
				rt.Topic, rt.TopicID = tp.Topic, tp.TopicID
				for _, p := range tp.Partitions {
					rp := kmsg.NewProduceResponseTopicPartition()
					rp.Partition, rp.ErrorCode = p.Partition, code
					rt.Partitions = append(rt.Partitions, rp)
				}
				resp.Topics = append(resp.Topics, rt)
			}
			return resp, nil, true
		})
		return &refused
	}
}

// refuseTxnRequests answers every transaction request (InitProducerId,
// AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn) with code
// until until.
func refuseTxnRequests(code int16) func(c *kfake.Cluster, _ faultNames, until time.Time) *atomic.Int32 {
	return func(c *kfake.Cluster, _ faultNames, until time.Time) *atomic.Int32 {
		var refused atomic.Int32
		answer := func(req kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			if time.Now().After(until) {
				return nil, nil, false
			}
			refused.Add(1)
			switch r := req.(type) {
			case *kmsg.InitProducerIDRequest:
				resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
				resp.ErrorCode, resp.ProducerID, resp.ProducerEpoch = code, -1, -1
				return resp, nil, true
			case *kmsg.AddPartitionsToTxnRequest:
				resp := r.ResponseKind().(*kmsg.AddPartitionsToTxnResponse)
				for _, tp := range r.Topics {
					rt := kmsg.NewAddPartitionsToTxnResponseTopic()
					rt.Topic = tp.Topic
					for _, p := range tp.Partitions {
						rp := kmsg.NewAddPartitionsToTxnResponseTopicPartition()
						rp.Partition, rp.ErrorCode = p, code
						rt.Partitions = append(rt.Partitions, rp)
					}
					resp.Topics = append(resp.Topics, rt)
				}
				return resp, nil, true
			case *kmsg.AddOffsetsToTxnRequest:
				resp := r.ResponseKind().(*kmsg.AddOffsetsToTxnResponse)
				resp.ErrorCode = code
				return resp, nil, true
			case *kmsg.TxnOffsetCommitRequest:
				resp := r.ResponseKind().(*kmsg.TxnOffsetCommitResponse)
				for _, tp := range r.Topics {
					rt := kmsg.NewTxnOffsetCommitResponseTopic()
					rt.Topic = tp.Topic
					for _, p := range tp.Partitions {
						rp := kmsg.NewTxnOffsetCommitResponseTopicPartition()
						rp.Partition, rp.ErrorCode = p.Partition, code
						rt.Partitions = append(rt.Partitions, rp)
					}
					resp.Topics = append(resp.Topics, rt)
				}
				return resp, nil, true
			case *kmsg.EndTxnRequest:
				resp := r.ResponseKind().(*kmsg.EndTxnResponse)
				resp.ErrorCode = code
				return resp, nil, true
			}
			return nil, nil, false
		}
		for _, k := range []kmsg.Key{kmsg.InitProducerID, kmsg.AddPartitionsToTxn, kmsg.AddOffsetsToTxn, kmsg.TxnOffsetCommit, kmsg.EndTxn} {
			c.ControlKey(int16(k), answer)
		}
		return &refused
	}
}

// Kafka clusters restart brokers and move leaders and coordinators every
// week: a worker rides out what Kafka calls retriable within its delivery
// timeout (issue #24: 0 worker exits, every table exact). Each fault is
// armed on kfake while the worker processes, under each guarantee: a
// changelog answering UNKNOWN_TOPIC_OR_PARTITION for 5 s (metadata not yet
// propagated), a sink's partition leader gone for 10 s
// (NOT_LEADER_OR_FOLLOWER), and on the transaction path NOT_COORDINATOR and
// CONCURRENT_TRANSACTIONS for 10 s. The worker must keep running, reach lag
// 0, and leave the table exact and the sink exact for a read_committed
// reader (at-least-once too: the retries are the idempotent producer's, and
// no partition restarts).
func TestWorkerRidesOutBrokerTrouble(t *testing.T) {
	if testbroker.Real() {
		t.Skip("arms faults through kfake's control functions")
	}
	faults := []fault{
		{name: "changelog-unknown-topic-5s", window: 5 * time.Second, arm: refuseProduceTo("changelog", kerr.UnknownTopicOrPartition.Code)},
		{name: "sink-leader-gone-10s", window: 10 * time.Second, arm: refuseProduceTo("sink", kerr.NotLeaderForPartition.Code)},
		{name: "txn-not-coordinator-10s", eosOnly: true, window: 10 * time.Second, arm: refuseTxnRequests(kerr.NotCoordinator.Code)},
		{name: "txn-concurrent-transactions-10s", eosOnly: true, window: 10 * time.Second, arm: refuseTxnRequests(kerr.ConcurrentTransactions.Code)},
	}
	for _, g := range []app.Guarantee{app.AtLeastOnce, app.ExactlyOnce} {
		for _, f := range faults {
			if f.eosOnly && g != app.ExactlyOnce {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", g, f.name), func(t *testing.T) {
				t.Parallel()
				rideOut(t, g, f)
			})
		}
	}
}

func rideOut(t *testing.T, g app.Guarantee, f fault) {
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	brokers := b.Addrs()
	id := testbroker.Topic(t, "app")
	fa := newFenceApp(t, id, app.WithGuarantee(g))
	dir := t.TempDir()
	w, running, stop := runFenceWorker(t, fa.app, brokers, dir)
	client := testbroker.Client(t, brokers)
	testbroker.WaitTopic(t, client, fa.words.Name())
	keys := append(wordPerPartition("a"), wordPerPartition("b")...)
	want := map[string]int{}
	first := valueRecords("x", 200, keys, want)
	send(t, brokers, fa.words.Name(), first...)
	waitProcessed(t, w, 50)
	names := faultNames{changelog: id + "-counts-changelog", sink: fa.out.Name()}
	names.ids = topicIDs(t, brokers, names.changelog, names.sink)
	start := time.Now()
	refused := f.arm(b.Cluster(), names, start.Add(f.window))
	second := valueRecords("y", 200, keys, want)
	send(t, brokers, fa.words.Name(), second...)
	waitGroupLag0(t, running, client, id, fa.words.Name(), f.window+90*time.Second)
	if refused.Load() == 0 {
		t.Fatalf("no request was refused: the fault did not apply")
	}
	if running.Err() != nil {
		t.Fatalf("the worker stopped during %s", f.name)
	}
	if n := fa.metric(t, "runnel_partition_restarts_total"); n != 0 {
		t.Errorf("partition restarts = %v, want 0: a retriable error restarted a partition", n)
	}
	t.Logf("%s: %d requests refused; lag 0 %.1f s after the fault began", f.name, refused.Load(), time.Since(start).Seconds())
	if err := stop(); err != nil {
		t.Fatalf("worker stopped with %v, want a clean stop", err)
	}
	wantCounts(t, storeTable(t, dir, "counts"), want)
	out := readCommittedValues(t, brokers, fa.out.Name())
	wantSinkExact(t, out, append(first, second...))
	if t.Failed() {
		var dup []string
		for v, n := range out {
			if n > 1 && !strings.HasPrefix(v, "-") {
				dup = append(dup, v)
			}
		}
		t.Logf("sink values read more than once: %d", len(dup))
	}
}
