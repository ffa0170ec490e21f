package assignor

import (
	"context"
	"slices"
	"time"
)

// CaughtUpWarmups returns the warm-up partitions (topic -> sorted partitions)
// that now qualify for an active by the rule the leader applies (KIP-441):
// lag = highwater - (applied + 1) <= acceptableLag, where offsets maps
// changelog topic -> partition -> the offset of the last record applied to
// the local store (absent: none, -1) and endOffsets maps topic -> partition
// -> highwater (absent: unknown, not caught up). acceptableLag 0 means
// DefaultAcceptableRecoveryLag, a negative value 0 (as in Cluster). The
// result is empty when nothing qualifies.
func CaughtUpWarmups(warmups map[string][]int32, offsets, endOffsets map[string]map[int32]int64, acceptableLag int64) map[string][]int32 {
	if acceptableLag == 0 {
		acceptableLag = DefaultAcceptableRecoveryLag
	} else if acceptableLag < 0 {
		acceptableLag = 0
	}
	out := map[string][]int32{}
	for _, t := range sortedKeys(warmups) {
		for _, p := range warmups[t] {
			end, ok := endOffsets[t][p]
			if !ok {
				continue
			}
			applied, ok := offsets[t][p]
			if !ok {
				applied = -1
			}
			if end-(applied+1) <= acceptableLag {
				out[t] = append(out[t], p)
			}
		}
		slices.Sort(out[t])
	}
	return out
}

// CheckWarmups is the member side of KIP-441's follow-up rebalance: when a
// warm-up of this member's current assignment has caught up (CaughtUpWarmups
// with Config.Offsets, Config.EndOffsets and Config.AcceptableRecoveryLag),
// it signals ProbeRequested at once instead of leaving the active on the
// caught-up member until the leader's probing timer fires
// (Config.ProbingRebalanceInterval, 10 minutes by default). It signals at
// most once per generation and reports whether it did. Without warm-ups,
// Offsets or EndOffsets it does nothing.
func (s *Strategy) CheckWarmups() bool {
	s.mu.Lock()
	cur := s.cur
	done := s.warmSignalled == cur.Generation
	s.mu.Unlock()
	if done || len(cur.Warmups) == 0 || s.cfg.Offsets == nil || s.cfg.EndOffsets == nil {
		return false
	}
	topics := map[string]int32{}
	for t := range cur.Warmups {
		if n, ok := s.cfg.Changelogs[t]; ok {
			topics[t] = n
		}
	}
	if len(topics) == 0 {
		return false
	}
	ready := CaughtUpWarmups(cur.Warmups, s.cfg.Offsets(), s.cfg.EndOffsets(topics), s.cfg.AcceptableRecoveryLag)
	if len(ready) == 0 {
		return false
	}
	s.mu.Lock()
	if s.warmSignalled == s.cur.Generation || s.cur.Generation != cur.Generation {
		s.mu.Unlock()
		return false
	}
	s.warmSignalled = cur.Generation
	s.mu.Unlock()
	s.log.Info("runnel assignor: warm-up caught up; requesting a rebalance", "generation", cur.Generation, "warmups", ready)
	s.requestProbe()
	return true
}

// WatchWarmups calls CheckWarmups every interval until ctx is done; it
// returns when ctx is done. Run it in a goroutine tied to the worker's
// context (interval: a second or two; the scale-out target of issue #13 is
// the restore time + 5 s).
func (s *Strategy) WatchWarmups(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.CheckWarmups()
		}
	}
}
