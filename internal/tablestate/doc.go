// Package tablestate is the runtime of Runnel's tables on one worker: a
// table's state (State: write cache, commit cycles, store), a global table's
// replica (GlobalState), the commit cycle a task cuts (Cutter, Cycle, Flush),
// a worker's runtime as tables and sinks see it (Env, InFlight, StreamTime,
// the send funcs and ack receivers), and the runtime side of the table types
// that only the worker calls (RuntimeOf).
//
// It is internal because calling any of it from an app breaks the ack
// accounting the commit protocol rests on (a Cut out of turn commits offsets
// for writes no changelog record holds; an Own steals a partition from its
// task), and because the runtime changes with every release: package table
// is the API an app author uses (declaring tables, reading and writing with
// events), and app, replay, runneltest and internal/task reach the runtime
// here. It never imports package table: its Def and Event have the method
// sets of table.Def and table.Event, so that table values satisfy them.
//
// tablestate must never put a write in the store before its changelog
// record was acknowledged.
package tablestate
