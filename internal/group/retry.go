package group

import (
	"sync"
	"sync/atomic"
)

// Attempts counts failed deliveries per record across sessions: a failure
// ends the member's session (app's partition.run), so the count must outlive the claim.
type Attempts struct {
	// n counts the tracked offsets of every partition (written under mu):
	// while it is 0, Get and Forget, called for every resolved record, skip
	// the lock and the map.
	n  atomic.Int64
	mu sync.Mutex
	m  map[string]map[int64]int // partition key -> offset -> failed deliveries; guarded by mu
}

// Add counts one more failed delivery of offset of partition key and
// returns the count.
func (a *Attempts) Add(key string, offset int64) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]map[int64]int{}
	}
	if a.m[key] == nil {
		a.m[key] = map[int64]int{}
	}
	if a.m[key][offset] == 0 {
		a.n.Add(1)
	}
	a.m[key][offset]++
	return a.m[key][offset]
}

// Get returns the failed deliveries counted for offset of partition key.
func (a *Attempts) Get(key string, offset int64) int {
	if a.n.Load() == 0 {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.m[key][offset]
}

// Forget drops the count of offset of partition key (the record resolved).
func (a *Attempts) Forget(key string, offset int64) {
	if a.n.Load() == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.m[key][offset]; ok {
		delete(a.m[key], offset)
		a.n.Add(-1)
	}
}
