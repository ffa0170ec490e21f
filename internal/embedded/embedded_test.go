package embedded

import (
	"context"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Records with old event times stay: dev mode sends inputs with their own
// timestamps (`dev --timestamp-field`), and under Kafka's default retention
// of seven days, which the broker applies every CleanerBackoff, a record of
// a year before was deleted before any agent read it. With Retention set,
// the same record goes at the retention pass.
func TestOldRecordsOutliveRetention(t *testing.T) {
	for _, tc := range []struct {
		name      string
		retention time.Duration
		start     int64 // the log start offset after the retention pass
	}{{"default", 0, 0}, {"seven-days", 7 * 24 * time.Hour, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Start(Options{Retention: tc.retention})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			cl, err := kgo.NewClient(kgo.SeedBrokers(b.Addrs()...), kgo.DefaultProduceTopic("in"))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx := context.Background()
			sc, err := sarama.NewClient(b.Addrs(), sarama.NewConfig())
			if err != nil {
				t.Fatal(err)
			}
			defer sc.Close()
			adm, err := sarama.NewClusterAdminFromClient(sc)
			if err != nil {
				t.Fatal(err)
			}
			if err := adm.CreateTopic("in", &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
				t.Fatal(err)
			}
			old := &kgo.Record{Value: []byte("x"), Timestamp: time.Now().AddDate(-1, 0, 0)}
			if err := cl.ProduceSync(ctx, old).FirstErr(); err != nil {
				t.Fatal(err)
			}
			b.Cluster().ApplyRetention()
			start, err := sc.GetOffset("in", 0, sarama.OffsetOldest)
			if err != nil || start != tc.start {
				t.Fatalf("log start offset %d (%v) after the retention pass, want %d", start, err, tc.start)
			}
		})
	}
}
