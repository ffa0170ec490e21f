// Package stores defines the Store interface for table state and its two
// implementations: Pebble (the default, on disk) and memory (tests).
//
// stores knows nothing of Kafka and imports no other Runnel package.
package stores
