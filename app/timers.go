package app

import (
	"context"
	"errors"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"github.com/runnel-dev/runnel/table"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/topology"
)

// hasTimers reports whether any of runners declared a timer: its partitions
// then run a task (commit cycles) even when they write no table, so that the
// timers' sends are ordered with the commits.
func hasTimers(runners []agentrt.Runner) bool {
	for _, r := range runners {
		if len(r.Settings().Timers) > 0 {
			return true
		}
	}
	return false
}

// startTimers starts the timers of the partition's agents (agent.Every) and
// returns the function that stops them and waits for a firing in progress.
// The timers run until ctx ends (the claim is revoked or the session ends).
// Each firing runs inside the partition's task (task.Task.Punctuate), so it
// never straddles a commit cycle; a firing that fails abandons the task (its
// caches may hold part of the firing's writes) and the partition restarts
// from its committed offsets, as after a failed record.
func (pt *partition) startTimers(ctx context.Context) (stop func()) {
	if pt.task == nil || !hasTimers(pt.runners) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	for _, r := range pt.runners {
		for _, tm := range r.Settings().Timers {
			if tm.Clock() == agentrt.StreamTime && pt.env.StreamTime == nil {
				pt.env.StreamTime = tablestate.NewStreamTime()
			}
		}
	}
	var wg sync.WaitGroup
	for _, r := range pt.runners {
		if len(r.Settings().Timers) == 0 {
			continue
		}
		// A firing writes and sends as its agent: what the agent declared
		// (agent.WritesTo, agent.SendsTo), counted as its sink records.
		env := pt.w.agentEnv(pt.env, r)
		for _, tm := range r.Settings().Timers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pt.runTimer(ctx, r.Name(), env, tm)
			}()
		}
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// runTimer fires tm, a timer of agent name, on the partition until ctx
// ends, with env, the agent's.
func (pt *partition) runTimer(ctx context.Context, name string, env *tablestate.Env, tm agentrt.Timer) {
	if tm.Cron() != "" {
		pt.runCron(ctx, name, env, tm)
		return
	}
	switch tm.Clock() {
	case agentrt.WallClock:
		last := tm.Boundary(time.Now())
		for {
			t := time.NewTimer(time.Until(last.Add(tm.Interval())))
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			// Late by more than one interval: fire once, for the latest.
			at := tm.Boundary(time.Now())
			if !at.After(last) {
				at = last.Add(tm.Interval()) // the timer woke a hair early
			}
			last = at
			pt.fire(ctx, name, env, tm, at)
		}
	case agentrt.StreamTime:
		st := pt.env.StreamTime
		var last time.Time
		first := true
		resets := st.Resets()
		for {
			select {
			case <-ctx.Done():
				return
			case <-st.Advanced():
			}
			if n := st.Resets(); n != resets {
				// The partition restarted from its committed offsets: the
				// firings since then were dropped with the caches, and its
				// records come again; start over as at the first record.
				resets, first = n, true
			}
			now, ok := st.Now()
			if !ok {
				continue
			}
			// The first record fires for the interval it falls in (Kafka
			// Streams fires at the first record): after a restart, a
			// firing whose effects were not committed is made again. Then
			// every multiple the stream time passed fires, in order: a
			// stream-time timer that emits the window which just closed
			// must not skip one because records came fast.
			to := tm.Boundary(now)
			at := to
			if first {
				if f, ok := st.First(); ok && f.Before(now) {
					at = tm.Boundary(f)
				}
				if to.Sub(at) >= maxCatchUp*tm.Interval() {
					at = to
				}
			} else {
				if !to.After(last) {
					continue
				}
				at = last.Add(tm.Interval())
				if to.Sub(at) >= maxCatchUp*tm.Interval() {
					at = to // a jump (a bad timestamp?): fire once, for the latest
				}
			}
			first = false
			for ; !at.After(to); at = at.Add(tm.Interval()) {
				if !pt.fire(ctx, name, env, tm, at) {
					break
				}
				last = at
			}
		}
	}
}

// cronRecheck is how often a running Cron timer reads its last firing back
// from its table between two scheduled times: a firing whose writes a
// failed record's restart dropped (the caches go back to the last commit)
// is then made again within this delay, not at the next scheduled time.
const cronRecheck = time.Minute

// cronNow reads the Cron timers' clock.
func (w *Worker) cronNow() time.Time {
	if w.cfg.cronClock != nil {
		return w.cfg.cronClock()
	}
	return time.Now()
}

// runCron fires a Cron timer on the partition until ctx ends. Its last
// firing, kept in the agent's cron table and committed with the firing's
// effects, says what was missed: at start, and every cronRecheck, a
// scheduled time passed since the last firing fires once, for the latest
// such time (missed runs are run once, not skipped). A schedule the
// partition never saw is armed at the current time: nothing before counts
// as missed.
func (pt *partition) runCron(ctx context.Context, name string, env *tablestate.Env, tm agentrt.Timer) {
	src, _ := pt.w.graph.Topic(pt.topic)
	tm = tm.WithPartitions(src.Partitions)
	armed := false
	for {
		now := pt.w.cronNow()
		last, ok, err := tm.LastFiring(pt.p, src.Partitions, env)
		switch {
		case err != nil && ctx.Err() != nil:
			return // the claim ended (its store may be closing)
		case err != nil:
			pt.timerFailed(name, tm, now, err)
			return
		case !ok && !armed:
			// First sight of the schedule on this partition.
			if !pt.arm(ctx, name, env, tm, src.Partitions, now) {
				return
			}
			armed, last = true, now
		case !ok:
			// Armed, and the arming dropped with the caches since: the
			// partition restarted; arm again from its last commit.
			armed = false
			continue
		default:
			armed = true
			if at, missed := tm.Prev(last, now); missed {
				if !pt.fire(ctx, name, env, tm, at) {
					return
				}
				last = at
			}
		}
		next := tm.Next(maxTime(now, last))
		if next.IsZero() {
			return // no scheduled time in the next five years
		}
		wait := next.Sub(pt.w.cronNow())
		recheck := wait > cronRecheck
		if recheck {
			wait = cronRecheck
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if recheck {
			continue
		}
		// Late by more than one scheduled time (a cycle or an earlier
		// firing took long): fire once, for the latest.
		at := next
		if p, ok := tm.Prev(next, pt.w.cronNow()); ok {
			at = p
		}
		if !pt.fire(ctx, name, env, tm, at) {
			return
		}
	}
}

// timerClock is the clock label of runnel_timer_firings_total: wall-clock,
// stream-time or cron.
func timerClock(tm agentrt.Timer) string {
	if tm.Cron() != "" {
		return "cron"
	}
	return tm.Clock().String()
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// arm records now as the Cron timer's last firing on the partition (its
// first sight there) inside the task, as a firing; false when it did not
// run (the claim ends, the task was abandoned, or it failed).
func (pt *partition) arm(ctx context.Context, name string, env *tablestate.Env, tm agentrt.Timer, parts int32, now time.Time) bool {
	fctx, cancel := context.WithTimeout(context.Background(), pt.w.flushBudget())
	defer cancel()
	ran := false
	err := pt.punctuate(ctx, &ran, func() error { return tm.Arm(fctx, pt.p, parts, env, now) })
	if ran && err != nil {
		pt.timerFailed(name, tm, now, err)
		return false
	}
	if ran {
		pt.w.log.Debug("cron timer armed", "agent", name, "topic", pt.topic, "partition", pt.p, "cron", tm.Cron(), "at", now)
	}
	return ran
}

// timerFailed abandons the partition's task after a timer's failure: the
// partition restarts from its committed offsets.
func (pt *partition) timerFailed(name string, tm agentrt.Timer, at time.Time, err error) {
	var undeclared *table.UndeclaredError
	if errors.As(err, &undeclared) {
		// A write or send the agent did not declare: every firing would
		// fail the same way until the code declares it (supervise stops
		// the worker on the agent's own for the same reason).
		pt.w.log.Error("timer writes or sends where its agent did not declare; stopping the worker",
			"agent", name, "topic", pt.topic, "partition", pt.p, "timer", tm.String(), "at", at, "err", err)
		pt.task.abandon(&pt.w.tasks, err)
		pt.w.fatal.stop(err)
		return
	}
	pt.w.log.Warn("timer failed; the partition restarts from its committed offsets",
		"agent", name, "topic", pt.topic, "partition", pt.p, "timer", tm.String(), "at", at, "err", err)
	pt.task.abandon(&pt.w.tasks, err)
}

// maxCatchUp bounds how many multiples of its interval a stream-time timer
// fires for in one step when the stream time jumped: beyond it, it fires once,
// for the latest (a record stamped a year ahead must not fire an hourly
// timer 8 760 times).
const maxCatchUp = 1024

// fire runs one firing of tm inside the partition's task and reports whether
// it ran. A failure (the function's error or panic, a send the broker
// refused) abandons the task: the partition restarts from its committed
// offsets. No firing starts once the claim ends: its final cycle may already
// have run, and writes after it would be dropped while its sends stay.
func (pt *partition) fire(ctx context.Context, name string, env *tablestate.Env, tm agentrt.Timer, at time.Time) bool {
	w := pt.w
	// The firing's sends are waited for with a budget of their own, not the
	// claim's context: the next cycle must not commit while they are in flight.
	fctx, cancel := context.WithTimeout(context.Background(), w.flushBudget())
	defer cancel()
	began := time.Now()
	ran := false
	err := pt.punctuate(ctx, &ran, func() error { return tm.Fire(fctx, pt.p, env, at) })
	switch {
	case !ran:
		// The task was abandoned (the partition restarts) or the claim
		// ends: no firing now.
		return false
	case err == nil:
		w.metrics.timerFirings.WithLabelValues(name, timerClock(tm)).Inc()
		w.log.Debug("timer fired", "agent", name, "topic", pt.topic, "partition", pt.p, "timer", tm.String(),
			"at", at, "elapsed", time.Since(began))
	default:
		pt.timerFailed(name, tm, at, err)
		return false
	}
	return true
}

// punctuate runs fn inside the partition's task between two cycles
// (task.Task.Punctuate), unless the claim ended, and sets *ran when it did.
// When fn fails, the task is abandoned before the cycle token is given back:
// fn may have written the caches, and a cycle that took the token between
// the failure and the abandonment would commit those writes (a failing
// timer's table write was committed that way under CPU load:
// TestFailingTimerRestartsPartition). The caller still reports the failure
// (timerFailed), which marks the task abandoned for its claims.
func (pt *partition) punctuate(ctx context.Context, ran *bool, fn func() error) error {
	return pt.task.t.Punctuate(ctx, func() error {
		if ctx.Err() != nil || pt.feed.IsRevoked() {
			return nil
		}
		*ran = true
		err := fn()
		if err != nil {
			pt.task.t.Abandon(err)
		}
		return err
	})
}

// describeAgent is r as the topology shows it: its source, the partitioned
// tables it looks up (checked for co-partitioning; global tables need no
// check) and its timers.
func describeAgent(r agentrt.Runner) topology.Agent {
	ta := topology.Agent{Name: r.Name(), Source: r.Topic()}
	for _, d := range r.Settings().Lookups {
		if !isGlobal(d) {
			ta.Lookups = append(ta.Lookups, d.Name())
		}
	}
	for _, tm := range r.Settings().Timers {
		ta.Timers = append(ta.Timers, tm.String())
	}
	return ta
}
