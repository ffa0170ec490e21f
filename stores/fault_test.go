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
		if err != failure { //nolint:errorlint // the very same error value
			t.Errorf("%s after the failure = %v, want the failure %v", name, err, failure)
		}
	}
	if s.Err() != failure { //nolint:errorlint
		t.Errorf("Err() = %v, want the failure", s.Err())
	}
}

// A full disk (a 20 MiB tmpfs) is an error, not a panic: the Apply or Sync
// that meets ENOSPC returns ErrFailed wrapping ENOSPC, every later call
// returns the same error, Close returns it, and once there is space again the
// reopened store holds exactly the batches up to some offset at or after the
// last Sync. Before, the worker died with "panic: write .../000005.log: no
// space left on device". Needs root (mount); skipped otherwise.
func TestPebbleDiskFull(t *testing.T) {
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

func diskFull(t *testing.T, memTable uint64) {
	mnt := filepath.Join(t.TempDir(), "mnt")
	must(t, os.Mkdir(mnt, 0o755))
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	dir := filepath.Join(mnt, "store")
	s, err := OpenPebble(dir, PebbleOptions{MemTableSize: memTable})
	must(t, err)
	t.Cleanup(func() { s.Close() })

	const size = 64 << 10
	var applied, synced int64 = -1, -1
	var failure error
	for n := int64(0); n < 2000 && failure == nil; n++ { // 2000*64 KiB = 125 MiB > 20 MiB
		if failure = s.Apply(0, faultBatch(n, size)); failure == nil {
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

	// Space returns: the store reopens with exact data.
	if out, err := exec.Command("mount", "-o", "remount,size=400m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v: %s", err, out)
	}
	s2, err := OpenPebble(dir, PebbleOptions{MemTableSize: memTable})
	if err != nil {
		t.Fatalf("reopen once there is space: %v", err)
	}
	defer s2.Close()
	checkFaultState(t, s2, synced, applied)
	t.Logf("reopened at offset %d", must1(s2.Offset(0)))
	must(t, s2.Apply(0, faultBatch(applied+1, size)))
	must(t, s2.Sync())
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

func must1[T any](v T, _ error) T { return v }
