package app_test

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A group coordinator that has just taken over the group (its broker
// restarted, as in every step of a rolling restart) answers OffsetCommit with
// COORDINATOR_LOAD_IN_PROGRESS until it has read the offsets partition. The
// commit is sent again: the cycle is not abandoned, so its records are not
// processed a second time (on a three-broker Kafka 4.4, two of the six broker
// restarts of t/chaos -brokers3 -broker-schedule rolling abandoned 8 cycles,
// whose records went through the intermediate topic again).
func TestCommitRetriedWhileCoordinatorLoadsOffsets(t *testing.T) {
	if testbroker.Real() {
		t.Skip("answers OffsetCommit through kfake's control functions")
	}
	b, err := embedded.Start(embedded.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	const refusals = 3
	var refused atomic.Int32
	b.Cluster().ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		b.Cluster().KeepControl()
		if refused.Add(1) >= refusals {
			b.Cluster().DropControl() // takes precedence: this is the last one refused
		}
		creq := req.(*kmsg.OffsetCommitRequest)
		resp := creq.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range creq.Topics {
			st := kmsg.NewOffsetCommitResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				sp := kmsg.NewOffsetCommitResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.CoordinatorLoadInProgress.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	var log testbroker.LockedBuffer
	c := newCountApp(t, testbroker.Topic(t, "app"), app.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	dir := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("worker log (%d OffsetCommits refused):\n%s", refused.Load(), log.String())
		}
	})
	runWorker(t, b.Addrs(), c, dir, kv{"a", "x"}, kv{"b", "y"}, kv{"a", "z"})
	if n := refused.Load(); n < refusals {
		t.Fatalf("%d OffsetCommits refused, want %d: the test did not refuse the worker's commits", n, refusals)
	}
	if strings.Contains(log.String(), "commit cycle abandoned") {
		t.Fatal("a commit refused with COORDINATOR_LOAD_IN_PROGRESS abandoned its cycle")
	}
	wantCounts(t, storeTable(t, dir, "counts"), map[string]int{"a": 2, "b": 1})
}
