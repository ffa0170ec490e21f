package app

import (
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"net/http"
	"strconv"
	"time"

	"github.com/runnel-dev/runnel/table"
)

// Windowed lookups (GET /api/tables/{table}/{key}/windows?from=&to=&limit=;
// docs/tables.md, "Windowed lookups"): a key's windows whose start is in
// [from, to], read, routed and refused like a point read of the key.
const (
	// DefaultWindowLimit is how many windows a lookup answers when ?limit=
	// is not given.
	DefaultWindowLimit = 100
	// MaxWindowLimit is the largest ?limit= of a windowed lookup (400
	// above).
	MaxWindowLimit = 1000
)

// windowParams are the parameters a windowed lookup accepts.
var windowParams = map[string]bool{"from": true, "to": true, "limit": true, "consistency": true, "maxLag": true,
	"forward": true, "position": true, "wait": true}

// parseWindowTime reads a window bound: Unix milliseconds ("1733500800000")
// or RFC 3339 ("2026-12-06T16:00:00Z").
func parseWindowTime(name, s string) (time.Time, error) {
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		return time.UnixMilli(ms).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q: want Unix milliseconds or an RFC 3339 time", name, s)
	}
	return t, nil
}

// prepareWindows checks a windowed lookup's table and parameters and sets
// q.read and q.answer; it returns the encoded key, or answers a 400 and
// returns an error.
func (q *tableQuery) prepareWindows(def table.Def) ([]byte, error) {
	fail := func(reason, msg string) ([]byte, error) {
		q.refuse(http.StatusBadRequest, reason, 0, msg)
		return nil, fmt.Errorf("%s", msg)
	}
	wq, ok := tablestate.RuntimeOf(def).(tablestate.WindowQuerier)
	if !ok {
		return fail(ReasonBadRequest, fmt.Sprintf("table %s is not windowed: read the key with GET /api/tables/%s/{key}", q.ans.Table, q.ans.Table))
	}
	params := q.r.URL.Query()
	for k := range params {
		if !windowParams[k] {
			return fail(ReasonBadRequest, fmt.Sprintf("unknown parameter %q (from, to, limit, consistency, maxLag, forward, position, wait)", k))
		}
	}
	// Unbounded by default: every window of the key.
	from, to := time.UnixMilli(-1<<62).UTC(), time.UnixMilli(1<<62).UTC()
	var err error
	if s, ok := params["from"]; ok {
		if from, err = parseWindowTime("from", s[0]); err != nil {
			return fail(ReasonBadRequest, err.Error())
		}
	}
	if s, ok := params["to"]; ok {
		if to, err = parseWindowTime("to", s[0]); err != nil {
			return fail(ReasonBadRequest, err.Error())
		}
	}
	if to.Before(from) {
		return fail(ReasonBadRequest, fmt.Sprintf("to %s is before from %s", to.Format(time.RFC3339Nano), from.Format(time.RFC3339Nano)))
	}
	limit := DefaultWindowLimit
	if s := params.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > MaxWindowLimit {
			return fail(ReasonBadRequest, fmt.Sprintf("limit %q: want a number of windows in [1, %d]", s, MaxWindowLimit))
		}
	}
	kb, err := wq.WindowKey(q.ans.Key)
	if err != nil {
		q.refuse(http.StatusBadRequest, ReasonBadKey, 0, err.Error())
		return nil, err
	}
	var (
		rows []tablestate.WindowRow
		more bool
	)
	q.read = func(st *tablestate.State, p int32) (err error) {
		rows, more, err = wq.QueryWindows(st, p, kb, from, to, limit)
		return err
	}
	q.answer = func(err error) {
		if err != nil {
			q.refuse(http.StatusInternalServerError, ReasonInternal, 0, err.Error())
			return
		}
		for _, r := range rows {
			q.ans.Windows = append(q.ans.Windows, WindowItem{Start: r.Start, End: r.End, Value: r.Value})
		}
		q.ans.Found, q.ans.More = len(rows) > 0, more
		q.reply(http.StatusOK)
	}
	return kb, nil
}
