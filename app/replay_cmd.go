package app

import (
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/replay"
	"github.com/runnel-dev/runnel/table"
)

// replayCommand is `replay`: run a time or offset range of an agent's topic
// through the agent in a replay group, with one named effect live
// (docs/replay.md).
func (a *App) replayCommand() *cobra.Command {
	var (
		agentName, effect, group, day, from, to, offsets string
		idle, deadline                                   time.Duration
		dryRun, noProgress, readCommitted                bool
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay a day (or a time or offset range) of an agent's topic into a replay group, with one effect live",
		Long: `Replay a range of an agent's source topic through the agent, in a consumer group
of its own: the live group's offsets are never touched. Only the effect named by
--effect applies; the agent's other effects are skipped, its sends to topics are
dropped and its tables are scratch copies, so history never re-sends
notifications. Per partition the range is [start, stop) from ListOffsets by
timestamp (--day, --from/--to) or explicit (--offsets); end offsets are captured
before reading. The replay commits in its group only after the effect; running
the same command again resumes where it stopped. It fails, saying how far each
partition got, when the idle timeout or the deadline expires.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var target agentrt.Runner
			var names []string
			for _, r := range a.agents {
				names = append(names, r.Name())
				if r.Name() == agentName {
					target = r
				}
			}
			if target == nil {
				return fmt.Errorf("--agent %q: no such agent (agents: %s)", agentName, strings.Join(names, ", "))
			}
			if effect == "" {
				return fmt.Errorf("--effect is required: the one effect of agent %s that the replay applies", agentName)
			}
			if declared := target.Settings().Effects; len(declared) > 0 && !slices.Contains(declared, effect) {
				return fmt.Errorf("--effect %q: agent %s applies no such effect (declared with agent.Applies: %s)", effect, agentName, strings.Join(declared, ", "))
			}
			spec := replay.Spec{Topic: target.Topic(), Group: group, LiveGroup: a.id, ReadCommitted: readCommitted}
			var err error
			switch {
			case offsets != "":
				if day != "" || from != "" || to != "" {
					return fmt.Errorf("--offsets excludes --day, --from and --to")
				}
				if spec.Offsets, err = parseOffsets(offsets); err != nil {
					return err
				}
			case day != "":
				if from != "" || to != "" {
					return fmt.Errorf("--day excludes --from and --to")
				}
				d, err := time.Parse("2006-01-02", day)
				if err != nil {
					return fmt.Errorf("--day %q: want YYYY-MM-DD (UTC): %w", day, err)
				}
				spec.From, spec.To = d, d.AddDate(0, 0, 1)
			default:
				if spec.From, err = time.Parse(time.RFC3339, from); err != nil {
					return fmt.Errorf("--from %q: want RFC 3339: %w", from, err)
				}
				if spec.To, err = time.Parse(time.RFC3339, to); err != nil {
					return fmt.Errorf("--to %q: want RFC 3339: %w", to, err)
				}
			}
			if spec.Group == "" {
				spec.Group = defaultReplayGroup(a.id, agentName, effect, spec)
			}
			brokers, err := resolveBrokers(a.cfg.Brokers)
			if err != nil {
				return err
			}
			client, _, err := a.connect(cmd.Context(), brokers, "runnel-replay", kafka.Timeouts{}, nil)
			if err != nil {
				return err
			}
			defer client.Close()
			plan, err := replay.NewPlan(wrapClient(client), spec)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprint(out, plan)
			if dryRun {
				return nil
			}
			var tables []table.Def
			for _, d := range a.tables {
				if !isGlobal(d) {
					tables = append(tables, d)
				}
			}
			opts := replay.Options{IdleTimeout: idle, Deadline: deadline, Logger: a.cfg.Logger, ReadCommitted: readCommitted}
			if fi, err := os.Stderr.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
				noProgress = true // not a terminal
			}
			var bar *progressbar.ProgressBar
			if !noProgress && plan.Records() > 0 {
				bar = progressbar.NewOptions64(plan.Records(), progressbar.OptionSetDescription("replay "+plan.Topic),
					progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowCount(), progressbar.OptionShowIts(),
					progressbar.OptionSetItsString("offsets"), progressbar.OptionThrottle(100*time.Millisecond))
				opts.OnProgress = func(p replay.Progress) { _ = bar.Set64(p.Offsets) }
			}
			res, err := replay.Run(cmd.Context(), wrapClient(client), plan, replay.Target{Agent: target, Effect: effect, Tables: tables}, opts)
			if bar != nil {
				_ = bar.Finish()
				fmt.Fprintln(os.Stderr)
			}
			if res != nil {
				writeReplayResult(out, res)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&agentName, "agent", "", "agent to replay (required)")
	f.StringVar(&effect, "effect", "", "the agent's effect (agent.Effect name) that applies; every other is skipped (required)")
	f.StringVar(&group, "group", "", "replay consumer group (default <app>-replay-<agent>-<effect>-<range>; never the app's group)")
	f.StringVar(&day, "day", "", "replay one UTC calendar day of record timestamps, YYYY-MM-DD")
	f.StringVar(&from, "from", "", "start of the time range (RFC 3339, inclusive)")
	f.StringVar(&to, "to", "", "end of the time range (RFC 3339, exclusive)")
	f.StringVar(&offsets, "offsets", "", "explicit ranges P:START-STOP[,P:START-STOP...], stop exclusive")
	f.DurationVar(&idle, "idle-timeout", 30*time.Second, "fail when a partition gets no record for this long before its stop offset")
	f.DurationVar(&deadline, "deadline", time.Hour, "fail when the replay is not complete within this wall-clock time")
	f.BoolVar(&readCommitted, "read-committed", false, "read with isolation level read_committed: end at the last stable offset, skip aborted transactions")
	f.BoolVar(&dryRun, "dry-run", false, "print the plan (per partition [start, stop)) and stop")
	f.BoolVar(&noProgress, "no-progress", false, "do not draw the progress bar (it is drawn only on a terminal)")
	return cmd
}

// defaultReplayGroup names the replay group after what is replayed, so that
// running the same command again resumes the same replay.
func defaultReplayGroup(app, agentName, effect string, spec replay.Spec) string {
	rng := "offsets"
	if spec.Offsets == nil {
		rng = spec.From.UTC().Format("20060102T150405") + "-" + spec.To.UTC().Format("20060102T150405")
	}
	return fmt.Sprintf("%s-replay-%s-%s-%s", app, agentName, effect, rng)
}

// parseOffsets parses "0:10-20,3:0-5" into per-partition ranges.
func parseOffsets(s string) (map[int32]replay.Range, error) {
	out := map[int32]replay.Range{}
	for _, part := range strings.Split(s, ",") {
		p, r, ok := strings.Cut(strings.TrimSpace(part), ":")
		lo, hi, ok2 := strings.Cut(r, "-")
		if !ok || !ok2 {
			return nil, fmt.Errorf("--offsets %q: want P:START-STOP", part)
		}
		pn, err1 := strconv.ParseInt(p, 10, 32)
		start, err2 := strconv.ParseInt(lo, 10, 64)
		stop, err3 := strconv.ParseInt(hi, 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("--offsets %q: want P:START-STOP with integers", part)
		}
		if _, dup := out[int32(pn)]; dup {
			return nil, fmt.Errorf("--offsets: partition %d given twice", pn)
		}
		out[int32(pn)] = replay.Range{Start: start, Stop: stop}
	}
	return out, nil
}

// writeReplayResult prints a replay's result: one line per partition, then
// the totals.
func writeReplayResult(w io.Writer, r *replay.Result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "partition\tstart\tstop\tfrom\tcommitted\trecords\tout of range\tgaps\teffects\tduplicates\tskipped effects\tsuppressed sends\tdone\t")
	for _, p := range r.Partitions {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t\n", p.Partition, p.Start, p.Stop, p.From, p.Committed,
			p.Records, p.OutOfRange, p.Gaps, p.Effects, p.Duplicates, p.Skipped, p.Suppressed, p.Done)
	}
	_ = tw.Flush()
	rate := 0.0
	if s := r.Elapsed.Seconds(); s > 0 {
		rate = float64(r.Records) / s
	}
	fmt.Fprintf(w, "replayed %s into group %s with effect %s: %s (%d out of the time range, %d rejected), %s; "+
		"effect applied %d, duplicates %d, errors %d; other effects skipped %d, sends suppressed %d; %s, %.0f records/s\n",
		r.Topic, r.Group, r.Effect, plural(r.Records, "record"), r.OutOfRange, r.Rejected, plural(r.Gaps, "gap"), r.Effects, r.Duplicates, r.EffectErrors,
		r.Skipped, r.Suppressed, r.Elapsed.Round(time.Millisecond), rate)
}
