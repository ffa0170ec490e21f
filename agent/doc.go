// Package agent holds agents (user functions over a stream of records), streams,
// events and sinks, and the ack-mode shared sources that feed them: one poll loop
// per source fans each record out to every subscribed agent, and a record is
// advanced (its offset committed) only after every subscriber moved past it and
// every record it derived was acknowledged by the broker.
//
// Table writes and Topic.Send made with an event return no error: a failed one
// fails the event, as if the agent's function had returned the error there
// (the stream ends, Stream.Err returns it, the error policy applies even when
// the function returns nil); their Try… variants return it instead. Package
// table's documentation ("Writes fail the event") has the rule. Effect.Apply
// returns its error: it is the external system's, which the agent may retry or
// branch on.
//
// agent must never commit an offset past an unresolved record.
package agent
