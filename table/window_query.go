package table

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"slices"
	"time"

	"github.com/runnel-dev/runnel/stores"
)

// queryWindows lists a key's windows (tablestate.WindowQuerier): the partition's unapplied writes of
// the key, then one seek of the store to the key's first window at or after
// from (stores.Seeker, else a full iteration of the partition) that reads no
// more of the key's windows than limit needs, with the unapplied writes
// laid over them.
func (t *Windowed[K, V]) queryWindows(st *tablestate.State, p int32, key []byte, from, to time.Time, limit int) ([]tablestate.WindowRow, bool, error) {
	if t.err != nil {
		return nil, false, t.err
	}
	lo, hi := windowKey(key, from.UnixMilli()), windowKey(key, to.UnixMilli())
	mine := func(k []byte) (int64, bool) {
		if bytes.Compare(k, lo) < 0 || bytes.Compare(k, hi) > 0 {
			return 0, false
		}
		kb, start, ok := decodeWindowKey(k)
		return start, ok && bytes.Equal(kb, key)
	}
	// The partition's unapplied writes of the key first (they win over the
	// store), then the store, which stops after limit+1+deleted rows of the
	// key: a stored row beyond those has at least limit+1 surviving rows
	// before it (at most deleted of them are deleted by unapplied writes),
	// so it is neither among the first limit nor needed to know there are
	// more. Without the stop a key with many windows in the range (a long
	// retention of short windows) was read whole for every request.
	pending := map[int64][]byte{} // window start -> unapplied row (nil: deleted)
	deleted := 0
	st.EachUnapplied(p, func(k string, v []byte, del bool) {
		if start, ok := mine([]byte(k)); ok {
			if del {
				v = nil
				deleted++
			}
			pending[start] = v
		}
	})
	rows := map[int64][]byte{} // window start -> row (nil: deleted)
	seen := 0
	stop := errors.New("stop")
	visit := func(k, v []byte) error {
		if bytes.Compare(k, hi) > 0 {
			return stop
		}
		if start, ok := mine(k); ok {
			rows[start] = v
			if seen++; limit > 0 && seen >= limit+1+deleted {
				return stop
			}
		}
		return nil
	}
	var err error
	if sk, ok := st.Store().(stores.Seeker); ok {
		err = sk.IterateFrom(p, lo, visit)
	} else {
		err = st.Store().Iterate(p, func(k, v []byte) error {
			if bytes.Compare(k, lo) < 0 {
				return nil
			}
			return visit(k, v)
		})
	}
	if err != nil && !errors.Is(err, stop) {
		return nil, false, fmt.Errorf("table %s[%d]: windows: %w", t.name, p, err)
	}
	for start, v := range pending {
		rows[start] = v
	}
	starts := make([]int64, 0, len(rows))
	for s, v := range rows {
		if v != nil {
			starts = append(starts, s)
		}
	}
	slices.Sort(starts)
	more := false
	if limit > 0 && len(starts) > limit {
		starts, more = starts[:limit], true
	}
	out := make([]tablestate.WindowRow, 0, len(starts))
	for _, s := range starts {
		_, vb, err := decodeRow(rows[s])
		if err != nil {
			return nil, false, fmt.Errorf("table %s[%d]: window %d: %w", t.name, p, s, err)
		}
		v, err := t.vc.Decode(vb)
		if err != nil {
			return nil, false, fmt.Errorf("table %s[%d]: window %d: decode value: %w", t.name, p, s, err)
		}
		w := t.ws.window(s)
		out = append(out, tablestate.WindowRow{Start: w.Start, End: w.End, Value: v})
	}
	return out, more, nil
}
