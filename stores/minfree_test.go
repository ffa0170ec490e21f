package stores

import (
	"errors"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// freeFS is the operating system's filesystem reporting avail bytes free.
type freeFS struct {
	vfs.FS
	avail atomic.Uint64
}

func (f *freeFS) GetDiskUsage(path string) (vfs.DiskUsage, error) {
	du, err := f.FS.GetDiskUsage(path)
	du.AvailBytes = f.avail.Load()
	return du, err
}

// An Apply that finds less free space than MinFreeBytes plus its batch fails
// the store with ErrFailed wrapping ENOSPC before Pebble writes: the batch
// is not applied, every later call returns the failure, Close releases the
// database (no panic left it locked), and a reopen with space holds every
// batch applied before.
func TestPebbleMinFreeBytes(t *testing.T) {
	dir := t.TempDir()
	fs := &freeFS{FS: vfs.Default}
	fs.avail.Store(1 << 30)
	s, err := OpenPebble(dir, PebbleOptions{FS: fs, MinFreeBytes: 1 << 20})
	must(t, err)
	for n := int64(0); n <= 3; n++ {
		must(t, s.Apply(0, faultBatch(n, 1000)))
	}
	fs.avail.Store(1<<20 + 500) // above MinFreeBytes, not with a 1000-byte batch
	err = s.Apply(0, faultBatch(4, 1000))
	if !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Apply with %d bytes free = %v, want ErrFailed wrapping ENOSPC", fs.avail.Load(), err)
	}
	fs.avail.Store(1 << 30)
	if _, _, err := s.Get(0, []byte("k00000001")); !errors.Is(err, ErrFailed) {
		t.Fatalf("Get after the failure = %v, want the store's failure", err)
	}
	if err := s.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("Close = %v, want the store's failure", err)
	}
	s, err = OpenPebble(dir, PebbleOptions{FS: fs, MinFreeBytes: 1 << 20})
	must(t, err)
	defer s.Close()
	checkFaultState(t, s, 3, 3)
	must(t, s.Apply(0, faultBatch(4, 1000)))
}

// MinFreeBytes defaults to two memtables; negative turns the check off.
func TestPebbleMinFreeBytesDefault(t *testing.T) {
	fs := &freeFS{FS: vfs.Default}
	fs.avail.Store(2*DefaultPebbleMemTableSize - 1)
	s, err := OpenPebble(t.TempDir(), PebbleOptions{FS: fs})
	must(t, err)
	if err := s.Apply(0, faultBatch(1, 10)); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Apply below the default reserve = %v, want ENOSPC", err)
	}
	_ = s.Close()
	s, err = OpenPebble(t.TempDir(), PebbleOptions{FS: fs, MinFreeBytes: -1})
	must(t, err)
	defer s.Close()
	must(t, s.Apply(0, faultBatch(1, 10)))
}
