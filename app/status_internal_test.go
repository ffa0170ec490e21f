package app

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/agent/source"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestPprofOptIn checks that /debug/pprof/ is served only with WithPprof.
func TestPprofOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		w, err := New("pprof-app", WithPprof(on), WithDataDir(t.TempDir())).NewWorker(WorkerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(w.httpMux())
		code, body := get(t, srv.URL+"/debug/pprof/goroutine?debug=1")
		srv.Close()
		switch {
		case on && (code != http.StatusOK || !strings.Contains(body, "goroutine profile")):
			t.Errorf("WithPprof(true): %d %.200s", code, body)
		case !on && code != http.StatusNotFound:
			t.Errorf("WithPprof(false): %d, want 404", code)
		}
	}
}

// TestListenAddrLocalhost checks that an address without a host binds the
// loopback interface only, and a named host is kept.
func TestListenAddrLocalhost(t *testing.T) {
	for in, want := range map[string]string{":8080": "127.0.0.1:8080", "0.0.0.0:8080": "0.0.0.0:8080",
		"[::]:9": "[::]:9", "10.1.2.3:80": "10.1.2.3:80", "localhost:1": "localhost:1"} {
		if got := listenAddr(in); got != want {
			t.Errorf("listenAddr(%q) = %q, want %q", in, got, want)
		}
	}
	ln, err := net.Listen("tcp", listenAddr(":0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
		t.Errorf(`":0" bound %v, want a loopback address`, ip)
	}
}

// TestAckTimeoutCounted checks that an agent stream failed by the ack
// timeout, as agent.Run reports it, is counted, and another failure is not.
func TestAckTimeoutCounted(t *testing.T) {
	w, err := New("ack-app", WithDataDir(t.TempDir())).NewWorker(WorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := w.metrics
	m.agentFailed("in", "a", &agent.Error{Agent: "a", Offset: -1, Stream: true,
		Err: &source.AckTimeoutError{Key: "in[0]", ID: "a", Offset: 7, Timeout: time.Second}})
	m.agentFailed("in", "a", &agent.Error{Agent: "a", Offset: 3, Err: errors.New("boom")})
	if n, samples := counterSum(t, m, "runnel_ack_timeouts_total"); n != 1 || samples != 1 {
		t.Errorf("runnel_ack_timeouts_total = %v in %d samples, want 1 sample of 1", n, samples)
	}
}

// counterSum gathers m and returns the sum of counter name over its label
// values, and how many samples it has.
func counterSum(t *testing.T, m *metrics, name string) (float64, int) {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	samples := 0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, s := range mf.GetMetric() {
				n += s.GetCounter().GetValue()
				samples++
			}
		}
	}
	return n, samples
}
