package testbroker

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// maxLine is the longest input line the data fixtures read (1 MiB): longer
// than any record of the repository's test data.
const maxLine = 1 << 20

// GzipLines returns the lines of the gzipped file at path (the test data of
// the tables and examples, such as a change-events .jsonl.gz), at most limit
// of them (limit <= 0: all). Each line is a copy without its newline.
func GzipLines(t testing.TB, path string, limit int) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("testbroker: %v", err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("testbroker: %s: %v", path, err)
	}
	var out [][]byte
	sc := bufio.NewScanner(z)
	sc.Buffer(make([]byte, maxLine), maxLine)
	for (limit <= 0 || len(out) < limit) && sc.Scan() {
		out = append(out, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("testbroker: read %s: %v", path, err)
	}
	return out
}

// WriteLines writes lines, each followed by a newline, to a new file in the
// test's temporary directory and returns its path (an input file for
// `send` or dev mode).
func WriteLines(t testing.TB, lines [][]byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "lines.jsonl")
	f, err := os.Create(p)
	if err != nil {
		t.Fatalf("testbroker: %v", err)
	}
	w := bufio.NewWriter(f)
	for _, l := range lines {
		_, _ = w.Write(l)
		_ = w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("testbroker: write %s: %v", p, err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("testbroker: close %s: %v", p, err)
	}
	return p
}

// LogWriter is an io.Writer that logs each write with t.Log, so that a test's
// slog output shows up with the test (and only when it fails or with -v).
type LogWriter struct{ T testing.TB }

// Write implements io.Writer.
func (w LogWriter) Write(p []byte) (int, error) {
	w.T.Helper()
	w.T.Log(string(p))
	return len(p), nil
}

// LockedBuffer is a bytes.Buffer that several goroutines may write (a
// logger, a child process's stderr copier) while a test reads it.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
