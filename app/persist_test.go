package app_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/assignor"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// A worker keeps its last assignment in its data dir (assignment.json, what
// it reports on its next join through assignor.Strategy.Restore).
func TestWorkerPersistsAssignment(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "app")
	c := newCountApp(t, id)
	dirs := []string{t.TempDir(), t.TempDir()}
	type running struct {
		w    *app.Worker
		stop func() error
	}
	start := func(dir string) running {
		w, stop := goWorker(t, c.app, brokers, dir)
		return running{w, stop}
	}
	settle := func(rs []running) []map[string][]int32 {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			var out []map[string][]int32
			total := 0
			for _, r := range rs {
				a := r.w.Assignment()
				out = append(out, a.Actives)
				total += len(a.Actives[c.words.Name()])
				if len(a.Pending) > 0 || !r.w.Ready() {
					total = -1
				}
			}
			if total == parts {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("group never settled: %v", out)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	stop := func(rs []running) {
		for _, r := range rs {
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
		}
	}
	rs := []running{start(dirs[0])}
	testbroker.WaitTopic(t, testbroker.Client(t, brokers), c.words.Name())
	rs = append(rs, start(dirs[1]))
	want := settle(rs)
	for i, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "assignment.json"))
		if err != nil {
			t.Fatal(err)
		}
		var a assignor.Assignment
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a.Actives, want[i]) {
			t.Fatalf("worker %d persisted actives %v, holds %v", i, a.Actives, want[i])
		}
	}
	stop(rs)
}
