package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The latency workloads (issue #28 item 2) run the stateless app (consume →
// upper-case → produce) on input the harness produces at fixed rates while
// the worker runs, each record's value stamped with the time the harness
// handed it to its producer ("lat-<level>-<unix ns>-<seq>"; upper-casing
// leaves the digits). A read_committed reader of the output topic, in the
// harness process and so on the same clock, takes the latency of each
// derived record: from that stamp to the poll that returned it. Only the
// first copy of a record counts; every record must arrive (a missing one
// fails the run, as a record counted twice does under exactly-once).
//
//   - latency: one worker; a warm-up, then each level of -latency-rates or
//     -latency-load for -latency-duration, one result per level.
//   - latency-handover, latency-kill: two workers at the middle level; in
//     the middle of the window worker 1 gets SIGTERM (a clean hand-over) or
//     SIGKILL; one result over the whole window (records produced from
//     half a window before the signal to half a window after it).
const (
	latencyWorkload  = "latency"
	latencyHandover  = "latency-handover"
	latencyKill      = "latency-kill"
	latencyKeys      = 10_000 // keys the latency records cycle through
	latencyValuePref = "lat-"
)

// isLatency reports whether wl is one of the latency workloads.
func isLatency(wl string) bool { return strings.HasPrefix(wl, latencyWorkload) }

// latencyLevel is one fixed input rate of the latency workloads.
type latencyLevel struct {
	name string  // "25%" (of the system's capacity) or "5000/s" (given)
	rate float64 // records/s
}

// latencyLevels are s's input rates: -latency-rates as given, or the
// fractions of -latency-load of s's capacity measured in this run (its
// stateless steady rate, median of its rounds so far; a system whose output
// is visible at commits only has no steady rate, and its capacity is its
// records over its whole stateless time, a lower bound).
func (h *harness) latencyLevels(s *system) ([]latencyLevel, error) {
	var out []latencyLevel
	if len(h.cfg.latencyRates) > 0 {
		for _, r := range h.cfg.latencyRates {
			out = append(out, latencyLevel{name: fmt.Sprintf("%.0f/s", r), rate: r})
		}
		return out, nil
	}
	caps := h.capacity[s.name]
	if len(caps) == 0 {
		return nil, fmt.Errorf("no capacity of %s measured: run the stateless workload before (-workloads stateless,latency) or give -latency-rates", s.name)
	}
	c := median(caps)
	for _, f := range h.cfg.latencyLoad {
		out = append(out, latencyLevel{name: fmt.Sprintf("%.0f%%", f*100), rate: f * c})
	}
	return out, nil
}

// noteCapacity records a stateless result's rate as its system's capacity.
func (h *harness) noteCapacity(s *system, r result) {
	if r.Workload != "stateless" || r.Failure != "" || r.Seconds <= 0 {
		return
	}
	rate := r.Rate
	if s.eos || rate == 0 {
		rate = float64(h.data.n) / r.Seconds
	}
	if h.capacity == nil {
		h.capacity = map[string][]float64{}
	}
	h.capacity[s.name] = append(h.capacity[s.name], rate)
}

// latReader reads the output topic read_committed and keeps the latency of
// the first copy of every stamped record, per level.
type latReader struct {
	cl      *kgo.Client
	cancel  context.CancelFunc
	stopped chan struct{}

	mu      sync.Mutex
	seen    []bool      // per seq
	lat     [][]float64 // per level: ms from the stamp to the poll (index len(levels): warm-up)
	recvAt  [][]int64   // per level, beside lat: the stamp (unix ns), for windows
	dups    int64
	bad     int64
	badMsg  string
	n       int // distinct records seen
	first   time.Time
	arrived chan struct{} // closed at the first record
}

func newLatReader(addrs []string, topic string, levels int) (*latReader, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.MetadataMinAge(100*time.Millisecond), kgo.MetadataMaxAge(time.Second))
	if err != nil {
		return nil, fmt.Errorf("latency reader of %s: %w", topic, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	lr := &latReader{cl: cl, cancel: cancel, stopped: make(chan struct{}), arrived: make(chan struct{}),
		lat: make([][]float64, levels+1), recvAt: make([][]int64, levels+1)}
	go lr.loop(ctx)
	return lr, nil
}

func (lr *latReader) loop(ctx context.Context) {
	defer close(lr.stopped)
	for {
		fs := lr.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		lr.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			level, stamp, seq, err := parseStamp(r.Value, len(lr.lat)-1)
			if err != nil {
				lr.bad++
				if lr.badMsg == "" {
					lr.badMsg = err.Error()
				}
				return
			}
			for seq >= len(lr.seen) {
				lr.seen = append(lr.seen, make([]bool, max(len(lr.seen), 1024))...)
			}
			if lr.seen[seq] {
				lr.dups++
				return
			}
			lr.seen[seq] = true
			lr.n++
			if lr.first.IsZero() {
				lr.first = now
				close(lr.arrived)
			}
			lr.lat[level] = append(lr.lat[level], float64(now.UnixNano()-stamp)/1e6)
			lr.recvAt[level] = append(lr.recvAt[level], stamp)
		})
		lr.mu.Unlock()
	}
}

// parseStamp reads "LAT-<level>-<unix ns>-<seq>" (the upper-cased stamp;
// level w is the warm-up, returned as warm).
func parseStamp(v []byte, warm int) (level int, stamp int64, seq int, err error) {
	f := bytes.Split(v, []byte("-"))
	if len(f) != 4 || string(f[0]) != "LAT" {
		return 0, 0, 0, fmt.Errorf("output value %q is no upper-cased latency stamp", v)
	}
	if s := string(f[1]); s == "W" {
		level = warm
	} else if level, err = strconv.Atoi(s); err != nil || level < 0 || level >= warm {
		return 0, 0, 0, fmt.Errorf("output value %q: level %q", v, s)
	}
	if stamp, err = strconv.ParseInt(string(f[2]), 10, 64); err != nil {
		return 0, 0, 0, fmt.Errorf("output value %q: stamp: %w", v, err)
	}
	if seq, err = strconv.Atoi(string(f[3])); err != nil || seq < 0 {
		return 0, 0, 0, fmt.Errorf("output value %q: sequence number", v)
	}
	return level, stamp, seq, nil
}

func (lr *latReader) Close() {
	lr.cancel()
	<-lr.stopped
	lr.cl.Close()
}

// count is the number of distinct records seen.
func (lr *latReader) count() int {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	return lr.n
}

// latPacer produces stamped records at fixed rates.
type latPacer struct {
	cl         *kgo.Client
	topic      string
	partitions int
	seq        int
	mu         sync.Mutex
	firstErr   error
}

func newLatPacer(addrs []string, topic string, partitions int) (*latPacer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DisableIdempotentWrite(),
		kgo.MaxBufferedRecords(1_000_000))
	if err != nil {
		return nil, fmt.Errorf("latency producer: %w", err)
	}
	return &latPacer{cl: cl, topic: topic, partitions: partitions}, nil
}

// run produces at rate records/s for d (or until stop closes), level
// being the level's index ("W": warm-up), and returns how many it sent:
// fewer than rate × d when the harness's own producer falls behind (its
// process also holds kfake and the reader), which the report shows.
func (p *latPacer) run(level string, rate float64, d time.Duration, stop <-chan struct{}) int {
	start := time.Now()
	sent := 0
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		el := time.Since(start)
		if el >= d {
			return sent
		}
		for due := int(rate * el.Seconds()); sent < due; sent++ {
			seq := p.seq
			p.seq++
			v := fmt.Appendf(nil, "%s%s-%d-%d", latencyValuePref, level, time.Now().UnixNano(), seq)
			p.cl.Produce(context.Background(), &kgo.Record{Topic: p.topic, Partition: int32(seq % p.partitions),
				Key: fmt.Appendf(nil, "k%05d", seq%latencyKeys), Value: v}, p.done)
		}
		select {
		case <-stop:
			return sent
		case <-t.C:
		}
	}
}

func (p *latPacer) done(_ *kgo.Record, err error) {
	if err != nil {
		p.mu.Lock()
		if p.firstErr == nil {
			p.firstErr = fmt.Errorf("latency producer: %w", err)
		}
		p.mu.Unlock()
	}
}

// close waits for every record's acknowledgement and returns the first
// produce error.
func (p *latPacer) close() error {
	err := p.cl.Flush(context.Background())
	p.cl.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.firstErr != nil {
		return p.firstErr
	}
	if err != nil {
		return fmt.Errorf("latency producer flush: %w", err)
	}
	return nil
}

// percentiles fills res's p50, p99, p99.9 and max of the latencies ms
// (nearest rank).
func (res *result) percentiles(ms []float64) {
	s := slices.Clone(ms)
	slices.Sort(s)
	res.Samples = len(s)
	if len(s) == 0 {
		return
	}
	rank := func(q float64) float64 { return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)] }
	res.P50, res.P99, res.P999, res.MaxMS = rank(0.50), rank(0.99), rank(0.999), s[len(s)-1]
}

// loadAvg is the 1-minute load average (0 when /proc cannot be read).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	_, _ = fmt.Sscan(string(b), &l)
	return l
}

// runLatency runs a latency workload of s (see the top of this file).
func (h *harness) runLatency(s *system, wl string, round int) []result {
	base := result{System: s.name, Workload: wl, Round: round, Load: loadAvg()}
	failAll := func(err error) []result { return []result{base.fail(err)} }
	levels, err := h.latencyLevels(s)
	if err != nil {
		return failAll(err)
	}
	workers := 1
	var sig syscall.Signal
	if wl != latencyWorkload {
		// One level: the middle one, with a hand-over or kill in it.
		levels = []latencyLevel{levels[len(levels)/2]}
		workers, sig = 2, syscall.SIGTERM
		if wl == latencyKill {
			sig = syscall.SIGKILL
		}
	}
	r, err := h.newRun(s, wl, round)
	if err != nil {
		return failAll(err)
	}
	defer r.close()
	if err := r.b.createTopic(r.output, h.cfg.partitions); err != nil {
		return failAll(err)
	}
	// No records go in before the worker starts, so nothing else makes sure
	// the broker's metadata has the topics: Goka on Kafka 4.4 exited with
	// "requested topic was not found" when started right after the create.
	if err := r.b.awaitTopics(h.cfg.timeout, r.input, r.output); err != nil {
		return failAll(err)
	}
	lr, err := newLatReader(r.b.addrs, r.output, len(levels))
	if err != nil {
		return failAll(err)
	}
	defer lr.Close()
	pc, err := newLatPacer(r.b.addrs, r.input, h.cfg.partitions)
	if err != nil {
		return failAll(err)
	}
	pacerClosed := false
	defer func() {
		if !pacerClosed {
			_ = pc.close()
		}
	}()

	var cs []*child
	var u1 usage
	var stopErr error
	stopped := map[*child]bool{}
	defer func() {
		for _, c := range cs {
			if !stopped[c] {
				_, _ = c.stop(syscall.SIGKILL, 10*time.Second)
			}
		}
	}()
	for i := range workers {
		c, err := r.start("stateless", fmt.Sprintf("w%d", i+1))
		if err != nil {
			return failAll(err)
		}
		cs = append(cs, c)
		if workers > 1 && i == 0 {
			// Worker 2 starts once worker 1 is in the group (Goka's
			// processors race to create topics when started together).
			if err := r.awaitMembers(1, false, c.exited); err != nil {
				return failAll(err)
			}
		}
	}
	exited := anyExited(cs...)

	// Warm-up: the lowest level's rate (at most 1000/s) until the first
	// output and then the warm-up time (under exactly-once at least one
	// commit interval); with two workers, also until they form a stable group
	// in which both hold partitions.
	warmRate := math.Min(levels[0].rate, 1000)
	stopWarm := make(chan struct{})
	warmDone := make(chan struct{})
	go func() {
		defer close(warmDone)
		pc.run("W", warmRate, time.Duration(math.MaxInt64), stopWarm)
	}()
	warmErr := func() error {
		select {
		case <-lr.arrived:
		case <-exited:
			return fmt.Errorf("a worker exited before its first output (logs in %s)", r.dir)
		case <-time.After(h.cfg.timeout):
			return fmt.Errorf("no output within %s of the start (logs in %s)", h.cfg.timeout, r.dir)
		}
		if workers > 1 {
			if err := r.awaitMembers(2, true, exited); err != nil {
				return err
			}
		}
		warm := h.cfg.latencyWarmup
		if s.eos {
			// Its output shows at commits: at least one after the first.
			warm = max(warm, h.commitOf(s))
		}
		select {
		case <-time.After(warm):
		case <-exited:
			return fmt.Errorf("a worker exited in the warm-up (logs in %s)", r.dir)
		}
		return nil
	}()
	close(stopWarm)
	<-warmDone
	if warmErr != nil {
		return failAll(warmErr)
	}

	sentAt := make([]float64, len(levels)) // records/s the pacer reached per level
	for i, lv := range levels {
		start := time.Now()
		if sig == 0 {
			n := pc.run(strconv.Itoa(i), lv.rate, h.cfg.latencyDuration, nil)
			sentAt[i] = float64(n) / time.Since(start).Seconds()
			continue
		}
		half := h.cfg.latencyDuration / 2
		n := pc.run(strconv.Itoa(i), lv.rate, half, nil)
		// The signal in the middle of the window, the records going on.
		sigDone := make(chan struct{})
		go func() {
			defer close(sigDone)
			u1, stopErr = cs[0].stop(sig, 60*time.Second)
			stopped[cs[0]] = true
		}()
		n += pc.run(strconv.Itoa(i), lv.rate, h.cfg.latencyDuration-half, nil)
		sentAt[i] = float64(n) / time.Since(start).Seconds()
		<-sigDone
	}
	sent := pc.seq
	pacerClosed = true
	if err := pc.close(); err != nil {
		return failAll(err)
	}
	survivor := cs[len(cs)-1]
	// Every record must arrive; an exactly-once output shows at the next
	// commit.
	deadline := time.After(h.cfg.timeout)
	for lr.count() < sent {
		select {
		case <-survivor.exited:
			return failAll(fmt.Errorf("the worker exited with %d of %d records' output seen (log %s)", lr.count(), sent, survivor.log.Name()))
		case <-deadline:
			return failAll(fmt.Errorf("%d of %d records' output seen %s after the last was produced: records lost (logs in %s)", lr.count(), sent, h.cfg.timeout, r.dir))
		case <-time.After(20 * time.Millisecond):
		}
	}
	time.Sleep(settle) // late duplicates
	u, err := survivor.stop(syscall.SIGTERM, 60*time.Second)
	stopped[survivor] = true
	if err != nil {
		return failAll(err)
	}
	if stopErr != nil && sig == syscall.SIGTERM {
		return failAll(stopErr)
	}
	lr.mu.Lock()
	defer lr.mu.Unlock()
	if lr.bad > 0 {
		return failAll(fmt.Errorf("%d output records wrong, the first: %s", lr.bad, lr.badMsg))
	}
	if s.eos && lr.dups > 0 {
		return failAll(fmt.Errorf("%d records' output seen twice under exactly-once", lr.dups))
	}
	load := loadAvg()
	var out []result
	for i, lv := range levels {
		res := base
		res.Level, res.InRate, res.SentRate, res.Doubles, res.LoadEnd = lv.name, lv.rate, sentAt[i], lr.dups, load
		if caps := h.capacity[s.name]; len(caps) > 0 {
			res.CapFrac = lv.rate / median(caps)
		}
		res.percentiles(lr.lat[i])
		res.CPU, res.RSSMB = u.cpu, math.Max(u.rssMB, u1.rssMB)
		if res.Samples == 0 {
			res = res.fail(fmt.Errorf("level %s: no records", lv.name))
		}
		out = append(out, res)
	}
	return out
}

// commitOf is s's commit interval (exactly-once Runnel: its default, 2.8 s).
func (h *harness) commitOf(s *system) time.Duration {
	for _, e := range s.env {
		if v, ok := strings.CutPrefix(e, "BENCH_COMMIT_MS="); ok {
			if ms, err := strconv.Atoi(v); err == nil && ms > 0 {
				return time.Duration(ms) * time.Millisecond
			}
			return 2800 * time.Millisecond
		}
	}
	return h.cfg.commit
}

// awaitMembers waits until the run's group has n members (stable, each with
// input partitions, when settled), or exited closes, or the timeout.
func (r *run) awaitMembers(n int, settled bool, exited <-chan struct{}) error {
	deadline := time.Now().Add(r.h.cfg.timeout)
	for {
		got, stable, allActive, err := r.b.groupMembers(r.id, r.input)
		if err == nil && got >= n && (!settled || (stable && allActive)) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timeout waiting for %d members in the group (%d, stable %v, all with partitions %v, err %v; logs in %s)",
				n, got, stable, allActive, err, r.dir)
		}
		select {
		case <-exited:
			return fmt.Errorf("a worker exited before the group formed (logs in %s)", r.dir)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
