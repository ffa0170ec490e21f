// Package table provides typed, partitioned key/value tables backed by a local
// store (package stores) and a compacted Kafka changelog topic (package changelog).
//
// A table write is always bound to the event being processed, so that the source
// record is not committed before the changelog record is acknowledged.
//
// # Writes fail the event
//
// A write reads like Kafka Streams' store.put or Faust's table[key] = value:
//
//	counts.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
//	sessions.Put(ev, ev.Key, s)
//	sessions.Delete(ev, ev.Key)
//
// Put, Update, Compute and Delete (of Table and GlobalTable), Windowed's
// Update and UpdateAt, the agent package's Topic.Send and the replay
// package's SetVersion and DeleteVersion return no error:
// what makes them fail is a programming or data error (a value the codec
// refuses, a key outside the event's partition, a write after the agent moved
// to the next event), which the code at the call site cannot fix. A failed
// write fails the event instead, exactly as if the agent's function had
// returned the error at that point: the agent's stream yields no further
// event (its for range loop ends), Stream.Err returns the error (naming the
// table or topic and the key), and the worker handles the agent's run as
// failed with that error even if the function returns nil: the error policy
// (agent.OnError) restarts the partition or dead-letters the record, the
// record and those after it are not committed, and nothing is lost or
// applied twice. Every later write made with an event of the failed run is
// refused (ErrEventFailed). A timer's firing (agent.Tick) fails the same way.
//
// Each has a Try… variant (TryPut, TryUpdate, TryCompute, TryDelete,
// Windowed.TryUpdate, Topic.TrySend, replay.TrySetVersion, …) that returns the
// error and leaves the event alone, for a caller that branches on it:
//
//	if err := counts.TryPut(ev, k, v); errors.Is(err, table.ErrNotCoPartitioned) {
//		// re-key through a topic instead
//	}
//
// Reads (Get, Lookup, Range, Windowed.Current, …) return their errors as
// before. A write with an event no worker made (a zero agent.Event) has no run
// to fail: the Try… variants return ErrNotRunning, the others panic.
//
// Package table must never let a write that failed pass unnoticed: it is
// returned (Try…) or fails the event, never dropped.
package table
