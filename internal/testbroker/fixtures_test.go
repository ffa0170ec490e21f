package testbroker_test

import (
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/internal/testbroker"
)

// The fixtures report the broker's state: a topic created with three
// partitions has three highwaters that count exactly the records produced,
// a group that committed nothing reads -1 everywhere (also on Kafka 4, where
// such a group does not exist), and WaitLag0 returns once the commits reach
// the highwaters.
func TestFixturesOffsets(t *testing.T) {
	brokers := testbroker.Brokers(t)
	topic := testbroker.Topic(t, "fx")
	group := testbroker.Topic(t, "fx-group")
	testbroker.CreateTopic(t, brokers, topic, 3, map[string]string{"retention.ms": "-1"})
	client := testbroker.Client(t, brokers)

	prod := testbroker.SyncProducer(t, brokers)
	defer prod.Close()
	for range 2 {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 1, Value: sarama.StringEncoder("v")}); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := testbroker.Highwaters(t, client, topic), map[int32]int64{0: 0, 1: 2, 2: 0}; !equal(got, want) {
		t.Fatalf("highwaters %v, want %v", got, want)
	}
	if got, want := testbroker.Committed(t, brokers, group, topic), map[int32]int64{0: -1, 1: -1, 2: -1}; !equal(got, want) {
		t.Fatalf("committed before any commit %v, want %v", got, want)
	}

	// A simple (group-less) commit of offset 2 on partition 1, as
	// kafka-consumer-groups --reset-offsets writes it.
	coord, err := client.Coordinator(group)
	if err != nil {
		t.Fatal(err)
	}
	req := &sarama.OffsetCommitRequest{Version: 2, ConsumerGroup: group, ConsumerGroupGeneration: -1, RetentionTime: -1}
	req.AddBlock(topic, 1, 2, 0, "")
	resp, err := coord.CommitOffset(req)
	if err != nil {
		t.Fatal(err)
	}
	if kerr := resp.Errors[topic][1]; kerr != sarama.ErrNoError {
		t.Fatal(kerr)
	}
	testbroker.WaitLag0(t, brokers, group, topic)
	if got, want := testbroker.Committed(t, brokers, group, topic), map[int32]int64{0: -1, 1: 2, 2: -1}; !equal(got, want) {
		t.Fatalf("committed %v, want %v", got, want)
	}
}

// Start runs the runner until stop, which returns Run's error every time it
// is called.
func TestFixturesStart(t *testing.T) {
	want := errors.New("stopped")
	runs := 0
	stop := testbroker.Start(t, runFunc(func(ctx context.Context) error {
		runs++
		<-ctx.Done()
		return want
	}))
	if err := stop(); err != want {
		t.Fatalf("stop: %v, want %v", err, want)
	}
	if err := stop(); err != want || runs != 1 {
		t.Fatalf("second stop: %v after %d runs, want %v after 1", err, runs, want)
	}
}

// GzipLines reads back what was written, up to the limit; WriteLines writes
// one line per element.
func TestFixturesLines(t *testing.T) {
	lines := [][]byte{[]byte(`{"a":1}`), []byte(`{"b":2}`), []byte(`{"c":3}`)}
	plain, err := os.ReadFile(testbroker.WriteLines(t, lines))
	if err != nil {
		t.Fatal(err)
	}
	if string(plain) != "{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n" {
		t.Fatalf("WriteLines wrote %q", plain)
	}
	gz := filepath.Join(t.TempDir(), "l.jsonl.gz")
	f, err := os.Create(gz)
	if err != nil {
		t.Fatal(err)
	}
	z := gzip.NewWriter(f)
	if _, err := z.Write(plain); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(z.Close(), f.Close()); err != nil {
		t.Fatal(err)
	}
	if got := testbroker.GzipLines(t, gz, 0); len(got) != 3 || string(got[2]) != `{"c":3}` {
		t.Fatalf("GzipLines(0) = %q", got)
	}
	if got := testbroker.GzipLines(t, gz, 2); len(got) != 2 || string(got[1]) != `{"b":2}` {
		t.Fatalf("GzipLines(2) = %q", got)
	}
}

type runFunc func(ctx context.Context) error

func (f runFunc) Run(ctx context.Context) error { return f(ctx) }

func equal(a, b map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
