// Package codec converts typed keys and values to and from the bytes stored in
// Kafka records and local stores.
//
// codec imports no other Runnel package.
package codec
