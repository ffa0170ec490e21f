package task

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// State is where a task (one partition of a co-partitioned group of topics
// and tables) is in its life on one worker. The valid transitions are the
// edges of the table in transitions; Lifecycles.Move refuses every other one.
// The shape follows Kafka Streams' Task.State (CREATED, RESTORING, RUNNING,
// SUSPENDED, CLOSED), with Runnel's standby followers and per-partition
// restarts as states of their own:
//
//	created ──► restoring ──► running ◄──► restarting
//	   │  │         ▲   │        │  ▲          │
//	   │  └► standby┘   │        ▼  │          │
//	   │       │        │    suspending        │
//	   │       │        ▼        │             │
//	   │       │    abandoned ◄──┴─────────────┘
//	   ▼       ▼        ▼
//	  closed ◄──────────┘   (every state but closed may close)
type State uint8

const (
	// Created: the task exists on this worker and has not started its work.
	Created State = iota
	// Restoring: a claim of the task brings its table partitions up to their
	// changelogs' highwater (a restore, or a standby's promotion) before its
	// records are processed.
	Restoring
	// Running: the task's sources hand out records and its cycles commit.
	Running
	// Restarting: a failed record's partition waits out its redelivery
	// backoff, caches dropped, before it reads again from the last commit
	// point.
	Restarting
	// Suspending: the partition is being given up (revoked, or the worker
	// stops): its records drain and a final cycle commits them.
	Suspending
	// Standby: the task's table partitions are followed (a standby or
	// warm-up replica); no records are processed.
	Standby
	// Abandoned: a cycle could not complete, or the partition stopped
	// without a final cycle; the writes since the last commit are dropped
	// and the task's claims end (the records are processed again from the
	// committed offsets).
	Abandoned
	// Closed: the task is gone from this worker.
	Closed
	numStates
)

var stateNames = [numStates]string{"created", "restoring", "running", "restarting", "suspending", "standby", "abandoned", "closed"}

// String returns the state's name as logs, metrics and the HTTP API show it.
func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", s)
}

// MarshalText implements encoding.TextMarshaler (the name).
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// States lists every state in order (metrics present a series for each).
func States() []State {
	out := make([]State, numStates)
	for i := range out {
		out[i] = State(i)
	}
	return out
}

// transitions[from] lists the states from may move to. Invariants kept by
// the table: a task processes records (running) only after its tables were
// restored or promoted (restoring) or when it has none (created → running);
// a standby never processes records without a restoring step that promotes
// it; nothing leaves closed (a task that comes back is a new task); an
// abandoned task only closes (its claims end; the next session creates it
// anew).
var transitions = [numStates][]State{
	Created:    {Restoring, Running, Standby, Closed},
	Restoring:  {Running, Abandoned, Closed},
	Running:    {Restarting, Suspending, Abandoned, Closed},
	Restarting: {Running, Suspending, Abandoned, Closed},
	// A suspending task goes back to running when one of its partitions is
	// given up while another co-partitioned claim of it stays (the task
	// keeps running for that one).
	Suspending: {Running, Abandoned, Closed},
	Standby:    {Restoring, Closed},
	Abandoned:  {Closed},
	Closed:     nil,
}

// CanMove reports whether from → to is a valid transition.
func CanMove(from, to State) bool {
	if from >= numStates {
		return false
	}
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// ErrTransition: a transition outside the table (CanMove). It is a bug in the
// runtime, never a broker's or a user's fault.
var ErrTransition = errors.New("invalid task state transition")

// ID names a task: partition Partition of the co-partitioned topics and
// tables with Partitions partitions.
type ID struct{ Partitions, Partition int32 }

// String returns "partition/partitions", as the logs name a task.
func (id ID) String() string { return fmt.Sprintf("%d/%d", id.Partition, id.Partitions) }

// Info is one task's state as Lifecycles.Snapshot reports it.
type Info struct {
	ID    ID
	State State
	// Since is when the task entered State.
	Since time.Time
}

// Lifecycles holds the state of every task of a worker and performs their
// transitions. Move is the one place a transition happens: it validates it
// against the table, logs it (message "task state", keys task, partition,
// from, to), counts it (Moved) and publishes it (Snapshot). A task that
// moves to closed leaves the set; a later Move of its ID starts from created.
// The zero value is ready to use and logs nothing.
type Lifecycles struct {
	// Log receives one line per transition (Info) and per refused one
	// (Error). Nil: no logging.
	Log *slog.Logger
	// Moved, when set, is called after each transition.
	Moved func(from, to State)
	// Refused, when set, is called for each transition outside the table.
	Refused func(id ID, from, to State)

	mu sync.Mutex
	m  map[ID]*Info // guarded by mu
}

// State returns the task's state: closed when it is not in the set.
func (l *Lifecycles) State(id ID) State {
	l.mu.Lock()
	defer l.mu.Unlock()
	if in := l.m[id]; in != nil {
		return in.State
	}
	return Closed
}

// Move moves the task to state to and returns the state it left. A task not
// in the set is created first (from created), unless to is closed (nothing
// to do). Moving to the current state does nothing. A transition outside the
// table is refused: the state stays, Refused is called and the error wraps
// ErrTransition.
func (l *Lifecycles) Move(id ID, to State) (State, error) {
	l.mu.Lock()
	in := l.m[id]
	if in == nil {
		if to == Closed {
			l.mu.Unlock()
			return Closed, nil
		}
		if l.m == nil {
			l.m = map[ID]*Info{}
		}
		in = &Info{ID: id, State: Created, Since: time.Now()}
		l.m[id] = in
	}
	from := in.State
	if from == to {
		l.mu.Unlock()
		return from, nil
	}
	if !CanMove(from, to) {
		l.mu.Unlock()
		if l.Log != nil {
			l.Log.Error("invalid task state transition; state kept", "task", id.String(), "partition", id.Partition, "from", from.String(), "to", to.String())
		}
		if l.Refused != nil {
			l.Refused(id, from, to)
		}
		return from, fmt.Errorf("task %s: %s → %s: %w", id, from, to, ErrTransition)
	}
	in.State, in.Since = to, time.Now()
	if to == Closed {
		delete(l.m, id)
	}
	l.mu.Unlock()
	if l.Log != nil {
		l.Log.Info("task state", "task", id.String(), "partition", id.Partition, "from", from.String(), "to", to.String())
	}
	if l.Moved != nil {
		l.Moved(from, to)
	}
	return from, nil
}

// Snapshot returns every task in the set, by Partitions then Partition.
func (l *Lifecycles) Snapshot() []Info {
	l.mu.Lock()
	out := make([]Info, 0, len(l.m))
	for _, in := range l.m {
		out = append(out, *in)
	}
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].ID.Partitions != out[j].ID.Partitions {
			return out[i].ID.Partitions < out[j].ID.Partitions
		}
		return out[i].ID.Partition < out[j].ID.Partition
	})
	return out
}
