package tablestate

import "time"

// Link ties a table declaration (a value of package table) to its runtime
// side: the methods only the worker calls (attach a replica, activate a
// windowed partition, list windows, backfill a join), kept out of the table
// type's API. A table type embeds a Link through an unexported alias, as
// agent.Event embeds evbind.Handle: the embedding adds no exported field or
// method, only the unexported one RuntimeOf asks for.
type Link struct{ rt any }

// NewLink returns a link to rt, a value implementing those of Replicated,
// PartitionActivator, WindowQuerier and Backfiller that apply to the table.
func NewLink(rt any) Link { return Link{rt: rt} }

func (l Link) tableRuntime() any { return l.rt }

// linked is implemented by the types that embed a Link, and by no type
// outside this module (its method is unexported).
type linked interface{ tableRuntime() any }

// RuntimeOf returns the runtime side of table declaration d, nil for a
// table that has none (a plain table) or a Def not made by package table.
// The caller asserts the interface it needs.
func RuntimeOf(d any) any {
	if l, ok := d.(linked); ok {
		return l.tableRuntime()
	}
	return nil
}

// Replicated is the runtime side of a global table: every worker holds a
// replica of every partition. Plain tables do not implement it.
type Replicated interface {
	// AttachReplica registers a worker's replica of the table so that reads
	// without an event (GlobalTable.Lookup) find one; detach undoes it.
	AttachReplica(s *GlobalState) (detach func())
}

// PartitionActivator is the runtime side of a table that keeps state per
// active partition beside its store (a windowed table's stream time and
// open windows): the worker activates a partition after its restore and
// deactivates it when the partition is released.
type PartitionActivator interface {
	ActivatePartition(st *State, p int32) error
	DeactivatePartition(st *State, p int32)
}

// WindowQuerier is the runtime side of a windowed table whose windows of a
// key can be listed without an event (GET /api/tables/{table}/{key}/windows
// on a worker).
type WindowQuerier interface {
	// WindowKey encodes the table key named by s: s itself for a string
	// key, else s parsed as JSON. The key's partition is that of these
	// bytes (the window is not part of it).
	WindowKey(s string) ([]byte, error)
	// QueryWindows lists the windows of the encoded key in partition p of
	// st whose start is in [from, to], ascending by start, at most limit
	// (more is set when further windows in the range were left out). It
	// reads what a point read of the partition reads: the write cache, the
	// cycle being flushed, then the store (only the store on a copy that is
	// not active). Errors: the store's, a stored row that does not decode.
	QueryWindows(st *State, p int32, key []byte, from, to time.Time, limit int) (rows []WindowRow, more bool, err error)
}

// WindowRow is one window of a key and its decoded value (QueryWindows):
// the window is [Start, End).
type WindowRow struct {
	Start, End time.Time
	Value      any
}

// Backfiller is the runtime side of a join: a join declared after its
// input tables already held data is filled from them once, partition by
// partition, before the partition's records are processed.
type Backfiller interface {
	// Backfill writes the join of every key of ev's partition of the two
	// tables; it returns how many join rows it wrote.
	Backfill(ev Event) (int, error)
}
