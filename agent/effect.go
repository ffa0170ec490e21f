package agent

import (
	"fmt"

	"github.com/runnel-dev/runnel/table"
)

// Effect is a named side effect of an agent on a system outside Kafka: an
// audit row in a database, a notification, an HTTP call. Naming it lets a
// replay (package replay, docs/replay.md) run an agent over history with
// that one effect live and every other effect skipped, so that replaying
// yesterday re-fills an audit table without re-sending yesterday's e-mails.
//
// An Effect is declared once (usually beside the agent) and called inside
// the event's window, before the agent pulls the next event: the source
// record is then committed only after the effect returned without error.
type Effect struct {
	name string
}

// NewEffect declares an effect. name identifies it to `replay --effect`; it
// must be non-empty and unique among the effects of an app.
func NewEffect(name string) *Effect { return &Effect{name: name} }

// Name returns the effect's name.
func (e *Effect) Name() string { return e.name }

// Apply runs fn for ev, unless ev is being replayed for another effect, in
// which case it does nothing and returns (false, nil). fn reports whether it
// changed the external system: false means it found the effect already
// applied (a duplicate, e.g. a unique-key conflict or a dedup hit; see
// replay.SQLOnce and replay.Dedup). Apply returns fn's result; an error is
// wrapped with the effect's name, and the agent should return it so that
// the record is not committed (it is redelivered, or fails the replay).
// Unlike a table write or Topic.Send, Apply does not fail the event by
// itself: fn's error is the external system's (a timeout, a refusal), which
// the agent may retry or branch on before it gives up on the record.
func (e *Effect) Apply(ev table.Event, fn func() (applied bool, err error)) (bool, error) {
	var gate table.ReplayGate
	if env := envOf(ev); env != nil {
		gate = env.Replay
	}
	if gate != nil && !gate.Live(e.name) {
		return false, nil
	}
	applied, err := fn()
	if gate != nil {
		gate.Done(e.name, applied, err)
	}
	if err != nil {
		return false, &EffectError{Effect: e.name, Err: err}
	}
	return applied, nil
}

// EffectError is the error of an effect's function, as Effect.Apply returns
// it: a replay fails on it even when the agent's error policy dead-letters
// the record (a replay writes no dead letters, so the effect would be lost).
type EffectError struct {
	Effect string
	Err    error
}

func (e *EffectError) Error() string { return fmt.Sprintf("effect %s: %v", e.Effect, e.Err) }

func (e *EffectError) Unwrap() error { return e.Err }
