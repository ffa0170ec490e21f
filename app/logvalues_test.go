package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// syncBuffer is a bytes.Buffer a logger writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestJSONLogsNameEnumsAndListPartitions runs a worker with a JSON logger
// and reads its join and assignment lines back: the rebalance protocol is
// its name, and partitions by topic are an object of arrays, as
// /api/assignment shows them, not a flattened string.
func TestJSONLogsNameEnumsAndListPartitions(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	var logs syncBuffer
	o := newOpsApp(t, id, app.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	w, err := o.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	line := func(msg string) map[string]any {
		for _, l := range strings.Split(logs.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
				return m
			}
		}
		return nil
	}
	for deadline := time.Now().Add(60 * time.Second); line("session started") == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no session within 60 s; logs:\n%s", logs.String())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}

	join := line("worker joining group")
	if join["protocol"] != "cooperative" {
		t.Errorf(`"worker joining group": protocol %#v, want "cooperative"`, join["protocol"])
	}
	asg := line("assignment")
	words := o.words.Name()
	var all []any
	for p := range parts {
		all = append(all, float64(p))
	}
	actives, ok := asg["actives"].(map[string]any)
	if !ok {
		t.Fatalf(`"assignment": actives %#v, want an object of arrays`, asg["actives"])
	}
	if !reflect.DeepEqual(actives[words], all) {
		t.Errorf(`"assignment": actives[%s] = %#v, want %v`, words, actives[words], all)
	}
	for _, k := range []string{"standbys", "warmups", "pending"} {
		if m, ok := asg[k].(map[string]any); !ok || len(m) != 0 {
			t.Errorf(`"assignment": %s %#v, want {}`, k, asg[k])
		}
	}
	claims, ok := line("session started")["claims"].(map[string]any)
	if !ok {
		t.Fatalf(`"session started": claims %#v, want an object of arrays`, line("session started")["claims"])
	}
	if !reflect.DeepEqual(claims[words], all) {
		t.Errorf(`"session started": claims[%s] = %#v, want %v`, words, claims[words], all)
	}
}
