package changelog_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/stores"
)

// TestRestoreOneMillionRecords restores a changelog partition of 1,000,000
// records (100,000 keys, each written 10 times, 100-byte values; no
// compaction: the topic is cleanup.policy=delete) into a fresh Pebble store and
// checks the count, the checkpoint and every key's last value. Skipped with
// -short.
func TestRestoreOneMillionRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("1M records: skipped with -short")
	}
	const n, keys = 1_000_000, 100_000
	pad := make([]byte, 90)
	for i := range pad {
		pad[i] = 'x'
	}
	value := func(i int) []byte { return append([]byte(fmt.Sprintf("%010d", i)), pad...) }
	client, topic := bulkTopic(t, "million", n, func(i int) string { return "k" + strconv.Itoa(i%keys) }, value)

	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	st, err := stores.OpenPebble(t.TempDir(), stores.PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := &changelog.Restorer{Client: client, Consumer: consumer, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	start := time.Now()
	res, err := r.Restore(context.Background(), topic, 0, st)
	if err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	t.Logf("restored %d records in %v (%.0f records/s)", res.Records, el, float64(res.Records)/el.Seconds())
	if res.Records != n || res.To != n {
		t.Fatalf("restored %d records to offset %d, want %d to %d", res.Records, res.To, n, n)
	}
	if off, _ := st.Offset(0); off != n-1 {
		t.Fatalf("checkpoint %d, want %d", off, n-1)
	}
	seen := 0
	err = st.Iterate(0, func(k, v []byte) error {
		i, err := strconv.Atoi(string(k[1:]))
		if err != nil {
			return err
		}
		// The last write of key i%keys is record n-keys+i.
		if want := value(n - keys + i); string(v) != string(want) {
			return fmt.Errorf("key %s = %.10s, want %.10s", k, v, want)
		}
		seen++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen != keys {
		t.Fatalf("%d keys, want %d", seen, keys)
	}
}
