package group

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/task"
)

// Member is the group member an OffsetCommit is sent as, and what sends it.
type Member struct {
	// Client finds the group coordinator (offset lookups, never behind a
	// fetch).
	Client sarama.Client
	// Group is the consumer group ID.
	Group string
	// InstanceID is the member's group.instance.id (KIP-345); empty for a
	// dynamic member.
	InstanceID string
	// Mu orders the commits with the session's own (Sarama's, from marked
	// offsets): held while a request is sent and its offsets are marked in
	// the session.
	Mu *sync.Mutex
	// Log gets one debug line per OffsetCommit request ("offsets
	// committed", with tasks, generation, elapsed and err).
	Log *slog.Logger
}

// CommitSync commits offs, the commit offsets of task key's sources, for the
// group member of sess, and marks them in the session (task.Source.Committable),
// so that Sarama's own commits never go back. meta, called once per attempt,
// returns each offset's commit metadata (as offs; nil for none). It returns
// the first error of offs's partitions (for example UNKNOWN_MEMBER_ID once
// the member was evicted): Sarama's session commits report errors only
// asynchronously, and a commit cycle must know before it applies to the
// store. The OffsetCommit request goes through q, which sends the cycles of
// several tasks in one request. A rebalance in progress, or a generation the
// coordinator moved past while this member's session is being carried into
// the next one (cooperative rebalancing), is retried every 50 ms with the
// session's current generation until ctx ends.
func (q *OffsetCommitter[K]) CommitSync(ctx context.Context, m Member, key K, sess sarama.ConsumerGroupSession, offs []task.Offset, meta func() []string) error {
	if len(offs) == 0 {
		q.Unexpect(key)
		return nil
	}
	for {
		err := q.Commit(ctx, m, key, sess, offs, meta())
		if err == nil || !RetriableCommit(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (%w)", err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// RetriableCommit reports whether an OffsetCommit error passes once the
// group settles: a rebalance in progress, a generation moved on, a
// coordinator moved or loading. The coordinator answers
// COORDINATOR_LOAD_IN_PROGRESS while it reads the group's offsets partition
// after taking it over (a broker restarting: in a rolling restart of a
// three-broker Kafka 4.4 it failed 8 cycles, whose records were processed
// again, before it was retried here).
func RetriableCommit(err error) bool {
	return errors.Is(err, sarama.ErrRebalanceInProgress) || errors.Is(err, sarama.ErrIllegalGeneration) ||
		errors.Is(err, sarama.ErrNotCoordinatorForConsumer) || errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable) ||
		errors.Is(err, sarama.ErrOffsetsLoadInProgress)
}

// FinalLinger bounds how long the commit queue holds a commit back for the
// final cycles of suspending tasks that have not asked to commit yet. The
// tasks of a worker that stops, or of partitions revoked together, finish
// their final cycles within a few ms of each other (their changelog records
// are acknowledged by the same produce responses); the partitions are given
// up when the last of them committed, so waiting for it costs the hand-over
// nothing, and one OffsetCommit replaces one per task (each a round trip to
// the coordinator, serialized under Member.Mu: 3–22 ms each in
// bench/sidebyside's hand-over on Kafka 4.4 at load ~20, 350 ms at worst).
const FinalLinger = 50 * time.Millisecond

// OffsetCommitter sends the at-least-once commit cycles' OffsetCommits,
// coalescing the commits of several tasks (named by K) into one request: a
// commit asked while another request is in flight waits for it and goes
// with every other commit queued meanwhile (group commit), and while
// suspending tasks still run their final cycles (Expect), a commit waits for
// theirs up to FinalLinger. Each task learns the errors of its own
// partitions only; a task whose cycle failed never asks, so nothing is
// committed for it. The zero value is ready to use.
//
// Lock order: OffsetCommitter.mu, then nothing; the sender takes Member.Mu
// without holding mu.
type OffsetCommitter[K comparable] struct {
	// Linger replaces FinalLinger when above 0 (tests set it). Set before
	// the first commit; read by the sender.
	Linger time.Duration

	mu      sync.Mutex
	queue   []*commitReq  // asked and not yet sent; guarded by mu
	sending bool          // a sender goroutine runs; guarded by mu
	waiting map[K]bool    // suspending tasks whose final commit has not come; guarded by mu
	news    chan struct{} // a commit was asked or a task stopped being waited for (capacity 1)
	m       Member        // set by each commit; guarded by mu
}

// commitReq is one task's commit: its partitions' offsets, and where its
// result goes.
type commitReq struct {
	ctx  context.Context
	sess sarama.ConsumerGroupSession
	offs []task.Offset
	// meta is each offset's commit metadata (where the dead letters of the
	// records from it on start), as offs.
	meta []string
	done chan error // capacity 1
}

func (q *OffsetCommitter[K]) init() {
	if q.news == nil {
		q.news = make(chan struct{}, 1)
		q.waiting = map[K]bool{}
	}
}

func (q *OffsetCommitter[K]) notify() {
	select {
	case q.news <- struct{}{}:
	default:
	}
}

// Expect notes that task key runs its final cycle: a commit waits for its
// commit (up to FinalLinger) to send both in one request.
func (q *OffsetCommitter[K]) Expect(key K) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.init()
	q.waiting[key] = true
}

// Unexpect notes that task key will not ask for a commit soon (it asked, its
// cycle had nothing to commit, or it left the suspending state).
func (q *OffsetCommitter[K]) Unexpect(key K) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.init()
	if q.waiting[key] {
		delete(q.waiting, key)
		q.notify()
	}
}

// Commit sends offs (task key's partitions), with their commit metadata meta
// (as offs; nil for none), in the next OffsetCommit request of sess's member
// and returns the first error of those partitions. On success the offsets
// are also marked in the session, under m.Mu with the commit.
func (q *OffsetCommitter[K]) Commit(ctx context.Context, m Member, key K, sess sarama.ConsumerGroupSession, offs []task.Offset, meta []string) error {
	r := &commitReq{ctx: ctx, sess: sess, offs: offs, meta: meta, done: make(chan error, 1)}
	q.mu.Lock()
	q.init()
	q.m = m
	delete(q.waiting, key)
	q.queue = append(q.queue, r)
	if !q.sending {
		q.sending = true
		go q.send()
	}
	q.notify()
	q.mu.Unlock()
	// The result always comes: the sender answers every request it takes,
	// and a request takes at most the client's network timeouts.
	return <-r.done
}

// send sends the queued commits until the queue is empty.
func (q *OffsetCommitter[K]) send() {
	var linger *time.Timer
	var lingerC <-chan time.Time
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	for {
		q.mu.Lock()
		if len(q.queue) == 0 {
			q.sending = false
			q.mu.Unlock()
			return
		}
		if len(q.waiting) > 0 {
			if linger == nil {
				d := q.Linger
				if d <= 0 {
					d = FinalLinger
				}
				linger = time.NewTimer(d)
				lingerC = linger.C
			}
			if lingerC != nil {
				q.mu.Unlock()
				select {
				case <-q.news:
				case <-lingerC:
					lingerC = nil // waited long enough: send what is queued
				}
				continue
			}
		}
		batch := q.queue
		q.queue = nil
		m := q.m
		q.mu.Unlock()
		if linger != nil {
			linger.Stop()
			linger, lingerC = nil, nil
		}
		// One request per member session: a member's generation and ID
		// go in the request (a cooperative session carries on into the
		// next generation: the same sess answers the new generation).
		for len(batch) > 0 {
			sess := batch[0].sess
			var mine, rest []*commitReq
			for _, r := range batch {
				switch {
				case r.sess != sess:
					rest = append(rest, r)
				case r.ctx.Err() != nil:
					r.done <- fmt.Errorf("commit: %w", r.ctx.Err())
				default:
					mine = append(mine, r)
				}
			}
			batch = rest
			if len(mine) == 0 {
				continue
			}
			began := time.Now()
			m.Mu.Lock()
			errs := m.commitOnce(sess, mine)
			for i, r := range mine {
				if errs[i] == nil {
					// Marked with the metadata just committed: Sarama's
					// session commits a marked offset again (its periodic
					// and final commits), and an empty string there erased
					// the dead-letter position the cycle's commit carried
					// (the next owner then wrote those dead letters again).
					for j, o := range r.offs {
						md := ""
						if j < len(r.meta) {
							md = r.meta[j]
						}
						sess.MarkOffset(o.Topic, o.Partition, o.Offset, md)
					}
				}
			}
			m.Mu.Unlock()
			if m.Log.Enabled(context.Background(), slog.LevelDebug) {
				var offs []string
				for _, r := range mine {
					for _, o := range r.offs {
						offs = append(offs, fmt.Sprintf("%s[%d]@%d", o.Topic, o.Partition, o.Offset))
					}
				}
				m.Log.Debug("offsets committed", "tasks", len(mine), "generation", sess.GenerationID(),
					"elapsed", time.Since(began), "offsets", offs, "err", errors.Join(errs...))
			}
			for i, r := range mine {
				r.done <- errs[i]
			}
		}
	}
}

// commitOnce commits the offsets of reqs for the group member of sess in one
// OffsetCommit request to the group coordinator and returns each request's
// error: the request's own (coordinator unknown, connection lost) for all,
// else the first error of its partitions. Called with m.Mu held.
func (m Member) commitOnce(sess sarama.ConsumerGroupSession, reqs []*commitReq) []error {
	errs := make([]error, len(reqs))
	all := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	coord, err := m.Client.Coordinator(m.Group)
	if err != nil {
		return all(fmt.Errorf("commit: coordinator of %s: %w", m.Group, err))
	}
	v := m.Client.Config().Version
	req := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: m.Group, ConsumerID: sess.MemberID(),
		ConsumerGroupGeneration: sess.GenerationID()}
	switch {
	case v.IsAtLeast(sarama.V2_4_0_0):
		req.Version = 8
	case v.IsAtLeast(sarama.V2_3_0_0):
		req.Version = 7
	case v.IsAtLeast(sarama.V2_1_0_0):
		req.Version = 6
	case v.IsAtLeast(sarama.V2_0_0_0):
		req.Version = 4
	}
	if req.Version >= 7 && m.InstanceID != "" {
		id := m.InstanceID
		req.GroupInstanceId = &id
	}
	for _, r := range reqs {
		for i, o := range r.offs {
			md := ""
			if i < len(r.meta) {
				md = r.meta[i]
			}
			req.AddBlock(o.Topic, o.Partition, o.Offset, 0, md)
		}
	}
	resp, err := coord.CommitOffset(req)
	if err != nil {
		_ = coord.Close() // sarama reopens it on the next request
		return all(fmt.Errorf("commit: %w", err))
	}
	refresh := false
	for i, r := range reqs {
		for _, o := range r.offs {
			if kerr, ok := resp.Errors[o.Topic][o.Partition]; ok && kerr != sarama.ErrNoError {
				if kerr == sarama.ErrNotCoordinatorForConsumer || kerr == sarama.ErrConsumerCoordinatorNotAvailable {
					refresh = true
				}
				errs[i] = fmt.Errorf("commit %s[%d]@%d (generation %d): %w", o.Topic, o.Partition, o.Offset, sess.GenerationID(), kerr)
				break
			}
		}
	}
	if refresh {
		_ = m.Client.RefreshCoordinator(m.Group)
	}
	return errs
}
