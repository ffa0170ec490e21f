package source

import (
	"context"
	"errors"
	"fmt"
)

// Subscription is one subscriber (an agent instance) of a shared source. Its
// methods Next and Unsubscribe are meant for the subscriber's own goroutine;
// Token methods may be called from any goroutine.
type Subscription struct{ s *subscriber }

// Key returns the shared source key; ID the subscriber id.
func (s *Subscription) Key() string { return s.s.g.key }

// ID returns the subscriber id given to Subscribe.
func (s *Subscription) ID() string { return s.s.id }

// Next closes the window of the previous delivery (ACKED at once when nothing
// bound in it is unconfirmed, otherwise when the last token confirms), then
// waits for the next record. The window closes when the subscriber asks for
// the next record, not when one arrives.
//
// Errors: ctx.Err(); ErrGroupStopped (wrapped) after Stop/StopAll or the last
// unsubscribe; *OverflowError; *AckTimeoutError; the producer's error or
// ErrPollEnded (wrapped) when the group terminated; ErrUnsubscribed after
// Unsubscribe. Once an error other than ctx.Err() is returned, every later
// call returns it too.
func (s *Subscription) Next(ctx context.Context) (*Delivery, error) {
	// Allocated before taking the group lock, which the poll loop contends
	// for; unused (garbage) when Next returns an error.
	d := &Delivery{}
	if err := s.NextInto(ctx, d); err != nil {
		return nil, err
	}
	return d, nil
}

// NextInto is Next writing the delivery into d, so that a subscriber can
// allocate it inside its own per-record value (the agent's event) instead of
// once more per record. d must be a zero Delivery that was never passed to
// NextInto before: a delivery's address names its binding window. On an error
// d is left unused.
func (s *Subscription) NextInto(ctx context.Context, d *Delivery) error {
	sub := s.s
	g := sub.g
	d.s = sub
	g.mu.Lock()
	if sub.win != nil {
		// Close the previous window and open the next one in one
		// subscriber-lock section when a record is waiting.
		sub.mu.Lock()
		g.closeWindowLocked(sub)
		if !sub.gone && sub.qlen() > 0 {
			g.deliverLocked(sub, d)
			sub.mu.Unlock()
			g.mu.Unlock()
			return nil
		}
		sub.mu.Unlock()
	}
	for {
		if sub.gone {
			g.mu.Unlock()
			return ErrUnsubscribed
		}
		if sub.qlen() > 0 {
			if g.ack {
				sub.mu.Lock()
				g.deliverLocked(sub, d)
				sub.mu.Unlock()
			} else {
				g.deliverLocked(sub, d)
			}
			g.mu.Unlock()
			return nil
		}
		if sub.err != nil {
			err := sub.err
			g.mu.Unlock()
			return err
		}
		g.mu.Unlock()
		select {
		case <-sub.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
		g.mu.Lock()
	}
}

// deliverLocked pops the head of sub's queue into d and opens its window. The
// caller holds g.mu and, in ack mode, sub.mu; the queue is not empty.
func (g *group) deliverLocked(sub *subscriber, d *Delivery) {
	it := sub.pop()
	g.wakeEmitLocked()
	d.Record, d.e, d.i = it.rec, it.e, it.bi
	if it.e != nil && it.e.binds[it.bi].state == bQueued {
		it.e.binds[it.bi].state = bOpen
		sub.win, sub.winIdx, sub.winD = it.e, it.bi, d
	}
}

// Unsubscribe removes the subscriber (docs/design.md §3.4, GONE): its queue is
// dropped; records it never pulled count FAILED; its open window is closed
// and counts ACKED when nothing bound in it is unconfirmed (otherwise it keeps
// waiting for the confirmations). With cause != nil the open window counts
// FAILED with that cause instead (deviation 3: the reference counts it ACKED,
// committing a record the subscriber crashed on). Windows closed earlier keep
// waiting for their confirmations. When it was the last subscriber the group
// stops and Unsubscribe waits for its drain. Calling it twice is a no-op.
func (s *Subscription) Unsubscribe(cause error) {
	sub := s.s
	g := sub.g
	m := g.m
	m.mu.Lock()
	g.mu.Lock()
	if sub.gone {
		g.mu.Unlock()
		m.mu.Unlock()
		return
	}
	sub.gone = true
	sub.failed = false
	clear(sub.queue)
	sub.queue, sub.qhead = nil, 0
	sub.mu.Lock()
	win, winIdx := sub.win, sub.winIdx
	sub.win, sub.winD = nil, nil
	for i, x := range g.subs {
		if x == sub {
			g.subs = append(g.subs[:i], g.subs[i+1:]...)
			break
		}
	}
	if g.state == running {
		for _, ln := range g.lanes {
			for _, e := range ln.q[ln.head:] {
				if e.pending == 0 {
					continue
				}
				for i := range e.binds {
					b := &e.binds[i]
					if b.sub != sub || b.state == bResolved {
						continue
					}
					switch {
					case b.state == bQueued:
						g.resolveLocked(e, i, outFailed, fmt.Errorf("subscriber %s unsubscribed before pulling the record", sub.id))
					case b.state == bOpen && (e != win || i != winIdx):
						// Cannot happen (one window per subscriber); treat it as the window.
						fallthrough
					case b.state == bOpen:
						if cause != nil {
							g.resolveLocked(e, i, outFailed, cause)
						} else if len(b.seqs) == 0 {
							g.resolveLocked(e, i, outAcked, nil)
						} else {
							b.state = bClosed
						}
					}
				}
			}
		}
	}
	sub.mu.Unlock()
	select {
	case sub.notify <- struct{}{}:
	default:
	}
	g.wakeEmitLocked()
	last := len(g.subs) == 0 && m.groups[g.key] == g
	if last {
		delete(m.groups, g.key)
		g.beginStopLocked(nil)
	}
	g.mu.Unlock()
	m.mu.Unlock()
	if last {
		<-g.done
	}
}

// Delivery is one record handed to one subscriber; its binding window is open
// from Next's return until the next Next or Unsubscribe. A Delivery whose
// window closed is stale: Bind and Reject on it are no-ops (deviation 2). So
// are Open, Bind, Reject and Fail on a Delivery that Next never filled (the
// zero Delivery, or a nil pointer): it has no window.
type Delivery struct {
	Record *Record

	s *subscriber
	e *entry // nil on the fast path
	i int
}

// Open reports whether d's binding window is open: the subscriber has not
// pulled the next record and d is not resolved. It binds nothing.
func (d *Delivery) Open() bool {
	if d == nil || d.e == nil {
		return false
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.g.live.Load() && s.winD == d && d.e.binds[d.i].state == bOpen
}

// Payload returns what the producer delivered d's record with (the payload
// given to emit: a Kafka producer's incarnation of its partition), nil
// outside d's open window or on the fast path. Senders stamp a derived
// record with it (package dedup).
func (d *Delivery) Payload() any {
	if d == nil || d.e == nil {
		return nil
	}
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.winD != d {
		return nil
	}
	return d.e.payload
}

// Bind binds one derived record (a sink record, a changelog record) to d's
// window and returns its persist token: d's subscriber is not acked on the
// record until the token is confirmed. ok is false (and the returned Token is
// a no-op) when the window is closed, the binding was already resolved
// (rejected or failed), the group is on the fast path, or the group stopped.
// A derived record must be bound before the subscriber calls Next again.
func (d *Delivery) Bind() (tok Token, ok bool) {
	if d == nil || d.e == nil {
		return Token{}, false
	}
	// Only the subscriber lock: the window is open (winD==d) and its entry
	// cannot be recycled until the window closes, which takes s.mu too.
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.g.live.Load() || s.winD != d {
		return Token{}, false
	}
	b := &d.e.binds[d.i]
	if b.state != bOpen {
		return Token{}, false
	}
	seq := s.g.nextSeq.Add(1) - 1
	b.seqs = append(b.seqs, seq)
	return Token{d: d, seq: seq}, true
}

// Reject resolves d's record REJECTED for this subscriber now (terminal:
// the producer dead-letters it); tokens already bound in the window are
// dropped and later Binds return false. It returns true when it took effect.
// Outside d's open window (stale delivery, fast path, after a failure or a
// previous reject) it does nothing; outside a window it logs a warning. On a
// Delivery that Next never filled (zero or nil) it does nothing and returns
// false: there is no subscriber to log for.
func (d *Delivery) Reject(reason error) bool {
	if d == nil || d.s == nil {
		return false
	}
	g := d.s.g
	if d.e == nil {
		g.m.log.Warn("Reject called outside an ack-mode binding window; ignored", "source", g.key, "subscriber", d.s.id)
		return false
	}
	g.mu.Lock()
	if g.state != running || d.s.winD != d {
		g.mu.Unlock()
		g.m.log.Warn("Reject called outside an ack-mode binding window; ignored", "source", g.key, "subscriber", d.s.id)
		return false
	}
	if d.e.binds[d.i].state != bOpen {
		g.mu.Unlock()
		return false
	}
	if reason == nil {
		reason = errors.New("rejected")
	}
	d.s.mu.Lock()
	g.resolveLocked(d.e, d.i, outRejected, reason)
	d.s.mu.Unlock()
	g.mu.Unlock()
	g.m.log.Info("source record rejected", "source", g.key, "subscriber", d.s.id, "offset", d.Record.Offset, "reason", reason)
	return true
}

// Fail resolves d's record FAILED for this subscriber now, with cause (the
// agent returned an error or panicked on the record): the record is not
// committed and the producer redelivers it. Tokens already bound in the
// window are dropped and later Binds return false; the subscriber stays
// subscribed and keeps receiving later records (unlike Unsubscribe(cause),
// which also removes it from later snapshots). It returns true when it took
// effect; outside d's open window (stale delivery, fast path, after a reject
// or an earlier failure) it does nothing.
func (d *Delivery) Fail(cause error) bool {
	if d == nil || d.e == nil {
		return false
	}
	g := d.s.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != running || d.s.winD != d || d.e.binds[d.i].state != bOpen {
		return false
	}
	if cause == nil {
		cause = errors.New("failed")
	}
	d.s.mu.Lock()
	g.resolveLocked(d.e, d.i, outFailed, cause)
	d.s.mu.Unlock()
	return true
}

// Token is the persist token of one derived record bound to a window. The
// zero Token is a no-op. Its methods are safe from any goroutine; duplicate
// and stale calls (after the binding resolved, or after the group stopped)
// are no-ops.
type Token struct {
	d   *Delivery // the window the token was bound in
	seq uint64    // unique in the group
}

// Confirm records that the derived record is durable (the broker
// acknowledged it, acks=all, or its transaction committed).
func (t Token) Confirm() {
	d := t.d
	if d == nil {
		return
	}
	s := d.s
	g := s.g
	s.mu.Lock()
	if s.winD == d {
		// Inside the open window a confirmation cannot resolve the
		// binding (the window's close does), so only s.mu is needed.
		if g.live.Load() {
			if b := &d.e.binds[d.i]; b.state == bOpen {
				b.take(t.seq)
			}
		}
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := t.takeLocked()
	if !ok {
		return
	}
	if b.state == bClosed && len(b.seqs) == 0 {
		g.resolveLocked(d.e, d.i, outAcked, nil)
	}
}

// Fail records that delivering the derived record failed: the record is
// resolved FAILED for this subscriber at once with err as its cause
// (deviation 4: the reference waits for the ack timeout). The subscriber
// itself stays healthy.
func (t Token) Fail(err error) {
	d := t.d
	if d == nil {
		return
	}
	g := d.s.g
	g.mu.Lock()
	defer g.mu.Unlock()
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if _, ok := t.takeLocked(); !ok {
		return
	}
	if err == nil {
		err = errors.New("delivery failed")
	}
	g.resolveLocked(d.e, d.i, outFailed, fmt.Errorf("derived record delivery: %w", err))
}

// takeLocked removes t's seq from its binding; false when it is stale. The
// caller holds g.mu and t.d.s.mu.
func (t Token) takeLocked() (*binding, bool) {
	d := t.d
	if d.s.g.state != running {
		return nil, false
	}
	if d.i >= len(d.e.binds) { // a later use of a recycled entry
		return nil, false
	}
	b := &d.e.binds[d.i]
	// b.sub differs on a later use of a recycled entry; then b.seqs is not
	// guarded by the lock held. Same subscriber: the unique seq decides.
	if b.sub != d.s || b.state == bResolved {
		return nil, false
	}
	if b.take(t.seq) {
		return b, true
	}
	return nil, false
}

// take removes seq from b.seqs; false when it is not there.
func (b *binding) take(seq uint64) bool {
	for k, s := range b.seqs {
		if s == seq {
			b.seqs = append(b.seqs[:k], b.seqs[k+1:]...)
			return true
		}
	}
	return false
}
