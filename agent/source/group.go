package source

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

type groupState int

const (
	starting groupState = iota // cohort grace sleep, factory call
	running                    // poll loop live; resolutions are recorded
	stopping                   // deliberate stop: ErrGroupStopped delivered, resolutions ignored
	terminal                   // error delivered to every subscriber, resolutions ignored
)

// bindState is the state of one (record, subscriber) pair; see the state
// machine in docs/design.md §3.3.
type bindState uint8

const (
	bQueued   bindState = iota // fanned out, not yet pulled
	bOpen                      // the subscriber's open window
	bClosed                    // window closed, waiting for confirmations (seqs non-empty)
	bResolved                  // acked, failed or rejected: terminal, later resolutions are no-ops
)

// binding is one (record, subscriber) pair. Locking: sub is written only
// under group.mu; state only under group.mu and sub.mu together (so either
// lock reads it); seqs under sub.mu (Bind and a Confirm inside the open
// window take only sub.mu, off the group lock the poll loop holds).
type binding struct {
	sub   *subscriber
	state bindState
	// seqs are the unconfirmed persist tokens bound in this window; seqs are
	// unique in the group, so a token of an earlier use of a recycled entry
	// never matches. Invariant: state==bClosed implies len(seqs)>0;
	// state==bResolved implies len(seqs)==0 (the backing array is kept for
	// the entry's next use).
	seqs []uint64
}

// entry is one fanned-out record of an ack-mode group. Entries are recycled
// (group.free) once the pump advanced them: a Delivery identifies its window
// by its own pointer (subscriber.winD) and a Token by its group-unique seq, so
// neither can act on a later use of the same entry.
type entry struct {
	id      uint64
	rec     *Record
	payload any
	lane    *lane
	created time.Time
	// size is what the record counts toward the group's inFlight bytes
	// (recordSize), set at fan-out and given back when the pump harvests it.
	size int64
	// binds has one binding per member of the fan-out snapshot, in
	// subscription order. The slice never changes length after fan-out.
	binds []binding
	// pending counts bindings not yet bResolved. The entry is resolved when
	// pending==0; only the pump removes entries (from their lane head).
	pending int
	out     Outcome
	causes  []error
	// causeIDs[i] is the subscriber id of causes[i].
	causeIDs []string
	inline   [1]binding // backing store of binds for a single-member snapshot
	// resolvedOpen is set when a binding resolved while its window was open
	// (guarded by the group's mu).
	resolvedOpen bool
}

// lane is the FIFO of one ordering lane: entries in fan-out order. q[head:]
// are the outstanding entries; the pump pops only resolved entries, only
// from the head.
type lane struct {
	key     any
	q       []*entry
	head    int
	deleted bool // removed from group.lanes (the pump's snapshot may still hold it)
}

type queueItem struct {
	rec *Record
	e   *entry // nil on the fast path
	bi  int
}

type subscriber struct {
	g      *group
	id     string
	notify chan struct{} // capacity 1: a record or an error may be waiting

	// mu guards the seqs of this subscriber's bindings; it is taken after
	// group.mu (lock order Manager.mu, group.mu, subscriber.mu) or alone.
	// win, winIdx, winD and the state of this subscriber's bindings change
	// only with both group.mu and mu held.
	mu sync.Mutex

	// Fields below are guarded by g.mu, except the window (see mu).
	queue []queueItem // queue[qhead:] are the queued records, at most QueueSize
	qhead int
	// err, once set, is returned by Next when the queue is empty; it is set
	// together with draining the queue (overflow, ack timeout, stop, terminal).
	err    error
	failed bool // overflow or ack timeout: excluded from later snapshots
	gone   bool // unsubscribed
	// win, winIdx name the open window (ack mode): the binding win.binds[winIdx]
	// of the record last returned by Next, and winD the Delivery Next returned
	// for it. Invariant: at most one window per subscriber; win==nil and
	// winD==nil between Next calls that returned no record, and once win was
	// recycled (group.recycleLocked clears them).
	win    *entry
	winIdx int
	winD   *Delivery
}

func (s *subscriber) qlen() int { return len(s.queue) - s.qhead }

func (s *subscriber) push(it queueItem) {
	s.queue = append(s.queue, it)
	// Next waits on notify only after it found the queue empty under
	// g.mu, so only the push that ends an empty queue needs to wake it.
	if s.qlen() == 1 {
		select {
		case s.notify <- struct{}{}:
		default:
		}
	}
}

func (s *subscriber) pop() queueItem {
	it := s.queue[s.qhead]
	s.queue[s.qhead] = queueItem{}
	s.qhead++
	if s.qhead == len(s.queue) {
		s.queue, s.qhead = s.queue[:0], 0
	}
	return it
}

// failLocked drains the queue and makes err the next thing Next returns.
func (s *subscriber) failLocked(err error) {
	clear(s.queue)
	s.queue, s.qhead = s.queue[:0], 0
	s.err = err
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// group is one shared source: one poll loop, one advance pump, one ack-timeout
// scanner (the latter two only in ack mode).
type group struct {
	m       *Manager
	key     string
	ack     bool
	factory ProducerFactory
	open    OpenFunc

	ctx    context.Context // poll context: cancelled by stop or termination
	cancel context.CancelFunc
	done   chan struct{} // closed when the runner finished: goroutines joined, producer closed

	pumpWake chan struct{} // capacity 1
	pumpStop chan struct{} // closed by the runner once the poll and the scanner ended

	// producer is written by the runner before the pump and the poll start
	// and is read-only afterwards.
	producer Producer
	// laneScratch is owned by the pump goroutine.
	laneScratch []*lane

	mu    sync.Mutex
	state groupState // guarded by mu; only moves forward
	// live mirrors state==running for the paths that run without mu (Bind
	// and Token.Confirm inside an open window); written under mu.
	live atomic.Bool
	// subs are the registered subscribers in subscription order (guarded by mu).
	subs      []*subscriber
	nextEvent uint64        // guarded by mu
	nextSeq   atomic.Uint64 // persist token sequence: unique in the group
	// lanes in insertion order; a lane is deleted when its FIFO empties and
	// recreated at the end on its next record (guarded by mu).
	lanes   []*lane
	laneIdx map[any]*lane
	// spaceCh is non-nil while emit waits for queue room or for in-flight
	// bytes to drop (Backpressure); it is closed when room may have appeared
	// (guarded by mu).
	spaceCh chan struct{}
	// inFlight is the sum of the sizes of the entries fanned out and not yet
	// harvested by the pump (every entry in a lane; guarded by mu). Under
	// Backpressure emit waits while it is at or over Config.MaxInFlightBytes
	// (waitRoomLocked); a group with nothing in flight always lets a record
	// through, whatever its size, and every entry in flight leaves it by
	// itself (its subscribers resolve it, fail, time out or go, with no new
	// record needed), so the wait always ends.
	inFlight int64
	// lastLane is the lane of the previous emit (guarded by mu): most
	// producers emit runs of one lane, so the laneIdx lookup is skipped
	// while the key repeats and the lane is live.
	lastLane *lane
	// spareQ is the FIFO array of the last deleted lane, for reuse (guarded
	// by mu).
	spareQ []*entry
	// free holds advanced entries for reuse, at most maxFree (guarded by mu).
	free []*entry
	// popped and advanced are owned by the pump goroutine: the entries of
	// the current batch, and those of the previous batches waiting to be
	// recycled at the next harvest.
	popped, advanced []*entry
	batch            []AdvanceItem
	// batchKeys holds the lanes of the batch being emitted; owned by the
	// poll goroutine.
	batchKeys []any
}

// maxFree bounds the entry free list of a group.
const maxFree = 4096

func newGroup(m *Manager, key string, factory ProducerFactory, open OpenFunc) *group {
	ctx, cancel := context.WithCancel(context.Background())
	return &group{
		m: m, key: key, ack: factory != nil, factory: factory, open: open,
		ctx: ctx, cancel: cancel, done: make(chan struct{}),
		pumpWake: make(chan struct{}, 1), pumpStop: make(chan struct{}),
		laneIdx: make(map[any]*lane),
	}
}

func (g *group) wakePump() {
	select {
	case g.pumpWake <- struct{}{}:
	default:
	}
}

func (g *group) wakeEmitLocked() {
	if g.spaceCh != nil {
		close(g.spaceCh)
		g.spaceCh = nil
	}
}

// beginStopLocked moves a live group to stopping (err==nil: ErrGroupStopped is
// delivered) or terminal (err delivered) and cancels the poll. The caller
// holds Manager.mu and g.mu and has evicted the key. It is a no-op on a group
// already stopping or terminal, so a terminal error is never replaced.
func (g *group) beginStopLocked(err error) {
	if g.state >= stopping {
		return
	}
	deliver := err
	g.live.Store(false)
	if err == nil {
		g.state = stopping
		deliver = fmt.Errorf("source %q: %w", g.key, ErrGroupStopped)
	} else {
		g.state = terminal
	}
	for _, s := range g.subs {
		s.failLocked(deliver)
	}
	g.wakeEmitLocked()
	g.cancel()
}

// terminate makes the group terminal with err unless it is already stopping:
// evict the key, deliver err to every subscriber, cancel the poll. Called
// without g.mu held.
func (g *group) terminate(err error) {
	m := g.m
	m.mu.Lock()
	g.mu.Lock()
	if g.state < stopping {
		if m.groups[g.key] == g {
			delete(m.groups, g.key)
		}
		g.beginStopLocked(err)
		m.log.Error("shared source terminated", "source", g.key, "err", err)
	}
	g.mu.Unlock()
	m.mu.Unlock()
}

// run is the group's runner goroutine: grace, factory, poll, teardown.
func (g *group) run() {
	defer func() {
		g.cancel()
		g.m.mu.Lock()
		delete(g.m.all, g)
		g.m.mu.Unlock()
		close(g.done)
	}()
	if d := g.m.cfg.CohortGrace; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-g.ctx.Done():
			t.Stop()
			return // stop during grace: no factory call, no Open, no Close
		}
	}
	if g.ctx.Err() != nil {
		return
	}
	if !g.ack {
		g.setRunning()
		err := g.open(g.ctx, g.emitFast)
		g.pollEnded(err)
		return
	}
	p, err := g.factory(g.ctx)
	if err != nil || p == nil {
		if p != nil {
			g.closeProducer(p)
		}
		if err == nil {
			err = errors.New("factory returned a nil producer")
		}
		g.terminate(fmt.Errorf("source %q: create producer: %w", g.key, err))
		return
	}
	g.producer = p
	if !g.setRunning() {
		g.closeProducer(p)
		return
	}
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		g.scan()
	}()
	pumpDone := make(chan struct{})
	go func() {
		defer close(pumpDone)
		g.pump()
	}()
	if bp, ok := p.(BatchProducer); ok {
		err = bp.OpenBatch(g.ctx, g.emitBatch)
	} else {
		err = p.Open(g.ctx, g.emit)
	}
	g.pollEnded(err)
	// The group is now stopping or terminal and g.ctx is cancelled.
	<-scanDone
	close(g.pumpStop)
	<-pumpDone
	g.closeProducer(p)
}

func (g *group) setRunning() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != starting {
		return false
	}
	g.state = running
	g.live.Store(true)
	return true
}

// pollEnded terminates the group when the poll returned on its own (a no-op
// after a stop or a termination, whose cancel made it return).
func (g *group) pollEnded(err error) {
	if err == nil {
		err = ErrPollEnded
	}
	g.terminate(fmt.Errorf("source %q: poll: %w", g.key, err))
}

func (g *group) closeProducer(p Producer) {
	if err := p.Close(); err != nil {
		g.m.log.Warn("Producer close failed", "source", g.key, "err", err)
	}
}

// comparableLane reports an error instead of panicking when a lane cannot be
// a map key (a slice, a map, a func, or a struct holding one).
func comparableLane(k any) (err error) {
	switch k.(type) {
	case nil, int32, int64, int, uint32, uint64, string:
		return nil // the common lanes: skip the deferred recover
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("lane %T is not comparable: %v", k, r)
		}
	}()
	_ = k == k //nolint:staticcheck // the comparison is the check: it panics on non-comparable dynamic types
	return nil
}

// waitRoomLocked blocks (releasing g.mu) while Backpressure applies and a
// snapshot member's queue is full or the group's in-flight bytes are at or
// over Config.MaxInFlightBytes. It returns with g.mu held; ok is false when
// the group is no longer running, waited is true when it released g.mu.
func (g *group) waitRoomLocked() (ok, waited bool) {
	if g.state != running {
		return false, false
	}
	if g.m.cfg.Overflow != Backpressure || g.inFlight < g.m.cfg.MaxInFlightBytes && !g.someFullLocked() {
		return true, false
	}
	return g.awaitRoomLocked(), true
}

// awaitRoomLocked is waitRoomLocked's wait, telling a RoomObserver producer
// why it waits and when it stops; it reports whether the group still runs.
func (g *group) awaitRoomLocked() bool {
	obs, _ := g.producer.(RoomObserver) // nil on the fast path
	last := RoomFree
	defer func() {
		if obs != nil && last != RoomFree {
			obs.WaitingForRoom(RoomFree)
		}
	}()
	for {
		if g.state != running {
			return false
		}
		why := RoomFree
		switch {
		case g.inFlight >= g.m.cfg.MaxInFlightBytes:
			why = RoomBytes
		case g.someFullLocked():
			why = RoomQueue
		}
		if why == RoomFree {
			return true
		}
		if obs != nil && why != last {
			obs.WaitingForRoom(why)
		}
		last = why
		if g.spaceCh == nil {
			g.spaceCh = make(chan struct{})
		}
		ch := g.spaceCh
		g.mu.Unlock()
		select {
		case <-ch:
		case <-g.ctx.Done():
		}
		g.mu.Lock()
	}
}

func (g *group) someFullLocked() bool {
	for _, s := range g.subs {
		if !s.failed && s.qlen() >= g.m.cfg.QueueSize {
			return true
		}
	}
	return false
}

func (g *group) stoppedErr() error {
	if err := g.ctx.Err(); err != nil {
		return err
	}
	return ErrGroupStopped
}

// emitFast fans rec out on the fast path: no entry, no bookkeeping.
func (g *group) emitFast(rec *Record) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ok, _ := g.waitRoomLocked(); !ok {
		return g.stoppedErr()
	}
	for _, s := range g.subs {
		if s.failed {
			continue
		}
		if s.qlen() >= g.m.cfg.QueueSize {
			g.overflowLocked(s)
			continue
		}
		s.push(queueItem{rec: rec})
	}
	return nil
}

// emit fans one record out in ack mode (docs/design.md §3.2).
func (g *group) emit(rec *Record, payload any) error {
	if !g.live.Load() { // live is cleared before the poll context is cancelled
		if err := g.ctx.Err(); err != nil {
			return err
		}
	}
	key, err := g.lane(rec, payload)
	if err != nil {
		return err
	}
	// The fan-out time is read before taking g.mu (the clock read is the
	// costliest step of emit; the poll loop must not hold the lock over
	// it) and again after a Backpressure wait, so only a lock wait of
	// microseconds counts toward the ack timeout.
	created := g.m.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	ok, waited := g.waitRoomLocked()
	if !ok {
		return g.stoppedErr()
	}
	if waited {
		created = g.m.now()
	}
	g.emitLocked(rec, payload, key, created)
	return nil
}

// lane returns the ordering lane of a record, terminating the group when the
// producer cannot give a comparable one.
func (g *group) lane(rec *Record, payload any) (any, error) {
	key, err := g.producer.Lane(payload)
	if err == nil {
		err = comparableLane(key)
	}
	if err != nil {
		err = fmt.Errorf("source %q: lane of record %s[%d]@%d: %w", g.key, rec.Topic, rec.Partition, rec.Offset, err)
		g.terminate(err)
		return nil, err
	}
	return key, nil
}

// emitBatch fans a batch out in ack mode (BatchProducer): every record as
// emit would, in order, under one lock acquisition unless Backpressure makes
// it wait for room. The lanes are computed first, off the lock; a lane error
// terminates the group before any record of the batch is fanned out.
func (g *group) emitBatch(batch []Emit) error {
	if !g.live.Load() {
		if err := g.ctx.Err(); err != nil {
			return err
		}
	}
	keys := g.batchKeys[:0]
	for _, it := range batch {
		key, err := g.lane(it.Record, it.Payload)
		if err != nil {
			clear(keys)
			g.batchKeys = keys[:0]
			return err
		}
		keys = append(keys, key)
	}
	defer func() {
		clear(keys)
		g.batchKeys = keys[:0]
	}()
	created := g.m.now() // see emit: read off the lock, again after a wait
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, it := range batch {
		ok, waited := g.waitRoomLocked()
		if !ok {
			return g.stoppedErr()
		}
		if waited {
			created = g.m.now()
		}
		g.emitLocked(it.Record, it.Payload, keys[i], created)
	}
	return nil
}

// emitLocked fans one record out on lane key; the caller holds g.mu and made
// sure there is room (waitRoomLocked).
func (g *group) emitLocked(rec *Record, payload any, key any, created time.Time) {
	ln := g.lastLane
	if ln == nil || ln.deleted || ln.key != key {
		ln = g.laneIdx[key]
		if ln == nil {
			ln = &lane{key: key, q: g.spareQ}
			g.spareQ = nil
			g.laneIdx[key] = ln
			g.lanes = append(g.lanes, ln)
		}
		g.lastLane = ln
	}
	e := g.newEntryLocked()
	e.id, e.rec, e.payload, e.created = g.nextEvent, rec, payload, created
	e.size = recordSize(rec)
	g.inFlight += e.size
	if e.lane != ln {
		e.lane = ln
	}
	g.nextEvent++
	n := 0
	for _, s := range g.subs {
		if !s.failed {
			n++
		}
	}
	switch {
	case n == 1:
		e.binds = e.inline[:0]
	case cap(e.binds) < n: // also when binds was the inline array
		e.binds = make([]binding, 0, n)
	default:
		e.binds = e.binds[:0]
	}
	for _, s := range g.subs {
		if !s.failed {
			k := len(e.binds)
			e.binds = e.binds[:k+1]
			// A reused binding is resolved, so its seqs are empty;
			// writing only what changed spares GC write barriers.
			b := &e.binds[k]
			if b.sub != s {
				b.sub = s
			}
			b.state = bQueued
		}
	}
	e.pending = n
	ln.q = append(ln.q, e)
	if n == 0 {
		// Born resolved (0,0,0): not clean, still in lane order.
		if ln.q[ln.head] == e {
			g.wakePump()
		}
		return
	}
	for i := range e.binds {
		s := e.binds[i].sub
		if s.failed { // failed earlier in this loop? cannot happen, but keep the binding resolved
			continue
		}
		if s.qlen() >= g.m.cfg.QueueSize {
			g.overflowLocked(s) // resolves e.binds[i] FAILED with the others
			continue
		}
		s.push(queueItem{rec: rec, e: e, bi: i})
	}
}

// newEntryLocked returns a zeroed entry from the free list or a new one.
func (g *group) newEntryLocked() *entry {
	if n := len(g.free); n > 0 {
		e := g.free[n-1]
		g.free[n-1] = nil
		g.free = g.free[:n-1]
		return e
	}
	return &entry{}
}

// scrub clears an advanced entry for reuse. It runs on the pump without g.mu:
// once harvested, an entry is out of every lane, so only the pump and stale
// Deliveries and Tokens reach it, and those read only binds under the locks
// (emit rewrites binds under g.mu, after recycleLocked).
func (e *entry) scrub() {
	// rec and payload may hold large records; lane (small) and the
	// bindings' subscribers are kept: emit overwrites them only when they
	// differ, sparing GC write barriers.
	e.rec, e.payload = nil, nil
	e.out = Outcome{}
	if e.causes != nil {
		// The producer may keep the cause slices it was handed.
		e.causes, e.causeIDs = nil, nil
	}
}

// recycleLocked puts advanced (scrubbed) entries on the free list. An
// advanced entry is referenced only by stale Deliveries and Tokens (which
// check winD and their seq) and by the window of a subscriber that resolved
// it without closing the window (Reject, Fail, a failure; flagged by
// resolvedOpen): that window is closed here, as a resolved binding makes
// closing it a no-op.
func (g *group) recycleLocked(es []*entry) {
	for _, e := range es {
		if !e.resolvedOpen {
			continue
		}
		e.resolvedOpen = false
		for i := range e.binds {
			if s := e.binds[i].sub; s != nil && s.win == e && s.winIdx == i {
				s.mu.Lock()
				s.win, s.winD = nil, nil
				s.mu.Unlock()
			}
		}
	}
	if room := maxFree - len(g.free); room > 0 {
		g.free = append(g.free, es[:min(room, len(es))]...)
	}
	clear(es)
}

// overflowLocked fails s for overflow (FailSubscriber policy).
func (g *group) overflowLocked(s *subscriber) {
	err := &OverflowError{Key: g.key, ID: s.id, QueueSize: g.m.cfg.QueueSize}
	g.m.log.Warn("source subscriber overflow", "source", g.key, "subscriber", s.id, "err", err)
	g.failSubscriberLocked(s, err)
}

// failSubscriberLocked excludes s from later snapshots, replaces its queue by
// err, and resolves it FAILED in every outstanding entry.
func (g *group) failSubscriberLocked(s *subscriber, err error) {
	s.failed = true
	s.failLocked(err)
	g.wakeEmitLocked()
	g.failEverywhereLocked(s, err)
}

// failEverywhereLocked resolves every unresolved binding of s FAILED. The
// caller holds g.mu, not s.mu.
func (g *group) failEverywhereLocked(s *subscriber, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ln := range g.lanes {
		for _, e := range ln.q[ln.head:] {
			if e.pending == 0 {
				continue
			}
			for i := range e.binds {
				if e.binds[i].sub == s && e.binds[i].state != bResolved {
					g.resolveLocked(e, i, outFailed, cause)
				}
			}
		}
	}
}

type outcomeKind uint8

const (
	outAcked outcomeKind = iota
	outFailed
	outRejected
)

// resolveLocked resolves binding i of e exactly once and wakes the pump when
// e became a resolved lane head. The caller holds g.mu and e.binds[i].sub.mu.
func (g *group) resolveLocked(e *entry, i int, k outcomeKind, cause error) {
	b := &e.binds[i]
	if b.state == bResolved {
		return
	}
	if b.state == bOpen {
		e.resolvedOpen = true // the window may stay open on it: see recycleLocked
	}
	b.state = bResolved
	b.seqs = b.seqs[:0]
	switch k {
	case outAcked:
		e.out.Acked++
	case outFailed:
		e.out.Failed++
	case outRejected:
		e.out.Rejected++
	}
	if cause != nil {
		e.causes = append(e.causes, cause)
		e.causeIDs = append(e.causeIDs, b.sub.id)
	}
	e.pending--
	if e.pending == 0 && !e.lane.deleted && e.lane.q[e.lane.head] == e {
		g.wakePump()
	}
}

// closeWindowLocked closes s's open window: ACKED when nothing bound in it is
// unconfirmed, otherwise it waits for the confirmations (bClosed). The caller
// holds g.mu and s.mu.
func (g *group) closeWindowLocked(s *subscriber) {
	e, i := s.win, s.winIdx
	s.win, s.winD = nil, nil
	if e == nil || g.state != running {
		return
	}
	b := &e.binds[i]
	if b.state != bOpen {
		return
	}
	if len(b.seqs) == 0 {
		g.resolveLocked(e, i, outAcked, nil)
	} else {
		b.state = bClosed
	}
}

// pump is the single advance pump (docs/design.md §3.6): at most one Advance in
// flight, one batch per lane per pass, passes repeated while they progress;
// after pumpStop it drains what is resolved and exits.
func (g *group) pump() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopping := false
	for {
		select {
		case <-g.pumpWake:
		case <-g.pumpStop:
			stopping = true
		}
		for {
			progressed, err := g.pass(ctx)
			if err != nil {
				g.m.log.Error("source advance failed; stopping the source and its subscribers", "source", g.key, "err", err)
				g.terminate(fmt.Errorf("source %q: advance: %w", g.key, err))
				return
			}
			if !progressed {
				break
			}
		}
		if stopping {
			return
		}
	}
}

func (g *group) pass(ctx context.Context) (bool, error) {
	g.mu.Lock()
	lanes := append(g.laneScratch[:0], g.lanes...)
	g.mu.Unlock()
	progressed := false
	for _, ln := range lanes {
		g.mu.Lock()
		g.recycleLocked(g.advanced)
		g.advanced = g.advanced[:0]
		popped := g.harvestLocked(ln, g.popped[:0])
		g.mu.Unlock()
		if len(popped) == 0 {
			continue
		}
		progressed = true
		// Resolved entries are immutable (resolveLocked and
		// failEverywhereLocked skip them) and harvested ones are out of
		// every lane, so the batch is built (and the entries scrubbed)
		// without holding g.mu: a long harvest must not stall the poll
		// loop. They reach the free list at the next harvest.
		batch := slices.Grow(g.batch[:0], len(popped))
		for _, e := range popped {
			batch = append(batch, AdvanceItem{Record: e.rec, Payload: e.payload, Outcome: e.out, Causes: e.causes, CauseIDs: e.causeIDs})
			e.scrub()
		}
		g.popped, g.advanced = g.advanced, popped
		err := g.producer.Advance(ctx, batch)
		clear(batch) // the slice is reused: drop the records it points at
		g.batch = batch[:0]
		if err != nil {
			return progressed, err
		}
	}
	clear(lanes)
	g.laneScratch = lanes[:0]
	return progressed, nil
}

// harvestLocked pops the maximal resolved prefix of ln, appending it to dst,
// and deletes ln when it empties.
func (g *group) harvestLocked(ln *lane, dst []*entry) []*entry {
	start := ln.head
	for ln.head < len(ln.q) && ln.q[ln.head].pending == 0 {
		g.inFlight -= ln.q[ln.head].size
		ln.head++
	}
	if ln.head > start && g.inFlight < g.m.cfg.MaxInFlightBytes {
		g.wakeEmitLocked() // in-flight bytes dropped under the bound
	}
	popped := append(dst, ln.q[start:ln.head]...)
	clear(ln.q[start:ln.head])
	if ln.deleted {
		return popped
	}
	switch {
	case ln.head == len(ln.q):
		ln.deleted = true
		// The empty FIFO's array serves the next new lane (a lane that
		// the pump drains empties and is recreated on its next record).
		if cap(ln.q) > cap(g.spareQ) {
			g.spareQ = ln.q[:0]
		}
		ln.q, ln.head = nil, 0
		delete(g.laneIdx, ln.key)
		g.lanes = slices.DeleteFunc(g.lanes, func(x *lane) bool { return x == ln })
	case ln.head > 64 && ln.head*2 > len(ln.q):
		n := copy(ln.q, ln.q[ln.head:])
		clear(ln.q[n:])
		ln.q, ln.head = ln.q[:n], 0
	}
	return popped
}

// scan is the ack-timeout scanner (docs/design.md §3.5).
func (g *group) scan() {
	t := time.NewTicker(g.m.cadence)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
			g.scanOnce()
		}
	}
}

func (g *group) scanOnce() {
	now := g.m.now()
	timeout := g.m.cfg.AckTimeout
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != running {
		return
	}
	var due []*entry
	for _, ln := range g.lanes {
		for _, e := range ln.q[ln.head:] {
			if e.pending > 0 && now.Sub(e.created) >= timeout {
				due = append(due, e)
			}
		}
	}
	slices.SortFunc(due, func(a, b *entry) int { return cmp.Compare(a.id, b.id) })
	for _, e := range due {
		for i := range e.binds {
			b := &e.binds[i]
			if b.state == bResolved {
				continue
			}
			s := b.sub
			err := &AckTimeoutError{Key: g.key, ID: s.id, EventID: e.id, Offset: e.rec.Offset, Timeout: timeout}
			if !s.gone && !s.failed {
				g.m.log.Warn("source ack timeout", "source", g.key, "subscriber", s.id, "offset", e.rec.Offset, "err", err)
				s.failed = true
				s.failLocked(err)
				g.wakeEmitLocked()
			}
			g.failEverywhereLocked(s, err)
		}
	}
}
