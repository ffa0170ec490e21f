package group

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/task"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// memberOf joins group as a real member consuming topic and returns its
// session (what the commit cycles commit under).
func memberOf(t *testing.T, brokers []string, group, topic string) sarama.ConsumerGroupSession {
	t.Helper()
	cg, err := sarama.NewConsumerGroup(brokers, group, testbroker.SaramaConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &sessionHandler{sess: make(chan sarama.ConsumerGroupSession, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cg.Consume(ctx, []string{topic}, h)
	}()
	t.Cleanup(func() { cancel(); <-done; _ = cg.Close() })
	select {
	case s := <-h.sess:
		return s
	case <-time.After(30 * time.Second):
		t.Fatal("no group session within 30 s")
		return nil
	}
}

type sessionHandler struct {
	sess chan sarama.ConsumerGroupSession
}

func (h *sessionHandler) Setup(s sarama.ConsumerGroupSession) error {
	select {
	case h.sess <- s:
	default:
	}
	return nil
}
func (h *sessionHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *sessionHandler) ConsumeClaim(s sarama.ConsumerGroupSession, _ sarama.ConsumerGroupClaim) error {
	<-s.Context().Done()
	return nil
}

// TestCommitQueueSendsFinalCyclesTogether: four tasks suspend together (a
// worker stopping); their final cycles' commits go to the coordinator in one
// OffsetCommit, each task hears its own answer, and the group's offsets are
// the four commit points. A suspending task that ends without a commit (its
// final cycle had nothing to write, or failed) stops being waited for. A
// commit whose context ended before it was sent is answered with that error
// and not sent. The linger is long here so that the test waits for events,
// not time: only the tasks' own commits (or their leaving) release a batch.
func TestOffsetCommitterSendsFinalCyclesTogether(t *testing.T) {
	brokers := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "in")
	testbroker.CreateTopic(t, brokers, topic, 4, nil)
	group := testbroker.Topic(t, "g")
	sess := memberOf(t, brokers, group, topic)
	var logs testbroker.LockedBuffer
	var mu sync.Mutex
	m := Member{Client: testbroker.Client(t, brokers), Group: group, Mu: &mu,
		Log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	q := &OffsetCommitter[int]{Linger: time.Hour}
	noMeta := func() []string { return nil }

	trs := []int{0, 1, 2, 3} // the tasks of partitions 0 to 3
	for _, tr := range trs {
		q.Expect(tr)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(trs))
	for i, tr := range trs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = q.CommitSync(context.Background(), m, tr, sess, []task.Offset{{Topic: topic, Partition: int32(i), Offset: int64(10 + i)}}, noMeta)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("task %d: %v", i, err)
		}
	}
	if got := commitLines(logs.String()); len(got) != 1 || !strings.Contains(got[0], "tasks=4 ") {
		t.Fatalf("OffsetCommit requests %q, want one for 4 tasks", got)
	}
	want := map[int32]int64{0: 10, 1: 11, 2: 12, 3: 13}
	if got := testbroker.Committed(t, brokers, group, topic); !equalOffsets(got, want) {
		t.Fatalf("committed %v, want %v", got, want)
	}

	// Two suspend; one commits, the other ends without a commit.
	a, b := 0, 1
	q.Expect(a)
	q.Expect(b)
	res := make(chan error, 1)
	go func() {
		res <- q.CommitSync(context.Background(), m, a, sess, []task.Offset{{Topic: topic, Partition: 0, Offset: 20}}, noMeta)
	}()
	q.Unexpect(b)
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	if got := testbroker.Committed(t, brokers, group, topic)[0]; got != 20 {
		t.Fatalf("partition 0 committed at %d, want 20", got)
	}

	// A commit whose context ended is not sent.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := q.Commit(ctx, m, a, sess, []task.Offset{{Topic: topic, Partition: 0, Offset: 30}}, nil); err == nil {
		t.Fatal("a commit with an ended context succeeded")
	}
	if got := testbroker.Committed(t, brokers, group, topic)[0]; got != 20 {
		t.Fatalf("partition 0 committed at %d after a cancelled commit, want 20", got)
	}
	if got := commitLines(logs.String()); len(got) != 2 {
		t.Fatalf("OffsetCommit requests %q, want 2 in all", got)
	}
}

func commitLines(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="offsets committed"`) {
			out = append(out, l)
		}
	}
	return out
}

func equalOffsets(a, b map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestSessionCommitKeepsCycleMetadata: after a cycle's commit the offset is
// marked in Sarama's session, whose own commits (the worker's periodic
// session commit, Cleanup's) send it again; the mark carries the metadata
// the cycle committed, so the group keeps it (the dead-letter position the
// next owner reads). With an empty mark, the session's commit erased it.
func TestSessionCommitKeepsCycleMetadata(t *testing.T) {
	brokers := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "in")
	testbroker.CreateTopic(t, brokers, topic, 1, nil)
	group := testbroker.Topic(t, "g")
	sess := memberOf(t, brokers, group, topic)
	client := testbroker.Client(t, brokers)
	var mu sync.Mutex
	m := Member{Client: client, Group: group, Mu: &mu, Log: slog.New(slog.DiscardHandler)}
	q := &OffsetCommitter[int]{}
	const meta = "runnel-dlq:in-a-dlq=7"
	if err := q.CommitSync(context.Background(), m, 0, sess, []task.Offset{{Topic: topic, Partition: 0, Offset: 5}},
		func() []string { return []string{meta} }); err != nil {
		t.Fatal(err)
	}
	sess.Commit() // what the worker's session ticker and Cleanup do
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
	if err != nil {
		t.Fatal(err)
	}
	b := resp.GetBlock(topic, 0)
	if b == nil || b.Offset != 5 || b.Metadata != meta {
		t.Fatalf("committed %+v, want offset 5 with metadata %q", b, meta)
	}
}
