// Package stores defines the Store interface for table state and its two
// implementations: Pebble (the default, on disk) and memory (tests).
//
// A storage fault (a full disk, an I/O error, corruption) is an error of the
// store's methods (ErrFailed), never a panic or an exit of the process: Pebble's
// panics and fatal log calls are caught at this package's boundary, and the
// store stays failed afterwards.
//
// stores knows nothing of Kafka and imports no other Runnel package.
package stores
