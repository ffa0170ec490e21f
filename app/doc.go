// Package app declares a Runnel application (topics, agents, tables) and runs it:
// the worker lifecycle inside a Kafka consumer group, the embedded dev broker, the
// CLI (worker, dev, describe, tables, send) and the HTTP endpoints.
//
// app may import every other Runnel package; no other Runnel package imports app.
package app
