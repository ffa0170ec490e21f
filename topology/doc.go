// Package topology holds the declared graph of an application (topics, agents,
// tables) as plain data, validates co-partitioning and renders it for describe.
//
// topology imports no Kafka client.
package topology
