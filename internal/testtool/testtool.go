// Package testtool lets a test use an optional program of the machine
// (Chromium, nats-server, PostgreSQL) without making `go test ./...` fail on
// a machine that has only what the README asks for: Go.
//
// A missing tool skips the test with a one-line reason, unless the
// environment variable that requires it is set to 1, as CI (.ci/run) does:
// then the test fails, so a tool lost from the CI image cannot turn a test
// into a silent skip.
//
// The variables are RUNNEL_REQUIRE_ followed by the tool's name in upper
// case, with '-' as '_': RUNNEL_REQUIRE_CHROMIUM, RUNNEL_REQUIRE_NATS_SERVER,
// RUNNEL_REQUIRE_POSTGRESQL.
//
// This package must never install anything or look for a tool outside what
// the caller names.
package testtool

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvVar is the environment variable that, set to 1, makes tool required.
func EnvVar(tool string) string {
	return "RUNNEL_REQUIRE_" + strings.ToUpper(strings.ReplaceAll(tool, "-", "_"))
}

// Required reports whether the environment requires tool (EnvVar(tool)=1).
func Required(tool string) bool { return os.Getenv(EnvVar(tool)) == "1" }

// Missing ends the test for a missing tool: a skip with why and how to
// install it, or a failure when the environment requires the tool.
func Missing(t testing.TB, tool, why, install string) {
	t.Helper()
	if Required(tool) {
		t.Fatalf("%s: %s (required by %s=1; %s)", tool, why, EnvVar(tool), install)
	}
	t.Skipf("%s: %s (%s; %s=1 makes this a failure)", tool, why, install, EnvVar(tool))
}

// LookPath finds program on PATH for a test, or ends the test through
// Missing under the name tool.
func LookPath(t testing.TB, tool, program, install string) string {
	t.Helper()
	p, err := exec.LookPath(program)
	if err != nil {
		Missing(t, tool, program+" not found on PATH", install)
	}
	return p
}

// NATSServer starts a real nats-server (Debian package nats-server) with
// JetStream in a temporary directory on a free loopback port, stopped at
// the test's cleanup, and returns its URL (nats://127.0.0.1:port). A missing
// binary skips the test unless RUNNEL_REQUIRE_NATS_SERVER=1 (CI) fails it
// (LookPath); a server not ready within 10 s fails it.
func NATSServer(t testing.TB) string {
	t.Helper()
	bin := LookPath(t, "nats-server", "nats-server", "apt-get install nats-server")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-js", "-sd", t.TempDir())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		var once sync.Once
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Server is ready") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("nats-server did not become ready")
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", port)
}
