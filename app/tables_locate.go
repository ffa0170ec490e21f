package app

import (
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"net/http"
	"sort"

	keypart "github.com/runnel-dev/runnel/partition"
	"github.com/runnel-dev/runnel/table"
)

// TableError is a table request the worker refuses for what the request
// says (an unknown table, a key the codec cannot parse, a bad option), as
// Locate and the scans return it: Status is the HTTP status it is answered
// with (400 or 404, 500 for an internal failure), Reason one of the Reason*
// values.
type TableError struct {
	Status int
	Reason string
	Err    error
}

func (e *TableError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *TableError) Unwrap() error { return e.Err }

func tableErr(status int, reason string, format string, args ...any) *TableError {
	return &TableError{Status: status, Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Replica is a copy of a table partition other than the active
// (Location.Standbys): the URL of the worker holding it, its role (standby
// or warmup) and its lag in changelog records behind the changelog's end,
// nil when unknown.
type Replica struct {
	URL  string `json:"url"`
	Role string `json:"role"`
	Lag  *int64 `json:"lag,omitempty"`
}

// Location is where a key of a table lives (GET /api/locate/{table}/{key},
// Worker.Locate), as the worker asked sees it.
type Location struct {
	Table string `json:"table"`
	Key   string `json:"key"`
	// Partition is the key's partition: the table's partitioner (murmur2 of
	// the encoded key, partition.For) over Partitions.
	Partition int32 `json:"partition"`
	// Partitions is the partition count of the table's changelog from the
	// topic metadata (the declared count for a worker not running), never
	// inferred from the owner map.
	Partitions int32 `json:"partitions"`
	// Changelog is the table's changelog topic (the key of the table in
	// /api/assignment's urls).
	Changelog string `json:"changelog"`
	// Generation is the assignment generation of the worker asked.
	Generation int32 `json:"generation"`
	// Global is set for a global table: every worker holds all of it, and
	// Active is empty.
	Global bool `json:"global,omitempty"`
	// Active is the URL (HTTP address) of the worker active for the
	// partition, "" when none is known (a rebalance is under way).
	Active string `json:"active,omitempty"`
	// Role is what the worker asked holds of the partition (Role*); Self
	// its URL.
	Role string `json:"role"`
	Self string `json:"self"`
	// Standbys are the copies known to the worker asked: its own standby or
	// warm-up, with its lag when the broker answered. Other workers'
	// standbys are not in the assignment's URL map.
	Standbys []Replica `json:"standbys"`
}

// Locate returns where key lives in the table named name: its partition
// from the table's partitioner and the changelog's partition count in the
// topic metadata, the active's URL, the standbys this worker knows of and
// the assignment generation. A windowed table's key is located by the key
// alone (its windows share the key's partition). Errors are *TableError: an
// unknown table (404, ReasonUnknownTable), a key the codec cannot parse
// (400, ReasonBadKey), the topic metadata unavailable (500, ReasonInternal).
func (w *Worker) Locate(name, key string) (Location, error) {
	a := w.Assignment()
	loc := Location{Table: name, Key: key, Generation: a.Generation, Self: w.cfg.HTTPAddr, Standbys: []Replica{}}
	def, encode, err := w.keyEncoder(name)
	if err != nil {
		return loc, err
	}
	kb, err := encode(key)
	if err != nil {
		return loc, tableErr(http.StatusBadRequest, ReasonBadKey, "locate %s/%s: %w", name, key, err)
	}
	loc.Changelog = def.Changelog()
	if gs := w.globalReplica(name); gs != nil {
		loc.Global, loc.Role, loc.Partitions = true, RoleGlobal, gs.Partitions()
		loc.Partition = keypart.For(kb, loc.Partitions)
		return loc, nil
	}
	t := w.tableByName(name)
	if t == nil {
		return loc, tableErr(http.StatusInternalServerError, ReasonInternal, "locate %s/%s: table %s is not run by this worker", name, key, name)
	}
	if loc.Partitions, err = w.changelogPartitions(t); err != nil {
		return loc, &TableError{Status: http.StatusInternalServerError, Reason: ReasonInternal, Err: fmt.Errorf("locate %s/%s: %w", name, key, err)}
	}
	loc.Changelog = t.state.Topic()
	loc.Partition = keypart.For(kb, loc.Partitions)
	st := w.partState(t, a, loc.Partition)
	loc.Role = st.role
	switch st.role {
	case RoleActive, RoleRestoring:
		loc.Active = w.cfg.HTTPAddr
	case RolePending:
		// Withheld until its owner revoked it: no owner to name.
	default:
		if o := w.ownerURL(loc.Changelog, loc.Partition); o != w.cfg.HTTPAddr {
			loc.Active = o
		}
	}
	if st.role == RoleStandby || st.role == RoleWarmup {
		r := Replica{URL: w.cfg.HTTPAddr, Role: st.role}
		if cl, err := w.copyLagOf(t, loc.Partition); err == nil {
			lag := cl.lag()
			r.Lag = &lag
		}
		loc.Standbys = append(loc.Standbys, r)
	}
	return loc, nil
}

// queryable returns the declaration of the table named name if it can be
// read by key; the error is a *TableError.
func (w *Worker) queryable(name string) (tablestate.Queryable, error) {
	for _, d := range w.app.tables {
		if d.Name() != name {
			continue
		}
		qr, ok := d.(tablestate.Queryable)
		if !ok {
			return nil, tableErr(http.StatusBadRequest, ReasonBadRequest, "table %s is windowed: it is not scanned; list a key's windows with GET /api/tables/%s/{key}/windows", name, name)
		}
		return qr, nil
	}
	return nil, tableErr(http.StatusNotFound, ReasonUnknownTable, "no table %q in app %s", name, w.app.id)
}

// keyEncoder returns the declaration of the table named name and how its
// keys are encoded from their URL form (Queryable.QueryKey, or the table key
// of a windowed table, WindowQuerier.WindowKey); the error is a *TableError
// (404 unknown table).
func (w *Worker) keyEncoder(name string) (table.Def, func(string) ([]byte, error), error) {
	for _, d := range w.app.tables {
		if d.Name() != name {
			continue
		}
		if x, ok := d.(tablestate.Queryable); ok {
			return d, x.QueryKey, nil
		}
		if x, ok := tablestate.RuntimeOf(d).(tablestate.WindowQuerier); ok {
			return d, x.WindowKey, nil
		}
		return nil, nil, tableErr(http.StatusBadRequest, ReasonBadRequest, "table %s cannot be read by key over HTTP", name)
	}
	return nil, nil, tableErr(http.StatusNotFound, ReasonUnknownTable, "no table %q in app %s", name, w.app.id)
}

// TableInfo describes one table of the app (GET /api/tables): what a client
// needs to compute a key's partition itself.
type TableInfo struct {
	Name string `json:"name"`
	// Changelog is the changelog topic, the table's key in the URL map of
	// /api/assignment.
	Changelog string `json:"changelog"`
	// Partitions is the changelog's partition count (topic metadata), 0
	// when unknown (the worker has no metadata for it yet).
	Partitions int32 `json:"partitions"`
	// Global is set for a global table (every worker answers every key);
	// Windowed for a windowed table (read by key and time range,
	// GET /api/tables/{table}/{key}/windows).
	Global   bool `json:"global,omitempty"`
	Windowed bool `json:"windowed,omitempty"`
	// TextKeys is set when a key's encoded bytes are its text as it appears
	// in a URL path (a string key codec), so a client computes the
	// partition as keypart.For([]byte(key), partitions).
	TextKeys   bool   `json:"text_keys"`
	KeyCodec   string `json:"key_codec"`
	ValueCodec string `json:"value_codec"`
}

// textKeyProbe is a key no JSON parser accepts: a codec whose QueryKey gives
// back its bytes takes the text of a key as its encoding.
const textKeyProbe = `{"runnel-probe ü`

// Tables describes the app's tables, sorted by name.
func (w *Worker) Tables() []TableInfo {
	out := []TableInfo{}
	for _, d := range w.app.tables {
		ti := TableInfo{Name: d.Name(), Changelog: d.Changelog(), KeyCodec: d.KeyCodec(), ValueCodec: d.ValueCodec()}
		_, ti.Windowed = tablestate.RuntimeOf(d).(tablestate.WindowQuerier)
		if _, encode, err := w.keyEncoder(d.Name()); err == nil {
			kb, err := encode(textKeyProbe)
			ti.TextKeys = err == nil && string(kb) == textKeyProbe
		}
		if gs := w.globalReplica(d.Name()); gs != nil {
			ti.Global, ti.Partitions = true, gs.Partitions()
		} else if t := w.tableByName(d.Name()); t != nil {
			ti.Changelog = t.state.Topic()
			if n, err := w.changelogPartitions(t); err == nil {
				ti.Partitions = n
			}
		}
		out = append(out, ti)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// locateAnswer is the body of GET /api/locate/{table}/{key}: the location,
// or the refusal's reason and error.
type locateAnswer struct {
	Location
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// serveLocate registers GET /api/locate/{table}/{key} and GET /api/tables.
func (w *Worker) serveLocate(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/locate/{table}/{key}", func(rw http.ResponseWriter, r *http.Request) {
		loc, err := w.Locate(r.PathValue("table"), r.PathValue("key"))
		ans := locateAnswer{Location: loc}
		code := http.StatusOK
		if err != nil {
			var te *TableError
			if !errors.As(err, &te) {
				te = &TableError{Status: http.StatusInternalServerError, Reason: ReasonInternal, Err: err}
			}
			code, ans.Reason, ans.Error = te.Status, te.Reason, te.Error()
		}
		rw.Header().Set(GenerationHeader, fmt.Sprint(loc.Generation))
		writeJSONStatus(rw, code, ans)
	})
	mux.HandleFunc("GET /api/tables", func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set(GenerationHeader, fmt.Sprint(w.Assignment().Generation))
		writeJSONStatus(rw, http.StatusOK, w.Tables())
	})
}
