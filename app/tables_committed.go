package app

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
)

// Consistency of tables with committed source offsets (docs/tables.md): every
// changelog record carries the source record it came from; a restore skips the
// records whose source offset the group has not committed (they will be
// produced again when the source record is reprocessed), and a standby holds
// them back until the commit. Each store partition also keeps source-offset
// marks (the highest source offset whose effect it holds, per source
// partition); a restore wipes a partition whose marks reach a committed
// offset. committedOffsets is what all three consult.

// committedOffsets fetches the group's committed offsets of every partition of
// the app's source topics (OffsetFetch through the group coordinator). A
// partition without a commit maps to 0: the group starts from the earliest
// offset (kafka.NewConfig sets Consumer.Offsets.Initial to OffsetOldest).
func (w *Worker) committedOffsets() (map[string]map[int32]int64, error) {
	req := map[string][]int32{}
	for _, topic := range w.graph.Subscriptions() {
		t, ok := w.graph.Topic(topic)
		if !ok {
			continue
		}
		for p := int32(0); p < t.Partitions; p++ {
			req[topic] = append(req[topic], p)
		}
	}
	out := map[string]map[int32]int64{}
	if len(req) == 0 {
		return out, nil
	}
	w.adminOnce.Do(func() {
		// An admin built from the worker's metadata client shares it; it is
		// never closed (closing it would close the client).
		w.admin, w.adminErr = sarama.NewClusterAdminFromClient(w.meta)
	})
	if w.adminErr != nil {
		return nil, fmt.Errorf("committed offsets: %w", w.adminErr)
	}
	// A partition answered with an error (a rebalance in progress, an unstable
	// offset under KIP-447) must not be read as "nothing committed": that would
	// skip every changelog record derived from it. Retry, then fail.
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		resp, err := w.admin.ListConsumerGroupOffsets(w.app.id, req)
		if err != nil {
			lastErr = err
			continue
		}
		if resp.Err != sarama.ErrNoError {
			lastErr = resp.Err
			continue
		}
		lastErr = nil
		for topic, ps := range req {
			m := map[int32]int64{}
			for _, p := range ps {
				b := resp.GetBlock(topic, p)
				switch {
				case b == nil:
					lastErr = fmt.Errorf("%s[%d]: no answer", topic, p)
				case b.Err != sarama.ErrNoError:
					lastErr = fmt.Errorf("%s[%d]: %w", topic, p, b.Err)
				case b.Offset >= 0:
					m[p] = b.Offset
				default:
					m[p] = 0
				}
			}
			out[topic] = m
		}
		if lastErr == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("committed offsets of group %s: %w", w.app.id, lastErr)
}

// committedFunc turns a committed-offsets map into a changelog.CommittedFunc:
// topics not in m are untracked.
func committedFunc(m map[string]map[int32]int64) changelog.CommittedFunc {
	return func(topic string, p int32) (int64, bool) {
		tm, ok := m[topic]
		if !ok {
			return 0, false
		}
		return tm[p], true
	}
}

// committedTracker keeps the group's committed offsets fresh for standbys,
// refreshing them every interval until its context ends.
type committedTracker struct {
	mu sync.Mutex
	m  map[string]map[int32]int64 // latest fetch; guarded by mu
}

// followOptions starts a tracker tied to ctx and returns the options of a
// standby Follow: hold back records of uncommitted source offsets.
func (w *Worker) followOptions(ctx context.Context, wg *sync.WaitGroup) []changelog.Option {
	tr := &committedTracker{}
	refresh := func() {
		m, err := w.committedOffsets()
		if err != nil {
			w.log.Warn("standby: fetching committed offsets failed", "err", err)
			return
		}
		tr.mu.Lock()
		tr.m = m
		tr.mu.Unlock()
	}
	interval := min(max(w.cfg.CommitInterval/2, 100*time.Millisecond), 2*time.Second)
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The first fetch runs here, not in the caller, which holds the
		// table-partition lock inside assignment handling; until it answers,
		// every stamped record is held back.
		refresh()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				refresh()
			}
		}
	}()
	return []changelog.Option{changelog.SkipUncommitted(func(topic string, p int32) (int64, bool) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.m == nil {
			// Nothing fetched yet: hold every stamped record back.
			return 0, true
		}
		return committedFunc(tr.m)(topic, p)
	})}
}
