package app

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
)

// Read-your-writes bounds of table reads (?position=topic:partition:offset,
// IQv2's Position; docs/tables.md, "Read-your-writes"). A caller that wrote a
// source record and got its offset from the producer asks for a read that
// holds the record's effect; the worker answers once the copy it reads has
// applied every source record up to that offset, waits up to ?wait for it,
// and refuses with ReasonPositionNotReached otherwise.

// Read-your-writes wait (?wait=).
const (
	// DefaultPositionWait is how long a read with a position bound waits for
	// the copy to reach it when ?wait= is not given.
	DefaultPositionWait = 500 * time.Millisecond
	// MaxPositionWait is the longest ?wait= accepted (400 above): below the
	// 5 s timeout of a forwarded query, so a forward never times out while
	// the owner waits.
	MaxPositionWait = 3 * time.Second
	// positionPoll is how often a waiting read looks at the position again.
	positionPoll = 2 * time.Millisecond
)

// ReasonPositionNotReached: 503, the copy that may answer has not applied
// the source records up to the query's position bound within its wait
// (TableAnswer.Position says how far it is). Retry-After 1.
const ReasonPositionNotReached = "position-not-reached"

// SourcePosition is one entry of a read-your-writes bound: a source record's
// topic, partition and offset, as its producer got them from the broker. A
// copy of a table partition holds the record's effect once it has applied
// every record of that source partition up to Offset. Its text form, in
// ?position= and TableAnswer.Position, is "topic:partition:offset".
type SourcePosition struct {
	Topic     string
	Partition int32
	Offset    int64
}

// String renders p as "topic:partition:offset".
func (p SourcePosition) String() string {
	return p.Topic + ":" + strconv.FormatInt(int64(p.Partition), 10) + ":" + strconv.FormatInt(p.Offset, 10)
}

// ParsePosition parses a position bound: entries "topic:partition:offset"
// separated by commas (Kafka topic names hold no ':' or ','). The error
// names the entry that does not parse.
func ParsePosition(s string) ([]SourcePosition, error) {
	var out []SourcePosition
	for _, f := range strings.Split(s, ",") {
		parts := strings.Split(f, ":")
		if len(parts) != 3 || parts[0] == "" {
			return nil, fmt.Errorf("position %q: want topic:partition:offset", f)
		}
		p, err := strconv.ParseInt(parts[1], 10, 32)
		if err != nil || p < 0 {
			return nil, fmt.Errorf("position %q: partition %q: want a number >= 0", f, parts[1])
		}
		o, err := strconv.ParseInt(parts[2], 10, 64)
		if err != nil || o < 0 {
			return nil, fmt.Errorf("position %q: offset %q: want a number >= 0", f, parts[2])
		}
		out = append(out, SourcePosition{Topic: parts[0], Partition: int32(p), Offset: o})
	}
	return out, nil
}

// formatPosition renders positions as ParsePosition reads them.
func formatPosition(ps []SourcePosition) string {
	strs := make([]string, len(ps))
	for i, p := range ps {
		strs[i] = p.String()
	}
	return strings.Join(strs, ",")
}

// parsePositionParams reads ?position= (repeated or comma-separated) and
// ?wait= (a Go duration in [0, MaxPositionWait]; only with a position).
func parsePositionParams(q map[string][]string, qp *queryParams) error {
	qp.wait = DefaultPositionWait
	for _, s := range q["position"] {
		ps, err := ParsePosition(s)
		if err != nil {
			return err
		}
		qp.position = append(qp.position, ps...)
	}
	if s, ok := q["wait"]; ok {
		if len(qp.position) == 0 {
			return fmt.Errorf("wait applies to a read with a position only")
		}
		d, err := time.ParseDuration(s[0])
		if err != nil || d < 0 || d > MaxPositionWait {
			return fmt.Errorf("wait %q: want a duration in [0, %v] (500ms, 2s)", s[0], MaxPositionWait)
		}
		qp.wait = d
	}
	return nil
}

// checkPosition validates a position bound against a table of parts
// partitions: every topic must be a source topic of the app with that many
// partitions (only its records can have written the table; a record of an
// input that reaches the table through a repartition topic cannot be
// waited for by its own offset), every partition below parts. It returns
// the entries for partition p, the only ones that bind a read of p: a
// record of source partition q writes table partition q alone
// (co-partitioning, table.ErrNotCoPartitioned). When agents declare that
// they write the table (agent.WritesTo), the topic must be the source of
// one of them: a source of the same task that reaches the table only
// through a repartition topic (or not at all) would count as reached
// before the record's effect is there.
func (w *Worker) checkPosition(name string, parts int32, bounds []SourcePosition, p int32) ([]SourcePosition, error) {
	var out []SourcePosition
	writers := map[string]bool{} // source topics of the agents declared to write the table
	if w.graph != nil {
		for _, a := range w.graph.Agents {
			if slices.Contains(a.Tables, name) {
				writers[a.Source] = true
			}
		}
	}
	for _, b := range bounds {
		t, ok := w.graph.Topic(b.Topic)
		subscribed := false
		for _, s := range w.graph.Subscriptions() {
			subscribed = subscribed || s == b.Topic
		}
		if !ok || !subscribed || t.Partitions != parts {
			return nil, fmt.Errorf("position %s: %q is not a source topic of app %s with the %d partitions of table %s", b, b.Topic, w.app.id, parts, name)
		}
		if len(writers) > 0 && !writers[b.Topic] {
			return nil, fmt.Errorf("position %s: no agent of %q writes table %s (agent.WritesTo): a bound is an offset of a topic whose agents write the table", b, b.Topic, name)
		}
		if b.Partition >= parts {
			return nil, fmt.Errorf("position %s: partition %d out of [0, %d)", b, b.Partition, parts)
		}
		if b.Partition == p {
			out = append(out, b)
		}
	}
	return out, nil
}

// positionView is how far a copy of a table partition is against a bound:
// at holds, per bound entry, the highest source offset whose effect the copy
// shows (-1: none known). For the active it also holds what a read must find
// unchanged after it (still).
type positionView struct {
	at      []SourcePosition
	reached bool
	// tr, drops and epochs identify the caches the active's view relied on:
	// the task, its count of cache drops and, per claim it read the
	// watermark of, the claim's incarnation. Nil tr: the store's marks
	// alone.
	tr     *taskRun
	drops  uint64
	epochs []*epoch
}

// marksPosition reads the source-offset marks of partition p of store st
// (the highest source offset whose effect the store holds, per source
// partition; changelog.Source.MarkKey) against the bounds.
func marksPosition(st stores.Store, p int32, bounds []SourcePosition) (positionView, error) {
	v := positionView{at: make([]SourcePosition, len(bounds)), reached: true}
	marks, err := st.Marks(p)
	if err != nil {
		return v, fmt.Errorf("marks of partition %d: %w", p, err)
	}
	for i, b := range bounds {
		at := int64(-1)
		if m, ok := marks[changelog.Source{Topic: b.Topic, Partition: b.Partition}.MarkKey()]; ok {
			at = m
		}
		v.at[i] = SourcePosition{Topic: b.Topic, Partition: b.Partition, Offset: at}
		v.reached = v.reached && at >= b.Offset
	}
	return v, nil
}

// globalStore returns the store of the global table named name (its
// replica's data and marks), nil when this worker runs none.
func (w *Worker) globalStore(name string) stores.Store {
	for _, g := range w.glob.tables {
		if g.def.Name() == name {
			return g.store
		}
	}
	return nil
}

// resolvedSource is a task source that tells how far its records resolved
// (claimProducer).
type resolvedSource interface {
	resolvedNext() (int64, *epoch)
}

// resolvedNext returns the lowest offset of the claim not resolved yet:
// every record below it was resolved by every agent, so its table writes
// are in the task's caches (or a cycle applied them to the store). The
// epoch is the claim's incarnation: a seek back replaces it, and only then
// does the watermark move back.
func (c *claimProducer) resolvedNext() (int64, *epoch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wm.Next(), c.epoch
}

// activePosition is how far the active partition p of t is against bounds:
// the store's marks, raised by each claim's resolved watermark when the
// task's caches are intact (a point read on the active reads the caches
// over the store, tablestate.State.Lookup).
func (w *Worker) activePosition(t *tableRuntime, p int32, bounds []SourcePosition) (positionView, error) {
	v, err := marksPosition(t.store, p, bounds)
	if err != nil || v.reached {
		return v, err
	}
	ts := &w.tasks
	ts.mu.Lock()
	tr := ts.m[taskKey{t.parts, p}]
	ts.mu.Unlock()
	if tr == nil {
		return v, nil
	}
	// Drops first: a drop after this read raises the count the read is
	// checked against (still).
	v.tr, v.drops = tr, tr.t.Drops()
	if tr.t.Err() != nil {
		return v, nil // abandoned: the caches were dropped, the store alone counts
	}
	srcs := tr.t.SourceList()
	v.reached = true
	for i, b := range bounds {
		if v.at[i].Offset < b.Offset {
			for _, s := range srcs {
				rs, ok := s.(resolvedSource)
				if !ok || s.Topic() != b.Topic || s.Partition() != b.Partition {
					continue
				}
				next, ep := rs.resolvedNext()
				v.epochs = append(v.epochs, ep)
				v.at[i].Offset = max(v.at[i].Offset, next-1)
			}
		}
		v.reached = v.reached && v.at[i].Offset >= b.Offset
	}
	return v, nil
}

// still reports whether what v relied on is unchanged: the same task of the
// partition, no cache drop since, and every claim it read in the same
// incarnation (its watermark never moves back within one). Checked after a
// read, it proves the read saw the caches v's position was measured on.
func (w *Worker) still(t *tableRuntime, p int32, v positionView) bool {
	if v.tr == nil {
		return true
	}
	ts := &w.tasks
	ts.mu.Lock()
	tr := ts.m[taskKey{t.parts, p}]
	ts.mu.Unlock()
	if tr != v.tr || tr.t.Drops() != v.drops || tr.t.Err() != nil {
		return false
	}
	found := 0
	for _, s := range tr.t.SourceList() {
		rs, ok := s.(resolvedSource)
		if !ok {
			continue
		}
		_, ep := rs.resolvedNext()
		for _, e := range v.epochs {
			if e == ep {
				found++
			}
		}
	}
	return found == len(v.epochs)
}

// awaitPosition waits until view() reaches the bound, then reads with read
// and checks the view still holds (check); it returns the view and true
// once a read held the bound, or the last view and false when wait passed
// or ctx ended.
func awaitPosition(ctx context.Context, wait time.Duration, view func() (positionView, error), read func() error, check func(positionView) bool) (positionView, bool, error) {
	deadline := time.Now().Add(wait)
	for {
		v, err := view()
		if err != nil {
			return v, false, err
		}
		if v.reached {
			if err := read(); err != nil {
				return v, false, err
			}
			if check(v) {
				return v, true, nil
			}
			if !time.Now().Before(deadline) || ctx.Err() != nil {
				return v, false, nil
			}
			continue
		}
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return v, false, nil
		}
		select {
		case <-ctx.Done():
			return v, false, nil
		case <-time.After(min(positionPoll, left)):
		}
	}
}

// refuseBehind answers ReasonPositionNotReached for a copy at v short of
// bounds // (the bounds of the key's partition); a copy other than the active was not
// waited for.
func (q *tableQuery) refuseBehind(v positionView, qp queryParams, bounds []SourcePosition, role string) {
	q.ans.Position = formatPosition(v.at)
	waited := "after waiting " + qp.wait.String()
	if role != RoleActive && role != RoleGlobal {
		waited = "and the active cannot be asked"
	}
	q.refuse(http.StatusServiceUnavailable, ReasonPositionNotReached, 1,
		fmt.Sprintf("the %s copy of partition %d of table %s shows %s, short of the bound %s, %s", role, q.ans.Partition, q.ans.Table,
			q.ans.Position, formatPosition(bounds), waited))
}
