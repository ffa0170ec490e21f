// Package evbind links an event (agent.Event, agent.Tick) to the runtime
// that table writes and sends made with it need, without making that link
// part of the event's API.
//
// An event type embeds a Handle through an unexported alias: the handle adds
// no exported field or method to the event, only the unexported method that
// Carrier asks for. table.Event embeds Carrier the same way, so that only
// events made by Runnel are table events, and a user cannot call what binds a
// derived record to a record's window (calling it out of turn would break the
// record's ack accounting).
//
// evbind must never hold state of its own: a Handle is a pointer to the
// event's Binder and nothing else.
package evbind

import "fmt"

// Binder is what a table write or a send needs of the event it is made with.
// E is the worker's runtime as tables see it (*table.Env).
type Binder[E any] interface {
	// BindPersist binds one derived record to the event's open window. done
	// must be called exactly once, with nil when the broker acknowledged
	// the record. ok is false when the window is closed.
	BindPersist() (done func(error), ok bool)
	// Env is the runtime of the worker processing the event (nil outside a
	// worker).
	Env() E
	// Fail records err as the failure of the run the event belongs to (an
	// agent's run over its stream, a timer's firing): the first error
	// recorded wins, later ones are ignored. The run then ends as if its
	// function had returned err where the failed write was made. Safe for
	// concurrent use.
	Fail(err error)
	// Failed returns the failure Fail recorded, nil when none. Safe for
	// concurrent use.
	Failed() error
}

// Handle is embedded in an event type to carry its Binder. The zero Handle
// carries none (Of returns nil).
type Handle[E any] struct{ b Binder[E] }

// New returns a handle carrying b.
func New[E any](b Binder[E]) Handle[E] { return Handle[E]{b: b} }

func (h Handle[E]) evbinder() Binder[E] { return h.b }

// Carrier is implemented by the types that embed a Handle[E], and by no type
// outside this module (its method is unexported).
type Carrier[E any] interface{ evbinder() Binder[E] }

// Of returns the binder c carries, nil for an event whose handle is zero (an
// event not made by a worker).
func Of[E any](c Carrier[E]) Binder[E] { return c.evbinder() }

// Failed returns the failure recorded for c's run (Binder.Failed), nil when
// none or when c carries no binder.
func Failed[E any](c Carrier[E]) error {
	if b := c.evbinder(); b != nil {
		return b.Failed()
	}
	return nil
}

// Fail records err (when non-nil) as the failure of c's run: the write
// methods that return no error (Table.Put, Topic.Send, …) fail the event
// with it. An event carrying no binder was made by no worker, so there is no
// run to fail and no caller to return err to; Fail panics then rather than
// drop the write silently (a write with a hand-made event is a programming
// error, like a write to a nil map).
func Fail[E any](c Carrier[E], err error) {
	if err == nil {
		return
	}
	b := c.evbinder()
	if b == nil {
		panic(fmt.Sprintf("runnel: write with an event no worker made: %v", err))
	}
	b.Fail(err)
}
