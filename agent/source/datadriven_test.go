package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestScenarios runs the ack-mode scenarios kept in testdata/: one file per
// group of behaviours (fan-out, backpressure, ack timeout, deviations, ...),
// each file in one synctest bubble, so "sleep" advances a fake clock and every
// directive returns once the manager's goroutines are idle. Rewrite the
// expected output with
//
//	go test ./agent/source -run TestScenarios -rewrite
//
// and read the diff: a changed line is a changed behaviour.
//
// Directives (a record is written off, or pN@off outside partition 0; a batch
// is "off:acked/failed/rejected ..."; names such as broker-gone stand for an
// error made by the script and are printed where an error wraps them):
//
//	manager [queue-size=N] [overflow=fail|backpressure] [ack-timeout=D] [cohort-grace=D]
//	    stop the previous scenario's manager and start a new one (prints a
//	    config error instead when NewManager refuses the config)
//	config                      the effective config and scanner cadence
//	subscribe a b [key=k] [no-factory]   ack-mode subscribers (errors printed);
//	                            outside key k a subscriber is then called key/id
//	subscribe-fast a b [key=k]  fast-path subscribers; the first brings the poll loop
//	emit 0 1 [partition=N]      the fake poll loop emits these offsets
//	end [error=name]            Open returns (nil or the named error)
//	next a b                    Next on each (1 ms deadline): record, "nothing queued" or the error
//	next-cancelled a            Next with a cancelled context
//	error-contains a            whether a's last Next error says the input text
//	bind a@0 t1 t2              Bind on a's delivery of offset 0, naming the tokens; no names: just report
//	confirm t1 zero             Token.Confirm ("zero" is Token{})
//	fail t1 [cause=name]        Token.Fail
//	reject a@0 [reason=name]    Delivery.Reject ("zero" is &Delivery{}, "nil" a nil *Delivery; also for bind)
//	unsubscribe a [cause=name]  Subscription.Unsubscribe
//	advanced [items]            Advance batches since the last call ("items": items only, for racy batching)
//	items                       every advanced item so far: outcome, Clean, causes and their subscribers
//	sleep D                     advance the fake clock
//	elapsed                     fake time since the scenario started
//	emitted                     records the fake poll loop has emitted so far
//	producers                   producers built, with their Open and Close counts
//	groups                      keys registered, groups not yet torn down
//	stop k [async] | stop-all | wait-stopped
//	gate | release              block Advance calls from now on / let them through
//	advance-error name|none     Advance returns the named error from now on
//	factory-error name|none     the factory returns the named error from now on
//	lane error-at=OFF error=name | lane not-comparable
//	logged                      whether the log holds the input text
//
// Every file runs twice: with a per-record poll loop (Producer.Open) and with
// a batch poll loop (BatchProducer.OpenBatch) emitting each record as a batch
// of one, so the batch path keeps every scenario's outcome (batches of many
// records: batch_test.go).
func TestScenarios(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "record", true: "batch"}[batch], func(t *testing.T) {
			datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
				synctest.Test(t, func(t *testing.T) {
					s := &script{t: t, batch: batch}
					defer s.finish()
					datadriven.RunTest(t, path, s.run)
				})
			})
		})
	}
}

// script is the state of one testdata file: the current scenario's harness
// and the names the file gave to deliveries, tokens and errors.
type script struct {
	t     *testing.T
	h     *harness
	start time.Time
	batch bool // the producers are BatchProducers

	subs       map[string]*Subscription
	deliveries map[string]*Delivery // "a@0", "a@p1@20"
	tokens     map[string]Token
	errs       map[string]error // script-made errors by name
	lastErr    map[string]error // last Next error per subscriber
	gate       chan struct{}
	stops      []chan struct{}
}

// finish ends the current scenario: opens the gate, stops every group and
// waits for asynchronous stops, so the bubble ends with no goroutine left.
func (s *script) finish() {
	if s.h == nil {
		return
	}
	s.release()
	s.h.m.StopAll()
	s.waitStopped()
	synctest.Wait()
	s.h = nil
}

func (s *script) release() {
	if s.gate == nil {
		return
	}
	s.h.mu.Lock()
	s.h.advanceGate = nil
	s.h.mu.Unlock()
	close(s.gate)
	s.gate = nil
}

func (s *script) waitStopped() {
	for _, c := range s.stops {
		<-c
	}
	s.stops = nil
}

func (s *script) run(t *testing.T, d *datadriven.TestData) string {
	if d.Cmd != "manager" && s.h == nil {
		d.Fatalf(t, "%s before manager", d.Cmd)
	}
	out := s.do(t, d)
	synctest.Wait()
	return out
}

func (s *script) do(t *testing.T, d *datadriven.TestData) string {
	h := s.h
	var b strings.Builder
	switch d.Cmd {
	case "manager":
		s.finish()
		var cfg Config
		for _, a := range d.CmdArgs {
			v := a.SingleVal(t)
			switch a.Key {
			case "queue-size":
				cfg.QueueSize = s.atoi(t, d, v)
			case "ack-timeout":
				cfg.AckTimeout = s.duration(t, d, v)
			case "cohort-grace":
				cfg.CohortGrace = s.duration(t, d, v)
			case "overflow":
				switch v {
				case "fail":
					cfg.Overflow = FailSubscriber
				case "backpressure":
					cfg.Overflow = Backpressure
				default:
					cfg.Overflow = Overflow(s.atoi(t, d, v))
				}
			default:
				d.Fatalf(t, "unknown argument %s", a.Key)
			}
		}
		h = &harness{t: t, in: make(chan fakeItem, 1<<12), log: &bytes.Buffer{}, batch: s.batch}
		cfg.Logger = slog.New(slog.NewTextHandler(lockedWriter{w: h.log, mu: &h.mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
		m, err := NewManager(cfg)
		if err != nil {
			return "error: " + err.Error()
		}
		h.m = m
		s.h, s.start = h, time.Now()
		s.subs, s.deliveries, s.tokens = map[string]*Subscription{}, map[string]*Delivery{}, map[string]Token{}
		s.errs, s.lastErr = map[string]error{}, map[string]error{}

	case "config":
		c := h.m.cfg
		fmt.Fprintf(&b, "queue-size=%d ack-timeout=%s cohort-grace=%s overflow=%d cadence=%s",
			c.QueueSize, c.AckTimeout, c.CohortGrace, c.Overflow, h.m.cadence)

	case "subscribe", "subscribe-fast":
		key := "k"
		d.MaybeScanArgs(t, "key", &key)
		first := true
		for _, id := range s.positional(d) {
			var sub *Subscription
			var err error
			switch {
			case d.Cmd == "subscribe-fast" && first:
				sub, err = h.m.SubscribeFast(key, id, s.fastOpen)
			case d.Cmd == "subscribe-fast":
				sub, err = h.m.SubscribeFast(key, id, nil)
			case d.HasArg("no-factory"):
				sub, err = h.m.Subscribe(key, id, nil)
			default:
				sub, err = h.m.Subscribe(key, id, h.factory)
			}
			first = false
			if err != nil {
				fmt.Fprintf(&b, "%s: error: %s\n", id, s.fmtErr(err))
				continue
			}
			if key != "k" {
				id = key + "/" + id // a in group k1 is k1/a
			}
			s.subs[id] = sub
			synctest.Wait()
		}

	case "emit":
		var part int32
		if d.HasArg("partition") {
			var p int
			d.ScanArgs(t, "partition", &p)
			part = int32(p)
		}
		for _, o := range s.positional(d) {
			h.emitP(part, int64(s.atoi(t, d, o)))
		}

	case "end":
		h.end(s.optErr(t, d, "error"))

	case "next":
		for _, id := range s.positional(d) {
			sub := s.sub(t, d, id)
			del, err := h.tryNext(sub)
			switch {
			case err == nil:
				ref := id + "@" + recName(del.Record)
				s.deliveries[ref] = del
				s.deliveries[id] = del
				fmt.Fprintf(&b, "%s: record %s\n", id, recName(del.Record))
			case errors.Is(err, context.DeadlineExceeded):
				fmt.Fprintf(&b, "%s: nothing queued\n", id)
			default:
				same := ""
				if prev := s.lastErr[id]; prev != nil && prev == err {
					same = " (same error value as before)"
				}
				s.lastErr[id] = err
				fmt.Fprintf(&b, "%s: error: %s%s\n", id, s.fmtErr(err), same)
			}
		}

	case "error-contains":
		id := s.one(t, d)
		err := s.lastErr[id]
		if err == nil {
			return "no error"
		}
		if strings.Contains(err.Error(), strings.TrimSpace(d.Input)) {
			return "yes"
		}
		return "no: " + err.Error()

	case "next-cancelled":
		for _, id := range s.positional(d) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := s.sub(t, d, id).Next(ctx)
			fmt.Fprintf(&b, "%s: error: %s\n", id, s.fmtErr(err))
		}

	case "bind":
		args := s.positional(d)
		if len(args) == 0 {
			d.Fatalf(t, "bind needs a delivery")
		}
		del := s.delivery(t, d, args[0])
		if len(args) == 1 {
			if _, ok := del.Bind(); ok {
				return "bound"
			}
			return "not bound"
		}
		for _, name := range args[1:] {
			tok, ok := del.Bind()
			if !ok {
				fmt.Fprintf(&b, "%s: not bound\n", name)
				continue
			}
			s.tokens[name] = tok
		}

	case "confirm":
		for _, name := range s.positional(d) {
			s.token(t, d, name).Confirm()
		}

	case "fail":
		cause := s.optErr(t, d, "cause")
		for _, name := range s.positional(d) {
			s.token(t, d, name).Fail(cause)
		}

	case "reject":
		reason := s.optErr(t, d, "reason")
		for _, ref := range s.positional(d) {
			if s.delivery(t, d, ref).Reject(reason) {
				fmt.Fprintf(&b, "%s: took effect\n", ref)
			} else {
				fmt.Fprintf(&b, "%s: ignored\n", ref)
			}
		}

	case "unsubscribe":
		cause := s.optErr(t, d, "cause")
		for _, id := range s.positional(d) {
			s.sub(t, d, id).Unsubscribe(cause)
		}

	case "advanced":
		got := h.advanced()
		if d.HasArg("items") {
			got = strings.Fields(strings.Join(got, " "))
			if len(got) > 0 {
				got = []string{strings.Join(got, " ")}
			}
		}
		if len(got) == 0 {
			return "none"
		}
		return strings.Join(got, "\n")

	case "items":
		h.mu.Lock()
		items := slices.Clone(h.items)
		h.mu.Unlock()
		for _, it := range items {
			var causes []string
			for _, c := range it.Causes {
				causes = append(causes, s.fmtCause(c))
			}
			fmt.Fprintf(&b, "%s clean=%t causes=[%s] by=[%s]\n", fmtBatch([]AdvanceItem{it}), it.Outcome.Clean(),
				strings.Join(causes, " "), strings.Join(it.CauseIDs, " "))
		}
		if len(items) == 0 {
			return "none"
		}

	case "sleep":
		time.Sleep(s.duration(t, d, s.one(t, d)))

	case "elapsed":
		return time.Since(s.start).String()

	case "emitted":
		return strconv.Itoa(h.emitted.Get())

	case "producers":
		n := h.nProducers()
		fmt.Fprintf(&b, "built %d\n", n)
		for i := range n {
			p := h.producer(i)
			p.mu.Lock()
			fmt.Fprintf(&b, "producer %d: opened %d, closed %d\n", i, p.opened, p.closed)
			p.mu.Unlock()
		}

	case "groups":
		h.m.mu.Lock()
		var keys []string
		for k := range h.m.groups {
			keys = append(keys, k)
		}
		all := len(h.m.all)
		h.m.mu.Unlock()
		slices.Sort(keys)
		fmt.Fprintf(&b, "registered [%s], not torn down %d", strings.Join(keys, " "), all)

	case "stop":
		key := s.one(t, d)
		if d.HasArg("async") {
			done := make(chan struct{})
			s.stops = append(s.stops, done)
			go func() { h.m.Stop(key); close(done) }()
		} else {
			h.m.Stop(key)
		}

	case "stop-all":
		h.m.StopAll()

	case "wait-stopped":
		s.waitStopped()

	case "gate":
		if s.gate != nil {
			d.Fatalf(t, "gate already closed")
		}
		s.gate = make(chan struct{})
		h.mu.Lock()
		h.advanceGate = s.gate
		h.mu.Unlock()

	case "release":
		s.release()

	case "advance-error":
		var fail func([]AdvanceItem) error
		if name := s.one(t, d); name != "none" {
			err := s.namedErr(name)
			fail = func([]AdvanceItem) error { return err }
		}
		h.mu.Lock()
		h.advanceErr = fail
		h.mu.Unlock()

	case "factory-error":
		var err error
		if name := s.one(t, d); name != "none" {
			err = s.namedErr(name)
		}
		h.mu.Lock()
		h.factoryErr = err
		h.mu.Unlock()

	case "lane":
		switch {
		case d.HasArg("not-comparable"):
			h.laneFn = func(*Record) (any, error) { return []int{1}, nil }
		case d.HasArg("error-at"):
			var at int
			var name string
			d.ScanArgs(t, "error-at", &at)
			d.ScanArgs(t, "error", &name)
			err := s.namedErr(name)
			h.laneFn = func(r *Record) (any, error) {
				if r.Offset == int64(at) {
					return nil, err
				}
				return r.Partition, nil
			}
		default:
			d.Fatalf(t, "lane: error-at=OFF error=NAME or not-comparable")
		}

	case "logged":
		want := strings.TrimSpace(d.Input)
		if strings.Contains(h.logs(), want) {
			return "yes"
		}
		return "no"

	default:
		d.Fatalf(t, "unknown directive %s", d.Cmd)
	}
	return b.String()
}

// fastOpen is the fast-path poll loop: it emits what the script emits.
func (s *script) fastOpen(ctx context.Context, emit func(*Record) error) error {
	in := s.h.in
	for {
		select {
		case it := <-in:
			if err := emit(it.rec); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// recName is off for partition 0 and pN@off otherwise, as in batches.
func recName(r *Record) string {
	if r.Partition != 0 {
		return fmt.Sprintf("p%d@%d", r.Partition, r.Offset)
	}
	return strconv.FormatInt(r.Offset, 10)
}

// sentinels are the errors a caller branches on with errors.Is.
var sentinels = []struct {
	name string
	err  error
}{
	{"ErrGroupStopped", ErrGroupStopped},
	{"ErrPollEnded", ErrPollEnded},
	{"ErrUnsubscribed", ErrUnsubscribed},
	{"context.Canceled", context.Canceled},
	{"context.DeadlineExceeded", context.DeadlineExceeded},
}

// fmtErr names what a caller can branch on: the typed errors' fields, the
// sentinels and script-made errors err wraps; the message when none applies.
func (s *script) fmtErr(err error) string {
	var parts []string
	var oe *OverflowError
	var te *AckTimeoutError
	if errors.As(err, &oe) {
		parts = append(parts, fmt.Sprintf("*OverflowError key=%s id=%s queue-size=%d", oe.Key, oe.ID, oe.QueueSize))
	}
	if errors.As(err, &te) {
		parts = append(parts, fmt.Sprintf("*AckTimeoutError key=%s id=%s event=%d offset=%d timeout=%s",
			te.Key, te.ID, te.EventID, te.Offset, te.Timeout))
	}
	for _, sn := range sentinels {
		if errors.Is(err, sn.err) {
			parts = append(parts, "is "+sn.name)
		}
	}
	for _, name := range s.errNames() {
		if errors.Is(err, s.errs[name]) {
			parts = append(parts, "is "+name)
		}
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%q", err.Error())
	}
	return strings.Join(parts, ", ")
}

// fmtCause is the name of the script-made error a cause wraps, the type and
// subscriber of a typed error, or the message quoted.
func (s *script) fmtCause(err error) string {
	for _, name := range s.errNames() {
		if errors.Is(err, s.errs[name]) {
			return name
		}
	}
	var oe *OverflowError
	var te *AckTimeoutError
	switch {
	case errors.As(err, &oe):
		return "*OverflowError(" + oe.ID + ")"
	case errors.As(err, &te):
		return "*AckTimeoutError(" + te.ID + ")"
	}
	return fmt.Sprintf("%q", err.Error())
}

func (s *script) errNames() []string {
	var names []string
	for n := range s.errs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// namedErr returns the script-made error called name, making it on first use.
func (s *script) namedErr(name string) error {
	if err, ok := s.errs[name]; ok {
		return err
	}
	err := errors.New(name)
	s.errs[name] = err
	return err
}

func (s *script) optErr(t *testing.T, d *datadriven.TestData, key string) error {
	var name string
	if !d.MaybeScanArgs(t, key, &name) {
		return nil
	}
	return s.namedErr(name)
}

// positional returns the arguments given without a value.
func (s *script) positional(d *datadriven.TestData) []string {
	var out []string
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 && a.Key != "no-factory" && a.Key != "async" && a.Key != "items" {
			out = append(out, a.Key)
		}
	}
	return out
}

func (s *script) one(t *testing.T, d *datadriven.TestData) string {
	p := s.positional(d)
	if len(p) != 1 {
		d.Fatalf(t, "%s takes one argument", d.Cmd)
	}
	return p[0]
}

func (s *script) sub(t *testing.T, d *datadriven.TestData, id string) *Subscription {
	sub, ok := s.subs[id]
	if !ok {
		d.Fatalf(t, "no subscriber %s", id)
	}
	return sub
}

func (s *script) delivery(t *testing.T, d *datadriven.TestData, ref string) *Delivery {
	switch ref {
	case "zero":
		return &Delivery{}
	case "nil":
		return nil
	}
	del, ok := s.deliveries[ref]
	if !ok {
		d.Fatalf(t, "no delivery %s", ref)
	}
	return del
}

func (s *script) token(t *testing.T, d *datadriven.TestData, name string) Token {
	if name == "zero" {
		return Token{}
	}
	tok, ok := s.tokens[name]
	if !ok {
		d.Fatalf(t, "no token %s", name)
	}
	return tok
}

func (s *script) atoi(t *testing.T, d *datadriven.TestData, v string) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	return n
}

func (s *script) duration(t *testing.T, d *datadriven.TestData, v string) time.Duration {
	dur, err := time.ParseDuration(v)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	return dur
}
