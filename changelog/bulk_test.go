package changelog_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// bulkTopic creates a one-partition topic on the test broker, produces n
// records to it (key(i), value(i)) as fast as the async producer goes, and
// returns a client configured for large fetches.
func bulkTopic(tb testing.TB, base string, n int, key func(int) string, value func(int) []byte) (sarama.Client, string) {
	tb.Helper()
	brokers := testbroker.Brokers(tb)
	cfg := testbroker.SaramaConfig(tb)
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.Fetch.Default = 8 << 20
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { client.Close() })
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		tb.Fatal(err)
	}
	topic := testbroker.Topic(tb, base)
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		tb.Fatal(err)
	}
	pcfg := testbroker.SaramaConfig(tb)
	pcfg.Producer.Partitioner = sarama.NewManualPartitioner
	pcfg.Producer.Flush.Messages = 5000
	pcfg.Producer.Flush.Frequency = 5 * time.Millisecond
	pcfg.Producer.Compression = sarama.CompressionNone
	prod, err := sarama.NewAsyncProducer(brokers, pcfg)
	if err != nil {
		tb.Fatal(err)
	}
	go func() {
		for i := range n {
			prod.Input() <- &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key(i)), Value: sarama.ByteEncoder(value(i))}
		}
	}()
	for range n {
		select {
		case <-prod.Successes():
		case err := <-prod.Errors():
			tb.Fatal(err)
		}
	}
	prod.Close()
	return client, topic
}
