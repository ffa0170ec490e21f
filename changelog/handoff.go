package changelog

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Handoff promotes a standby in place: the Follow that serves it (WithHandoff)
// turns into a restore on its live partition consumer instead of ending and
// leaving a new Restore to read again what it held back.
//
// A standby holds back the changelog records whose source offsets it has not
// yet seen committed (SkipUncommitted; it learns the committed offsets only
// every so often), and at a hand-over those are the records of the old
// owner's last cycles: ~1,300 records on Kafka 4.4 in bench/sidebyside's
// hand-over. A Restore after the Follow read them again from the broker, on a
// new partition consumer whose first fetch waits for Sarama's subscription
// batch (partitionConsumersBatchTimeout, 100 ms); ~230 ms of a 0.72 s
// hand-over (docs/benchmarks.md). Promote applies them from memory with the
// committed offsets of the promotion, and reads only what the follower had
// not received yet, up to the highwater it lists (ListOffsets) at promotion.
//
// The outcome is the Restore's: records of committed source offsets applied,
// uncommitted ones skipped (a key's first one putting back its before-image),
// records of a stale writer fenced, the checkpoint at the highwater. When the
// store holds an effect the promotion's committed offsets do not cover (the
// group's offsets went back), Promote declines and Restore wipes and rebuilds.
type Handoff struct {
	req chan handoffReq
	// served is set by the follower when it took a request (it then ends);
	// read and written only by the goroutine running the Follow.
	served bool
	// read is the offset after the last changelog record the follower
	// received (applied or held back), 0 before its first read; written by
	// the Follow's goroutine, read by Received.
	read atomic.Int64
}

// Received returns the changelog offset of the last record the follower
// serving h received, applied to the store or held back in memory, and
// false before it read anything. A promotion applies the held-back records
// from memory (Promote), so for the lag of a standby or warm-up (KIP-441's
// acceptable recovery lag) they count as caught up: a partition whose cycles
// write more records than the acceptable lag would otherwise never look
// caught up while its owner is busy. Held-back records dropped at
// MaxHoldBack take it back to the checkpoint.
func (h *Handoff) Received() (int64, bool) {
	r := h.read.Load()
	return r - 1, r > 0
}

type handoffReq struct {
	ctx       context.Context
	committed CommittedFunc
	reply     chan handoffReply // capacity 1
}

type handoffReply struct {
	res Result
	err error
	// declined: the follower did not promote (see Promote); it ended
	// without changing the store beyond what it had applied as a standby.
	declined bool
}

// NewHandoff returns a Handoff for one Follow (WithHandoff).
func NewHandoff() *Handoff { return &Handoff{req: make(chan handoffReq)} }

// WithHandoff makes Follow serve h: a Promote turns it into a restore, after
// which it returns nil.
func WithHandoff(h *Handoff) Option { return func(o *runOpts) { o.handoff = h } }

// ErrNotPromoted is returned by Promote when the follower did not promote:
// it had ended (stopped ended is closed) before taking the request, or the
// store holds effects of uncommitted source records under committed. The
// store is then as the standby left it; a Restore brings it up.
var ErrNotPromoted = errors.New("standby not promoted")

// Promote asks the Follow serving h to bring its partition up to the
// highwater as Restore(ctx, ..., SkipUncommitted(committed)) would, and
// returns that restore's Result; the Follow then ends. committed must answer
// with the group's offsets as they are now (after the previous owner's last
// commit: a claim's initial offsets). ended is the Follow's end (closed when
// the goroutine running it returned). Errors: ErrNotPromoted (fall back to
// Restore), ctx's (the caller then stops the Follow, which may still be
// restoring), and the restore's own (wrapped with the topic and partition);
// after an error other than ErrNotPromoted the store is as a failed Restore
// leaves it: consistent, possibly short of the highwater.
func (h *Handoff) Promote(ctx context.Context, committed CommittedFunc, ended <-chan struct{}) (Result, error) {
	start := time.Now()
	r := handoffReq{ctx: ctx, committed: committed, reply: make(chan handoffReply, 1)}
	select {
	case h.req <- r:
	case <-ended:
		return Result{}, fmt.Errorf("%w: the standby had ended", ErrNotPromoted)
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	// The follower took the request: it answers before it returns; ended
	// covers a follower that panicked away. The follower's read runs under
	// the Follow's context: a caller whose ctx ends must stop the Follow.
	var rep handoffReply
	select {
	case rep = <-r.reply:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-ended:
		select {
		case rep = <-r.reply:
		default:
			return Result{}, fmt.Errorf("%w: the standby ended without an answer", ErrNotPromoted)
		}
	}
	rep.res.Elapsed = time.Since(start)
	if rep.declined {
		return rep.res, fmt.Errorf("%w: %w", ErrNotPromoted, rep.err)
	}
	return rep.res, rep.err
}
