package source

import "testing"

// Outcome.Clean: zero subscribers is not clean (v3).
func TestOutcomeClean(t *testing.T) {
	for _, c := range []struct {
		o    Outcome
		want bool
	}{
		{Outcome{}, false},
		{Outcome{Acked: 1}, true},
		{Outcome{Acked: 2, Failed: 1}, false},
		{Outcome{Acked: 2, Rejected: 1}, false},
		{Outcome{Failed: 1}, false},
	} {
		if got := c.o.Clean(); got != c.want {
			t.Errorf("%+v.Clean() = %v", c.o, got)
		}
	}
}
