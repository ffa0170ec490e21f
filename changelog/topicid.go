package changelog

import (
	"encoding/binary"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/stores"
)

// The changelog topic's ID (KIP-516) is kept with the checkpoint, as two
// store marks holding its high and low 8 bytes (no '/': ParseMarkKey never
// takes them for source marks). A store whose recorded ID differs from the
// topic's holds the state of a deleted topic of the same name: a recreated
// changelog that already refilled past the checkpoint would otherwise be
// read from the checkpoint on and mixed into it (issue #12).
const (
	TopicIDHighMark = "changelog-topic-id-hi"
	TopicIDLowMark  = "changelog-topic-id-lo"
)

// TopicID returns topic's ID from a Metadata request of version 10 or
// later (Kafka 2.8+, sarama with Config.Version >= V2_8_0_0). ok is false
// when the broker or the negotiated version gives none (an all-zero ID).
// Errors: the request failed or the topic is unknown.
func TopicID(c sarama.Client, topic string) (id sarama.Uuid, ok bool, err error) {
	b := c.LeastLoadedBroker()
	if b == nil {
		return id, false, fmt.Errorf("topic id of %s: no broker", topic)
	}
	if err := b.Open(c.Config()); err != nil && err != sarama.ErrAlreadyConnected {
		return id, false, fmt.Errorf("topic id of %s: %w", topic, err)
	}
	resp, err := b.GetMetadata(sarama.NewMetadataRequest(c.Config().Version, []string{topic}))
	if err != nil {
		return id, false, fmt.Errorf("topic id of %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.Name != topic {
			continue
		}
		if t.Err != sarama.ErrNoError {
			return id, false, fmt.Errorf("topic id of %s: %w", topic, t.Err)
		}
		return t.Uuid, t.Uuid != (sarama.Uuid{}), nil
	}
	return id, false, fmt.Errorf("topic id of %s: not in the metadata response", topic)
}

// storedTopicID returns the topic ID recorded in a partition's marks.
func storedTopicID(marks map[string]int64) (id sarama.Uuid, ok bool) {
	hi, okHi := marks[TopicIDHighMark]
	lo, okLo := marks[TopicIDLowMark]
	if !okHi || !okLo {
		return id, false
	}
	binary.BigEndian.PutUint64(id[:8], uint64(hi))
	binary.BigEndian.PutUint64(id[8:], uint64(lo))
	return id, true
}

// topicIDBatch is a batch recording id in a partition's marks, leaving its
// checkpoint as it is.
func topicIDBatch(id sarama.Uuid) *stores.Batch {
	b := &stores.Batch{Offset: stores.NoOffset}
	b.Mark(TopicIDHighMark, int64(binary.BigEndian.Uint64(id[:8])))
	b.Mark(TopicIDLowMark, int64(binary.BigEndian.Uint64(id[8:])))
	return b
}
