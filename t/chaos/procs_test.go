package main

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// A SIGTERM that ends a worker before it wrote a line (it had not set up
// its signal handling yet) is a stop before the start, not a failure; one
// that ends a worker that had started is still reported.
func TestStopBeforeFirstLogLine(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		wantErr      bool
	}{
		{"silent", "sleep 30", false},
		{"started", "echo 'level=INFO msg=\"worker joining group\"'; sleep 30", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logged []string
			ws := &workerSet{bin: "/bin/sh", args: []string{"-c", tc.script}, dir: t.TempDir(),
				logf: func(f string, a ...any) { logged = append(logged, f) }, procs: map[string]*proc{}}
			defer ws.close()
			if err := ws.start("w1"); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // let the shell write its line
			err := ws.stop("w1", syscall.SIGTERM)
			if gotErr := err != nil; gotErr != tc.wantErr {
				t.Fatalf("stop: %v, want an error: %v (logged %q)", err, tc.wantErr, logged)
			}
			if tc.wantErr && !strings.Contains(err.Error(), "after SIGTERM") {
				t.Fatalf("stop: %v", err)
			}
		})
	}
}
