package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// countAcks counts the answers of the records sent with it.
type countAcks struct{ ok, failed atomic.Int64 }

func (c *countAcks) Acked(_ int64, err error) {
	if err != nil {
		c.failed.Add(1)
	} else {
		c.ok.Add(1)
	}
}

// readCommitted returns the values of partition 0 of topic that a
// read_committed consumer gets, up to the highwater.
func readCommitted(t *testing.T, brokers []string, topic string) []string {
	t.Helper()
	cfg := testbroker.SaramaConfig(t)
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	hwm, err := client.GetOffset(topic, 0, sarama.OffsetNewest)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	pc, err := cons.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var out []string
	// The last stable offset is the highwater once no transaction is open:
	// the read ends when a fetch gives nothing for a while (only markers
	// and aborted records left).
	for {
		select {
		case m := <-pc.Messages():
			out = append(out, string(m.Value))
			if m.Offset+1 >= hwm {
				return out
			}
		case <-time.After(2 * time.Second):
			return out
		}
	}
}

// Renew replaces a transactional producer while senders keep sending into
// its open transaction: every record sent gets exactly one answer (the
// producer's in-flight count drains), the records of the old producer's
// open transaction are aborted by the new producer's InitProducerId (a
// read_committed reader never sees them), and the new producer commits a
// transaction of its own that the reader sees exactly once.
func TestRenewAbortsOpenTransactionAndKeepsEveryAnswer(t *testing.T) {
	brokers := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "renew")
	admin, err := sarama.NewClusterAdmin(brokers, testbroker.SaramaConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
	p, err := kafka.NewTxnProducer(kafka.ProducerConfig{Brokers: brokers, TransactionalID: topic + "-txn"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	var acks countAcks
	var sent, refused atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				v := []byte(fmt.Sprintf("old-%d-%d", g, i))
				if err := p.SendRecord(topic, 0, nil, v, &acks); err != nil {
					refused.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				sent.Add(1)
			}
		}()
	}
	for sent.Load() < 200 {
		time.Sleep(time.Millisecond)
	}
	if err := p.Renew(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	// After the renewal no transaction is open: senders are refused until
	// Begin.
	if err := p.SendRecord(topic, 0, nil, []byte("outside"), &acks); !errors.Is(err, kafka.ErrNoTransaction) {
		t.Fatalf("send with no transaction open: %v, want ErrNoTransaction", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := acks.ok.Load() + acks.failed.Load(); got != sent.Load() {
		t.Fatalf("%d records sent, %d answers (%d ok, %d failed)", sent.Load(), got, acks.ok.Load(), acks.failed.Load())
	}
	if err := p.Begin(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := p.SendRecord(topic, 0, nil, []byte(fmt.Sprintf("new-%d", i)), &acks); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Commit(nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	got := readCommitted(t, brokers, topic)
	if len(got) != 10 {
		t.Fatalf("read_committed sees %d records, want the new transaction's 10: %v", len(got), got)
	}
	for i, v := range got {
		if want := fmt.Sprintf("new-%d", i); v != want {
			t.Fatalf("record %d is %q, want %q", i, v, want)
		}
	}
	if p.Fatal() {
		t.Fatal("renewed producer reports a fatal state")
	}
}

// Renew after Close fails and leaves the producer closed.
func TestRenewAfterClose(t *testing.T) {
	brokers := testbroker.Brokers(t)
	p, err := kafka.NewTxnProducer(kafka.ProducerConfig{Brokers: brokers, TransactionalID: testbroker.Topic(t, "txn")})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Renew(); !errors.Is(err, kafka.ErrProducerClosed) {
		t.Fatalf("Renew after Close: %v, want ErrProducerClosed", err)
	}
	if err := p.SendRecord("t", 0, nil, []byte("v"), &countAcks{}); !errors.Is(err, kafka.ErrProducerClosed) {
		t.Fatalf("send after Close: %v, want ErrProducerClosed", err)
	}
}
