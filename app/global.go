package app

import (
	"context"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// globals holds a worker's replicas of the app's global tables and the
// followers that keep them up to date.
//
// Lifecycle (docs/tables.md, "Global tables"): Run opens the replicas, then,
// before joining the group, restores every partition of every global
// changelog to the highwater captured at start (so no agent runs before its
// global tables hold what was there when the worker started; /readyz stays
// 503 meanwhile), then tails every partition until the worker stops. A claim
// of source partition p first waits until the replica of partition p of every
// global table with the source's partition count applied that partition's
// current highwater, so the new owner's read-modify-writes see the previous
// owner's writes. Followers checkpoint with every store batch (data and offset
// in one Pebble batch), so a restart replays only the tail.
type globals struct {
	tables []*globalRuntime

	restored     atomic.Int64 // changelog records applied by the start-up restores
	restoredSpan atomic.Int64 // changelog offsets those restores covered
	ready        atomic.Bool  // every start-up restore finished
}

type globalRuntime struct {
	def   table.Def
	parts int32
	store stores.Store
	state *tablestate.GlobalState
}

// openGlobals opens a store and a replica per declared global table. The
// returned closers (run in reverse) detach the replicas and close the stores;
// they are returned also on error.
func (w *Worker) openGlobals(send tablestate.ChangelogSendFunc) ([]func() error, error) {
	var closers []func() error
	for _, tt := range w.graph.Tables {
		var def table.Def
		var rep tablestate.Replicated
		for _, d := range w.app.tables {
			if g, ok := tablestate.RuntimeOf(d).(tablestate.Replicated); ok && d.Name() == tt.Name {
				def, rep = d, g
			}
		}
		if rep == nil {
			continue
		}
		var st stores.Store
		var err error
		if w.opts.MemoryStores {
			st = stores.NewMemory()
		} else if st, err = stores.OpenPebble(filepath.Join(w.cfg.DataDir, "tables", tt.Name), stores.PebbleOptions{}); err != nil {
			return closers, fmt.Errorf("open store of global table %s: %w", tt.Name, err)
		}
		closers = append(closers, st.Close)
		gs, err := tablestate.NewGlobalState(def, tt.Partitions, st, send)
		if err != nil {
			return closers, err
		}
		nparts := tt.Partitions
		gs.CacheBytes = w.cfg.CacheBytes
		gs.OnFull = func(p int32) { w.tasks.wake(taskKey{nparts, p}) }
		detach := rep.AttachReplica(gs)
		closers = append(closers, func() error { detach(); return nil })
		w.glob.tables = append(w.glob.tables, &globalRuntime{def: def, parts: tt.Partitions, store: st, state: gs})
	}
	return closers, nil
}

// globalStates maps each global table's name to its replica, for tablestate.Env.
func (w *Worker) globalStates() map[string]*tablestate.GlobalState {
	m := map[string]*tablestate.GlobalState{}
	for _, g := range w.glob.tables {
		m[g.def.Name()] = g.state
	}
	return m
}

// globalChangelogs maps each global changelog topic to its partition count
// (assignor.Config.Globals: every member is given every partition).
func (w *Worker) globalChangelogs() map[string]int32 {
	m := map[string]int32{}
	for _, g := range w.glob.tables {
		m[g.state.Topic()] = g.parts
	}
	return m
}

// startGlobals restores every partition of every global table to the
// highwater captured when its restore starts, then leaves a follower tailing
// each partition until ctx ends or stop is called. It returns once every
// restore finished (or the first failed: the error lists all failures). stop
// ends the followers and waits for them; it is returned also on error.
func (w *Worker) startGlobals(ctx context.Context) (stop func() error, err error) {
	ctx, cancel := context.WithCancel(ctx)
	var bg sync.WaitGroup
	var closers []func() error
	stop = func() error {
		cancel()
		bg.Wait()
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			if err := closers[i](); err != nil {
				errs = append(errs, err)
			}
		}
		return joinErrors(errs)
	}
	if len(w.glob.tables) == 0 {
		w.glob.ready.Store(true)
		return stop, nil
	}
	// The followers get their own connections: the worker's client allows one
	// request in flight per broker (Net.MaxOpenRequests = 1, for the
	// producer's ordering), so their fetches would queue behind the group's
	// and the standbys' fetches, each up to Consumer.MaxWaitTime long (measured
	// on kfake: 200-700 ms of lag with the shared client instead of ~one fetch).
	brokers, err := resolveBrokers(w.cfg.Brokers)
	if err != nil {
		return stop, err
	}
	cfg := *w.client.Config()
	cfg.ClientID += "-globals"
	client, err := sarama.NewClient(brokers, &cfg)
	if err != nil {
		return stop, fmt.Errorf("global tables: connect: %w", err)
	}
	closers = append(closers, client.Close)
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return stop, fmt.Errorf("global tables: consumer: %w", err)
	}
	closers = append(closers, consumer.Close)
	restorer := &changelog.Restorer{Client: client, Consumer: consumer, Logger: w.log}
	started := time.Now()
	var mu sync.Mutex
	var errs []error
	var restores sync.WaitGroup
	for _, g := range w.glob.tables {
		for p := range g.parts {
			restores.Add(1)
			bg.Add(1)
			go func() {
				defer bg.Done()
				topic := g.state.Topic()
				res, err := restorer.Restore(ctx, topic, p, g.state.Store())
				restores.Done()
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("global table %s: %w", g.def.Name(), err))
					mu.Unlock()
					return
				}
				w.glob.restored.Add(res.Records)
				w.glob.restoredSpan.Add(res.To - res.Start)
				w.metrics.restored.WithLabelValues(g.def.Name()).Add(float64(res.Records))
				w.log.Debug("global partition restored", "table", g.def.Name(), "partition", p, "records", res.Records,
					"from", res.From, "to", res.To, "rebuilt", res.Rebuilt, "elapsed", res.Elapsed)
				// Follow returns only with an error before ctx ends (a broker
				// or store failure); the replica must keep tailing, so retry.
				for ctx.Err() == nil {
					if err := restorer.Follow(ctx, topic, p, g.state.Store()); err != nil {
						w.log.Warn("global table follower stopped; restarting", "table", g.def.Name(), "partition", p, "err", err)
						select {
						case <-ctx.Done():
						case <-time.After(time.Second):
						}
					}
				}
			}()
		}
	}
	done := make(chan struct{})
	go func() { restores.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return stop, ctx.Err()
	}
	mu.Lock()
	defer mu.Unlock()
	if err := joinErrors(errs); err != nil {
		return stop, err
	}
	w.glob.ready.Store(true)
	w.log.Info("global tables restored", "tables", len(w.glob.tables), "records", w.glob.restored.Load(),
		"span", w.glob.restoredSpan.Load(), "elapsed", time.Since(started))
	return stop, nil
}

// globalsCatchUp waits until partition p of every global table with parts
// partitions (the claimed source topic's count) applied the changelog up to
// its current highwater: the claim's agents may then read-modify-write the
// partition's keys on top of every write of the previous owner (which drained
// before it released the partition). Global changelogs carry no transactions,
// so the record before the highwater is a data record the follower applies.
func (w *Worker) globalsCatchUp(ctx context.Context, parts, p int32) error {
	for _, g := range w.glob.tables {
		if g.parts != parts {
			continue
		}
		topic := g.state.Topic()
		end, err := w.meta.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("global table %s[%d]: highwater: %w", g.def.Name(), p, err)
		}
		oldest, err := w.meta.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("global table %s[%d]: log start offset: %w", g.def.Name(), p, err)
		}
		if end <= oldest {
			continue // empty partition: nothing to wait for
		}
		if err := g.state.WaitApplied(ctx, p, end-1); err != nil {
			return err
		}
	}
	return nil
}

// checkGlobals warns when an assignment does not give this member every
// partition of its global changelogs (a leader running a build that does not
// know the table): the worker follows them anyway.
func (w *Worker) checkGlobals(a assignor.Assignment) {
	for _, g := range w.glob.tables {
		if got := a.Globals[g.state.Topic()]; len(got) != int(g.parts) {
			w.log.Warn("assignment lacks global changelog partitions; following all of them regardless",
				"table", g.def.Name(), "topic", g.state.Topic(), "assigned", got, "partitions", g.parts)
		}
	}
}

// globalReplica returns this worker's replica of the named global table (nil
// if there is none), for tests and the status page.
func (w *Worker) globalReplica(name string) *tablestate.GlobalState {
	for _, g := range w.glob.tables {
		if g.def.Name() == name {
			return g.state
		}
	}
	return nil
}

// GlobalRestored returns how many changelog records the worker's start-up
// restores of global tables applied, and the offset span they covered (end
// minus start offset, summed over partitions).
func (w *Worker) GlobalRestored() (records, span int64) {
	return w.glob.restored.Load(), w.glob.restoredSpan.Load()
}

// GlobalsReady reports whether the start-up restore of every global table
// finished.
func (w *Worker) GlobalsReady() bool { return w.glob.ready.Load() }

func isGlobal(d table.Def) bool {
	_, ok := tablestate.RuntimeOf(d).(tablestate.Replicated)
	return ok
}
