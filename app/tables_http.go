package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

// Headers of GET /api/tables/{table}/{key} (docs/tables.md, "Querying tables
// over HTTP"). Every answer carries the generation; every answer about a
// partition carries the partition and this worker's role for it; an answer
// from a copy (any role) carries its lag.
const (
	// PartitionHeader is the key's partition (the table's partitioner, the
	// changelog's partition count from topic metadata).
	PartitionHeader = "Runnel-Partition"
	// GenerationHeader is the assignment generation of the worker that
	// answered.
	GenerationHeader = "Runnel-Generation"
	// RoleHeader is what the answering worker holds of the partition: one of
	// the Role* values.
	RoleHeader = "Runnel-Role"
	// LagHeader is how many changelog offsets the copy that answered is
	// behind the changelog's end (0 for the active).
	LagHeader = "Runnel-Lag"
	// HopsHeader counts the forwards a query went through. A worker forwards
	// a query only while it is below MaxHops, so two workers whose views of
	// the assignment disagree never bounce a query between them.
	HopsHeader = "Runnel-Hops"
	// ForwardedHeader is the hop marker of earlier versions; a query that
	// carries it is treated as having used its hop.
	ForwardedHeader = "X-Runnel-Forwarded"
	// ServedByHeader names the worker a forwarded answer came from.
	ServedByHeader = "X-Runnel-Served-By"
)

// MaxHops is how many times a table query is forwarded at most: once, from
// the worker asked to the owner in its view of the assignment.
const MaxHops = 1

// Roles of a worker for a table partition (RoleHeader, TableAnswer.Role).
const (
	RoleActive    = "active"    // active here and restored: answers are current
	RoleRestoring = "restoring" // active here, restore not finished (or not started)
	RoleStandby   = "standby"   // a standby replica follows the changelog here
	RoleWarmup    = "warmup"    // a warm-up replica (to take the active once caught up)
	RolePending   = "pending"   // planned active here, withheld until its owner revoked it
	RoleNone      = "none"      // no copy here
	RoleGlobal    = "global"    // a global table's local replica
)

// Reasons of an answer that is not a value or a true "absent"
// (TableAnswer.Reason). Callers branch on them; the status code goes with the
// reason as listed.
const (
	// ReasonRestoring: 503, the partition is active here and its store is
	// being restored (TableAnswer.Restore has the progress when known).
	ReasonRestoring = "restoring"
	// ReasonRebalancing: 503, no owner of the partition is known (a
	// rebalance is under way, or the assignment here is older than the
	// owner map).
	ReasonRebalancing = "rebalancing"
	// ReasonNotOwner: 503, this worker is not active for the partition and
	// does not forward (?forward=0, or the query used its hop); 502, the
	// forward to the owner failed (unreachable, timed out). Owner names the
	// owner as this worker knows it.
	ReasonNotOwner = "not-owner"
	// ReasonStaleBeyondBound: 503, with consistency=any the only copy that
	// could answer is more than maxLag behind and the active cannot be asked.
	ReasonStaleBeyondBound = "stale-beyond-bound"
	// ReasonUnknownTable: 404, the app declares no table of that name.
	ReasonUnknownTable = "unknown-table"
	// ReasonBadKey: 400, the key codec cannot parse the key.
	ReasonBadKey = "bad-key"
	// ReasonBadRequest: 400, a bad consistency or maxLag, or a table that
	// cannot be read by key.
	ReasonBadRequest = "bad-request"
	// ReasonInternal: 500, a store read or decode failed.
	ReasonInternal = "internal"
)

// Consistency levels of a query (?consistency=).
const (
	ConsistencyActive = "active" // only the active answers (default)
	ConsistencyAny    = "any"    // a standby or restoring copy within maxLag may answer
)

// TableAnswer is the JSON body of GET /api/tables/{table}/{key}.
type TableAnswer struct {
	Table     string `json:"table"`
	Key       string `json:"key"`
	Partition int32  `json:"partition"`
	// Generation is the assignment generation of the worker that answered.
	Generation int32 `json:"generation"`
	// Role is what the answering worker holds of the partition (Role*).
	Role string `json:"role,omitempty"`
	// Found is true when the key has a value (200). It is false with no
	// Reason only when the key is absent from the copy that answered (404):
	// the active, or a copy at most Lag behind under consistency=any.
	Found bool `json:"found"`
	// Value is the decoded value (the value codec's type rendered as JSON).
	Value any `json:"value,omitempty"`
	// Lag is the answering copy's distance to the changelog's end in
	// offsets (0 for the active); set when a copy answered or was refused
	// (stale-beyond-bound).
	Lag *int64 `json:"lag,omitempty"`
	// Global is set for a global table, served from the local replica;
	// Applied is then the replica's applied changelog offset of the key's
	// partition (its staleness: compare with the changelog's highwater).
	Global  bool   `json:"global,omitempty"`
	Applied *int64 `json:"applied,omitempty"`
	// Owner is the URL of the worker active for the partition, when this
	// worker is not and did not forward (or forwarding failed).
	Owner string `json:"owner,omitempty"`
	// Reason is the typed reason of a refusal (Reason*); Error says more.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	// RetryAfter is the Retry-After header's value in seconds, on a
	// retryable refusal.
	RetryAfter int `json:"retry_after_s,omitempty"`
	// Restore is the progress of the partition's restore here (reason
	// restoring, or a restoring copy that answered).
	Restore *RestoreProgress `json:"restore,omitempty"`
	// Position is set on a read with a position bound (?position=): per
	// bound entry of the key's partition, "topic:partition:offset" with the
	// highest source offset whose effect the answering copy shows (-1: none
	// known), the bound's syntax. On a ReasonPositionNotReached refusal it
	// says how far the copy got.
	Position string `json:"position,omitempty"`
	// Windows are the key's windows in the asked range, ascending by start
	// (GET /api/tables/{table}/{key}/windows; absent when there are none,
	// Found then false). More is set when windows of the range were left
	// out past the limit: ask again from the last start + 1 ms.
	Windows []WindowItem `json:"windows,omitempty"`
	More    bool         `json:"more,omitempty"`
}

// WindowItem is one window of a windowed lookup: [Start, End) in UTC and the
// decoded value.
type WindowItem struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Value any       `json:"value"`
}

// RestoreProgress is how far a table partition's local copy is: RestoredOffset
// is the offset after the last changelog record applied to the store, EndOffset
// the changelog's end (highwater) when asked. Rate and ETA come from the
// restore's latest progress report, when one runs.
type RestoreProgress struct {
	RestoredOffset int64   `json:"restored_offset"`
	EndOffset      int64   `json:"end_offset"`
	Remaining      int64   `json:"remaining"`
	Rate           float64 `json:"records_per_second,omitempty"`
	ETAMS          float64 `json:"eta_ms,omitempty"`
}

// queryParams are a query's options
// (?consistency=&maxLag=&forward=&position=&wait=).
type queryParams struct {
	consistency string
	maxLag      int64 // with ConsistencyAny; -1 otherwise
	forward     bool
	hops        int
	// position is the read-your-writes bound (every entry, all partitions);
	// wait how long a read waits for it (DefaultPositionWait unless given).
	position []SourcePosition
	wait     time.Duration
}

func parseQueryParams(r *http.Request) (queryParams, error) {
	q := r.URL.Query()
	qp := queryParams{consistency: ConsistencyActive, maxLag: -1, forward: q.Get("forward") != "0"}
	switch c := q.Get("consistency"); c {
	case "", ConsistencyActive:
	case ConsistencyAny:
		qp.consistency = ConsistencyAny
	default:
		return qp, fmt.Errorf("consistency %q: want %s or %s", c, ConsistencyActive, ConsistencyAny)
	}
	if s, ok := q["maxLag"]; ok {
		if qp.consistency != ConsistencyAny {
			return qp, errors.New("maxLag applies to consistency=any only")
		}
		n, err := strconv.ParseInt(s[0], 10, 64)
		if err != nil || n < 0 {
			return qp, fmt.Errorf("maxLag %q: want a number of records >= 0", s[0])
		}
		qp.maxLag = n
	} else if qp.consistency == ConsistencyAny {
		// No default bound: an unbounded read of a copy that has not
		// caught up would answer "absent" for keys that exist.
		return qp, errors.New("consistency=any needs maxLag=N (changelog records the copy may be behind)")
	}
	if err := parsePositionParams(q, &qp); err != nil {
		return qp, err
	}
	if h := r.Header.Get(HopsHeader); h != "" {
		n, err := strconv.Atoi(h)
		if err != nil || n < 0 {
			return qp, fmt.Errorf("%s %q: want a count >= 0", HopsHeader, h)
		}
		qp.hops = n
	}
	if r.Header.Get(ForwardedHeader) != "" {
		qp.hops = max(qp.hops, MaxHops)
	}
	return qp, nil
}

// tableQuery is one GET /api/tables/{table}/{key} (or …/{key}/windows)
// being answered.
type tableQuery struct {
	w   *Worker
	rw  http.ResponseWriter
	r   *http.Request
	ans TableAnswer
	// windows is set for a windowed lookup.
	windows bool
	// read reads the key from partition p of st (set by serve for a point
	// read or a windowed lookup); answer answers what it read, or err.
	read   func(st *tablestate.State, p int32) error
	answer func(err error)
}

func (q *tableQuery) reply(code int) {
	h := q.rw.Header()
	h.Set("Content-Type", "application/json")
	h.Set(GenerationHeader, strconv.Itoa(int(q.ans.Generation)))
	if q.ans.Role != "" {
		h.Set(PartitionHeader, strconv.Itoa(int(q.ans.Partition)))
		h.Set(RoleHeader, q.ans.Role)
	}
	if q.ans.Lag != nil {
		h.Set(LagHeader, strconv.FormatInt(*q.ans.Lag, 10))
	}
	if q.ans.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(q.ans.RetryAfter))
	}
	q.rw.WriteHeader(code)
	_ = json.NewEncoder(q.rw).Encode(q.ans)
}

// refuse answers code with a typed reason; retryAfter > 0 sets Retry-After.
func (q *tableQuery) refuse(code int, reason string, retryAfter int, err string) {
	q.ans.Reason, q.ans.Error, q.ans.RetryAfter = reason, err, retryAfter
	q.reply(code)
}

// value answers the result of a read: 200 with the value, or 404 (absent,
// no reason) when ok is false.
func (q *tableQuery) value(fm table.Def, kb, b []byte, ok bool, err error) {
	if err != nil {
		q.refuse(http.StatusInternalServerError, ReasonInternal, 0, err.Error())
		return
	}
	if !ok {
		q.reply(http.StatusNotFound)
		return
	}
	_, v, err := fm.Format(kb, b)
	if err != nil {
		q.refuse(http.StatusInternalServerError, ReasonInternal, 0, err.Error())
		return
	}
	q.ans.Found, q.ans.Value = true, v
	q.reply(http.StatusOK)
}

// serveTables registers GET /api/tables/{table}/{key} (docs/tables.md,
// "Querying tables over HTTP"). A query is answered "absent" (404 with
// found=false and no reason) only by a copy entitled to say so: the restored
// active, or under consistency=any a copy at most maxLag changelog records
// behind. Every other case a key may exist in is a typed, retryable refusal
// (Reason*), never a 404.
//
//   - a global table is answered from the local replica;
//   - a plain table is answered locally when this worker is active for the
//     key's partition and restored it; with consistency=any also from a
//     local standby, warm-up or restoring copy within maxLag; otherwise the
//     query is forwarded to the owner (at most MaxHops hops), unless
//     ?forward=0.
func (w *Worker) serveTables(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/tables/{table}/{key}", func(rw http.ResponseWriter, r *http.Request) {
		q := &tableQuery{w: w, rw: rw, r: r, ans: TableAnswer{Table: r.PathValue("table"), Key: r.PathValue("key")}}
		q.serve()
	})
	mux.HandleFunc("GET /api/tables/{table}/{key}/windows", func(rw http.ResponseWriter, r *http.Request) {
		q := &tableQuery{w: w, rw: rw, r: r, windows: true, ans: TableAnswer{Table: r.PathValue("table"), Key: r.PathValue("key")}}
		q.serve()
	})
	w.serveLocate(mux) // GET /api/locate/{table}/{key}, GET /api/tables (tables_locate.go)
	w.serveScan(mux)   // GET /api/tables/{table} (tables_scan.go)
}

func (q *tableQuery) serve() {
	w := q.w
	a := w.Assignment()
	q.ans.Generation = a.Generation
	var def table.Def
	for _, d := range w.app.tables {
		if d.Name() == q.ans.Table {
			def = d
		}
	}
	if def == nil {
		q.refuse(http.StatusNotFound, ReasonUnknownTable, 0, fmt.Sprintf("no table %q in app %s (a missing key answers found=false with no reason)", q.ans.Table, w.app.id))
		return
	}
	qp, err := parseQueryParams(q.r)
	if err != nil {
		q.refuse(http.StatusBadRequest, ReasonBadRequest, 0, err.Error())
		return
	}
	var kb []byte
	if q.windows {
		if kb, err = q.prepareWindows(def); err != nil {
			return // answered
		}
	} else {
		qr, ok := def.(tablestate.Queryable)
		if !ok {
			q.refuse(http.StatusBadRequest, ReasonBadRequest, 0, fmt.Sprintf("table %s is windowed: list a key's windows with GET /api/tables/%s/{key}/windows?from=&to=", q.ans.Table, q.ans.Table))
			return
		}
		if kb, err = qr.QueryKey(q.ans.Key); err != nil {
			q.refuse(http.StatusBadRequest, ReasonBadKey, 0, err.Error())
			return
		}
		var (
			b     []byte
			found bool
		)
		q.read = func(st *tablestate.State, p int32) (err error) {
			b, found, err = st.Lookup(p, kb)
			return err
		}
		q.answer = func(err error) { q.value(def, kb, b, found, err) }
	}
	if gs := w.globalReplica(q.ans.Table); gs != nil {
		q.ans.Global, q.ans.Role = true, RoleGlobal
		q.ans.Partition = kafka.PartitionFor(kb, gs.Partitions())
		bounds, err := w.checkPosition(q.ans.Table, gs.Partitions(), qp.position, q.ans.Partition)
		if err != nil {
			q.refuse(http.StatusBadRequest, ReasonBadRequest, 0, err.Error())
			return
		}
		var (
			b  []byte
			ok bool
		)
		read := func() error {
			off := gs.Applied(q.ans.Partition)
			q.ans.Applied = &off
			b, ok, err = gs.Lookup(kb)
			return err
		}
		if len(bounds) == 0 {
			err = read()
			q.value(def, kb, b, ok, err)
			return
		}
		// A replica holds a source record's effect once its follower
		// applied a changelog record stamped with that source offset or a
		// later one (the replica store's marks).
		st := w.globalStore(q.ans.Table)
		v, reached, err := awaitPosition(q.r.Context(), qp.wait, func() (positionView, error) { return marksPosition(st, q.ans.Partition, bounds) },
			read, func(positionView) bool { return true })
		if err == nil && !reached {
			q.refuseBehind(v, qp, bounds, RoleGlobal)
			return
		}
		q.ans.Position = formatPosition(v.at)
		q.value(def, kb, b, ok, err)
		return
	}
	t := w.tableByName(q.ans.Table)
	if t == nil {
		q.refuse(http.StatusInternalServerError, ReasonInternal, 0, fmt.Sprintf("table %s is not run by this worker", q.ans.Table))
		return
	}
	n, err := w.changelogPartitions(t)
	if err != nil {
		q.refuse(http.StatusInternalServerError, ReasonInternal, 0, err.Error())
		return
	}
	p := kafka.PartitionFor(kb, n)
	q.ans.Partition = p
	bounds, err := w.checkPosition(q.ans.Table, n, qp.position, p)
	if err != nil {
		q.refuse(http.StatusBadRequest, ReasonBadRequest, 0, err.Error())
		return
	}
	st := w.partState(t, a, p)
	q.ans.Role = st.role
	if st.role == RoleActive {
		zero := int64(0)
		q.ans.Lag = &zero
		if len(bounds) == 0 {
			q.answer(q.read(t.state, p))
			return
		}
		// The active shows a source record's effect once every agent
		// resolved it (its writes are in the write cache, which a point
		// read sees): wait for the claim's watermark, read, and check
		// that no cache drop came in between.
		v, reached, err := awaitPosition(q.r.Context(), qp.wait,
			func() (positionView, error) { return w.activePosition(t, p, bounds) },
			func() error { return q.read(t.state, p) }, func(v positionView) bool { return w.still(t, p, v) })
		if err == nil && !reached {
			q.refuseBehind(v, qp, bounds, RoleActive)
			return
		}
		q.ans.Position = formatPosition(v.at)
		q.answer(err)
		return
	}
	// A copy here may answer under consistency=any; its lag is measured
	// before the read, so the value read is at least that fresh. With a
	// position bound it must also hold the bound already (its store's
	// marks): a copy catches up only at the active's next commit, so the
	// active, which answers as soon as it processed the record, is asked
	// instead of waiting here.
	var (
		stale  *copyLag
		behind *positionView
	)
	if qp.consistency == ConsistencyAny && st.role != RoleNone && st.role != RolePending {
		cl, err := w.copyLagOf(t, p)
		if err == nil {
			lag := cl.lag()
			q.ans.Lag = &lag
			if st.role == RoleRestoring {
				q.ans.Restore = w.restoreProgress(t, p, cl)
			}
			var v positionView
			if lag <= qp.maxLag && len(bounds) > 0 {
				v, err = marksPosition(t.store, p, bounds)
				if err != nil {
					q.refuse(http.StatusInternalServerError, ReasonInternal, 0, fmt.Sprintf("table %s[%d]: %v", q.ans.Table, p, err))
					return
				}
				if !v.reached {
					behind = &v
				}
				q.ans.Position = formatPosition(v.at)
			}
			if lag <= qp.maxLag && behind == nil {
				q.answer(q.read(t.state, p))
				return
			}
			if behind == nil {
				stale = &cl
			}
		}
	}
	if st.role == RoleRestoring {
		if q.ans.Restore == nil {
			q.ans.Restore = w.restoreProgress(t, p, copyLag{})
		}
		if stale != nil {
			q.refuse(http.StatusServiceUnavailable, ReasonStaleBeyondBound, retryAfterRestore(q.ans.Restore),
				fmt.Sprintf("the restoring copy here is %s behind, more than maxLag=%d", plural(*q.ans.Lag, "record"), qp.maxLag))
			return
		}
		if behind != nil {
			q.refuseBehind(*behind, qp, bounds, RoleRestoring)
			return
		}
		msg := fmt.Sprintf("partition %d of table %s is being restored on this worker", p, q.ans.Table)
		if st.restoreErr != nil {
			msg = fmt.Sprintf("the restore of partition %d of table %s failed on this worker and will be retried: %v", p, q.ans.Table, st.restoreErr)
		}
		q.refuse(http.StatusServiceUnavailable, ReasonRestoring, retryAfterRestore(q.ans.Restore), msg)
		return
	}
	// Not active here: the owner answers.
	q.ans.Owner = w.ownerURL(t.state.Topic(), p)
	switch {
	case q.ans.Owner == "" || q.ans.Owner == w.cfg.HTTPAddr || st.role == RolePending:
		// The URL map naming this worker for a partition it is not active
		// for, or a partition withheld until its owner revoked it: the
		// assignment is moving.
		q.ans.Owner = ""
		if behind != nil {
			q.refuseBehind(*behind, qp, bounds, st.role)
			return
		}
		if stale != nil {
			q.refuse(http.StatusServiceUnavailable, ReasonStaleBeyondBound, 1,
				fmt.Sprintf("the %s copy here is %s behind, more than maxLag=%d, and no owner is known (rebalance under way)", st.role, plural(*q.ans.Lag, "record"), qp.maxLag))
			return
		}
		q.refuse(http.StatusServiceUnavailable, ReasonRebalancing, 1,
			fmt.Sprintf("no owner known for partition %d of table %s (rebalance under way)", p, q.ans.Table))
	case !qp.forward || qp.hops >= MaxHops:
		if behind != nil {
			q.refuseBehind(*behind, qp, bounds, st.role)
			return
		}
		if stale != nil {
			q.refuse(http.StatusServiceUnavailable, ReasonStaleBeyondBound, 1,
				fmt.Sprintf("the %s copy here is %s behind, more than maxLag=%d; the active is %s", st.role, plural(*q.ans.Lag, "record"), qp.maxLag, q.ans.Owner))
			return
		}
		why := "forward=0"
		if qp.forward {
			why = fmt.Sprintf("the query was forwarded %d time(s) already", qp.hops)
		}
		q.refuse(http.StatusServiceUnavailable, ReasonNotOwner, 1,
			fmt.Sprintf("this worker is not active for partition %d of table %s (%s); ask the owner", p, q.ans.Table, why))
	default:
		if err := forwardQuery(q.rw, q.r, q.ans.Owner, qp.hops+1); err != nil {
			q.refuse(http.StatusBadGateway, ReasonNotOwner, 1, err.Error())
		}
	}
}

// changelogPartitions returns the partition count of t's changelog from the
// topic metadata the worker's client holds (the count the changelog records
// were partitioned by), never from an owner map: a map missing partitions
// mid-rebalance would route keys to the wrong partition.
func (w *Worker) changelogPartitions(t *tableRuntime) (int32, error) {
	if w.meta == nil {
		return t.parts, nil
	}
	ps, err := w.meta.Partitions(t.state.Topic())
	if err != nil {
		return 0, fmt.Errorf("table %s: partitions of %s: %w", t.def.Name(), t.state.Topic(), err)
	}
	if int32(len(ps)) != t.parts {
		return 0, fmt.Errorf("table %s: changelog %s has %d partitions, the table %d", t.def.Name(), t.state.Topic(), len(ps), t.parts)
	}
	return t.parts, nil
}

// partStatus is what this worker holds of one table partition.
type partStatus struct {
	role string // Role*
	// restoreErr is the error of a failed restore of the current activation.
	restoreErr error
}

// partState derives this worker's role for partition p of t from the
// assignment a and the partition's lifecycle (Worker.parts): active only when
// a has it active and the activation's restore finished without error.
func (w *Worker) partState(t *tableRuntime, a assignor.Assignment, p int32) partStatus {
	topic := t.state.Topic()
	switch {
	case slices.Contains(a.Actives[topic], p):
		st := partStatus{role: RoleRestoring}
		if w.parts == nil {
			return st
		}
		w.parts.mu.Lock()
		defer w.parts.mu.Unlock()
		tp := w.parts.parts[restoreKey{t.def.Name(), p}]
		if tp == nil || tp.gate == nil {
			return st // the claim has not started the activation yet
		}
		select {
		case <-tp.gate.done:
			if tp.gate.err == nil {
				st.role = RoleActive
			} else {
				st.restoreErr = tp.gate.err
			}
		default:
		}
		return st
	case slices.Contains(a.Standbys[topic], p):
		return partStatus{role: RoleStandby}
	case slices.Contains(a.Warmups[topic], p):
		return partStatus{role: RoleWarmup}
	case slices.Contains(a.Pending[topic], p):
		return partStatus{role: RolePending}
	}
	return partStatus{role: RoleNone}
}

// copyLag is a local copy's position against its changelog.
type copyLag struct {
	applied   int64 // offset after the last record applied to the store (0: none)
	highwater int64 // the changelog's end, asked of the broker
}

func (c copyLag) lag() int64 { return max(c.highwater-c.applied, 0) }

// copyLagOf reads the applied offset of partition p of t's store, then asks
// the broker for the changelog's highwater (one ListOffsets): read in that
// order, a store that advances meanwhile only makes the lag an overestimate.
func (w *Worker) copyLagOf(t *tableRuntime, p int32) (copyLag, error) {
	return w.copyLagWith(t, p, w.liveHighwater)
}

// highwaterFunc returns the end offset of partition p of changelog topic:
// asked of the broker now (Worker.liveHighwater) or the status page's cached
// answer (brokerSnapshot.highwater).
type highwaterFunc func(topic string, p int32) (int64, error)

// copyLagWith is copyLagOf with the highwater from hw.
func (w *Worker) copyLagWith(t *tableRuntime, p int32, hw highwaterFunc) (copyLag, error) {
	var c copyLag
	off, err := t.store.Offset(p)
	if err != nil {
		return c, fmt.Errorf("table %s[%d]: offset: %w", t.def.Name(), p, err)
	}
	if off != stores.NoOffset {
		c.applied = off + 1
	}
	if c.highwater, err = hw(t.state.Topic(), p); err != nil {
		return c, fmt.Errorf("table %s[%d]: highwater: %w", t.def.Name(), p, err)
	}
	return c, nil
}

// restoreProgress is the progress of partition p's restore here: the copy's
// position (c, asked now when zero) and the rate and ETA of the restore's
// latest progress report when it has not finished. Nil when unknown.
func (w *Worker) restoreProgress(t *tableRuntime, p int32, c copyLag) *RestoreProgress {
	if c == (copyLag{}) {
		var err error
		if c, err = w.copyLagOf(t, p); err != nil {
			return nil
		}
	}
	rp := &RestoreProgress{RestoredOffset: c.applied, EndOffset: c.highwater, Remaining: c.lag()}
	rp.Rate, rp.ETAMS = w.restoreRate(t, p, rp.Remaining)
	return rp
}

// restoreRate is the rate of partition p's restore here, from its latest
// progress report, and the ETA of remaining offsets at that rate in
// milliseconds; zeros when no restore of p runs.
func (w *Worker) restoreRate(t *tableRuntime, p int32, remaining int64) (rate, etaMS float64) {
	w.metrics.mu.Lock()
	pr, ok := w.metrics.restores[restoreKey{t.state.Topic(), p}]
	w.metrics.mu.Unlock()
	if !ok || pr.Done || pr.Rate <= 0 {
		return 0, 0
	}
	return pr.Rate, float64(remaining) / pr.Rate * 1000
}

// retryAfterRestore is the Retry-After of a query refused while a restore
// runs: the restore's ETA rounded up, between 1 and 30 s (1 when unknown).
func retryAfterRestore(rp *RestoreProgress) int {
	if rp == nil || rp.ETAMS <= 0 {
		return 1
	}
	return int(min(max(math.Ceil(rp.ETAMS/1000), 1), 30))
}

var forwardClient = &http.Client{Timeout: 5 * time.Second}

// forwardQuery proxies the query to the owner (an HTTP address or URL) with
// hops in HopsHeader and copies its answer, headers included; an error means
// nothing was written to rw.
func forwardQuery(rw http.ResponseWriter, r *http.Request, owner string, hops int) error {
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
	req.Header.Set(HopsHeader, strconv.Itoa(hops))
	req.Header.Set(ForwardedHeader, "1") // workers of earlier versions
	resp, err := forwardClient.Do(req)
	if err != nil {
		return fmt.Errorf("forward to %s: %w", owner, err)
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Retry-After", PartitionHeader, GenerationHeader, RoleHeader, LagHeader} {
		if v := resp.Header.Get(h); v != "" {
			rw.Header().Set(h, v)
		}
	}
	rw.Header().Set(ServedByHeader, owner)
	rw.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(rw, resp.Body)
	return nil
}

// TablePartitionStatus is one table partition this worker holds a copy of
// (GET /api/status, table_partitions): its role, and the copy's position
// against the changelog (RestoredOffset / EndOffset, Lag their difference; -1
// when the broker did not answer). A restoring partition has the rate and ETA
// of its restore when a progress report is under way.
type TablePartitionStatus struct {
	Table     string `json:"table"`
	Partition int32  `json:"partition"`
	// Role is one of active, restoring, standby, warmup, pending.
	Role           string  `json:"role"`
	RestoredOffset int64   `json:"restored_offset"`
	EndOffset      int64   `json:"end_offset"`
	Lag            int64   `json:"lag"`
	Rate           float64 `json:"records_per_second,omitempty"`
	ETAMS          float64 `json:"eta_ms,omitempty"`
	// Error is the failed restore's error of a restoring partition.
	Error string `json:"error,omitempty"`
}

// tablePartitions lists every table partition this worker is active for,
// restores, follows or waits for under a, sorted by table and partition,
// with each changelog highwater from hw.
func (w *Worker) tablePartitions(a assignor.Assignment, hw highwaterFunc) []TablePartitionStatus {
	out := []TablePartitionStatus{}
	for _, t := range w.tables {
		for p := int32(0); p < t.parts; p++ {
			if s, ok := w.tablePartition(t, a, p, hw); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// tablePartition is the status of partition p of t under assignment a, with
// the changelog's highwater from hw; false when this worker holds no copy of
// it (RoleNone).
func (w *Worker) tablePartition(t *tableRuntime, a assignor.Assignment, p int32, hw highwaterFunc) (TablePartitionStatus, bool) {
	st := w.partState(t, a, p)
	if st.role == RoleNone {
		return TablePartitionStatus{}, false
	}
	s := TablePartitionStatus{Table: t.def.Name(), Partition: p, Role: st.role, Lag: -1}
	if st.restoreErr != nil {
		s.Error = st.restoreErr.Error()
	}
	if c, err := w.copyLagWith(t, p, hw); err == nil {
		s.RestoredOffset, s.EndOffset, s.Lag = c.applied, c.highwater, c.lag()
		if st.role == RoleRestoring { // not restoreProgress: it asks the broker again when c is zero
			s.Rate, s.ETAMS = w.restoreRate(t, p, c.lag())
		}
	}
	return s, true
}
