package main

import (
	"bufio"
	"strings"
)

// raceExitCode is the exit status of a process built with -race that found
// a data race (GORACE's exitcode, 66 by default).
const raceExitCode = 66

// ourRaces reads the race detector's reports in a worker's log and returns
// those whose two racing accesses include a frame of Runnel's code. A report
// whose accesses are both inside Sarama is its transaction manager reading
// its last error without the lock transitionTo writes it under
// (IBM/sarama#2913, open upstream; app/txn_fence_test.go): a worker that
// exits with raceExitCode for that alone is not a failure of the run, one
// whose log holds any other report is. log is the log's text.
func ourRaces(log string) (ours []string, sarama int) {
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var (
		in       bool // inside a report
		accesses bool // inside one of its two access stacks
		runnel   bool // an access stack has a Runnel frame
		first    string
	)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "WARNING: DATA RACE"):
			in, accesses, runnel, first = true, false, false, ""
		case !in:
		case strings.HasPrefix(line, "=================="):
			in = false
			if runnel {
				ours = append(ours, first)
			} else {
				sarama++
			}
		case strings.HasPrefix(line, "Goroutine "):
			accesses = false // where the goroutines were created: not an access
		case strings.Contains(line, " at 0x") && (strings.HasPrefix(line, "Read") || strings.HasPrefix(line, "Write") || strings.HasPrefix(line, "Previous")):
			accesses = true
		case accesses && strings.HasPrefix(line, "  github.com/runnel-dev/runnel/"):
			if !runnel {
				first = strings.TrimSpace(line)
			}
			runnel = true
		}
	}
	return ours, sarama
}
