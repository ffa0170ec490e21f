package agent

import (
	"context"
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/table"
)

// cronParser reads the standard 5-field crontab expressions (minute, hour,
// day of month, month, day of week; names such as MON and JAN allowed) and
// the descriptors @yearly, @monthly, @weekly, @daily, @hourly. A leading
// "CRON_TZ=<IANA zone> " sets the zone, as in robfig/cron and Vixie cron.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// CronOption configures a Cron timer.
type CronOption func(*cronOptions)

type cronOptions struct{ loc *time.Location }

// CronLocation sets the time zone the schedule is read in; default UTC (so a
// schedule means the same on every worker, whatever its TZ). A "CRON_TZ="
// prefix in the expression wins over it. Across a daylight-saving change the
// zone's clock decides: a time that does not exist that day (02:30 when the
// clocks jump from 02:00 to 03:00) is skipped that day, a time that exists
// twice (01:30 when they go back from 02:00 to 01:00) fires at both, an
// hour apart (robfig/cron's reading; UTC has neither).
func CronLocation(loc *time.Location) CronOption { return func(o *cronOptions) { o.loc = loc } }

// Cron declares a wall-clock timer on a crontab schedule (Faust's
// @app.crontab): fn runs, inside the partition's task as an Every timer
// does, on every partition of the agent's topic this worker owns, at each
// time the standard 5-field expression spec names ("0 9 * * MON": Mondays
// at 09:00; "*/15 * * * *": every quarter hour; "@daily"), in UTC unless
// CronLocation or a "CRON_TZ=Europe/Paris " prefix says otherwise. A spec
// that does not parse (and "@every", which is Every's) is reported by the
// App at build.
//
// Which worker runs it: the one that owns the partition (its active task),
// once per partition; a schedule meant to run once for the whole app goes on
// an agent of a one-partition topic.
//
// Missed runs are run once. The time of the partition's last firing is kept
// in the table "<agent>-cron" (declared with the agent, co-partitioned with
// its topic, restored like any table) and written by the firing itself, so
// it is committed in the same cycle as the firing's table writes and after
// its sends were acknowledged. When the partition starts (a restart, a
// crash, a hand-over to another worker) and a scheduled time passed since
// that last firing, the timer fires once at start, for the latest such
// time (Tick.Time), however many were missed: a daily report missed for
// three days runs once. A firing whose effects were not committed (a crash,
// a failed record that restarted the partition) is made again the same way
// (at the partition's next start, or within a minute on a running worker):
// as a record may, a firing may repeat, and is never lost. A schedule never
// seen before on a partition (a new timer, a new app) is armed there: its
// row gets the current time, committed by the next cycle, and nothing before
// counts as missed (should that cycle be lost, the schedule is armed anew at
// the next start, and a time that passed in between is not fired). The table's key
// names the expression and the zone: a changed schedule is a new timer.
func Cron(spec string, fn TimerFunc, opts ...CronOption) Option {
	o := cronOptions{loc: time.UTC}
	for _, f := range opts {
		f(&o)
	}
	tm := timer{clock: WallClock, fn: fn, cron: spec}
	sched, err := parseCron(spec, o.loc)
	if err != nil {
		tm.cronErr = err
	} else {
		tm.sched = sched
		tm.zone = sched.Location.String()
	}
	return func(s *settings) { s.Timers = append(s.Timers, tm) }
}

func parseCron(spec string, loc *time.Location) (*cron.SpecSchedule, error) {
	if strings.Contains(spec, "@every") {
		return nil, fmt.Errorf("cron %q: @every is a fixed interval: use agent.Every", spec)
	}
	s, err := cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("cron %q: %w", spec, err)
	}
	ss, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("cron %q: not a calendar schedule", spec)
	}
	if !strings.HasPrefix(spec, "CRON_TZ=") && !strings.HasPrefix(spec, "TZ=") {
		ss.Location = loc
	}
	return ss, nil
}

// CronTable returns the name of the table that keeps the last firing of an
// agent's Cron timers: "<agent>-cron".
func CronTable(agent string) string { return agent + "-cron" }

// declareCronTable declares the agent's cron table when it has Cron timers
// and hands it to them; the App reports a host that cannot hold tables. It
// returns the table, nil when it declared none.
func declareCronTable(h Host, name string, partitions int32, timers []timer) table.Def {
	var last *table.Table[string, int64]
	for i := range timers {
		if timers[i].cron == "" {
			continue
		}
		if last == nil {
			th, ok := h.(table.Host)
			if !ok {
				timers[i].cronErr = fmt.Errorf("cron %q: the app cannot hold the table %s", timers[i].cron, CronTable(name))
				continue
			}
			var opts []table.Option
			if partitions > 0 {
				opts = append(opts, table.Partitions(partitions))
			}
			last = table.New(th, CronTable(name), codec.String(), codec.DecimalInt64(), opts...)
		}
		timers[i].last = last
	}
	if last == nil {
		return nil
	}
	return last
}

// Next returns the first scheduled time of a Cron timer after t (zero when
// the schedule has none in the next five years, as robfig/cron answers).
func (tm timer) Next(t time.Time) time.Time {
	if tm.sched == nil {
		return time.Time{}
	}
	return tm.sched.Next(t)
}

// Prev returns the latest scheduled time of a Cron timer in (after, now],
// and false when there is none.
func (tm timer) Prev(after, now time.Time) (time.Time, bool) {
	if tm.sched == nil || !now.After(after) {
		return time.Time{}, false
	}
	// Look back over a window that doubles until it holds a scheduled
	// time (or reaches after), then walk forward to the latest one in it:
	// a few Next calls, also for a schedule last run years ago.
	for w := time.Minute; ; w *= 2 {
		from := now.Add(-w)
		if !from.After(after) {
			from = after
		}
		t := tm.sched.Next(from)
		if !t.IsZero() && !t.After(now) {
			for {
				n := tm.sched.Next(t)
				if n.IsZero() || n.After(now) {
					return t, true
				}
				t = n
			}
		}
		if from.Equal(after) {
			return time.Time{}, false
		}
	}
}

// cronKey is the key of the timer's row in the cron table for partition p
// of a table with parts partitions: the expression and the zone, then the
// first suffix that makes the key hash to p (a table key must belong to
// the partition that writes it).
func (tm timer) cronKey(p, parts int32) (string, error) {
	base := tm.cron + " @" + tm.zone + " #"
	for n := 0; n < 1<<20; n++ {
		k := base + strconv.Itoa(n)
		if kafka.PartitionFor([]byte(k), parts) == p {
			return k, nil
		}
	}
	return "", fmt.Errorf("cron %q: no key found for partition %d of %d", tm.cron, p, parts)
}

// LastFiring returns the time a Cron timer last fired on partition p (or
// was armed there, see Arm), as committed or written in the current cycle,
// and false when it never did. parts is the partition count of the agent's
// topic. Errors: the table's (not running, a store error).
func (tm timer) LastFiring(p, parts int32, env *tablestate.Env) (time.Time, bool, error) {
	if tm.last == nil {
		return time.Time{}, false, fmt.Errorf("cron %q: no cron table", tm.cron)
	}
	k, err := tm.cronKey(p, parts)
	if err != nil {
		return time.Time{}, false, err
	}
	ms, ok, err := tm.last.Get(newTick(time.Time{}, p, env, false), k)
	if err != nil || !ok {
		return time.Time{}, false, err
	}
	return time.UnixMilli(ms), true, nil
}

// Arm records at as the timer's last firing on partition p without running
// its function: a schedule first seen on a partition counts its missed runs
// from then. It runs between two commit cycles, as Fire does.
func (tm timer) Arm(ctx context.Context, p, parts int32, env *tablestate.Env, at time.Time) error {
	arm := tm
	arm.fn = func(context.Context, *Tick) error { return nil }
	arm.parts = parts
	return arm.Fire(ctx, p, env, at)
}

// recordFiring writes tk.Time as the last firing of a Cron timer, in the
// firing's window (so in its commit cycle).
func (tm timer) recordFiring(tk *Tick) error {
	if tm.last == nil {
		return nil
	}
	k, err := tm.cronKey(tk.partition, tm.parts)
	if err != nil {
		return err
	}
	if err := tm.last.TryPut(tk, k, tk.Time.UnixMilli()); err != nil {
		return fmt.Errorf("record the firing: %w", err)
	}
	return nil
}

// WithPartitions returns the timer with the partition count of its agent's
// topic, which a Cron timer needs to key its row in the cron table; the
// worker sets it before the first firing.
func (tm timer) WithPartitions(parts int32) agentrt.Timer {
	tm.parts = parts
	return tm
}

// String describes the timer as describe shows it: "every 1h0m0s
// stream-time" or "cron 0 9 * * MON (UTC)".
func (tm timer) String() string {
	if tm.cron != "" {
		return fmt.Sprintf("cron %s (%s)", tm.cron, tm.zone)
	}
	return fmt.Sprintf("every %v %s", tm.interval, tm.clock)
}
