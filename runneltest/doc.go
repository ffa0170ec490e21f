// Package runneltest runs a Runnel app's agents and tables inside a normal
// `go test`, with no Kafka to install: the app's workers run in the test's
// process on an embedded broker (kfake, which speaks the Kafka protocol in
// memory), exactly as they would on a cluster — same group protocol, same
// commit cycles, same changelogs. It is Runnel's counterpart of Kafka Streams'
// TopologyTestDriver and Faust's agent test context, except that nothing is
// simulated: a test that passes here ran the real record path.
//
//	d, err := runneltest.Start(p.App, runneltest.Options{})  // broker + workers, ready
//	defer d.Close()
//	runneltest.Send(d, p.Events, "alice", Change{...})       // produce, acked
//	n, ok, err := runneltest.Get(d, p.CommitsPerActor, "alice") // waits, then reads the changelog
//	out, err := runneltest.Records(d, p.ByDir)                // a sink topic, decoded
//	dls, err := d.DeadLetters("count-by-actor")               // rejected records, with reasons
//
// Every read first waits (Driver.Wait) until the app's consumer group has
// committed every source partition up to its highwater; a worker commits a
// source offset only after everything derived from the record (sink records,
// changelog records, dead letters) was acknowledged, so what a read returns
// is the complete, exact result of the records sent before it. Event time
// (windowed tables, stream time) comes from the record timestamp: Send with
// At(ts). Options.Brokers runs the same test on a cluster instead (a real
// Kafka in an integration tier). docs/testing.md is the guide.
//
// runneltest must never be imported by a production binary's main code path:
// it starts a broker and removes its stores on Close; and it never mocks the
// record path (no fake agents, tables or brokers of its own).
package runneltest
