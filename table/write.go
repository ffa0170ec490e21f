package table

import (
	"fmt"

	"github.com/runnel-dev/runnel/internal/evbind"
)

// partitionWriter is a table's runtime on one worker as a write sees it:
// State for a Table, GlobalState for a GlobalTable. Both put a write in the
// write cache of the event's partition (the current commit cycle) after
// checking the key's partition (ErrNotCoPartitioned), ownership
// (ErrNotActive) and the event's window (ErrOutsideWindow).
type partitionWriter interface {
	// write puts the encoded key and value (a tombstone when del) in the
	// commit cycle of ev's partition.
	write(ev Event, key, value []byte, del bool) error
	// lockRMW takes partition p's read-modify-write lock (Update) and
	// returns its unlock.
	lockRMW(p int32) (unlock func())
}

// lockRMW implements partitionWriter.
func (s *State) lockRMW(p int32) func() { return s.rmw.lock(p) }

// lockRMW implements partitionWriter.
func (s *GlobalState) lockRMW(p int32) func() { return s.rmw.lock(p) }

// writable is the one table writer's view of a typed table: Table and
// GlobalTable implement it, and setKey, updateKey, computeKey and deleteKey
// are their TryPut, TryUpdate, TryCompute and TryDelete, so that a fix to the
// write path (a lock, an error's context) is made once for both.
type writable[K any, V any] interface {
	// writer returns the runtime ev's writes go to, or ErrNotRunning
	// (wrapped) when ev's worker does not run the table.
	writer(ev Event) (partitionWriter, error)
	// Get reads key as ev's agent sees it (Update's read).
	Get(ev Event, key K) (V, bool, error)
	// written runs after every successful write of key (a Table's joins).
	written(ev Event, key K) error
	encodeKey(key K) ([]byte, error)
	encodeValue(key K, value V) ([]byte, error)
	// Name is the table's name (errors).
	Name() string
}

// The write model (doc.go, "Writes fail the event"): a write method that
// returns no error (Put, Update, Compute, Delete, Windowed.Update, the agent
// package's Topic.Send) fails the event when the write fails: failOn records
// the error with the event's run, whose stream then yields no further event
// and whose agent fails with the error, as if its function had returned it
// there. The Try… variants return the error and record nothing. Either way,
// once a run failed every later write made with one of its events is refused
// with ErrEventFailed (checkFailed): the run's effects stop where it failed.

// failOn fails ev's run with err (nil: nothing).
func failOn(ev Event, err error) {
	if err != nil {
		evbind.Fail[*Env](ev, err)
	}
}

// checkFailed returns ErrEventFailed (wrapping the failure) when ev's run
// already failed.
func checkFailed(name string, ev Event) error {
	if ferr := evbind.Failed[*Env](ev); ferr != nil {
		return fmt.Errorf("table %s: %w: %w", name, ErrEventFailed, ferr)
	}
	return nil
}

// setKey writes value under key in the current commit cycle of ev's
// partition, then runs t's watchers.
func setKey[K any, V any](t writable[K, V], ev Event, key K, value V) error {
	return writeKey(t, ev, key, &value)
}

// updateKey replaces key's value with fn(old) under the partition's
// read-modify-write lock, so that agents updating one table partition
// concurrently never lose each other's updates.
func updateKey[K any, V any](t writable[K, V], ev Event, key K, fn func(old V) V) (V, error) {
	if err := checkFailed(t.Name(), ev); err != nil {
		var zero V
		return zero, err
	}
	if w, err := t.writer(ev); err == nil {
		defer w.lockRMW(ev.Partition())()
	}
	old, _, err := t.Get(ev, key)
	if err != nil {
		return old, err
	}
	nv := fn(old)
	return nv, setKey(t, ev, key, nv)
}

// computeKey is Table.Compute: one read-modify-write of key under the
// partition's read-modify-write lock, a tombstone when fn drops a present key,
// nothing when it drops an absent one.
func computeKey[K any, V any](t writable[K, V], ev Event, key K, fn func(old V, found bool) (V, bool)) (V, bool, error) {
	if err := checkFailed(t.Name(), ev); err != nil {
		var zero V
		return zero, false, err
	}
	if w, err := t.writer(ev); err == nil {
		defer w.lockRMW(ev.Partition())()
	}
	old, found, err := t.Get(ev, key)
	if err != nil {
		return old, found, err
	}
	nv, keep := fn(old, found)
	if keep {
		return nv, true, setKey(t, ev, key, nv)
	}
	var zero V
	if !found {
		return zero, false, nil
	}
	return zero, false, deleteKey(t, ev, key)
}

// deleteKey writes a tombstone for key in the current commit cycle of ev's
// partition, then runs t's watchers.
func deleteKey[K any, V any](t writable[K, V], ev Event, key K) error {
	return writeKey(t, ev, key, nil)
}

// writeKey is TryPut (value non-nil) and TryDelete (value nil). Its errors
// come in this order: ErrNotRunning, ErrEventFailed, the key codec's, the
// value codec's (naming the key), then the write's (ErrNotCoPartitioned,
// ErrNotActive, ErrOutsideWindow) and the watchers'.
func writeKey[K any, V any](t writable[K, V], ev Event, key K, value *V) error {
	w, err := t.writer(ev)
	if err != nil {
		return err
	}
	if err := checkFailed(t.Name(), ev); err != nil {
		return err
	}
	kb, err := t.encodeKey(key)
	if err != nil {
		return err
	}
	var vb []byte
	if value != nil {
		if vb, err = t.encodeValue(key, *value); err != nil {
			return err
		}
	}
	if err := w.write(ev, kb, vb, value == nil); err != nil {
		return err
	}
	return t.written(ev, key)
}

// writerOf adapts a table's runtime lookup (Table.current,
// GlobalTable.current) to writable.writer.
func writerOf[S partitionWriter](s S, err error) (partitionWriter, error) {
	if err != nil {
		return nil, err
	}
	return s, nil
}
