package agent

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// JSON logs print a clock and an error policy by name, as text logs do.
func TestEnumsLogByName(t *testing.T) {
	var b bytes.Buffer
	slog.New(slog.NewJSONHandler(&b, nil)).Info("agent", "clock", StreamTime, "on_error", DeadLetter)
	if want := `"clock":"stream-time","on_error":"dead-letter"`; !strings.Contains(b.String(), want) {
		t.Errorf("got %s\nwant it to contain %s", b.String(), want)
	}
}
