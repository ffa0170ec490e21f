package app

import (
	"context"
	"sync"
	"time"
)

// The status page's rates (records/s beside the totals) come from samples
// of the worker's counters taken by the worker once per rateInterval, kept
// over rateWindow: a rate is the counter's increase between the oldest and
// the newest sample divided by the time between them. They do not depend on
// how often, or whether, anyone looks at the page.
const (
	rateInterval = time.Second
	rateWindow   = 10 * time.Second
)

// counterSample is the worker's counters at one instant.
type counterSample struct {
	at                               time.Time
	processed, retried, deadLettered int64
	handed                           map[taskKey]int64 // records handed out per task (TaskStatus.Handed)
}

// rateSampler keeps the samples of the last rateWindow.
type rateSampler struct {
	mu      sync.Mutex
	samples []counterSample // oldest first; newest.at - oldest.at <= window; guarded by mu
}

// rates are the counters' rates over the sampled window.
type rates struct {
	window                           time.Duration // newest.at - oldest.at; 0 with fewer than two samples
	processed, retried, deadLettered float64
	handed                           map[taskKey]float64
}

// add appends s (its at after every sample's) and drops the samples older
// than window before it.
func (r *rateSampler) add(s counterSample, window time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.samples = append(r.samples, s)
	drop := 0
	for drop < len(r.samples)-1 && s.at.Sub(r.samples[drop].at) > window {
		drop++
	}
	r.samples = r.samples[drop:]
}

// rates returns the rates between the oldest and the newest sample. A
// task's rate counts from the oldest sample after which it ran without
// starting again: a sample without the task, or with a count above the next
// one's, was taken before the task (re)started from 0, so the rate counts
// from 0 at that sample.
func (r *rateSampler) rates() rates {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := rates{handed: map[taskKey]float64{}}
	if len(r.samples) < 2 {
		return out
	}
	first, last := r.samples[0], r.samples[len(r.samples)-1]
	out.window = last.at.Sub(first.at)
	if out.window <= 0 {
		return rates{handed: out.handed}
	}
	per := func(d int64, w time.Duration) float64 { return float64(max(d, 0)) / w.Seconds() }
	out.processed = per(last.processed-first.processed, out.window)
	out.retried = per(last.retried-first.retried, out.window)
	out.deadLettered = per(last.deadLettered-first.deadLettered, out.window)
	for k, n := range last.handed {
		from, since := n, last.at
		for i := len(r.samples) - 2; i >= 0; i-- {
			m, ok := r.samples[i].handed[k]
			if !ok || m > from {
				// The task started (again) after sample i, counting from 0.
				from, since = 0, r.samples[i].at
				break
			}
			from, since = m, r.samples[i].at
		}
		if d := last.at.Sub(since); d > 0 {
			out.handed[k] = per(n-from, d)
		}
	}
	return out
}

// sampleRates samples the worker's counters every rateInterval until ctx
// ends (started by Run).
func (w *Worker) sampleRates(ctx context.Context) {
	t := time.NewTicker(rateInterval)
	defer t.Stop()
	w.rates.add(w.counterSample(time.Now()), rateWindow)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			w.rates.add(w.counterSample(now), rateWindow)
		}
	}
}

// counterSample reads the worker's counters.
func (w *Worker) counterSample(now time.Time) counterSample {
	return counterSample{at: now, processed: w.Processed(), retried: w.Retried(), deadLettered: w.DeadLettered(),
		handed: w.tasks.handedByTask()}
}
