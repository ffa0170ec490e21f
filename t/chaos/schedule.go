package main

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Step kinds of a schedule.
const (
	StepKill   = "kill-9"  // SIGKILL a worker, wait Down, start it again
	StepTerm   = "sigterm" // SIGTERM a worker (clean stop), wait Down, start it again
	StepAdd    = "add"     // start a new worker (a new name, an empty data dir)
	StepRemove = "remove"  // SIGTERM a worker for good
	StepBroker = "broker"  // stop the broker, wait Down, start it again (real Kafka)
)

// Step is one fault of a schedule, applied Gap after the previous step ended.
type Step struct {
	Kind   string
	Worker string        // the worker acted on (not for StepBroker)
	Wipe   bool          // StepKill: the worker restarts with an empty data dir (lost disk)
	Down   time.Duration // how long the worker or broker stays down
	Gap    time.Duration // wait before the step
}

func (s Step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "+%.1fs %s", s.Gap.Seconds(), s.Kind)
	if s.Worker != "" {
		fmt.Fprintf(&b, " %s", s.Worker)
	}
	if s.Down > 0 {
		fmt.Fprintf(&b, " down %.1fs", s.Down.Seconds())
	}
	if s.Wipe {
		b.WriteString(" wiped")
	}
	return b.String()
}

// Plan is what a schedule is made of: how many steps of each kind, and the
// ranges their random durations are drawn from.
type Plan struct {
	Workers                      int // workers at the start, named w1..wN
	Kills, Terms, Adds, Removes  int
	BrokerStops                  int
	WipeOneIn                    int // a kill-9 restarts with a wiped data dir once in this many (0: never)
	GapMin, GapMax               time.Duration
	DownMin, DownMax             time.Duration
	BrokerDownMin, BrokerDownMax time.Duration
}

// Schedule draws the steps of p from seed: the same seed and plan give the
// same schedule. Steps come in a random order; a remove never leaves fewer
// than one worker running (it becomes an add instead).
func Schedule(seed uint64, p Plan) []Step {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(r.Int64N(int64(hi-lo)))
	}
	var kinds []string
	add := func(k string, n int) {
		for range n {
			kinds = append(kinds, k)
		}
	}
	add(StepKill, p.Kills)
	add(StepTerm, p.Terms)
	add(StepAdd, p.Adds)
	add(StepRemove, p.Removes)
	add(StepBroker, p.BrokerStops)
	r.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	var running []string
	for i := 1; i <= p.Workers; i++ {
		running = append(running, fmt.Sprintf("w%d", i))
	}
	next := p.Workers + 1
	steps := make([]Step, 0, len(kinds))
	for _, k := range kinds {
		s := Step{Kind: k, Gap: between(p.GapMin, p.GapMax)}
		if k == StepRemove && len(running) <= 1 {
			s.Kind = StepAdd
		}
		switch s.Kind {
		case StepKill, StepTerm:
			s.Worker = running[r.IntN(len(running))]
			s.Down = between(p.DownMin, p.DownMax)
			s.Wipe = s.Kind == StepKill && p.WipeOneIn > 0 && r.IntN(p.WipeOneIn) == 0
		case StepAdd:
			s.Worker = fmt.Sprintf("w%d", next)
			next++
			running = append(running, s.Worker)
		case StepRemove:
			i := r.IntN(len(running))
			s.Worker = running[i]
			running = append(running[:i:i], running[i+1:]...)
		case StepBroker:
			s.Down = between(p.BrokerDownMin, p.BrokerDownMax)
		}
		steps = append(steps, s)
	}
	return steps
}
