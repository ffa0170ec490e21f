// Package assignor plans partition assignments for a Runnel consumer group:
// co-partitioned groups of topics, sticky actives balanced per member both
// among stateful tasks and in total, standby replicas of changelog partitions,
// KIP-441 lag-aware placement with warm-ups, and the Sarama BalanceStrategy
// that carries each member's state through SubscriptionUserData and
// OnAssignment (checksummed, versioned user data; docs/assignment.md).
// Members use CheckWarmups to ask for the follow-up rebalance when a warm-up
// caught up, URLsFromGroup to rebuild the partition -> URL map when the
// leader left it out, and Restore to report a persisted assignment after a
// restart.
//
// assignor knows nothing of tables or stores and does no I/O of its own (the
// Strategy calls the functions its Config gives it); its planning core is
// pure and deterministic and must never trust member user data it cannot
// verify.
package assignor
