package main

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// result is one run of one workload by one system.
type result struct {
	System   string  `json:"system"`
	Workload string  `json:"workload"`
	Round    int     `json:"round"`
	Failure  string  `json:"failure,omitempty"`        // a wrong answer or a run that did not finish
	Seconds  float64 `json:"seconds"`                  // the workload's time (see docs/benchmarks.md)
	Rate     float64 `json:"records_per_s,omitempty"`  // records over the span from the first to the last output record
	FirstOut float64 `json:"first_output_s,omitempty"` // from the start to the first output record: startup and group join
	CPU      float64 `json:"cpu_s,omitempty"`          // user+system of the worker(s)
	RSSMB    float64 `json:"rss_mb,omitempty"`         // peak RSS of the worker (the largest of them)
	Records  int64   `json:"records,omitempty"`        // restore: changelog records present (after compaction)
	Span     int64   `json:"span,omitempty"`           // stateful, restore: changelog offsets (records written)
	Doubles  int64   `json:"doubles"`                  // handover, kill: records counted more than once
	WarmupS  float64 `json:"warmup_s,omitempty"`       // scaleout (Runnel): from the newcomer's start to its last warm-up caught up
	// Phases: handover and kill (Runnel), seconds after the signal of each
	// step of the take-over (tracePhases, from the workers' logs).
	Phases map[string]float64 `json:"phases,omitempty"`
	// Expelled: rebalances, the times the surviving worker lost its
	// membership (ExpelledWhy: the first log line saying so).
	Expelled    int    `json:"expelled"`
	ExpelledWhy string `json:"expelled_why,omitempty"`
	// Ratio: redeliver, the other partitions' throughput while one
	// partition redelivers a failing record, relative to a run without it.
	Ratio float64 `json:"ratio,omitempty"`
	// Latency workloads: the level (its name and offered records/s), and
	// the percentiles in ms of the time from a record's produce to its
	// derived record's arrival at a read_committed reader, over Samples
	// records (Doubles: records whose output arrived more than once).
	Level  string  `json:"level,omitempty"`
	InRate float64 `json:"in_rate,omitempty"`
	// SentRate: records/s the harness actually produced at (below InRate
	// when its producer fell behind); CapFrac: InRate over the system's
	// stateless rate in this run (0: not measured).
	SentRate float64 `json:"sent_rate,omitempty"`
	CapFrac  float64 `json:"capacity_fraction,omitempty"`
	P50      float64 `json:"p50_ms,omitempty"`
	P99      float64 `json:"p99_ms,omitempty"`
	P999     float64 `json:"p999_ms,omitempty"`
	MaxMS    float64 `json:"max_ms,omitempty"`
	Samples  int     `json:"samples,omitempty"`
	// Load and LoadEnd: the machine's 1-minute load average at the run's
	// start and end.
	Load    float64 `json:"load,omitempty"`
	LoadEnd float64 `json:"load_end,omitempty"`
}

// run is one run's broker, topic names and directories.
type run struct {
	h      *harness
	s      *system
	b      *broker
	prefix string // of every topic and the group of this run
	id     string // app id / consumer group
	input  string
	output string
	dir    string   // data dirs and logs
	data   *dataset // the run's input (loaded into input by newRun)
}

func (h *harness) newRun(s *system, workload string, round int) (*run, error) {
	h.seq++
	prefix := fmt.Sprintf("sbs%d-%s-%s-", h.seq, s.name, workload)
	r := &run{h: h, s: s, prefix: prefix, id: prefix + "app", input: prefix + "in", output: prefix + "out",
		dir:  filepath.Join(h.workDir, fmt.Sprintf("%03d-%s-%s-r%d", h.seq, s.name, workload, round)),
		data: h.dataFor(workload)}
	if h.shared != nil {
		r.b = h.shared
	} else {
		b, err := openBroker("")
		if err != nil {
			return nil, err
		}
		r.b = b
	}
	if err := r.b.createTopic(r.input, h.cfg.partitions); err != nil {
		r.close()
		return nil, err
	}
	if r.data == nil { // the latency workloads produce while the worker runs
		return r, nil
	}
	if err := r.data.load(context.Background(), r.b.addrs, r.input); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// close drops the run's broker (kfake) or its topics (a shared broker).
func (r *run) close() {
	if r.h.shared == nil {
		r.b.Close()
		return
	}
	if err := r.b.deleteTopicsWithPrefix(r.prefix); err != nil {
		r.h.logf("cleanup: %v", err)
	}
}

// start starts one worker of the run's system.
func (r *run) start(workload, name string, extra ...string) (*child, error) {
	cfg := r.h.cfg
	env := []string{
		"BENCH_BROKERS=" + joinAddrs(r.b.addrs),
		"BENCH_WORKLOAD=" + workload,
		"BENCH_INPUT=" + r.input,
		"BENCH_OUTPUT=" + r.output,
		"BENCH_ID=" + r.id,
		"BENCH_DATA_DIR=" + filepath.Join(r.dir, name),
		fmt.Sprintf("BENCH_PARTITIONS=%d", cfg.partitions),
		fmt.Sprintf("BENCH_COMMIT_MS=%d", cfg.commit.Milliseconds()),
	}
	env = append(append(env, r.s.env...), extra...)
	return startChild(filepath.Join(r.h.binDir, r.s.bin), env, filepath.Join(r.dir, name+".log"))
}

func joinAddrs(a []string) string {
	s := ""
	for i, x := range a {
		if i > 0 {
			s += ","
		}
		s += x
	}
	return s
}

func complete(s state) bool { return !s.complete.IsZero() }

// settle is how long the harness keeps watching after a worker stopped for
// records that would make the answer wrong (late duplicates).
const settle = 500 * time.Millisecond

// runStateless: consume → upper-case → produce of the whole dataset by one
// worker; the time is from the worker's start to the last correct output
// record, and every key must have exactly its input count of output records.
func (h *harness) runStateless(s *system, round int, profile []string) result {
	res := result{System: s.name, Workload: "stateless", Round: round}
	r, err := h.newRun(s, "stateless", round)
	if err != nil {
		return res.fail(err)
	}
	defer r.close()
	if err := r.b.createTopic(r.output, h.cfg.partitions); err != nil {
		return res.fail(err)
	}
	w, err := watch(r.b.addrs, r.output, true, s.eos, nil, nil, r.data.counts)
	if err != nil {
		return res.fail(err)
	}
	defer w.Close()
	return r.single(w, "stateless", res, profile)
}

// single runs one worker until w is complete, stops it and checks that the
// answer stayed right.
func (r *run) single(w *watcher, workload string, res result, profile []string) result {
	c, err := r.start(workload, "w1", profile...)
	if err != nil {
		return res.fail(err)
	}
	st, err := w.waitFor(r.h.cfg.timeout, c.exited, complete)
	u, stopErr := c.stop(syscall.SIGTERM, 60*time.Second)
	res.CPU, res.RSSMB = u.cpu, u.rssMB
	if err != nil {
		return res.fail(fmt.Errorf("%w (log %s)", err, c.log.Name()))
	}
	if stopErr != nil {
		return res.fail(stopErr)
	}
	time.Sleep(settle)
	if after := w.state(); !complete(after) {
		return res.fail(fmt.Errorf("after the stop: %d keys below and %d above their expected value", after.under, after.over))
	}
	res.Seconds = st.complete.Sub(c.start).Seconds()
	res.FirstOut = st.first.Sub(c.start).Seconds()
	if span := st.complete.Sub(st.first).Seconds(); span > 0 {
		res.Rate = float64(r.data.n) / span // steady state: startup and group join left out
	}
	return res
}

// runStateful runs workload wl (stateful or stateful-distinct): count per
// key into the system's changelog-backed table; the time is from the
// worker's start to the changelog holding every key's count. With restore
// (the workload restoreOf[wl]), a fresh worker (empty data dir) then
// restores the table and must apply one probe record per partition on top
// of it: the restore time is from its start to those probes' counts in the
// changelog, and its start-up (FirstOut) from its start until it holds every
// input partition in the group. Untimed, one more record per key of the
// table then checks the restore of every key: each must reach its count + 1
// (+ 2 for the probe keys), none above.
func (h *harness) runStateful(s *system, wl string, round int, restore bool, profile []string) (result, result) {
	res := result{System: s.name, Workload: wl, Round: round}
	rres := result{System: s.name, Workload: restoreOf[wl], Round: round}
	r, err := h.newRun(s, wl, round)
	if err != nil {
		return res.fail(err), rres.fail(err)
	}
	defer r.close()
	if s.createChangelog {
		if err := r.b.createTopic(s.changelog(r.id), h.cfg.partitions); err != nil {
			return res.fail(err), rres.fail(err)
		}
	}
	w, err := h.watchChangelog(r, s)
	if err != nil {
		return res.fail(err), rres.fail(err)
	}
	defer w.Close()
	res = r.single(w, "stateful", res, profile)
	if res.Failure != "" {
		return res, rres.fail(fmt.Errorf("the stateful run before it failed"))
	}
	// What the run wrote to its changelog: one record per input record
	// without a write cache, fewer the more keys repeat within a flush.
	if res.Span, err = r.b.topicSize(s.changelog(r.id)); err != nil {
		return res.fail(err), rres.fail(err)
	}
	if !restore {
		return res, rres
	}
	rres.Span = res.Span
	if rres.Records, err = r.b.countRecords(s.changelog(r.id)); err != nil {
		return res, rres.fail(err)
	}
	// One probe per partition with a key of the table: its count must go
	// from the restored value to one more.
	var probes []*kgo.Record
	for p := range h.cfg.partitions {
		for i, k := range r.data.keys {
			if int(r.data.keyPart[i]) == p && r.data.counts[k] > 0 {
				probes = append(probes, &kgo.Record{Topic: r.input, Partition: int32(p), Key: []byte(k), Value: []byte("probe")})
				w.addExpect(k)
				break
			}
		}
	}
	if err := r.produce(probes); err != nil {
		return res, rres.fail(err)
	}
	before, err := r.b.memberPartitions(r.id, r.input)
	if err != nil {
		return res, rres.fail(err)
	}
	c, err := r.start("stateful", "w2")
	if err != nil {
		return res, rres.fail(err)
	}
	joined := r.watchJoin(c, before)
	st, err := w.waitFor(h.cfg.timeout, c.exited, complete)
	done := c.snapshot() // the restore's CPU and RSS, before the untimed check below
	if err == nil {
		err = r.checkEveryKey(w, c)
	}
	u, stopErr := c.stop(syscall.SIGTERM, 60*time.Second)
	rres.CPU, rres.RSSMB = done.cpu, done.rssMB
	if err != nil {
		return res, rres.fail(fmt.Errorf("%w (log %s)", err, c.log.Name()))
	}
	if stopErr != nil {
		return res, rres.fail(stopErr)
	}
	if done.cpu == 0 { // no /proc: what getrusage says at the end
		rres.CPU = u.cpu
	}
	time.Sleep(settle)
	if after := w.state(); !complete(after) {
		return res, rres.fail(fmt.Errorf("after the stop: %d keys below and %d above their expected value (%s)", after.under, after.over, w.sample(3)))
	}
	rres.Seconds = st.complete.Sub(c.start).Seconds()
	if t := <-joined; !t.IsZero() && t.Before(st.complete) {
		rres.FirstOut = t.Sub(c.start).Seconds()
	}
	return res, rres
}

// produce writes recs (with their partitions set) and waits for the acks.
func (r *run) produce(recs []*kgo.Record) error {
	pr, err := newProducer(r.b.addrs)
	if err != nil {
		return err
	}
	defer pr.Close()
	return pr.produce(context.Background(), func(yield func(*kgo.Record) bool) {
		for _, rec := range recs {
			if !yield(rec) {
				return
			}
		}
	})
}

// watchJoin polls the group every 20 ms from c's start until members not in
// before hold every input partition, and sends when that was first seen
// (zero if never, by the time c exits) on the returned channel.
func (r *run) watchJoin(c *child, before map[string][]int32) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			now := time.Now()
			if m, err := r.b.memberPartitions(r.id, r.input); err == nil {
				held := 0
				for id, ps := range m {
					if _, old := before[id]; !old {
						held += len(ps)
					}
				}
				if held >= r.h.cfg.partitions {
					out <- now
					return
				}
			}
			select {
			case <-c.exited:
				out <- time.Time{}
				return
			case <-t.C:
			}
		}
	}()
	return out
}

// checkEveryKey verifies a restore on every key: one record goes to each key
// of the table, and each key's changelog value must then be its expected
// count + 1 (a key restored wrongly or not at all ends elsewhere).
func (r *run) checkEveryKey(w *watcher, c *child) error {
	keys := make([]string, 0, len(r.data.counts))
	recs := make([]*kgo.Record, 0, len(r.data.counts))
	for i, k := range r.data.keys {
		if r.data.counts[k] > 0 {
			keys = append(keys, k)
			recs = append(recs, &kgo.Record{Topic: r.input, Partition: r.data.keyPart[i], Key: []byte(k), Value: []byte("check")})
		}
	}
	w.addExpectAll(keys)
	if err := r.produce(recs); err != nil {
		return fmt.Errorf("restore check of every key: %w", err)
	}
	if _, err := w.waitFor(r.h.cfg.timeout, c.exited, complete); err != nil {
		return fmt.Errorf("restore check of every key (%d keys, one record each): %w", len(keys), err)
	}
	return nil
}

// takeoverResolution: after worker 1 exited, changelog records that arrive
// within this time may still be its own.
const takeoverResolution = 250 * time.Millisecond

// runTakeover: two workers count the dataset; once both are members of a
// stable group, each with active partitions, and a quarter of the counts is in the changelog, a probe
// record goes to every partition every 20 ms (so that partitions whose
// backlog is done keep changing) and worker 1 gets sig (SIGTERM: clean
// hand-over; SIGKILL: crash). The time is from the signal until every
// partition has a changelog record that arrived more than
// takeoverResolution after worker 1 exited, i.e. was written by worker 2.
// Then the probes stop, every key must reach its expected count (fewer:
// records lost, a failure), and what is above it was counted twice.
func (h *harness) runTakeover(s *system, workload string, sig syscall.Signal, round int) result {
	res := result{System: s.name, Workload: workload, Round: round}
	r, err := h.newRun(s, workload, round)
	if err != nil {
		return res.fail(err)
	}
	defer r.close()
	w, err := h.watchChangelog(r, s)
	if err != nil {
		return res.fail(err)
	}
	defer w.Close()
	// Runnel's workers log every step of the take-over (traceTakeover).
	var trace []string
	if s.peer == "runnel" {
		trace = []string{"BENCH_LOG_LEVEL=debug"}
	}
	c1, err := r.start("stateful", "w1", trace...)
	if err != nil {
		return res.fail(err)
	}
	// Worker 2 starts once worker 1 is in the group: started together, two
	// Goka processors race to create the table topic and one exits.
	for deadline := time.Now().Add(h.cfg.timeout); ; {
		n, _, _, err := r.b.groupMembers(r.id, r.input)
		if err != nil || time.Now().After(deadline) {
			_, _ = c1.stop(syscall.SIGKILL, time.Second)
			return res.fail(fmt.Errorf("worker 1 did not join the group: %v (log %s)", err, c1.log.Name()))
		}
		if n > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	c2, err := r.start("stateful", "w2", trace...)
	if err != nil {
		_, _ = c1.stop(syscall.SIGKILL, time.Second)
		return res.fail(err)
	}
	stopAll := func() {
		for _, c := range []*child{c1, c2} {
			select {
			case <-c.exited:
			default:
				u, _ := c.stop(syscall.SIGTERM, 60*time.Second)
				res.CPU += u.cpu
				res.RSSMB = math.Max(res.RSSMB, u.rssMB)
			}
		}
	}
	defer stopAll()
	exited := anyExited(c1, c2)

	// Both workers in a stable group, and the load well under way.
	deadline := time.Now().Add(h.cfg.timeout)
	for {
		n, stable, allActive, err := r.b.groupMembers(r.id, r.input)
		if err != nil {
			return res.fail(err)
		}
		if n >= 2 && stable && allActive && w.state().sum >= int64(h.data.n/4) {
			break
		}
		select {
		case <-exited:
			return res.fail(fmt.Errorf("a worker exited before the hand-over (logs in %s)", r.dir))
		default:
		}
		if time.Now().After(deadline) {
			return res.fail(fmt.Errorf("timeout waiting for 2 members with active partitions in a stable group (%d members, stable %v, all with actives %v; %s)",
				n, stable, allActive, r.b.describeAssignment(r.id)))
		}
		time.Sleep(50 * time.Millisecond)
	}

	pb, err := newProbes(r.b.addrs, r.input, h.data.probes, w)
	if err != nil {
		return res.fail(err)
	}
	defer pb.stop()
	time.Sleep(500 * time.Millisecond)
	// Who holds what at the signal: the hand-over is over when the
	// partitions of worker 1 process again (worker 2's own partitions show
	// their next changelog record only at its next commit, which says
	// nothing about the hand-over for systems that cache table writes).
	before, err := r.b.memberPartitions(r.id, r.input)
	if err != nil {
		return res.fail(err)
	}
	sigAt := time.Now()
	u1, stopErr := c1.stop(sig, 60*time.Second)
	// Records of worker 1 may still be on their way (in flight at the
	// signal, fetched by the watcher up to 100 ms later): what arrives
	// after takeoverResolution is worker 2's, and so is a record stamped
	// after worker 1 ended, however soon it arrives: stamped at its write
	// (Runnel's Sarama producer), or with the time of an input record
	// produced after it (Kafka Streams), only worker 2 can have written it.
	exitAt := time.Now()
	w.resumeAfter(exitAt.Add(takeoverResolution), exitAt)
	var last time.Time
	for {
		got := w.resumed()
		if len(got) == h.cfg.partitions {
			moved := h.movedPartitions(r, before)
			for p, t := range got {
				if (moved == nil || moved[p]) && t.After(last) {
					last = t
				}
			}
			break
		}
		select {
		case <-c2.exited:
			return res.fail(fmt.Errorf("worker 2 exited during the hand-over (log %s)", c2.log.Name()))
		default:
		}
		if time.Since(sigAt) > h.cfg.timeout {
			return res.fail(fmt.Errorf("%d partitions not processing %s after the signal", h.cfg.partitions-len(got), h.cfg.timeout))
		}
		time.Sleep(10 * time.Millisecond)
	}
	res.Seconds = last.Sub(sigAt).Seconds()
	if trace != nil {
		res.Phases = traceTakeover(c1.log.Name(), c2.log.Name(), sigAt, last)
		h.logf("%s trace (ms after the signal): %s", workload, fmtPhases(res.Phases))
	}
	pb.stop()
	res.CPU, res.RSSMB = u1.cpu, u1.rssMB
	if stopErr != nil && sig == syscall.SIGTERM {
		return res.fail(stopErr)
	}
	if err := pb.err(); err != nil {
		return res.fail(err)
	}
	st, err := w.waitFor(h.cfg.timeout, c2.exited, func(s state) bool { return s.under == 0 })
	if err != nil {
		return res.fail(fmt.Errorf("after the take-over, counts lost: %w", err))
	}
	time.Sleep(h.cfg.commit + time.Second) // late duplicates
	st = w.state()
	if st.under > 0 {
		return res.fail(fmt.Errorf("after the take-over, %d keys fell below their count", st.under))
	}
	res.Doubles = st.excess
	if s.eos && st.excess > 0 {
		return res.fail(fmt.Errorf("after the take-over, %d records counted twice under exactly-once", st.excess))
	}
	return res
}

// movedPartitions returns the partitions the surviving member did not hold
// at the signal (before: member -> partitions then), or nil (all of them)
// when the survivor cannot be told from the group's description.
func (h *harness) movedPartitions(r *run, before map[string][]int32) map[int32]bool {
	// The group may still list worker 1 for a moment after its partitions
	// moved (a killed one until its session timeout): wait for one member.
	var after map[string][]int32
	for deadline := time.Now().Add(5 * time.Second); ; {
		var err error
		if after, err = r.b.memberPartitions(r.id, r.input); err != nil {
			return nil
		}
		if len(after) <= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	survivor := ""
	for m := range after {
		if _, ok := before[m]; ok {
			if survivor != "" {
				return nil // two members of before still in the group
			}
			survivor = m
		}
	}
	if survivor == "" {
		h.logf("hand-over: the survivor is not in the group's description before the signal (%v) and after (%v): timing every partition", before, after)
		return nil
	}
	moved := map[int32]bool{}
	for p := range int32(h.cfg.partitions) {
		moved[p] = !slices.Contains(before[survivor], p)
	}
	return moved
}

// probes sends one record per partition every 20 ms, each to that
// partition's probe key, and raises the watcher's expectation of it.
type probes struct {
	cl      *kgo.Client
	w       *watcher
	keys    []string
	mu      sync.Mutex
	sent    []int64 // probes sent per partition
	firstEr error
	done    chan struct{}
	ended   chan struct{}
	once    sync.Once
}

func newProbes(addrs []string, topic string, keys []string, w *watcher) (*probes, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerLinger(0), kgo.DisableIdempotentWrite())
	if err != nil {
		return nil, fmt.Errorf("probe producer: %w", err)
	}
	p := &probes{cl: cl, w: w, keys: keys, sent: make([]int64, len(keys)), done: make(chan struct{}), ended: make(chan struct{})}
	go p.loop(topic)
	return p, nil
}

func (p *probes) loop(topic string) {
	defer close(p.ended)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		p.mu.Lock()
		for i, k := range p.keys {
			p.w.addExpect(k)
			p.sent[i]++
			p.cl.Produce(context.Background(), &kgo.Record{Topic: topic, Partition: int32(i), Key: []byte(k), Value: []byte("probe")},
				func(_ *kgo.Record, err error) {
					if err != nil {
						p.mu.Lock()
						if p.firstEr == nil {
							p.firstEr = fmt.Errorf("probe: %w", err)
						}
						p.mu.Unlock()
					}
				})
		}
		p.mu.Unlock()
		select {
		case <-p.done:
			return
		case <-t.C:
		}
	}
}

// stop ends the probes and waits until every one was acknowledged.
func (p *probes) stop() {
	p.once.Do(func() {
		close(p.done)
		<-p.ended
		_ = p.cl.Flush(context.Background())
		p.cl.Close()
	})
}

func (p *probes) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.firstEr
}

func (r result) fail(err error) result {
	r.Failure = err.Error()
	return r
}
