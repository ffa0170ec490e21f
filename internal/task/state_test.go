package task

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestLifecycles runs testdata/lifecycle: each "move" command moves tasks
// (task=P/N, to=STATE) through a Lifecycles and prints the transition or the
// refusal; "states" prints every task in the set; "counts" the transitions
// counted by Moved (by the state entered) and the refusals.
func TestLifecycles(t *testing.T) {
	var l Lifecycles
	moved := map[State]int{}
	refused := 0
	l.Moved = func(_, to State) { moved[to]++ }
	l.Refused = func(ID, State, State) { refused++ }
	datadriven.RunTest(t, "testdata/lifecycle", func(t *testing.T, d *datadriven.TestData) string {
		switch d.Cmd {
		case "move":
			var id ID
			var to string
			for _, a := range d.CmdArgs {
				switch a.Key {
				case "task":
					if _, err := fmt.Sscanf(a.Vals[0], "%d/%d", &id.Partition, &id.Partitions); err != nil {
						d.Fatalf(t, "task %q: %v", a.Vals[0], err)
					}
				case "to":
					to = a.Vals[0]
				}
			}
			s, ok := parseState(to)
			if !ok {
				d.Fatalf(t, "unknown state %q", to)
			}
			from, err := l.Move(id, s)
			if err != nil {
				if !errors.Is(err, ErrTransition) {
					d.Fatalf(t, "error %v does not wrap ErrTransition", err)
				}
				return fmt.Sprintf("refused: %v; state %s", err, l.State(id))
			}
			return fmt.Sprintf("%s → %s", from, l.State(id))
		case "states":
			var b strings.Builder
			for _, in := range l.Snapshot() {
				fmt.Fprintf(&b, "%s %s\n", in.ID, in.State)
			}
			if b.Len() == 0 {
				return "none"
			}
			return b.String()
		case "counts":
			var b strings.Builder
			for _, s := range States() {
				if moved[s] > 0 {
					fmt.Fprintf(&b, "%s=%d ", s, moved[s])
				}
			}
			fmt.Fprintf(&b, "refused=%d", refused)
			return b.String()
		}
		d.Fatalf(t, "unknown command %q", d.Cmd)
		return ""
	})
}

func parseState(name string) (State, bool) {
	for _, s := range States() {
		if s.String() == name {
			return s, true
		}
	}
	return 0, false
}

// TestTransitionTable checks the table's invariants: nothing leaves closed,
// every state but closed can close, abandoned only closes, running is
// reached only from created, restoring or a running task's own states, and
// standby never reaches running without restoring.
func TestTransitionTable(t *testing.T) {
	for _, from := range States() {
		for _, to := range States() {
			ok := CanMove(from, to)
			switch {
			case from == Closed && ok:
				t.Errorf("%s → %s: nothing leaves closed", from, to)
			case from != Closed && to == Closed && !ok:
				t.Errorf("%s → closed refused: every state may close", from)
			case from == Abandoned && to != Closed && ok:
				t.Errorf("abandoned → %s: abandoned only closes", to)
			case from == Standby && to == Running && ok:
				t.Errorf("standby → running: a standby is promoted through restoring")
			case to == Created && ok:
				t.Errorf("%s → created: created is only the start", from)
			case from == to && ok:
				t.Errorf("%s → %s listed: moving to the current state is no transition", from, to)
			}
		}
	}
	if CanMove(State(200), Running) || State(200).String() != "state(200)" {
		t.Error("an unknown state moves or has a name")
	}
}
