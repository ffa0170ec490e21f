package group

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/internal/kafka"
)

// Rejoins follows the member's joins for the transactions' offset commits
// (KIP-447): joining is set while the member rejoins the group (from its
// JoinGroup, RejoinStrategy, to its assignment, Assigned) and gen is the
// generation of its last assignment. The zero value: not joining,
// generation 0.
type Rejoins struct {
	joining atomic.Bool
	gen     atomic.Int32
}

// Joining reports whether the member rejoins the group (its JoinGroup went
// out and its assignment has not come).
func (r *Rejoins) Joining() bool { return r.joining.Load() }

// Generation returns the generation of the member's last assignment.
func (r *Rejoins) Generation() int32 { return r.gen.Load() }

// Rejoined answers the coordinator's refusal of a transaction's offset commit
// for generation refused (kafka.Rejoined): the group rebalanced between the
// cut and the commit, and the coordinator bumped the generation when the
// join completed. Unanswered, the transaction would abort and every
// partition of the worker restart (issue #24: half the aborts of the kill -9
// schedule on Kafka). The member rejoined (or is rejoining: its JoinGroup
// went out, joining, and SyncGroup is pending), so Rejoined waits until its
// assignment arrived (app's Worker.onAssignment calls Assigned, inside
// SyncGroup handling; it takes none of the locks the cycle holds) and
// returns meta under the new generation.
// KIP-447: the coordinator checks the member and its generation, not which
// partitions it owns, so this is safe only for the generation right after
// the refused one: under the cooperative protocol the partitions that
// generation takes away stay this member's until it revokes them (their
// final cycles commit again), and a revoked claim cannot end, nor the
// member send the JoinGroup of the generation after, before its final cycle
// took TxnCommitter's mu, which the cycle holds (invariant: a
// claim's end waits for that mutex without a timeout; revokeClaims' timeout
// leads to the member's expulsion, which the retry meets as UNKNOWN_MEMBER_ID). Under the eager
// protocol every claim ended before the JoinGroup, so no cycle is open then.
// The member ID stays the one the commit was sent with: a member that
// rejoined under another ID is refused again (UNKNOWN_MEMBER_ID) and the
// transaction aborts. It gives up, false, when a later generation than the
// next one is already known, when no join of this member is in progress
// (the member left the group: the commit must fail), when ctx ends or at
// deadline (the transaction's timeout comes close). Each commit sent again
// is reported to resent (the refused generation, the new one, the wait).
func (r *Rejoins) Rejoined(meta *sarama.ConsumerGroupMetadata, deadline time.Time, resent func(refused, g int32, waited time.Duration)) kafka.Rejoined {
	return func(ctx context.Context, refused int32) (*sarama.ConsumerGroupMetadata, bool) {
		start := time.Now()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			switch g := r.gen.Load(); {
			case g == refused+1:
				next := *meta
				next.GenerationID = g
				resent(refused, g, time.Since(start))
				return &next, true
			case g > refused:
				// More than one generation passed: one of them may have
				// given a partition of this commit to another member
				// (which the next-generation rule below excludes).
				return nil, false
			}
			if !r.joining.Load() || !time.Now().Before(deadline) {
				return nil, false
			}
			select {
			case <-ctx.Done():
				return nil, false
			case <-t.C:
			}
		}
	}
}

// RejoinStrategy is the worker's assignor seen by Sarama under ExactlyOnce: it
// tells Rejoins when the member rejoins (SubscriptionUserData is
// called for every JoinGroup).
type RejoinStrategy struct {
	*assignor.Strategy
	Rejoins *Rejoins
}

// SubscriptionUserData marks the member as joining and returns the
// assignor's user data.
func (s RejoinStrategy) SubscriptionUserData(topics []string) ([]byte, error) {
	s.Rejoins.joining.Store(true)
	return s.Strategy.SubscriptionUserData(topics)
}

// Assigned records the generation of an assignment: the member joined.
func (r *Rejoins) Assigned(gen int32) {
	r.gen.Store(gen)
	r.joining.Store(false)
}
