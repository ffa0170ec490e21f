package stores

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/runnel-dev/runnel/internal/testtool"
)

// faultBatch is batch n of the fault tests: one put of key n (a new key
// each time, so that the data grows) with a value of size bytes naming n, at
// changelog offset n.
func faultBatch(n int64, size int) *Batch {
	b := &Batch{Offset: n}
	v := fmt.Appendf(nil, "%d:", n)
	b.Put(fmt.Appendf(nil, "k%08d", n), append(v, bytes.Repeat([]byte{'x'}, max(0, size-len(v)))...))
	b.Mark("n", n)
	return b
}

// checkFaultState checks that the store holds exactly the batches up to its
// applied offset, which must lie in [lo, hi].
func checkFaultState(t *testing.T, s Store, lo, hi int64) {
	t.Helper()
	off, err := s.Offset(0)
	must(t, err)
	if off < lo || off > hi {
		t.Fatalf("offset after reopen = %d, want in [%d, %d]", off, lo, hi)
	}
	wantMarks(t, s, 0, map[string]int64{"n": off})
	n := int64(0)
	must(t, s.Iterate(0, func(k, v []byte) error {
		if want := fmt.Sprintf("k%08d", n); string(k) != want || !bytes.HasPrefix(v, fmt.Appendf(nil, "%d:", n)) {
			return fmt.Errorf("key %d is %s = %.20q..., want %s and the value of batch %d", n, k, v, want, n)
		}
		n++
		return nil
	}))
	if n != off+1 {
		t.Fatalf("store holds %d keys at offset %d, want %d", n, off, off+1)
	}
}

// wantFailedEverywhere checks that every method of a failed store returns
// its failure, the same error each time.
func wantFailedEverywhere(t *testing.T, s *Pebble, failure error) {
	t.Helper()
	_, _, getErr := s.Get(0, []byte("k00000000"))
	_, offErr := s.Offset(0)
	_, marksErr := s.Marks(0)
	_, partsErr := s.Partitions()
	for name, err := range map[string]error{
		"Get": getErr, "Apply": s.Apply(0, faultBatch(1<<40, 100)), "Apply(empty)": s.Apply(0, nil),
		"Offset": offErr, "Marks": marksErr, "Partitions": partsErr, "Sync": s.Sync(),
		"Iterate": s.Iterate(0, func(k, v []byte) error { return nil }), "DropPartition": s.DropPartition(0),
	} {
		if err != failure {
			t.Errorf("%s after the failure = %v, want the failure %v", name, err, failure)
		}
	}
	if s.Err() != failure {
		t.Errorf("Err() = %v, want the failure", s.Err())
	}
}

// A full disk (a 20 MiB tmpfs) is an error, not a panic: the Apply or Sync
// that meets ENOSPC returns ErrFailed wrapping ENOSPC, every later call
// returns the same error and Close returns it. The process that met the
// fault then exits, as a worker does; once there is space again, the store
// reopened by a new process holds exactly the batches up to some offset at
// or after the last Sync. Before, the worker died with "panic: write
// .../000005.log: no space left on device". Needs root (mount); skipped
// otherwise.
func TestPebbleDiskFull(t *testing.T) {
	if os.Getenv(fillEnv) != "" {
		fillChild(t)
		return
	}
	if testing.Short() {
		t.Skip("mounts a tmpfs and fills it")
	}
	// With 4 MiB memtables a flush meets the full disk first (Pebble's
	// background error); with 64 MiB ones the write-ahead log does (the
	// commit panics in the writing goroutine: the crash of #12).
	for _, mt := range []uint64{4 << 20, 64 << 20} {
		t.Run(fmt.Sprintf("memtable-%dMiB", mt>>20), func(t *testing.T) { diskFull(t, mt) })
	}
}

// fillEnv, when set to "dir,memtable", turns TestPebbleDiskFull into the
// child that fills the store at dir until the disk is full.
const fillEnv = "RUNNEL_STORES_FILL"

const fillSize = 64 << 10

func diskFull(t *testing.T, memTable uint64) {
	mnt := filepath.Join(t.TempDir(), "mnt")
	must(t, os.Mkdir(mnt, 0o755))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", mnt).CombinedOutput(); err != nil {
		testtool.Missing(t, "tmpfs", fmt.Sprintf("cannot mount a tmpfs (needs root): %v: %s", err, bytes.TrimSpace(out)), "run as root where mount is allowed")
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	dir := filepath.Join(mnt, "store")

	cmd := exec.Command(os.Args[0], "-test.run=^TestPebbleDiskFull$", "-test.count=1", "-test.v", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d", fillEnv, dir, memTable))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("fill child: %v\n%s", err, out)
	}
	var applied, synced int64
	i := bytes.Index(out, []byte("RESULT "))
	if i < 0 {
		t.Fatalf("fill child printed no result:\n%s", out)
	}
	if _, err := fmt.Sscanf(string(out[i:]), "RESULT %d %d", &applied, &synced); err != nil {
		t.Fatalf("fill child result: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "fault_test.go") {
			t.Log("child:", strings.TrimSpace(l))
		}
	}

	// Space returns: a new process reopens the store with exact data.
	if out, err := exec.Command("mount", "-o", "remount,size=400m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	s, err := OpenPebble(dir, PebbleOptions{MemTableSize: memTable})
	if err != nil {
		t.Fatalf("reopen once there is space: %v", err)
	}
	defer s.Close()
	checkFaultState(t, s, synced, applied)
	off, _ := s.Offset(0)
	t.Logf("reopened at offset %d (applied %d, synced %d)", off, applied, synced)
	must(t, s.Apply(0, faultBatch(off+1, fillSize)))
	must(t, s.Sync())
}

// fillChild fills the store until the disk is full, checks the failure, and
// prints "RESULT applied synced".
func fillChild(t *testing.T) {
	var dir string
	var memTable uint64
	if _, err := fmt.Sscanf(strings.Replace(os.Getenv(fillEnv), ",", " ", 1), "%s %d", &dir, &memTable); err != nil {
		t.Fatalf("%s: %v", fillEnv, err)
	}
	// No free-space reserve: this test is about Pebble's own ENOSPC (the
	// reserve is TestPebbleMinFreeBytes').
	s, err := OpenPebble(dir, PebbleOptions{MemTableSize: memTable, MinFreeBytes: -1})
	must(t, err)
	var applied, synced int64 = -1, -1
	var failure error
	for n := int64(0); n < 2000 && failure == nil; n++ { // 2000*64 KiB = 125 MiB > 20 MiB
		if failure = s.Apply(0, faultBatch(n, fillSize)); failure == nil {
			applied = n
			if n%10 == 9 {
				if failure = s.Sync(); failure == nil {
					synced = n
				}
			}
		}
	}
	if failure == nil {
		t.Fatal("125 MiB written to a 20 MiB filesystem without an error")
	}
	t.Logf("failure after batch %d (synced %d): %v", applied, synced, failure)
	if !errors.Is(failure, ErrFailed) || !errors.Is(failure, syscall.ENOSPC) {
		t.Fatalf("failure %v: want ErrFailed wrapping ENOSPC", failure)
	}
	wantFailedEverywhere(t, s, failure)
	start := time.Now()
	if err := s.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Close of a failed store = %v, want the failure", err)
	}
	if d := time.Since(start); d > 2*failedCloseWait {
		t.Fatalf("Close took %v", d)
	}
	// Reopening in this process, with the disk still full, either works
	// (nothing to replay) or fails with ErrFailed within failedCloseWait: the
	// store could not be released (its WAL write panicked holding Pebble's
	// commit lock; the error says to restart), or Pebble's open met the full
	// disk again (it would wait for ever for the flush of the replayed log).
	start = time.Now()
	if s2, err := OpenPebble(dir, PebbleOptions{MemTableSize: memTable}); err == nil {
		t.Log("reopened in the same process")
		s2.Close()
	} else if !errors.Is(err, ErrFailed) {
		t.Fatalf("reopen in the same process: %v; want ErrFailed", err)
	} else {
		t.Logf("reopen in the same process (%v): %v", time.Since(start).Round(time.Millisecond), err)
	}
	fmt.Printf("RESULT %d %d\n", applied, synced)
}

// An I/O error (EIO) on the write-ahead log, injected with pebble's errorfs,
// is an error, not a panic, and the store stays failed; the directory then
// reopens (without the fault) with exact data.
func TestPebbleWALWriteEIO(t *testing.T) {
	dir := t.TempDir()
	var on atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if on.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.HasSuffix(op.Path, ".log") {
			return fmt.Errorf("%s: %w", op.Path, syscall.EIO)
		}
		return nil
	}))
	s, err := OpenPebble(dir, PebbleOptions{FS: fs})
	must(t, err)
	for n := int64(0); n < 100; n++ {
		must(t, s.Apply(0, faultBatch(n, 100)))
	}
	must(t, s.Sync())
	on.Store(true)
	var failure error
	for n := int64(100); n < 200 && failure == nil; n++ {
		if failure = s.Apply(0, faultBatch(n, 100)); failure == nil {
			failure = s.Sync()
		}
	}
	if !errors.Is(failure, ErrFailed) || !errors.Is(failure, syscall.EIO) {
		t.Fatalf("failure %v: want ErrFailed wrapping EIO", failure)
	}
	wantFailedEverywhere(t, s, failure)
	if err := s.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Close of a failed store = %v, want the failure", err)
	}

	on.Store(false)
	s2, err := OpenPebble(dir, PebbleOptions{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s2.Close()
	checkFaultState(t, s2, 99, 100)
}

// A corrupt store (every table file's bytes flipped after a flush) is an
// error on open or on read, never a panic.
func TestPebbleCorruptStore(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPebble(dir, PebbleOptions{MemTableSize: 1 << 20})
	must(t, err)
	for n := int64(0); n < 200; n++ {
		must(t, s.Apply(0, faultBatch(n, 10<<10))) // 2 MiB: flushes to tables
	}
	must(t, s.Close())
	tables, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
	if len(tables) == 0 {
		t.Fatal("no table files to corrupt")
	}
	for _, f := range tables {
		b, err := os.ReadFile(f)
		must(t, err)
		for i := 0; i < len(b); i += 97 {
			b[i] ^= 0xff
		}
		must(t, os.WriteFile(f, b, 0o644))
	}
	s2, err := OpenPebble(dir, PebbleOptions{})
	if err != nil {
		t.Logf("open of a corrupt store: %v", err)
		return
	}
	defer s2.Close()
	var errs []error
	for n := 0; n < 200; n++ {
		_, _, err := s2.Get(0, fmt.Appendf(nil, "k%08d", n))
		errs = append(errs, err)
	}
	errs = append(errs, s2.Iterate(0, func(k, v []byte) error { return nil }))
	if errors.Join(errs...) == nil {
		t.Fatal("every read of a corrupt store succeeded")
	}
	t.Logf("reads of a corrupt store: %v", errors.Join(errs...))
}
