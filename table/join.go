package table

import (
	"fmt"

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
	if q := kafka.PartitionFor(kb, s.partitions); q != ev.Partition() {
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
}

// JoinOf names the joined tables and the kind of join (for describe).
func (j *Joined[K, VO]) JoinOf() (kind string, left, right string) {
	return j.kind.String(), j.left, j.right
}

// JoinDef is implemented by joined tables (Join): the App checks that the
// three tables are co-partitioned.
type JoinDef interface {
	Def
	JoinOf() (kind string, left, right string)
}

// Join declares the table name that holds, for every key, joiner(left's
// value, right's value) according to kind: a Kafka Streams table-table
// join. Every write to left or right (Set, Update, Delete) recomputes the
// key's joined value in the same commit cycle as the write, so the joined
// table, its changelog and the two tables are always committed together;
// when the kind no longer keeps the key (InnerJoin: one side deleted;
// LeftJoin: the left deleted; OuterJoin: both deleted) the key is deleted
// from the joined table (a tombstone in its changelog), as Kafka Streams
// forwards a tombstone for it.
//
// The three tables must be co-partitioned (the same partition count; the
// App checks it at build); the joined table takes left's partition option.
// The joined table is written only by the join: a key written to left or
// right before the join was declared joins at its next write (there is no
// backfill). The joiner must not use the tables.
func Join[K any, VL any, VR any, VO any](h Host, name string, kind JoinKind, left *Table[K, VL], right *Table[K, VR],
	vc codec.Codec[VO], joiner Joiner[VL, VR, VO], opts ...Option) *Joined[K, VO] {
	if left.opts.partitions > 0 {
		opts = append([]Option{Partitions(left.opts.partitions)}, opts...)
	}
	j := &Joined[K, VO]{Table: &Table[K, VO]{declared: declare(h, name, left.kc, vc, opts)}, kind: kind,
		left: left.name, right: right.name}
	h.RegisterTable(j)
	recompute := func(ev Event, key K) error {
		out, err := j.current(ev)
		if err != nil {
			return err
		}
		// The join of one key is one step for the partition: of two
		// concurrent writes to left and right, the later recompute reads
		// both new values.
		defer out.rmw.lock(ev.Partition())()
		var l Side[VL]
		var r Side[VR]
		if l.Value, l.OK, err = left.Get(ev, key); err != nil {
			return fmt.Errorf("join %s: %w", name, err)
		}
		if r.Value, r.OK, err = right.Get(ev, key); err != nil {
			return fmt.Errorf("join %s: %w", name, err)
		}
		keep := l.OK && r.OK
		switch kind {
		case LeftJoin:
			keep = l.OK
		case OuterJoin:
			keep = l.OK || r.OK
		}
		if keep {
			return j.Set(ev, key, joiner(l, r))
		}
		if _, had, err := j.Get(ev, key); err != nil || !had {
			return err
		}
		return j.Delete(ev, key)
	}
	left.watch(recompute)
	right.watch(recompute)
	return j
}
