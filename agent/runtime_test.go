package agent

import (
	"testing"

	"github.com/runnel-dev/runnel/internal/agentrt"
)

// The worker reads an agent's error policy and its timers' clocks as
// agentrt's values (runner.Settings converts by value): the two enums must
// agree, or a DeadLetter agent would restart and a stream-time timer follow
// the wall clock.
func TestRuntimeEnumsAgree(t *testing.T) {
	for p, want := range map[ErrorPolicy]agentrt.ErrorPolicy{Restart: agentrt.Restart, StopWorker: agentrt.StopWorker, DeadLetter: agentrt.DeadLetter} {
		if agentrt.ErrorPolicy(p) != want || p.String() != want.String() {
			t.Errorf("policy %v is %v in agentrt", p, agentrt.ErrorPolicy(p))
		}
	}
	for c, want := range map[Clock]agentrt.Clock{WallClock: agentrt.WallClock, StreamTime: agentrt.StreamTime} {
		if agentrt.Clock(c) != want || c.String() != want.String() {
			t.Errorf("clock %v is %v in agentrt", c, agentrt.Clock(c))
		}
	}
}
