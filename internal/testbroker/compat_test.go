package testbroker_test

import (
	"errors"
	"testing"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/internal/testbroker"
)

// TestOffsetFetchUnknownGroup pins a known kfake difference (docs/kafka-compat.md): Kafka
// answers OffsetFetch for a group that never existed with offset -1 and no error; kfake
// answers GROUP_ID_NOT_FOUND. If kfake changes, this test says the doc must change too.
func TestOffsetFetchUnknownGroup(t *testing.T) {
	addrs := testbroker.Brokers(t)
	conf := testbroker.SaramaConfig(t)
	topic := testbroker.Topic(t, "t")
	admin, err := sarama.NewClusterAdmin(addrs, conf)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.DeleteTopic(topic) })

	resp, err := admin.ListConsumerGroupOffsets(testbroker.Topic(t, "nogroup"), map[string][]int32{topic: {0}})
	if testbroker.Real() {
		if err != nil {
			t.Fatalf("real Kafka: OffsetFetch for an unknown group: %v", err)
		}
		b := resp.GetBlock(topic, 0)
		if b == nil || b.Err != sarama.ErrNoError || b.Offset != -1 {
			t.Fatalf("real Kafka: unknown group's offset block %+v, want offset -1, no error", b)
		}
		return
	}
	var kerr sarama.KError
	if err == nil && resp.Err != sarama.ErrNoError {
		err = resp.Err
	}
	if !errors.As(err, &kerr) || kerr != sarama.ErrGroupIDNotFound {
		t.Fatalf("kfake: OffsetFetch for an unknown group gave %v (resp %+v), want GROUP_ID_NOT_FOUND", err, resp)
	}
}
