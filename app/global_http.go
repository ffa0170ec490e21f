package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/table"
)

// ForwardedHeader marks a table query forwarded by another worker; a worker
// never forwards such a query again (no loops while assignments move).
const ForwardedHeader = "X-Runnel-Forwarded"

// TableAnswer is the JSON body of GET /api/tables/{table}/{key}.
type TableAnswer struct {
	Table     string `json:"table"`
	Key       string `json:"key"`
	Partition int32  `json:"partition"`
	// Found is false when the key is absent (status 404).
	Found bool `json:"found"`
	// Value is the decoded value (the value codec's type rendered as JSON).
	Value any `json:"value,omitempty"`
	// Global is set for a global table, served from the local replica;
	// Applied is then the replica's applied changelog offset of the key's
	// partition (its staleness: compare with the changelog's highwater).
	Global  bool   `json:"global,omitempty"`
	Applied *int64 `json:"applied,omitempty"`
	// Owner is the URL of the worker active for the partition, when this
	// worker is not (status 404 with forward=0, or when forwarding failed).
	Owner string `json:"owner,omitempty"`
	Error string `json:"error,omitempty"`
}

// serveTables registers GET /api/tables/{table}/{key} (docs/http-api.md):
//   - a global table is answered from the local replica (docs/tables.md on its
//     staleness);
//   - a plain table is answered locally when this worker is active for the
//     key's partition and has restored it; otherwise the query is forwarded
//     to the owner from the assignment's URL map (at most one hop), or, with
//     ?forward=0, answered 404 with the owner's URL.
//
// The key is the path segment, unescaped: a string key as is, another key type
// as JSON (table.Queryable). Status: 200 found, 404 absent or not owned here,
// 400 bad key, 503 no owner known (a rebalance is under way).
func (w *Worker) serveTables(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/tables/{table}/{key}", func(rw http.ResponseWriter, r *http.Request) {
		name, key := r.PathValue("table"), r.PathValue("key")
		ans := TableAnswer{Table: name, Key: key}
		reply := func(code int) {
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(code)
			_ = json.NewEncoder(rw).Encode(ans)
		}
		var q table.Queryable
		for _, d := range w.app.tables {
			if d.Name() == name {
				q, _ = d.(table.Queryable)
			}
		}
		if q == nil {
			ans.Error = "no such table"
			reply(http.StatusNotFound)
			return
		}
		kb, err := q.QueryKey(key)
		if err != nil {
			ans.Error = err.Error()
			reply(http.StatusBadRequest)
			return
		}
		value := func(b []byte, ok bool, err error) {
			if err != nil {
				ans.Error = err.Error()
				reply(http.StatusInternalServerError)
				return
			}
			if !ok {
				reply(http.StatusNotFound)
				return
			}
			if _, v, err := q.Format(kb, b); err != nil {
				ans.Error = err.Error()
				reply(http.StatusInternalServerError)
				return
			} else {
				ans.Found, ans.Value = true, v
			}
			reply(http.StatusOK)
		}
		if gs := w.GlobalReplica(name); gs != nil {
			ans.Global = true
			ans.Partition = kafka.PartitionFor(kb, gs.Partitions())
			off := gs.Applied(ans.Partition)
			ans.Applied = &off
			value(gs.Lookup(kb))
			return
		}
		t := w.tableByName(name)
		if t == nil {
			ans.Error = "table not running on this worker"
			reply(http.StatusServiceUnavailable)
			return
		}
		p := kafka.PartitionFor(kb, t.parts)
		ans.Partition = p
		if w.servesLocally(name, t.state.Topic(), p) {
			value(t.state.Lookup(p, kb))
			return
		}
		ans.Owner = w.ownerURL(t.state.Topic(), p)
		if ans.Owner == "" {
			ans.Error = "no owner known for the partition (rebalance under way?)"
			reply(http.StatusServiceUnavailable)
			return
		}
		if r.URL.Query().Get("forward") == "0" || r.Header.Get(ForwardedHeader) != "" || ans.Owner == w.cfg.HTTPAddr {
			ans.Error = "partition not active on this worker"
			reply(http.StatusNotFound)
			return
		}
		if err := forwardQuery(rw, r, ans.Owner); err != nil {
			ans.Error = err.Error()
			reply(http.StatusNotFound)
		}
	})
}

// servesLocally reports whether this worker is active for partition p of the
// table and finished restoring it.
func (w *Worker) servesLocally(name, topic string, p int32) bool {
	if !slices.Contains(w.Assignment().Actives[topic], p) || w.parts == nil {
		return false
	}
	w.parts.mu.Lock()
	defer w.parts.mu.Unlock()
	tp := w.parts.parts[restoreKey{name, p}]
	if tp == nil || tp.gate == nil {
		return false
	}
	select {
	case <-tp.gate.done:
		return tp.gate.err == nil
	default:
		return false
	}
}

var forwardClient = &http.Client{Timeout: 5 * time.Second}

// forwardQuery proxies the query to the owner (an HTTP address or URL) and
// copies its answer; an error means nothing was written to rw.
func forwardQuery(rw http.ResponseWriter, r *http.Request, owner string) error {
	base := owner
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("owner URL %q: %w", owner, err)
	}
	u.Path = r.URL.Path
	u.RawPath = r.URL.RawPath
	u.RawQuery = r.URL.RawQuery
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("forward to %s: %w", owner, err)
	}
	req.Header.Set(ForwardedHeader, "1")
	resp, err := forwardClient.Do(req)
	if err != nil {
		return fmt.Errorf("forward to %s: %w", owner, err)
	}
	defer resp.Body.Close()
	rw.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	rw.Header().Set("X-Runnel-Served-By", owner)
	rw.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(rw, resp.Body)
	return nil
}

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
