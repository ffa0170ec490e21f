package app

import (
	"context"
	"errors"
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
// offset. The restore and the marks consult committedOffsets (stable
// offsets), the standby fetchCommitted(ctx, false).

// committedOffsets fetches the group's committed offsets of every partition of
// the app's source topics (OffsetFetch through the group coordinator). A
// partition without a commit maps to 0: the group starts from the earliest
// offset (kafka.NewConfig sets Consumer.Offsets.Initial to OffsetOldest).
//
// The fetch asks for stable offsets (OffsetFetch v7+ RequireStable, KIP-447),
// as Sarama's fetch of a claim's start does under read_committed: a
// partition whose offsets a transaction has committed in it but not yet ended
// answers UNSTABLE_OFFSET_COMMIT, and is asked again until the transaction
// ended or the budget (stableBudget) ran out. Read without it, such a
// partition answers the offset before the transaction whatever the
// transaction's outcome, while the transaction's changelog records may be
// visible by the time a restore reads them: the restore would put them back
// to their before-images although their offsets commit (docs/tables.md).
// The standby's tracker (followOptions) reads without it: an older offset
// only holds records back longer.
func (w *Worker) committedOffsets(ctx context.Context) (map[string]map[int32]int64, error) {
	return w.fetchCommitted(ctx, true)
}

// fetchBudget bounds how long committedOffsets retries: 4 s, and under
// ExactlyOnce, for stable offsets, as long as a transaction that committed
// offsets in the group may stay open: past the transaction timeout the
// broker aborts it (a previous owner that died with it open), plus the time
// the broker takes to notice.
func (w *Worker) fetchBudget(stable bool) time.Duration {
	if !stable || w.cfg.Guarantee != ExactlyOnce {
		return 4 * time.Second
	}
	return w.txnTimeout() + 5*time.Second
}

// fetchCommitted is committedOffsets; stable asks for stable offsets. It
// gives up when ctx ends.
func (w *Worker) fetchCommitted(ctx context.Context, stable bool) (map[string]map[int32]int64, error) {
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
	// A partition answered with an error (a rebalance in progress, a
	// coordinator moving, an unstable offset under KIP-447) must not be read
	// as "nothing committed": that would skip every changelog record derived
	// from it. Retry within the budget, then fail.
	deadline := time.Now().Add(w.fetchBudget(stable))
	var lastErr error
	for attempt := 0; attempt == 0 || time.Now().Before(deadline); attempt++ {
		if attempt > 0 {
			wait := 200 * time.Millisecond
			if errors.Is(lastErr, sarama.ErrUnstableOffsetCommit) {
				wait = 50 * time.Millisecond // a transaction ending: markers follow at once
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("committed offsets of group %s: %w (last error: %w)", w.app.id, ctx.Err(), lastErr)
			case <-time.After(wait):
			}
		}
		var resp *sarama.OffsetFetchResponse
		resp, lastErr = w.offsetFetch(req, stable)
		if lastErr != nil {
			continue
		}
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

// offsetFetch sends one OffsetFetch of partitions to the group's coordinator;
// stable sets RequireStable where the protocol version has it (v7+: Kafka
// 2.5). A coordinator error (top-level or the group's) is returned after the
// coordinator is looked up again.
func (w *Worker) offsetFetch(partitions map[string][]int32, stable bool) (*sarama.OffsetFetchResponse, error) {
	group := w.app.id
	coord, err := w.meta.Coordinator(group)
	if err != nil {
		_ = w.meta.RefreshCoordinator(group)
		return nil, err
	}
	req := sarama.NewOffsetFetchRequest(w.meta.Config().Version, group, partitions)
	req.RequireStable = stable && req.Version >= 7
	resp, err := coord.FetchOffset(req)
	if err == nil {
		if gerr := resp.GroupError(); gerr != sarama.ErrNoError {
			err = gerr
		}
	}
	if err != nil {
		_ = w.meta.RefreshCoordinator(group)
		return nil, err
	}
	return resp, nil
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
		m, err := w.fetchCommitted(ctx, false)
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
