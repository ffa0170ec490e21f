package main

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"syscall"
	"time"
)

// Hand-over trace (Runnel only): where the time from the signal to worker 2's
// first changelog record goes, read from the two workers' logs (Runnel at
// debug level: BENCH_LOG_LEVEL=debug) and the harness's own clock. Each phase
// is the time after the signal, in seconds, of the last such event (the
// hand-over is only as fast as its slowest partition):
//
//	final_cycles  worker 1: its last task closed (drain, final cycle: flush, commit, apply)
//	left          worker 1: LeaveGroup answered ("worker left group")
//	assignment    worker 2: the assignment of the next generation (it noticed the rebalance at a heartbeat, joined, synced)
//	claims        worker 2: Sarama started the last new claim (offset fetch, metadata)
//	restored      worker 2: the last restore of a moved table partition ended (the tail its standby had not applied)
//	running       worker 2: the last moved task runs
//	first_output  harness: the last moved partition's first changelog record by worker 2 (the workload's time)
var tracePhases = []string{"final_cycles", "left", "assignment", "claims", "restored", "running", "first_output"}

// traceEvents are the log lines each phase is read from (worker 1 or 2).
var traceEvents = []struct {
	phase string
	w2    bool
	re    *regexp.Regexp
}{
	{"final_cycles", false, regexp.MustCompile(`msg="task state" .* to=closed`)},
	{"left", false, regexp.MustCompile(`msg="worker left group"`)},
	{"assignment", true, regexp.MustCompile(`msg=assignment `)},
	{"claims", true, regexp.MustCompile(`msg="claim started"`)},
	{"restored", true, regexp.MustCompile(`msg=restored `)},
	{"running", true, regexp.MustCompile(`msg="task state" .* to=running`)},
}

var slogTime = regexp.MustCompile(`^time=(\S+) `)

// traceTakeover reads the phases of one hand-over from the workers' logs:
// events after sigAt and up to end (worker 2's first output on the last
// moved partition). assignment is the first such event, the others the last.
func traceTakeover(w1Log, w2Log string, sigAt, end time.Time) map[string]float64 {
	out := map[string]float64{}
	for _, w2 := range []bool{false, true} {
		path := w1Log
		if w2 {
			path = w2Log
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			m := slogTime.FindStringSubmatch(l)
			if m == nil {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil || at.Before(sigAt.Truncate(time.Millisecond)) || at.After(end) {
				continue
			}
			for _, ev := range traceEvents {
				if ev.w2 != w2 || !ev.re.MatchString(l) {
					continue
				}
				s := at.Sub(sigAt).Seconds()
				if _, seen := out[ev.phase]; ev.phase == "assignment" && seen {
					continue
				}
				out[ev.phase] = math.Max(out[ev.phase], s)
			}
		}
	}
	out["first_output"] = end.Sub(sigAt).Seconds()
	return out
}

// fmtPhases renders phases in the order of tracePhases, in milliseconds.
func fmtPhases(ph map[string]float64) string {
	var parts []string
	for _, p := range tracePhases {
		if v, ok := ph[p]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f", p, v*1000))
		}
	}
	return strings.Join(parts, ", ")
}

// rebalanceSteps is how many rebalances the rebalances workload makes
// (issue #9's target: no surviving member expelled in 20).
const rebalanceSteps = 20

// runRebalances: worker 1 (the survivor) counts the dataset while worker 2
// joins and leaves (SIGTERM) the group rebalanceSteps times in all (10 joins,
// 10 leaves), each step once the group is stable again (two members each
// with active partitions, or worker 1 alone); probes go to every partition
// every 20 ms throughout. Seconds is the median time of one step (from
// worker 2's start or signal to the stable group); Expelled counts the
// times worker 1 lost its membership (a new member ID in its log, or a
// session that ended with UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION: its
// session timed out, or its generation was fenced). Then every key must
// reach its count (fewer: records lost, a failure).
func (h *harness) runRebalances(s *system, round int) result {
	res := result{System: s.name, Workload: "rebalances", Round: round}
	r, err := h.newRun(s, "rebalances", round)
	if err != nil {
		return res.fail(err)
	}
	defer r.close()
	w, err := h.watchChangelog(r, s)
	if err != nil {
		return res.fail(err)
	}
	defer w.Close()
	logLevel := "BENCH_LOG_LEVEL=info"
	c1, err := r.start("stateful", "w1", logLevel)
	if err != nil {
		return res.fail(err)
	}
	var c2 *child
	defer func() {
		for _, c := range []*child{c1, c2} {
			if c == nil {
				continue
			}
			select {
			case <-c.exited:
			default:
				_, _ = c.stop(syscall.SIGTERM, 60*time.Second)
			}
		}
	}()
	// waitGroup waits until the group is stable with n members, each with
	// active partitions.
	waitGroup := func(n int, what string) error {
		deadline := time.Now().Add(h.cfg.timeout)
		for {
			got, stable, allActive, err := r.b.groupMembers(r.id, r.input)
			if err != nil {
				return err
			}
			if got == n && stable && allActive {
				return nil
			}
			select {
			case <-c1.exited:
				return fmt.Errorf("worker 1 exited (log %s)", c1.log.Name())
			default:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s: no stable group of %d members with actives after %s (%d members, stable %v; %s)",
					what, n, h.cfg.timeout, got, stable, r.b.describeAssignment(r.id))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := waitGroup(1, "worker 1 alone"); err != nil {
		return res.fail(err)
	}
	pb, err := newProbes(r.b.addrs, r.input, h.data.probes, w)
	if err != nil {
		return res.fail(err)
	}
	defer pb.stop()
	var steps []float64
	for i := range rebalanceSteps {
		at := time.Now()
		if i%2 == 0 {
			if c2, err = r.start("stateful", "w2", logLevel); err != nil {
				return res.fail(err)
			}
			err = waitGroup(2, fmt.Sprintf("join %d", i/2+1))
		} else {
			if _, err := c2.stop(syscall.SIGTERM, 60*time.Second); err != nil {
				return res.fail(fmt.Errorf("leave %d: %w", i/2+1, err))
			}
			err = waitGroup(1, fmt.Sprintf("leave %d", i/2+1))
		}
		if err != nil {
			return res.fail(err)
		}
		steps = append(steps, time.Since(at).Seconds())
	}
	res.Seconds = median(steps)
	pb.stop()
	if err := pb.err(); err != nil {
		return res.fail(err)
	}
	st, err := w.waitFor(h.cfg.timeout, c1.exited, func(s state) bool { return s.under == 0 })
	if err != nil {
		return res.fail(fmt.Errorf("after %d rebalances, counts lost: %w", rebalanceSteps, err))
	}
	time.Sleep(h.cfg.commit + time.Second) // late duplicates
	if st = w.state(); st.under > 0 {
		return res.fail(fmt.Errorf("after %d rebalances, %d keys fell below their count", rebalanceSteps, st.under))
	}
	res.Doubles = st.excess
	res.Expelled, res.ExpelledWhy = expelled(c1.log.Name())
	return res
}

var (
	sessionStarted = regexp.MustCompile(`msg="session started" .*member=(\S+)`)
	// Errors that say this member is no longer (or no longer in this
	// generation) a member of the group, as Sarama words them.
	lostMembership = regexp.MustCompile(`not known in the current generation|UNKNOWN_MEMBER_ID|generation id is not valid|ILLEGAL_GENERATION|is not the current generation|Rebalance timed out|FENCED_INSTANCE_ID`)
)

// expelled counts, in a Runnel worker's log, the times it lost its
// membership: member IDs after its first one, and error lines naming an
// unknown member or an illegal generation. why is the first such line.
func expelled(path string) (n int, why string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1, err.Error()
	}
	members := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if m := sessionStarted.FindStringSubmatch(l); m != nil && !members[m[1]] {
			members[m[1]] = true
			if len(members) > 1 {
				n++
				if why == "" {
					why = "new member ID " + m[1]
				}
			}
		}
		if lostMembership.MatchString(l) {
			n++
			if why == "" {
				why = l
			}
		}
	}
	return n, why
}

// Redeliver workload settings: the failing record's partition and offset,
// how often it fails, and the redelivery backoff (short, so that every
// redelivery falls within the other partitions' processing of the dataset).
const (
	redeliverPartition = 0
	redeliverTimes     = 10
	redeliverBackoffMS = 20
	redeliverMaxMS     = 100
)

// runRedeliver: one worker counts the dataset twice, in two runs with fresh
// topics: once as in the stateful workload, and once with the record at
// offset 1/8 of partition redeliverPartition's share failing its first
// redeliverTimes deliveries (the agent returns an error; the partition
// redelivers it, redeliverTimes retries, backoff redeliverBackoffMS doubling
// to redeliverMaxMS), in an order that alternates by round. Seconds is the
// failure run's time until every key of the other partitions has its count;
// Ratio is the other partitions' throughput with the failure relative to
// without it (the run without's time ÷ the run with's). Both runs must end
// with every key exact, and the failure run's log must show the
// redeliveries.
func (h *harness) runRedeliver(s *system, round int) result {
	res := result{System: s.name, Workload: "redeliver", Round: round}
	failAt := int64(h.data.partitionCount(redeliverPartition) / 8)
	fail := []string{
		fmt.Sprintf("BENCH_FAIL=%d:%d:%d", redeliverPartition, failAt, redeliverTimes),
		fmt.Sprintf("BENCH_REDELIVERY=%d:%d:%d", redeliverTimes, redeliverBackoffMS, redeliverMaxMS),
		"BENCH_LOG_LEVEL=info",
	}
	var with, without float64
	for i := range 2 {
		failing := (i+round)%2 == 0
		var extra []string
		if failing {
			extra = fail
		}
		secs, log, err := h.redeliverRun(s, round, extra)
		if err != nil {
			return res.fail(fmt.Errorf("run %s the failure: %w", map[bool]string{true: "with", false: "without"}[failing], err))
		}
		if !failing {
			without = secs
			continue
		}
		with = secs
		if n := countLines(log, `msg="partition failed; redelivering`); n != redeliverTimes {
			return res.fail(fmt.Errorf("the failing record was redelivered %d times, want %d (log %s)", n, redeliverTimes, log))
		}
	}
	res.Seconds = with
	res.Ratio = without / with
	return res
}

// redeliverRun runs one worker over a fresh copy of the dataset and returns
// the time from its start until every key outside redeliverPartition has its
// count; it then waits until every key has it.
func (h *harness) redeliverRun(s *system, round int, extra []string) (float64, string, error) {
	r, err := h.newRun(s, "redeliver", round)
	if err != nil {
		return 0, "", err
	}
	defer r.close()
	others := map[string]int64{}
	for i, k := range h.data.keys {
		if h.data.keyPart[i] != redeliverPartition {
			others[k] = h.data.counts[k]
		}
	}
	wo, err := watchOnly(r.b.addrs, s.changelog(r.id), s.decode, s.key, others)
	if err != nil {
		return 0, "", err
	}
	defer wo.Close()
	w, err := h.watchChangelog(r, s)
	if err != nil {
		return 0, "", err
	}
	defer w.Close()
	c, err := r.start("stateful", "w1", extra...)
	if err != nil {
		return 0, "", err
	}
	st, err := wo.waitFor(h.cfg.timeout, c.exited, complete)
	if err != nil {
		_, _ = c.stop(syscall.SIGTERM, 60*time.Second)
		return 0, c.log.Name(), fmt.Errorf("other partitions: %w (log %s)", err, c.log.Name())
	}
	_, err = w.waitFor(h.cfg.timeout, c.exited, complete)
	_, stopErr := c.stop(syscall.SIGTERM, 60*time.Second)
	if err != nil {
		return 0, c.log.Name(), fmt.Errorf("all partitions: %w (log %s)", err, c.log.Name())
	}
	if stopErr != nil {
		return 0, c.log.Name(), stopErr
	}
	time.Sleep(settle)
	if after := w.state(); !complete(after) {
		return 0, c.log.Name(), fmt.Errorf("after the stop: %d keys below and %d above their expected value", after.under, after.over)
	}
	return st.complete.Sub(c.start).Seconds(), c.log.Name(), nil
}

// countLines counts the lines of the file at path that contain s.
func countLines(path, s string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return -1
	}
	return strings.Count(string(b), s)
}
