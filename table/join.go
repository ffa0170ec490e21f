package table

import (
	"bytes"
	"fmt"
	"github.com/runnel-dev/runnel/internal/tablestate"
	"log/slog"

	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
)

// Lookup is the stream-table join: it reads key in the event's partition of
// the table, as Get does, but refuses a key that belongs to another
// partition with ErrNotCoPartitioned instead of answering "absent" (a key of
// another partition lives on the worker that owns that partition; Get
// would silently miss it). Declare the lookup on the agent
// (agent.Lookup) so that the App checks at build that the table and the
// agent's topic have the same partition count; for a table every worker
// holds whole, use a GlobalTable.
func (t *Table[K, V]) Lookup(ev Event, key K) (V, bool, error) {
	var zero V
	s, err := t.current(ev)
	if err != nil {
		return zero, false, err
	}
	kb, err := t.encodeKey(key)
	if err != nil {
		return zero, false, err
	}
	if q := kafka.PartitionFor(kb, s.Partitions()); q != ev.Partition() {
		return zero, false, fmt.Errorf("table %s: lookup of key %q from partition %d: the key belongs to partition %d: %w",
			t.name, kb, ev.Partition(), q, ErrNotCoPartitioned)
	}
	return t.Get(ev, key)
}

// JoinKind is the kind of a table-table join, as in Kafka Streams' KTable
// join, leftJoin and outerJoin.
type JoinKind int

const (
	// InnerJoin: the joined table holds key k while both tables hold it.
	InnerJoin JoinKind = iota
	// LeftJoin: the joined table holds k while the left table holds it.
	LeftJoin
	// OuterJoin: the joined table holds k while either table holds it.
	OuterJoin
)

func (k JoinKind) String() string {
	switch k {
	case InnerJoin:
		return "inner"
	case LeftJoin:
		return "left"
	case OuterJoin:
		return "outer"
	}
	return fmt.Sprintf("JoinKind(%d)", int(k))
}

// LogValue makes slog print the name in JSON logs too (the JSON handler
// would print the number: it does not call String).
func (k JoinKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// Side is one table's value for a key in a join: Value is meaningful when
// OK (the table holds the key).
type Side[V any] struct {
	Value V
	OK    bool
}

// Joiner computes the joined value of a key from both tables' values. It is
// only called when the join kind keeps the key (InnerJoin: both OK;
// LeftJoin: left OK; OuterJoin: either OK).
type Joiner[VL any, VR any, VO any] func(left Side[VL], right Side[VR]) VO

// Joined is a table kept equal to the join of two tables: it is a Table
// (read it, dump it, serve it) whose only writer is the join.
type Joined[K any, VO any] struct {
	*Table[K, VO]
	kind        JoinKind
	left, right string
	backfill    func(ev Event) (int, error) // see joinRuntime.Backfill
	link                                    // the runtime side (joinRuntime), no part of the API
}

// joinRuntime is a Joined's runtime side (tablestate.RuntimeOf): the worker
// backfills it (tablestate.Backfiller).
type joinRuntime[K any, VO any] struct{ j *Joined[K, VO] }

// Backfill implements tablestate.Backfiller: it makes the event's partition
// of the joined table equal to the join of the two tables' partitions: every
// key either table holds (or the joined table holds) is recomputed, and
// written (a value or a tombstone) only when the joined table's value
// differs. It returns how many keys it wrote. The worker runs it when a task
// starts, after its tables were restored and before the task's first cycle
// commits, so a join declared on tables that already hold data, or a joined
// table whose store and changelog were lost, is filled in the task's first
// commit cycle. Each key's recompute is one step for the partition, as a
// write's is, so records processed meanwhile never leave a stale joined
// value. Its cost is one scan of the three tables' partitions (its keys held
// in memory). Errors: the tables' (not running, a store error, a value that
// does not decode or encode).
func (r joinRuntime[K, VO]) Backfill(ev tablestate.Event) (int, error) { return r.j.backfill(ev) }

// JoinOf names the joined tables and the kind of join (for describe).
func (j *Joined[K, VO]) JoinOf() (kind string, left, right string) {
	return j.kind.String(), j.left, j.right
}

// Join declares the table name that holds, for every key, joiner(left's
// value, right's value) according to kind: a Kafka Streams table-table
// join. Every write to left or right (Put, Update, Compute, Delete) recomputes the
// key's joined value in the same commit cycle as the write, so the joined
// table, its changelog and the two tables are always committed together;
// when the kind no longer keeps the key (InnerJoin: one side deleted;
// LeftJoin: the left deleted; OuterJoin: both deleted) the key is deleted
// from the joined table (a tombstone in its changelog), as Kafka Streams
// forwards a tombstone for it.
//
// The three tables must be co-partitioned (the same partition count; the
// App checks it at build); the joined table takes left's partition option.
// The joined table is written only by the join. Keys the tables held
// before the join was declared (or before the joined table's state was
// lost) are filled in when each partition's task starts (the worker backfills it).
// The joiner must not use the tables.
func Join[K any, VL any, VR any, VO any](h Host, name string, kind JoinKind, left *Table[K, VL], right *Table[K, VR],
	vc codec.Codec[VO], joiner Joiner[VL, VR, VO], opts ...Option) *Joined[K, VO] {
	if left.opts.partitions > 0 {
		opts = append([]Option{Partitions(left.opts.partitions)}, opts...)
	}
	j := &Joined[K, VO]{Table: &Table[K, VO]{declared: declare(h, name, left.kc, vc, opts), joined: true}, kind: kind,
		left: left.name, right: right.name}
	j.link = tablestate.NewLink(joinRuntime[K, VO]{j})
	h.RegisterTable(j)
	// recompute sets key's joined value from both sides; onlyChanged
	// (the backfill) leaves a value that would not change unwritten and
	// reports whether it wrote.
	recompute := func(ev Event, key K, onlyChanged bool) (bool, error) {
		out, err := j.current(ev)
		if err != nil {
			return false, err
		}
		// The join of one key is one step for the partition: of two
		// concurrent writes to left and right, the later recompute reads
		// both new values.
		defer out.LockRMW(ev.Partition())()
		var l Side[VL]
		var r Side[VR]
		if l.Value, l.OK, err = left.Get(ev, key); err != nil {
			return false, fmt.Errorf("join %s: %w", name, err)
		}
		if r.Value, r.OK, err = right.Get(ev, key); err != nil {
			return false, fmt.Errorf("join %s: %w", name, err)
		}
		keep := l.OK && r.OK
		switch kind {
		case LeftJoin:
			keep = l.OK
		case OuterJoin:
			keep = l.OK || r.OK
		}
		if keep && !onlyChanged {
			return true, j.TryPut(ev, key, joiner(l, r))
		}
		cur, had, err := j.Get(ev, key)
		if err != nil {
			return false, err
		}
		if keep {
			v := joiner(l, r)
			if had {
				if same, err := j.sameValue(key, cur, v); err != nil || same {
					return false, err
				}
			}
			return true, j.TryPut(ev, key, v)
		}
		if !had {
			return false, nil
		}
		return true, j.TryDelete(ev, key)
	}
	onWrite := func(ev Event, key K) error {
		_, err := recompute(ev, key, false)
		return err
	}
	left.watch(onWrite)
	right.watch(onWrite)
	j.backfill = func(ev Event) (int, error) {
		keys := map[string]K{}
		collect := func(t *Table[K, VL], u *Table[K, VR], o *Table[K, VO]) error {
			add := func(k K) bool {
				kb, err := left.kc.Encode(k)
				if err == nil {
					keys[string(kb)] = k
				}
				return err == nil
			}
			if err := t.Range(ev, func(k K, _ VL) bool { return add(k) }); err != nil {
				return err
			}
			if err := u.Range(ev, func(k K, _ VR) bool { return add(k) }); err != nil {
				return err
			}
			return o.Range(ev, func(k K, _ VO) bool { return add(k) })
		}
		if err := collect(left, right, j.Table); err != nil {
			return 0, fmt.Errorf("join %s: backfill: %w", name, err)
		}
		n := 0
		for _, k := range keys {
			wrote, err := recompute(ev, k, true)
			if err != nil {
				return n, fmt.Errorf("join %s: backfill: %w", name, err)
			}
			if wrote {
				n++
			}
		}
		return n, nil
	}
	return j
}

// sameValue reports whether a and b encode to the same bytes (the joined
// table's value would not change).
func (j *Joined[K, VO]) sameValue(key K, a, b VO) (bool, error) {
	ab, err := j.encodeValue(key, a)
	if err != nil {
		return false, err
	}
	bb, err := j.encodeValue(key, b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ab, bb), nil
}
