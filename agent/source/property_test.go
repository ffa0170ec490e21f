package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// propProducer emits on request (synchronously: emitSync returns after emit
// returned) and records Advance calls.
type propProducer struct {
	req  chan *Record
	done chan error

	mu       sync.Mutex
	inflight bool
	closed   bool
	advanced []AdvanceItem
	errs     []string
}

func (p *propProducer) Open(ctx context.Context, emit func(*Record, any) error) error {
	for {
		select {
		case r := <-p.req:
			p.done <- emit(r, r)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *propProducer) emitSync(r *Record) error {
	p.req <- r
	return <-p.done
}

func (p *propProducer) Lane(payload any) (any, error) { return payload.(*Record).Partition, nil }

func (p *propProducer) Advance(_ context.Context, batch []AdvanceItem) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inflight || p.closed || len(batch) == 0 {
		p.errs = append(p.errs, fmt.Sprintf("bad Advance: inflight=%v closed=%v len=%d", p.inflight, p.closed, len(batch)))
	}
	for _, it := range batch[1:] {
		if it.Record.Partition != batch[0].Record.Partition {
			p.errs = append(p.errs, "batch mixes lanes")
		}
	}
	p.advanced = append(p.advanced, batch...)
	return nil
}

func (p *propProducer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	return nil
}

// Model of one (record, subscriber) binding.
type pBind struct {
	state   bindState
	pending map[int]bool // model token ids not yet confirmed
}

type pTok struct {
	tok  Token
	rec  int
	sub  int
	used bool
}

// TestPropertyAdvance drives random fan-outs over lanes, random late joins,
// random bind/confirm/fail/reject/pull orders, and checks: every record is
// advanced exactly once, in lane order, with exactly the outcome the model
// predicts (so only after its whole snapshot resolved), and
// acked+failed+rejected == |snapshot|.
func TestPropertyAdvance(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		nRec := rapid.IntRange(1, 25).Draw(rt, "records")
		nLane := rapid.IntRange(1, 3).Draw(rt, "lanes")
		nSub := rapid.IntRange(1, 3).Draw(rt, "subscribers")
		joinAt := make([]int, nSub) // subscriber k joins before record joinAt[k]
		for k := range joinAt {
			if k > 0 {
				joinAt[k] = rapid.IntRange(0, nRec).Draw(rt, fmt.Sprintf("join%d", k))
			}
		}
		m, err := NewManager(Config{AckTimeout: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			rt.Fatal(err)
		}
		p := &propProducer{req: make(chan *Record), done: make(chan error)}
		factory := func(context.Context) (Producer, error) { return p, nil }

		subs := make([]*Subscription, nSub)
		queues := make([][]int, nSub)         // model queue of record indices
		window := make([]*Delivery, nSub)     // open window delivery
		windowRec := make([]int, nSub)        // record index of the open window
		binds := make([]map[int]*pBind, nSub) // per sub: record -> binding
		recs := make([]*Record, nRec)
		snap := make([]int, nRec)
		want := make([]Outcome, nRec)
		var toks []*pTok
		emitted := 0

		join := func(k int) {
			s, err := m.Subscribe("k", fmt.Sprintf("s%d", k), factory)
			if err != nil {
				rt.Fatal(err)
			}
			subs[k] = s
			binds[k] = map[int]*pBind{}
		}
		resolve := func(k, r int, o outcomeKind) {
			b := binds[k][r]
			b.state = bResolved
			switch o {
			case outAcked:
				want[r].Acked++
			case outFailed:
				want[r].Failed++
			case outRejected:
				want[r].Rejected++
			}
		}
		closeWindow := func(k int) {
			if window[k] == nil {
				return
			}
			b := binds[k][windowRec[k]]
			if b.state == bOpen {
				if len(b.pending) == 0 {
					resolve(k, windowRec[k], outAcked)
				} else {
					b.state = bClosed
				}
			}
			window[k] = nil
		}
		pull := func(k int) {
			closeWindow(k)
			ctx, cancel := context.WithCancel(context.Background())
			if len(queues[k]) == 0 {
				cancel()
			}
			d, err := subs[k].Next(ctx)
			cancel()
			if len(queues[k]) == 0 {
				if !errors.Is(err, context.Canceled) {
					rt.Fatalf("s%d: Next with an empty queue: %v, %v", k, d, err)
				}
				return
			}
			if err != nil {
				rt.Fatalf("s%d: Next: %v", k, err)
			}
			r := queues[k][0]
			queues[k] = queues[k][1:]
			if d.Record != recs[r] {
				rt.Fatalf("s%d: got offset %d, want %d", k, d.Record.Offset, recs[r].Offset)
			}
			window[k], windowRec[k] = d, r
			binds[k][r].state = bOpen
		}
		emit := func() {
			for k := range subs {
				if subs[k] == nil && joinAt[k] <= emitted {
					join(k)
				}
			}
			lane := rapid.IntRange(0, nLane-1).Draw(rt, "lane")
			r := emitted
			recs[r] = &Record{Partition: int32(lane), Offset: int64(r)}
			for k := range subs {
				if subs[k] != nil {
					snap[r]++
					queues[k] = append(queues[k], r)
					binds[k][r] = &pBind{pending: map[int]bool{}}
				}
			}
			if err := p.emitSync(recs[r]); err != nil {
				rt.Fatal(err)
			}
			emitted++
		}

		steps := rapid.IntRange(nRec, 6*nRec).Draw(rt, "steps")
		for i := 0; i < steps || emitted < nRec; i++ {
			switch a := rapid.IntRange(0, 5).Draw(rt, "action"); {
			case a == 0 || i >= steps:
				if emitted < nRec {
					emit()
				}
			case a == 1: // pull
				k := rapid.IntRange(0, nSub-1).Draw(rt, "sub")
				if subs[k] != nil {
					pull(k)
				}
			case a == 2: // bind in the open window
				k := rapid.IntRange(0, nSub-1).Draw(rt, "sub")
				if subs[k] == nil || window[k] == nil {
					continue
				}
				tok, ok := window[k].Bind()
				b := binds[k][windowRec[k]]
				if ok != (b.state == bOpen) {
					rt.Fatalf("Bind ok=%v with model state %d", ok, b.state)
				}
				if ok {
					b.pending[len(toks)] = true
					toks = append(toks, &pTok{tok: tok, rec: windowRec[k], sub: k})
				}
			case a == 3 || a == 4: // confirm (or fail) a random token
				if len(toks) == 0 {
					continue
				}
				pt := toks[rapid.IntRange(0, len(toks)-1).Draw(rt, "tok")]
				fail := a == 4 && rapid.IntRange(0, 3).Draw(rt, "failRoll") == 0
				b := binds[pt.sub][pt.rec]
				id := -1
				for j, x := range toks {
					if x == pt {
						id = j
					}
				}
				live := !pt.used && b.state != bResolved && b.pending[id]
				pt.used = true
				if live {
					delete(b.pending, id)
					if fail {
						resolve(pt.sub, pt.rec, outFailed)
					} else if b.state == bClosed && len(b.pending) == 0 {
						resolve(pt.sub, pt.rec, outAcked)
					}
				}
				if fail {
					pt.tok.Fail(errors.New("delivery"))
				} else {
					pt.tok.Confirm()
				}
			case a == 5: // reject the open window
				k := rapid.IntRange(0, nSub-1).Draw(rt, "sub")
				if subs[k] == nil || window[k] == nil || rapid.IntRange(0, 2).Draw(rt, "rejectRoll") != 0 {
					continue
				}
				b := binds[k][windowRec[k]]
				wantOK := b.state == bOpen
				if wantOK {
					resolve(k, windowRec[k], outRejected)
				}
				if ok := window[k].Reject(errors.New("bad")); ok != wantOK {
					rt.Fatalf("Reject ok=%v, model %v", ok, wantOK)
				}
			}
		}
		// Drain: every subscriber pulls everything, then every token confirms.
		for k := range subs {
			if subs[k] == nil {
				continue
			}
			for len(queues[k]) > 0 {
				pull(k)
			}
			pull(k)
		}
		for j, pt := range toks {
			b := binds[pt.sub][pt.rec]
			if !pt.used && b.state != bResolved && b.pending[j] {
				delete(b.pending, j)
				if b.state == bClosed && len(b.pending) == 0 {
					resolve(pt.sub, pt.rec, outAcked)
				}
			}
			pt.used = true
			pt.tok.Confirm()
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			p.mu.Lock()
			n := len(p.advanced)
			p.mu.Unlock()
			if n >= nRec || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		m.StopAll()

		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.errs {
			rt.Error(e)
		}
		if len(p.advanced) != nRec {
			rt.Fatalf("advanced %d records, want %d", len(p.advanced), nRec)
		}
		seen := make([]bool, nRec)
		last := map[int32]int64{}
		for _, it := range p.advanced {
			r := int(it.Record.Offset)
			if seen[r] {
				rt.Fatalf("record %d advanced twice", r)
			}
			seen[r] = true
			if l, ok := last[it.Record.Partition]; ok && it.Record.Offset < l {
				rt.Fatalf("lane %d out of order: %d after %d", it.Record.Partition, r, l)
			}
			last[it.Record.Partition] = it.Record.Offset
			o := it.Outcome
			if o != want[r] {
				rt.Fatalf("record %d: outcome %+v, model %+v", r, o, want[r])
			}
			if o.Acked+o.Failed+o.Rejected != snap[r] {
				rt.Fatalf("record %d: outcome %+v, snapshot %d", r, o, snap[r])
			}
		}
	})
}

// TestPropertyWatermark: with increasing offsets (random gaps) fetched and
// resolved in random order, Next never passes an unresolved fetched record
// and reaches last fetched+1 once everything resolved.
func TestPropertyWatermark(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		committed := rapid.Int64Range(0, 1000).Draw(rt, "committed")
		w := NewWatermark(committed)
		next := committed
		var fetched []int64
		unresolved := map[int64]bool{}
		last := committed - 1
		check := func() {
			want := last + 1
			for _, o := range fetched {
				if unresolved[o] {
					want = o
					break
				}
			}
			if got := w.Next(); got != want {
				rt.Fatalf("Next()=%d, want %d (fetched %v, unresolved %v)", got, want, fetched, unresolved)
			}
			for o := range unresolved {
				if w.Next() > o {
					rt.Fatalf("Next()=%d passes unresolved %d", w.Next(), o)
				}
			}
		}
		check()
		for range rapid.IntRange(0, 100).Draw(rt, "ops") {
			if len(unresolved) == 0 || rapid.Bool().Draw(rt, "fetch") {
				next += rapid.Int64Range(0, 3).Draw(rt, "gap")
				w.Fetched(next)
				fetched = append(fetched, next)
				unresolved[next] = true
				last = next
				next++
			} else {
				var keys []int64
				for _, o := range fetched {
					if unresolved[o] {
						keys = append(keys, o)
					}
				}
				o := keys[rapid.IntRange(0, len(keys)-1).Draw(rt, "resolve")]
				w.Resolved(o)
				delete(unresolved, o)
				if rapid.IntRange(0, 4).Draw(rt, "dup") == 0 {
					w.Resolved(o) // duplicates are no-ops
					w.Fetched(o)  // not increasing: ignored
				}
			}
			check()
		}
		for _, o := range fetched {
			w.Resolved(o)
		}
		if got := w.Next(); got != last+1 {
			rt.Fatalf("all resolved: Next()=%d, want %d", got, last+1)
		}
	})
}
