package app

import (
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
)

// derivedURLs caches the partition -> URL map a worker derived from the
// group's description for one generation (Assignment.URLsOmitted).
type derivedURLs struct {
	mu   sync.Mutex // guards the fields below
	gen  int32      // generation of urls; -1 none
	urls map[string]map[int32]string
	last time.Time // last DescribeGroups (at most one per derivedRetry while stale)
}

// derivedRetry is how often a worker describes the group again while its
// description lags the worker's own generation (members still syncing).
const derivedRetry = 200 * time.Millisecond

// ownerURL returns the URL of the worker active for partition p of topic,
// "" when none is known: from the assignment's URL map, or, when the leader
// left the map out of the assignments (Assignment.URLsOmitted: its copies
// would exceed Config.MaxURLMapBytes), from the group's description
// (assignor.URLsFromGroup), derived once per generation. A description of
// another generation (a rebalance under way) gives no owner.
func (w *Worker) ownerURL(topic string, p int32) string {
	a := w.Assignment()
	if !a.URLsOmitted {
		return a.URLs[topic][p]
	}
	d := &w.derived
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.urls != nil && d.gen == a.Generation {
		return d.urls[topic][p]
	}
	if time.Since(d.last) < derivedRetry {
		return ""
	}
	d.last = time.Now()
	urls, gen, err := w.describeURLs()
	if err != nil {
		w.log.Debug("could not derive the URL map from the group", "generation", a.Generation, "err", err)
		return ""
	}
	if gen != a.Generation {
		return ""
	}
	d.urls, d.gen = urls, gen
	return urls[topic][p]
}

// describeURLs describes the worker's group and derives the URL map.
func (w *Worker) describeURLs() (map[string]map[int32]string, int32, error) {
	if w.meta == nil {
		return nil, -1, fmt.Errorf("describe group %s: worker not running", w.app.id)
	}
	w.adminOnce.Do(func() {
		// Shared with committed offsets (tables_committed.go): an admin on
		// the metadata client, never closed.
		w.admin, w.adminErr = sarama.NewClusterAdminFromClient(w.meta)
	})
	if w.adminErr != nil {
		return nil, -1, fmt.Errorf("describe group %s: %w", w.app.id, w.adminErr)
	}
	ds, err := w.admin.DescribeConsumerGroups([]string{w.app.id})
	if err != nil {
		return nil, -1, fmt.Errorf("describe group %s: %w", w.app.id, err)
	}
	if len(ds) == 0 {
		return nil, -1, fmt.Errorf("describe group %s: no description", w.app.id)
	}
	return assignor.URLsFromGroup(ds[0])
}
