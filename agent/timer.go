package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/runnel-dev/runnel/internal/evbind"
	"github.com/runnel-dev/runnel/table"
)

// Clock is the time a timer follows.
type Clock int

const (
	// WallClock timers fire when the worker's clock passes a multiple of
	// the interval (Kafka Streams' PunctuationType.WALL_CLOCK_TIME, Faust's
	// @app.timer), whether records arrive or not.
	WallClock Clock = iota
	// StreamTime timers fire when the partition's stream time (the highest
	// record timestamp its agents received) passes a multiple of the
	// interval (Kafka Streams' PunctuationType.STREAM_TIME): they follow the
	// data, so a replay of last week fires the same timers as the live run
	// did, and an idle partition fires none.
	StreamTime
)

func (c Clock) String() string {
	switch c {
	case WallClock:
		return "wall-clock"
	case StreamTime:
		return "stream-time"
	}
	return fmt.Sprintf("Clock(%d)", int(c))
}

// LogValue makes slog print the name in JSON logs too (the JSON handler
// would print the number: it does not call String).
func (c Clock) LogValue() slog.Value { return slog.StringValue(c.String()) }

// TimerFunc is a timer's body: it runs on one partition of the agent's topic
// with tick as its event. Table writes made with tick go to the partition's
// current commit cycle and sends with tick are waited for before the next
// cycle commits, exactly as a record's. A returned error (or a panic, or a
// failed write or send: Table.Put, Topic.Send and the other write methods
// that return no error fail the firing) restarts the partition from its
// committed offsets, like a failed record: the effects since the last cycle,
// the timer's included, are dropped and made again.
type TimerFunc func(ctx context.Context, tick *Tick) error

// Timer is a timer declared with Every (fn runs on every partition of the
// agent's topic each time the clock passes a multiple of Interval since the
// Unix epoch) or with Cron (at each time of a crontab schedule; Interval is
// then 0 and Clock WallClock).
type Timer struct {
	Interval time.Duration
	Clock    Clock
	Fn       TimerFunc
	// Cron is the crontab expression of a Cron timer; "" for Every.
	Cron string

	sched   *cron.SpecSchedule          // Cron's parsed schedule
	zone    string                      // Cron's time zone (its name)
	cronErr error                       // Cron's parse error, reported by Validate
	last    *table.Table[string, int64] // Cron's last firings (CronTable), in Unix ms
	parts   int32                       // partitions of the agent's topic (WithPartitions)
}

// Every declares a timer on the agent: fn runs, inside the partition's task,
// on every partition of the agent's topic that this worker owns, each time
// clock passes a multiple of d since the Unix epoch (an hourly timer fires on
// the hour, in UTC). d must be positive (the App reports it otherwise).
//
// Why per partition, inside the task (Kafka Streams' punctuate) rather than
// per worker (Faust's @app.timer): tables are partitioned, so only a timer
// that runs where partition p's task runs can read and write partition p's
// state, and only one that runs between two commit cycles of that task has
// its writes and sends committed all-or-nothing with the records' (a firing
// never straddles a cycle). A timer is declared on an agent, as Kafka
// Streams schedules a punctuator from a processor, because the agent's topic
// says which partitions it runs on.
//
// A StreamTime timer fires for every multiple the stream time passes, in
// order, even when several pass between two looks (records came fast): a
// timer that emits the window which just closed never skips one. (Kafka
// Streams fires once for the latest instead; a jump of more than 1024
// intervals, a record stamped far ahead, fires once here too.) A WallClock
// timer that is late (a cycle or an earlier firing took long) fires once,
// for the latest multiple.
//
// Timers fire asynchronously to the records: the agents go on processing
// while a timer runs, so a firing sees the effects of the records processed
// so far, possibly some stamped after Tick.Time. Keep timer functions short:
// the partition's next commit cycle waits for a firing in progress.
//
// Across restarts and hand-overs nothing is persisted: a StreamTime timer
// fires when its partition's first record arrives (for the interval that
// record falls in, as Kafka Streams fires at the first record) and then at
// every multiple, also after the partition restarted from its committed
// offsets, so a firing whose effects a crash or a failure dropped is made
// again (a firing may repeat, as a record may); a WallClock timer fires at
// the first multiple after the partition started.
func Every(d time.Duration, clock Clock, fn TimerFunc) Option {
	return func(s *Settings) { s.Timers = append(s.Timers, Timer{Interval: d, Clock: clock, Fn: fn}) }
}

// Validate reports a timer that cannot run (interval not positive, no function).
func (tm Timer) Validate() error {
	if tm.Cron != "" || tm.cronErr != nil {
		if tm.cronErr != nil {
			return fmt.Errorf("timer: %w", tm.cronErr)
		}
		if tm.Fn == nil {
			return fmt.Errorf("cron timer %q: no function", tm.Cron)
		}
		return nil
	}
	if tm.Interval <= 0 {
		return fmt.Errorf("%s timer: interval must be positive, got %v", tm.Clock, tm.Interval)
	}
	if tm.Fn == nil {
		return fmt.Errorf("%s timer every %v: no function", tm.Clock, tm.Interval)
	}
	if tm.Clock != WallClock && tm.Clock != StreamTime {
		return fmt.Errorf("timer every %v: unknown clock %v", tm.Interval, tm.Clock)
	}
	return nil
}

// Boundary returns the latest multiple of the timer's interval (since the
// Unix epoch) at or before t: the time a firing at t is for.
func (tm Timer) Boundary(t time.Time) time.Time {
	return t.Truncate(tm.Interval)
}

// Fire runs the timer's function once for partition p with Tick.Time at, and
// waits for the broker's answer to every record it sent (ctx bounds that
// wait). The worker calls it between two commit cycles of the partition's
// task. Errors: fn's (a panic is recovered into one), the first delivery
// error, ctx's.
func (tm Timer) Fire(ctx context.Context, p int32, env *table.Env, at time.Time) error {
	tk := newTick(at, p, env, true)
	err := tk.call(ctx, tm.Fn)
	if ferr := tk.failed.get(); ferr != nil && !errors.Is(err, ferr) {
		// A write or send failed the firing (Table.Put, Topic.Send, …): it
		// fails with that error whatever the function returned, as an
		// agent's run does (Agent.Run).
		if err == nil {
			err = ferr
		} else {
			err = errors.Join(ferr, err)
		}
	}
	if err == nil {
		// A Cron timer's last firing is written by the firing itself: it
		// is committed exactly when the firing's effects are.
		err = tm.recordFiring(tk)
	}
	tk.close()
	if werr := tk.wait(ctx); werr != nil {
		err = errors.Join(err, werr)
	}
	if err != nil {
		if tm.Cron != "" {
			return fmt.Errorf("cron timer %q at %s on partition %d: %w", tm.Cron, at.UTC().Format(time.RFC3339Nano), p, err)
		}
		return fmt.Errorf("%s timer at %s on partition %d: %w", tm.Clock, at.UTC().Format(time.RFC3339Nano), p, err)
	}
	return nil
}

// Tick is one firing of a timer on one partition: the event its table writes
// and sends are made with (it implements table.Event). It is valid until the
// timer function returns; writes and sends made later are refused with
// table.ErrOutsideWindow.
type Tick struct {
	// Time is the multiple of the interval the clock passed: the wall-clock
	// time or the stream time the firing is for.
	Time time.Time

	handle    // links table writes and sends to the worker (evbind)
	partition int32
	env       *table.Env
	failed    failure // the first failed write or send (evbind.Binder.Fail)

	mu      sync.Mutex
	open    bool          // the function is running; guarded by mu
	pending int           // records sent and not answered; guarded by mu
	err     error         // first delivery error; guarded by mu
	idle    chan struct{} // closed when closed and pending is 0
}

// Partition implements table.Event: the partition the timer runs on.
func (t *Tick) Partition() int32 { return t.partition }

// newTick returns the firing of a timer at on partition p; open says whether
// it takes writes (the timer function runs).
func newTick(at time.Time, p int32, env *table.Env, open bool) *Tick {
	t := &Tick{Time: at, partition: p, env: env, open: open, idle: make(chan struct{})}
	t.handle = evbind.New[*table.Env]((*tickBinder)(t))
	return t
}

// tickBinder gives a Tick the methods evbind.Binder asks for without making
// them methods of Tick.
type tickBinder Tick

// Env implements evbind.Binder.
func (b *tickBinder) Env() *table.Env { return b.env }

// BindPersist implements evbind.Binder.
func (b *tickBinder) BindPersist() (func(error), bool) { return (*Tick)(b).bindPersist() }

// Fail implements evbind.Binder: it records err as the firing's failure.
func (b *tickBinder) Fail(err error) { b.failed.set(err) }

// Failed implements evbind.Binder.
func (b *tickBinder) Failed() error { return b.failed.get() }

// InWindow reports whether the timer function is still running (table
// writes check it).
func (t *Tick) InWindow() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.open
}

// Origin implements table.Originator: a tick has no source record; its
// timestamp is Time, so windowed tables put its writes in Time's window.
func (t *Tick) Origin() table.Origin {
	return table.Origin{Partition: t.partition, Offset: -1, Timestamp: t.Time}
}

// bindPersist binds one derived record to the firing: the firing waits for
// the broker's answer to every record bound to it before the next commit
// cycle.
func (t *Tick) bindPersist() (func(error), bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.open {
		return nil, false
	}
	t.pending++
	var inflight *table.InFlight
	if t.env != nil {
		inflight = t.env.InFlight
	}
	if inflight != nil {
		inflight.Add()
	}
	var once sync.Once
	return func(err error) {
		once.Do(func() {
			t.mu.Lock()
			if err != nil && t.err == nil {
				t.err = err
			}
			t.pending--
			if !t.open && t.pending == 0 {
				close(t.idle)
			}
			t.mu.Unlock()
			if inflight != nil {
				inflight.Done()
			}
		})
	}, true
}

func (t *Tick) call(ctx context.Context, fn TimerFunc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return fn(ctx, t)
}

func (t *Tick) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.open = false
	if t.pending == 0 {
		close(t.idle)
	}
}

func (t *Tick) wait(ctx context.Context) error {
	select {
	case <-t.idle:
	case <-ctx.Done():
		t.mu.Lock()
		n := t.pending
		t.mu.Unlock()
		return fmt.Errorf("%d records sent by the timer unanswered: %w", n, ctx.Err())
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil {
		return fmt.Errorf("delivery: %w", t.err)
	}
	return nil
}
