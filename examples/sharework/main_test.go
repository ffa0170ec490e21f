package main

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/runnel-dev/runnel/internal/testbroker"
)

// The example end to end: two items processed (each result written once,
// on the item's first delivery), the empty one dead-lettered, and the
// worker stops with its context.
func TestShareWork(t *testing.T) {
	brokers := testbroker.Brokers(t)
	in, out, group := testbroker.Topic(t, "work"), testbroker.Topic(t, "results"), testbroker.Topic(t, "share")
	testbroker.CreateTopic(t, brokers, in, 2, nil)
	testbroker.CreateTopic(t, brokers, out, 1, nil)
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testbroker.WaitTimeout)
	defer cancel()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: in, Key: []byte("1"), Value: []byte("paint")},
		&kgo.Record{Topic: in, Key: []byte("2"), Value: nil}, &kgo.Record{Topic: in, Key: []byte("3"), Value: []byte("sand")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- run(rctx, brokers, group, in, out) }()

	results := read(ctx, t, brokers, out, 2)
	slices.Sort(results)
	if want := []string{"PAINT done (delivery 1)", "SAND done (delivery 1)"}; !slices.Equal(results, want) {
		t.Fatalf("results %q, want %q", results, want)
	}
	if dl := read(ctx, t, brokers, group+"-worker-dlq", 1); dl[0] != "" {
		t.Fatalf("dead letter %q, want the empty item", dl[0])
	}
	stop()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Fatalf("run: %v", err)
	}
}

func read(ctx context.Context, t *testing.T, brokers []string, topic string, n int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []string
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: %d of %d records: %v", topic, len(out), n, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) { out = append(out, string(r.Value)) })
	}
	return out
}
