package replay

import (
	"context"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/agentrt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/agent/source"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// Target is what a replay runs the records through: one agent, with one
// named effect live.
type Target struct {
	// Agent is the agent to replay (an *agent.Agent); its topic must be the
	// plan's topic.
	Agent agent.Def
	// Effect names the only agent.Effect that applies; every other effect of
	// the agent is skipped. Required.
	Effect string
	// Tables are the app's tables. The agent sees each through a scratch
	// state (an in-memory store, empty at the start of the replay, whose
	// writes are never flushed or sent to a changelog): the live stores and
	// changelogs are never opened. Global tables are not available (reads
	// return table.ErrNotRunning).
	Tables []table.Def
}

// Options tune Run. Zero fields take the defaults.
type Options struct {
	// IdleTimeout fails the replay when a partition below its stop offset
	// gets no record from the broker for this long; default 30 s.
	IdleTimeout time.Duration
	// Deadline bounds the whole replay in wall-clock time, independently of
	// the idle timeout; default 1 h.
	Deadline time.Duration
	// CommitInterval is how often the replay commits the offsets of the
	// records whose effects are done; default 500 ms. The last offsets are
	// committed when the replay ends, also when it fails.
	CommitInterval time.Duration
	// FetchMaxWait is how long one fetch waits for data; default 250 ms.
	FetchMaxWait time.Duration
	// OnProgress, when set, is called about every ProgressInterval (default
	// 500 ms) and once at the end.
	OnProgress       func(Progress)
	ProgressInterval time.Duration
	// Logger receives the replay's logs; default slog.Default().
	Logger *slog.Logger
	// ReadCommitted reads with isolation level read_committed (KIP-98): the
	// records of aborted transactions are skipped (counted as gaps), and a
	// partition waits for open transactions below its stop offset. Default:
	// the client's Consumer.IsolationLevel.
	ReadCommitted bool
	iso           sarama.IsolationLevel
}

func (o *Options) isolation() sarama.IsolationLevel { return o.iso }

func (o *Options) defaults() {
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 30 * time.Second
	}
	if o.Deadline <= 0 {
		o.Deadline = time.Hour
	}
	if o.CommitInterval <= 0 {
		o.CommitInterval = 500 * time.Millisecond
	}
	if o.FetchMaxWait <= 0 {
		o.FetchMaxWait = 250 * time.Millisecond
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 500 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// PartitionResult is what the replay did on one partition.
type PartitionResult struct {
	Partition int32
	// Start and Stop are the planned range [Start, Stop); From is where this
	// run began reading (above Start when it resumed the replay group's
	// commit); Committed is the replay group's committed offset at the end
	// (Stop when the partition completed).
	Start, Stop, From, Committed int64
	// Position is the offset after the last offset read (records, gaps).
	Position int64
	// Records is the data records read in [From, Stop); OutOfRange those of
	// them not delivered because their timestamp lies outside the plan's
	// time range; Gaps the offsets in [From, Stop) without a data record
	// (compaction, transaction markers, aborted records).
	Records, OutOfRange, Gaps int64
	// Delivered records went to the agent; Rejected ones it (or its codec)
	// rejected: in a replay they are committed without a dead letter.
	Delivered, Rejected int64
	// Effects counts calls of the named effect that applied it, Duplicates
	// calls that found it already applied, EffectErrors failed calls.
	Effects, Duplicates, EffectErrors int64
	// Skipped counts calls of other effects (not live in a replay);
	// Suppressed records the agent sent to topics (dropped); TableWrites are
	// not counted (they go to scratch state).
	Skipped, Suppressed int64
	Done                bool
}

// Result sums a replay over its partitions. Run returns it also with an
// error, to say how far the replay got; only a nil error means complete.
type Result struct {
	Topic, Group, Effect                                   string
	Partitions                                             []PartitionResult
	Records, OutOfRange, Gaps, Delivered, Rejected         int64
	Effects, Duplicates, EffectErrors, Skipped, Suppressed int64
	Elapsed                                                time.Duration
}

// Progress is a snapshot of a running replay.
type Progress struct {
	// Offsets is the number of offsets of the plan covered so far (read
	// records and gaps), out of Total.
	Offsets, Total int64
	Records        int64
	Effects        int64
	Elapsed        time.Duration
}

// IncompleteError is the error of a replay that did not cover its whole
// range: the deadline or the idle timeout expired, an agent or effect
// failed, or the broker failed. It says how far each partition got; the
// replay group holds the committed offsets, and running the same plan again
// resumes from them.
type IncompleteError struct {
	// Reason is "deadline", "idle", "failed" or "cancelled".
	Reason     string
	Err        error
	Partitions []PartitionResult
}

func (e *IncompleteError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "replay incomplete (%s): %v;", e.Reason, e.Err)
	for _, p := range e.Partitions {
		state := "done"
		if !p.Done {
			state = fmt.Sprintf("read to %d, committed %d", p.Position, p.Committed)
		}
		fmt.Fprintf(&b, " [%d] [%d, %d) %s;", p.Partition, p.Start, p.Stop, state)
	}
	return strings.TrimSuffix(b.String(), ";")
}

func (e *IncompleteError) Unwrap() error { return e.Err }

// errIdle is the cause of an idle expiry.
var errIdle = errors.New("no record within the idle timeout")

// part is the run state of one partition.
type part struct {
	pp   PartitionPlan
	from int64
	gate *gate

	// written by the fetch loop
	position, records, outOfRange, gaps atomic.Int64
	emitted                             atomic.Int64
	fetchDone                           atomic.Bool
	// written by Advance
	advanced, rejected, delivered atomic.Int64
	acked                         atomic.Int64 // offset after the last advanced record, -1 none
	committed                     atomic.Int64
	suppressed                    atomic.Int64

	complete chan struct{} // closed when every emitted record advanced after fetchDone
	once     sync.Once
}

func (p *part) checkComplete() {
	if p.fetchDone.Load() && p.advanced.Load() == p.emitted.Load() {
		p.once.Do(func() { close(p.complete) })
	}
}

func (p *part) result() PartitionResult {
	r := PartitionResult{Partition: p.pp.Partition, Start: p.pp.Start, Stop: p.pp.Stop, From: p.from,
		Committed: p.committed.Load(), Position: p.position.Load(), Records: p.records.Load(),
		OutOfRange: p.outOfRange.Load(), Gaps: p.gaps.Load(), Delivered: p.delivered.Load(),
		Rejected: p.rejected.Load(), Suppressed: p.suppressed.Load()}
	r.Effects, r.Duplicates, r.EffectErrors, r.Skipped = p.gate.applied.Load(), p.gate.dups.Load(), p.gate.errs.Load(), p.gate.skipped.Load()
	r.Done = r.Committed >= p.pp.Stop
	return r
}

// gate is the tablestate.ReplayGate of one partition.
type gate struct {
	effect                              string
	calls, applied, dups, errs, skipped atomic.Int64
}

func (g *gate) Live(name string) bool {
	if name == g.effect {
		g.calls.Add(1)
		return true
	}
	g.skipped.Add(1)
	return false
}

func (g *gate) Done(_ string, applied bool, err error) {
	switch {
	case err != nil:
		g.errs.Add(1)
	case applied:
		g.applied.Add(1)
	default:
		g.dups.Add(1)
	}
}

// Run executes plan: every partition is read from its start (or the replay
// group's committed offset, when an earlier run of the same plan got that
// far) to its stop through target's agent, with only target's effect live,
// and the offset of each record is committed in the replay group once the
// agent moved past it and its effect returned. Partitions run in parallel.
//
// Run returns a nil error only when every partition reached its stop offset
// and the stop offsets are committed. Otherwise the error is an
// *IncompleteError (wrapping the cause: ErrBackwards, an agent's error, the
// deadline, errIdle, the broker's), and the Result says how far it got.
// Errors before reading: ErrLiveGroup, ErrGroupOutside, ErrBeyondEnd.
func Run(ctx context.Context, c Cluster, plan *Plan, target Target, opts Options) (*Result, error) {
	return run(ctx, kafka.SaramaClient(c), plan, target, opts)
}

func run(ctx context.Context, client sarama.Client, plan *Plan, target Target, opts Options) (*Result, error) {
	opts.defaults()
	opts.iso = client.Config().Consumer.IsolationLevel
	if opts.ReadCommitted {
		opts.iso = sarama.ReadCommitted
	}
	start := time.Now()
	if plan.Group == "" || plan.Group == plan.LiveGroup {
		return nil, fmt.Errorf("replay %s: %w", plan.Topic, ErrLiveGroup)
	}
	runner := agentrt.RunnerOf(target.Agent)
	if runner == nil || target.Effect == "" {
		return nil, fmt.Errorf("replay %s: an agent and an effect name are required", plan.Topic)
	}
	if target.Agent.Topic() != plan.Topic {
		return nil, fmt.Errorf("replay %s: agent %s reads topic %s", plan.Topic, target.Agent.Name(), target.Agent.Topic())
	}
	nparts, err := client.Partitions(plan.Topic)
	if err != nil {
		return nil, fmt.Errorf("replay %s: partitions: %w", plan.Topic, err)
	}
	// The plan's end offsets were captured before anything was read; a stop
	// past them is refused before reading (plans built by hand included).
	for _, pp := range plan.Partitions {
		if pp.Stop > pp.End || pp.Start > pp.Stop || pp.Start < 0 {
			return nil, fmt.Errorf("replay %s[%d]: [%d, %d), captured end %d: %w", plan.Topic, pp.Partition, pp.Start, pp.Stop, pp.End, ErrBeyondEnd)
		}
	}
	committed, err := fetchCommitted(client, plan)
	if err != nil {
		return nil, err
	}
	parts := make([]*part, 0, len(plan.Partitions))
	for _, pp := range plan.Partitions {
		p := &part{pp: pp, from: pp.Start, gate: &gate{effect: target.Effect}, complete: make(chan struct{})}
		if c, ok := committed[pp.Partition]; ok {
			if c < pp.Start || c > pp.Stop {
				return nil, fmt.Errorf("replay %s[%d]: group %s committed %d, plan [%d, %d): %w", plan.Topic, pp.Partition, plan.Group, c, pp.Start, pp.Stop, ErrGroupOutside)
			}
			p.from = c
		}
		p.position.Store(p.from)
		p.committed.Store(p.from)
		p.acked.Store(-1)
		if _, ok := committed[pp.Partition]; !ok {
			p.committed.Store(-1)
		}
		parts = append(parts, p)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, opts.Deadline)
	defer dcancel()

	mgr, err := source.NewManager(source.Config{Overflow: source.Backpressure, AckTimeout: max(opts.IdleTimeout, opts.Deadline), Logger: opts.Logger})
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer mgr.StopAll()

	var (
		errOnce  sync.Once
		firstErr error
		failed   = make(chan struct{})
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; close(failed) })
	}

	cm := &committer{client: client, topic: plan.Topic, group: plan.Group, parts: parts}
	var agents sync.WaitGroup
	for _, p := range parts {
		if p.from >= p.pp.Stop {
			p.fetchDone.Store(true)
			p.checkComplete()
			continue
		}
		env, err := replayEnv(p, target, int32(len(nparts)))
		if err != nil {
			return nil, err
		}
		key := fmt.Sprintf("replay/%s/%d", plan.Topic, p.pp.Partition)
		p := p
		factory := func(context.Context) (source.Producer, error) {
			return &producer{client: client, plan: plan, p: p, opts: &opts, fail: fail}, nil
		}
		sub, err := mgr.Subscribe(key, target.Agent.Name(), factory)
		if err != nil {
			return nil, fmt.Errorf("replay %s[%d]: subscribe: %w", plan.Topic, p.pp.Partition, err)
		}
		agents.Add(1)
		go func() {
			defer agents.Done()
			if err := runner.Run(ctx, p.pp.Partition, sub, env); err != nil {
				fail(fmt.Errorf("agent %s on %s[%d]: %w", target.Agent.Name(), plan.Topic, p.pp.Partition, err))
			}
		}()
	}

	all := make(chan struct{})
	go func() {
		for _, p := range parts {
			select {
			case <-p.complete:
			case <-ctx.Done():
				return
			}
		}
		close(all)
	}()

	commitT := time.NewTicker(opts.CommitInterval)
	defer commitT.Stop()
	progT := time.NewTicker(opts.ProgressInterval)
	defer progT.Stop()
	total := plan.Records()
	progress := func() {
		if opts.OnProgress == nil {
			return
		}
		var pr Progress
		pr.Total, pr.Elapsed = total, time.Since(start)
		for _, p := range parts {
			pr.Offsets += p.position.Load() - p.pp.Start
			pr.Records += p.records.Load()
			pr.Effects += p.gate.applied.Load()
		}
		opts.OnProgress(pr)
	}
	var runErr *IncompleteError
loop:
	for {
		select {
		case <-all:
			break loop
		case <-failed:
			runErr = &IncompleteError{Reason: "failed", Err: firstErr}
			if errors.Is(firstErr, errIdle) {
				runErr.Reason = "idle"
			}
			break loop
		case <-dctx.Done():
			if ctx.Err() != nil {
				runErr = &IncompleteError{Reason: "cancelled", Err: ctx.Err()}
			} else {
				runErr = &IncompleteError{Reason: "deadline", Err: fmt.Errorf("wall-clock deadline of %s reached", opts.Deadline)}
			}
			break loop
		case <-commitT.C:
			if err := cm.commit(); err != nil {
				fail(err)
			}
		case <-progT.C:
			progress()
		}
	}
	// Stop the sources, let the agents return, then commit what advanced: a
	// complete replay commits every stop offset.
	mgr.StopAll()
	cancel()
	agents.Wait()
	if err := cm.commit(); err != nil && runErr == nil {
		runErr = &IncompleteError{Reason: "failed", Err: err}
	}
	progress()
	res := &Result{Topic: plan.Topic, Group: plan.Group, Effect: target.Effect, Elapsed: time.Since(start)}
	var calls int64
	for _, p := range parts {
		r := p.result()
		calls += p.gate.calls.Load()
		res.Partitions = append(res.Partitions, r)
		res.Records += r.Records
		res.OutOfRange += r.OutOfRange
		res.Gaps += r.Gaps
		res.Delivered += r.Delivered
		res.Rejected += r.Rejected
		res.Effects += r.Effects
		res.Duplicates += r.Duplicates
		res.EffectErrors += r.EffectErrors
		res.Skipped += r.Skipped
		res.Suppressed += r.Suppressed
	}
	if runErr != nil {
		runErr.Partitions = res.Partitions
		return res, runErr
	}
	for _, r := range res.Partitions {
		if !r.Done {
			return res, &IncompleteError{Reason: "failed", Err: fmt.Errorf("partition %d committed %d below stop %d", r.Partition, r.Committed, r.Stop), Partitions: res.Partitions}
		}
	}
	if res.Delivered > res.Rejected && calls == 0 {
		return res, fmt.Errorf("replay %s: effect %q: %s delivered to agent %s: %w", plan.Topic, target.Effect, plural(res.Delivered, "record"), target.Agent.Name(), ErrEffectUnused)
	}
	return res, nil
}

// replayEnv is the runtime the agent sees on partition p: scratch table
// states, a sink that drops (and counts) every record, and the gate. The
// agent writes and sends only what it declared, as in a worker
// (table.UndeclaredError).
func replayEnv(p *part, target Target, partitions int32) (*tablestate.Env, error) {
	env := &tablestate.Env{States: map[string]*tablestate.State{}, InFlight: &tablestate.InFlight{}, Replay: p.gate}
	env.Agent = target.Agent.Name()
	for _, t := range agentrt.RunnerOf(target.Agent).Settings().Tables {
		env.Writes = append(env.Writes, t.Name())
	}
	for _, t := range agentrt.RunnerOf(target.Agent).Settings().Sinks {
		env.Sends = append(env.Sends, t.Name())
	}
	env.Send = func(_ string, _ int32, _, _ []byte, ack tablestate.Acker) error {
		p.suppressed.Add(1)
		ack.Acked(-1, nil)
		return nil
	}
	for _, d := range target.Tables {
		n := d.Partitions()
		if n <= 0 {
			n = partitions
		}
		st := tablestate.NewState(d, n, stores.NewMemory(), nil)
		if err := st.SetActive(p.pp.Partition, true); err != nil {
			return nil, fmt.Errorf("replay: scratch table %s: %w", d.Name(), err)
		}
		if a, ok := tablestate.RuntimeOf(d).(tablestate.PartitionActivator); ok {
			if err := a.ActivatePartition(st, p.pp.Partition); err != nil {
				return nil, fmt.Errorf("replay: scratch table %s: %w", d.Name(), err)
			}
		}
		env.States[d.Name()] = st
	}
	return env, nil
}
