package app

import "github.com/runnel-dev/runnel/agent/source"

// What a test harness (package runneltest) needs of an App beyond a worker's
// options: settings changed after New, and dead letters decoded.

// Configure applies opts to an app after New, before any worker starts (a
// worker copies the settings when NewWorker creates it). Unlike options given
// to New, these are applied after the RUNNEL_* environment, so they win over
// it. Not safe for concurrent use with NewWorker.
func (a *App) Configure(opts ...Option) {
	for _, o := range opts {
		o(&a.cfg)
	}
}

// DecodeDeadLetter decodes one record of a dead-letter topic (rec's topic,
// partition and offset locate the dead letter): the source record's key,
// value and timestamp, and the runnel-* headers (HeaderReason and the
// others); a header that is missing or malformed leaves its field empty
// (Partition and Offset -1).
func DecodeDeadLetter(rec *source.Record) DeadLetter { return decodeDeadLetterRecord(rec) }
