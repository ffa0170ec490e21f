package app

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"
)

func runPlanCmd(t *testing.T, args ...string) PlanOutput {
	t.Helper()
	a := New("plan-cmd-test")
	cmd := a.Command()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(append([]string{"assignment", "plan", "--file", "testdata/assignment-cluster.json"}, args...))
	if err := cmd.Execute(); err != nil {
		t.Fatalf("assignment plan %v: %v", args, err)
	}
	var p PlanOutput
	if err := json.Unmarshal(out.Bytes(), &p); err != nil {
		t.Fatalf("output is not a plan: %v\n%s", err, out.String())
	}
	return p
}

// TestAssignmentPlanCommand runs `assignment plan` on the example cluster of
// docs/assignment.md: as is nothing moves; adding two workers moves exactly
// one task from each old worker to each newcomer (both statelessly: they held
// no standby); removing w2 promotes its standbys on w1; with the cooperative
// protocol the moves are withheld (pending) and nobody's active yet.
func TestAssignmentPlanCommand(t *testing.T) {
	same := runPlanCmd(t)
	if len(same.Moves) != 0 || same.MovedTasks != 0 {
		t.Fatalf("unchanged cluster moves %v", same.Moves)
	}
	if !reflect.DeepEqual(same.Members["w1"].Actives["orders"], []int32{0, 1}) || same.URLs["orders"][2] != "http://host-b:6066" {
		t.Fatalf("unchanged plan: %+v", same)
	}

	grow := runPlanCmd(t, "--add", "2")
	if grow.MovedTasks != 2 || grow.Stateless != 2 || len(grow.Moves) != 4 {
		t.Fatalf("add 2: moved %d tasks (%d stateless), moves %v", grow.MovedTasks, grow.Stateless, grow.Moves)
	}
	for _, id := range []string{"w1", "w2", "new-1", "new-2"} {
		if n := len(grow.Members[id].Actives["orders"]); n != 1 {
			t.Fatalf("add 2: %s has %d partitions: %+v", id, n, grow.Members)
		}
		if !reflect.DeepEqual(grow.Members[id].Actives["orders"], grow.Members[id].Actives["shop-totals-changelog"]) {
			t.Fatalf("add 2: %s not co-partitioned: %v", id, grow.Members[id].Actives)
		}
	}
	for _, mv := range grow.Moves {
		if (mv.From != "w1" && mv.From != "w2") || (mv.To != "new-1" && mv.To != "new-2") {
			t.Fatalf("add 2: unexpected move %+v", mv)
		}
	}

	shrink := runPlanCmd(t, "--remove", "w2")
	if shrink.MovedTasks != 2 || shrink.Stateless != 0 || !reflect.DeepEqual(shrink.Members["w1"].Actives["orders"], []int32{0, 1, 2, 3}) {
		t.Fatalf("remove w2: %+v", shrink)
	}

	coop := runPlanCmd(t, "--add", "2", "--cooperative")
	if coop.Withheld != 2 || len(coop.Members["new-1"].Actives["orders"]) != 0 || len(coop.Members["new-1"].Pending["orders"]) != 1 {
		t.Fatalf("cooperative add 2: %+v", coop)
	}
	if n := len(coop.Members["w1"].Actives["orders"]); n != 1 {
		t.Fatalf("cooperative: w1 keeps %d, want 1 (the other is revoked)", n)
	}
}

// Without --file, --brokers nor RUNNEL_BROKERS, and stdin a terminal,
// `assignment plan` fails at once, naming the ways to give a cluster,
// instead of waiting for JSON typed in; --file with --brokers is an error.
func TestAssignmentPlanNeedsInput(t *testing.T) {
	t.Setenv("RUNNEL_BROKERS", "")
	isTerminal = func(io.Reader) bool { return true }
	t.Cleanup(func() { isTerminal = terminalStdin })
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "nothing to plan: give --brokers (or RUNNEL_BROKERS)"},
		{[]string{"--file", "testdata/assignment-cluster.json", "--brokers", "127.0.0.1:1"}, "--file and --brokers: give one"},
	} {
		cmd := New("plan-cmd-test").Command()
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.SetIn(strings.NewReader(""))
		cmd.SetArgs(append([]string{"assignment", "plan"}, c.args...))
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("assignment plan %v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
