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

// runScaleOut: worker 1 counts the dataset alone; once a quarter of the
// counts is in the changelog (so its changelog partitions are far past a
// newcomer's acceptable recovery lag: Kafka Streams' and Runnel's default
// is 10 000 offsets), probes go to every partition every 20 ms (every
// partition keeps changing) and worker 2 starts with an empty data dir. The
// time is from worker 2's start until the group is stable with worker 2
// holding its fair share of the input partitions (floor(P/2)) and worker 1
// the rest; Span is the changelog's size (offsets) at worker 2's start, the
// state worker 2 has to restore part of. Issue #13's target: within worker
// 2's restore time + 5 s (compare the restore workload, a fresh worker
// restoring the whole table). Then the probes stop, every key must reach
// its expected count (fewer: records lost, a failure), and what is above it
// was counted twice.
func (h *harness) runScaleOut(s *system, round int) result {
	res := result{System: s.name, Workload: "scaleout", Round: round}
	r, err := h.newRun(s, "scaleout", round)
	if err != nil {
		return res.fail(err)
	}
	defer r.close()
	w, err := h.watchChangelog(r, s)
	if err != nil {
		return res.fail(err)
	}
	defer w.Close()
	c1, err := r.start("stateful", "w1")
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
				u, _ := c.stop(syscall.SIGTERM, 60*time.Second)
				res.CPU += u.cpu
				res.RSSMB = math.Max(res.RSSMB, u.rssMB)
			}
		}
	}()
	// Worker 1 alone in a stable group, a quarter of the counts done.
	deadline := time.Now().Add(h.cfg.timeout)
	for {
		n, stable, allActive, err := r.b.groupMembers(r.id, r.input)
		if err != nil {
			return res.fail(err)
		}
		if n == 1 && stable && allActive && w.state().sum >= int64(h.data.n/4) {
			break
		}
		select {
		case <-c1.exited:
			return res.fail(fmt.Errorf("worker 1 exited (log %s)", c1.log.Name()))
		default:
		}
		if time.Now().After(deadline) {
			return res.fail(fmt.Errorf("timeout waiting for worker 1 to be busy (%d members, stable %v; %s)", n, stable, r.b.describeAssignment(r.id)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	pb, err := newProbes(r.b.addrs, r.input, h.data.probes, w)
	if err != nil {
		return res.fail(err)
	}
	defer pb.stop()
	if res.Span, err = r.b.topicSize(s.changelog(r.id)); err != nil {
		return res.fail(err)
	}
	// Runnel's worker logs each warm-up that caught up (info level).
	if c2, err = r.start("stateful", "w2", "BENCH_LOG_LEVEL=info"); err != nil {
		return res.fail(err)
	}
	fair := h.cfg.partitions / 2
	for {
		parts, err := r.b.memberPartitions(r.id, r.input)
		if err != nil {
			return res.fail(err)
		}
		_, stable, _, err := r.b.groupMembers(r.id, r.input)
		if err != nil {
			return res.fail(err)
		}
		if stable && len(parts) == 2 {
			lo := h.cfg.partitions
			for _, ps := range parts {
				lo = min(lo, len(ps))
			}
			if lo >= fair {
				break
			}
		}
		select {
		case <-anyExited(c1, c2):
			return res.fail(fmt.Errorf("a worker exited during the scale-out (logs in %s)", r.dir))
		default:
		}
		if time.Since(c2.start) > h.cfg.timeout {
			return res.fail(fmt.Errorf("worker 2 has no fair share of %d partitions %s after its start (%s)", fair, h.cfg.timeout, r.b.describeAssignment(r.id)))
		}
		time.Sleep(20 * time.Millisecond)
	}
	fairAt := time.Now()
	res.Seconds = fairAt.Sub(c2.start).Seconds()
	if at, n := warmupsCaughtUp(c2.log.Name(), fairAt); n > 0 {
		res.WarmupS = at.Sub(c2.start).Seconds()
		r.h.logf("scaleout: %d warm-up follow-ups; the last warm-up caught up %.2f s after the newcomer's start, fair share %.2f s after it",
			n, res.WarmupS, res.Seconds)
	}
	pb.stop()
	if err := pb.err(); err != nil {
		return res.fail(err)
	}
	st, err := w.waitFor(h.cfg.timeout, anyExited(c1, c2), func(s state) bool { return s.under == 0 })
	if err != nil {
		return res.fail(fmt.Errorf("after the scale-out, counts lost: %w", err))
	}
	time.Sleep(h.cfg.commit + time.Second) // late duplicates
	st = w.state()
	if st.under > 0 {
		return res.fail(fmt.Errorf("after the scale-out, %d keys fell below their count", st.under))
	}
	res.Doubles = st.excess
	return res
}

// warmUpLine is what Runnel's assignor logs when a warm-up caught up and
// the member asks for the follow-up rebalance (assignor.CheckWarmups).
var warmUpLine = regexp.MustCompile(`^time=(\S+) .*warm-up caught up`)

// warmupsCaughtUp returns the time of the last "warm-up caught up" line of
// a worker log before limit, and how many there were (0: none, or not
// Runnel).
func warmupsCaughtUp(path string, limit time.Time) (time.Time, int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, 0
	}
	var last time.Time
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		m := warmUpLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || at.After(limit) {
			continue
		}
		last, n = at, n+1
	}
	return last, n
}
