// Package assignor plans partition assignments for a Runnel consumer group:
// co-partitioned groups of topics, sticky actives, standby replicas of changelog
// partitions, and the Sarama BalanceStrategy that carries each member's state
// through SubscriptionUserData and OnAssignment.
//
// assignor knows nothing of tables or stores; its planning core is pure and
// deterministic.
package assignor
