package stores

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// lockChildEnv, when set to a directory, turns TestLockedByAnotherProcess
// into the child that holds a store there until its stdin closes.
const lockChildEnv = "RUNNEL_STORES_LOCK_CHILD_DIR"

// A store held by another process is refused with the holder's pid and
// command line; before, the error was Pebble's "resource temporarily
// unavailable" with no word of who holds it.
func TestLockedByAnotherProcess(t *testing.T) {
	if dir := os.Getenv(lockChildEnv); dir != "" {
		s, err := OpenPebble(dir, PebbleOptions{})
		if err != nil {
			t.Fatal(err)
		}
		os.Stdout.WriteString("ready\n")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the parent closes stdin
		s.Close()
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockedByAnotherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), lockChildEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q, %v", line, err)
	}

	s, err := OpenPebble(dir, PebbleOptions{})
	if err == nil {
		s.Close()
		t.Fatal("OpenPebble of a directory held by another process succeeded")
	}
	var le *LockedError
	if !errors.As(err, &le) || !errors.Is(err, ErrLocked) {
		t.Fatalf("err = %v, want a *LockedError", err)
	}
	if le.PID != cmd.Process.Pid || le.Self {
		t.Fatalf("holder pid = %d (self %v), want the child's %d", le.PID, le.Self, cmd.Process.Pid)
	}
	msg := err.Error()
	t.Log(msg)
	wants := []string{dir, "pid " + strconv.Itoa(cmd.Process.Pid), "same data dir"}
	if _, err := os.Stat("/proc/self/cmdline"); err == nil {
		wants = append(wants, "TestLockedByAnotherProcess") // the holder's command line
	}
	for _, want := range wants {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not contain %q", msg, want)
		}
	}

	// Once the holder exits, the store opens.
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	s, err = OpenPebble(dir, PebbleOptions{})
	if err != nil {
		t.Fatalf("open after the holder exited: %v", err)
	}
	must(t, s.Close())
}

// A second open of a store in the same process is refused and said to be
// this process's own (the kernel's lock cannot see it).
func TestLockedBySameProcess(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPebble(dir, PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = OpenPebble(dir, PebbleOptions{})
	var le *LockedError
	if !errors.As(err, &le) || !le.Self || le.PID != os.Getpid() {
		t.Fatalf("err = %v, want a *LockedError naming this process", err)
	}
	// The first store still works: finding the holder must not drop its lock.
	must(t, s.Apply(0, &Batch{Offset: 1}))
	if _, err := OpenPebble(dir, PebbleOptions{}); !errors.Is(err, ErrLocked) {
		t.Fatalf("third open: err = %v, want ErrLocked", err)
	}
}
