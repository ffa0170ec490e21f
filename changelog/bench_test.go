package changelog_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
)

var benchRecords = flag.Int("restore-records", 200_000, "records in the changelog of BenchmarkRestorePebble (use 1000000 for the 1M figure)")

// BenchmarkRestorePebble measures restore throughput: records/s from a kfake
// (or real) changelog partition into a fresh Pebble store, 16-byte keys and
// 100-byte values, 1000-record store batches.
func BenchmarkRestorePebble(b *testing.B) {
	n := *benchRecords
	value := make([]byte, 100)
	client, topic := bulkTopic(b, "bench", n, func(i int) string { return fmt.Sprintf("key-%012d", i) }, func(int) []byte { return value })
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		b.Fatal(err)
	}
	defer consumer.Close()
	r := &changelog.Restorer{Client: client, Consumer: consumer, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b.ResetTimer()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		st, err := stores.OpenPebble(b.TempDir(), stores.PebbleOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		res, err := r.Restore(context.Background(), topic, 0, st)
		total += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if res.Records != int64(n) {
			b.Fatalf("restored %d of %d", res.Records, n)
		}
		b.StopTimer()
		st.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "records/s")
}
