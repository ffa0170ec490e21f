package kafka

import (
	"errors"
	"fmt"
	"sort"

	"github.com/IBM/sarama"
	"github.com/hashicorp/go-multierror"
)

// TopicSpec describes a topic Runnel declares and creates.
type TopicSpec struct {
	Name       string
	Partitions int32
	// Replication is the replication factor; 0 takes min(3, brokers in the cluster).
	Replication int16
	// Config holds topic configs such as cleanup.policy=compact.
	Config map[string]string
}

// EnsureTopics creates the topics that do not exist and checks that the ones that
// do have the declared partition count (a mismatch breaks co-partitioning, so it
// is an error, never silently accepted). Errors for several topics are combined.
func EnsureTopics(admin sarama.ClusterAdmin, brokers int, specs []TopicSpec) error {
	existing, err := admin.ListTopics()
	if err != nil {
		return fmt.Errorf("list topics: %w", err)
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name })
	var errs *multierror.Error
	for _, s := range specs {
		if d, ok := existing[s.Name]; ok {
			if d.NumPartitions != s.Partitions {
				errs = multierror.Append(errs, fmt.Errorf("topic %s has %d partitions, the app declares %d: co-partitioned topics and tables need the declared count", s.Name, d.NumPartitions, s.Partitions))
			}
			continue
		}
		rf := s.Replication
		if rf <= 0 {
			rf = int16(min(3, max(brokers, 1)))
		}
		cfg := map[string]*string{}
		for k, v := range s.Config {
			cfg[k] = &v
		}
		err := admin.CreateTopic(s.Name, &sarama.TopicDetail{NumPartitions: s.Partitions, ReplicationFactor: rf, ConfigEntries: cfg}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			var te *sarama.TopicError
			if !(errors.As(err, &te) && te.Err == sarama.ErrTopicAlreadyExists) {
				errs = multierror.Append(errs, fmt.Errorf("create topic %s: %w", s.Name, err))
			}
		}
	}
	return errs.ErrorOrNil()
}
