package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/table"
)

// TestPlanLiveGroup: `assignment plan --brokers` reads the running group
// (its members' subscriptions and assignments, the changelogs'
// highwaters) and plans it: with nothing added or removed the plan is the
// members' current assignment and nothing moves; with --add 1 the
// newcomer gets its share. RUNNEL_BROKERS names the group's brokers as
// --brokers does: stdin is not read.
func TestPlanLiveGroup(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "planlive")
	newApp := func() (*app.App, string) {
		a := app.New(id,
			app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
			app.WithCommitInterval(200*time.Millisecond), app.WithLogger(testLogger()), app.WithTopicPrefix(id+"-"))
		in := app.Topic(a, "in", codec.String(), codec.String(), app.Partitions(4))
		counts := table.New(a, "counts", codec.String(), codec.DecimalInt64())
		agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				counts.Update(ev, ev.Key, func(c int64) int64 { return c + 1 })
			}
			return s.Err()
		}, agent.WritesTo(counts))
		return a, in.Name()
	}
	a, topic := newApp()
	w, err := a.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for deadline := time.Now().Add(30 * time.Second); !w.Ready() || len(w.Assignment().Actives[topic]) != 4; {
		if time.Now().After(deadline) {
			t.Fatalf("worker never ready: %v", w.Assignment().Actives)
		}
		time.Sleep(20 * time.Millisecond)
	}
	plan := func(args ...string) app.PlanOutput {
		t.Helper()
		pa, _ := newApp()
		cmd := pa.Command()
		var out, errOut bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		cmd.SetArgs(append([]string{"assignment", "plan", "--brokers", strings.Join(brokers, ",")}, args...))
		if err := cmd.Execute(); err != nil {
			t.Fatalf("assignment plan --brokers %v: %v (%s)", args, err, errOut.String())
		}
		var po app.PlanOutput
		if err := json.Unmarshal(out.Bytes(), &po); err != nil {
			t.Fatalf("output %q: %v", out.String(), err)
		}
		return po
	}
	cur := w.Assignment()
	po := plan()
	if len(po.Members) != 1 || len(po.Moves) != 0 || !reflect.DeepEqual(po.Members[cur.MemberID].Actives, cur.Actives) {
		t.Fatalf("plan of the live group: %+v, want member %s keeping %v", po, cur.MemberID, cur.Actives)
	}
	// The group runs the cooperative protocol (the default): the
	// newcomer's partitions are pending until their owner revoked them.
	po = plan("--add", "1")
	nw := po.Members["new-1"]
	if got := len(nw.Actives[topic]) + len(nw.Pending[topic]); got != 2 || po.MovedTasks != 2 {
		t.Fatalf("with --add 1 the newcomer gets %d partitions of %s (%d tasks move), want 2 (%+v)", got, topic, po.MovedTasks, po)
	}

	t.Setenv("RUNNEL_BROKERS", strings.Join(brokers, ","))
	pa, _ := newApp()
	cmd := pa.Command()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader("")) // read, it would be no JSON
	cmd.SetArgs([]string{"assignment", "plan"})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("RUNNEL_BROKERS=%s assignment plan: %v (%s)", strings.Join(brokers, ","), err, errOut.String())
	}
	var env app.PlanOutput
	if err := json.Unmarshal(out.Bytes(), &env); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	if len(env.Members) != 1 || !reflect.DeepEqual(env.Members[cur.MemberID].Actives, cur.Actives) {
		t.Fatalf("plan with RUNNEL_BROKERS: %+v, want member %s keeping %v", env, cur.MemberID, cur.Actives)
	}
}
