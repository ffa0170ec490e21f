// Package agent holds agents (user functions over a stream of records), streams,
// events and sinks, and the ack-mode shared sources that feed them: one poll loop
// per source fans each record out to every subscribed agent, and a record is
// advanced (its offset committed) only after every subscriber moved past it and
// every record it derived was acknowledged by the broker.
//
// agent must never commit an offset past an unresolved record.
package agent
