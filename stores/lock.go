package stores

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// ErrLocked is returned (inside a *LockedError) by OpenPebble when the store
// directory is held by another open store: another process, usually a second
// worker started on the same data dir, or another store of this process.
var ErrLocked = errors.New("stores: store directory is locked")

// LockedError says which process holds a store directory. Pebble locks the
// file LOCK of the directory with a POSIX record lock (fcntl F_SETLK); the
// kernel reports the holder's pid (F_GETLK), so the pid is right even when
// the holder was started elsewhere and left no trace in the directory.
type LockedError struct {
	Dir string
	// PID is the process holding the lock; 0 when it could not be found.
	PID int
	// Command is the holder's command line when /proc shows it ("" otherwise).
	Command string
	// Self is set when the holder is this process (another open store).
	Self bool
	// Err is Pebble's error.
	Err error
}

func (e *LockedError) Error() string {
	switch {
	case e.Self:
		return fmt.Sprintf("store %s is already open in this process (pid %d): two workers of one process on the same data dir?", e.Dir, os.Getpid())
	case e.PID > 0 && e.Command != "":
		return fmt.Sprintf("store %s is in use by another process (pid %d: %s): is another worker running on the same data dir?", e.Dir, e.PID, e.Command)
	case e.PID > 0:
		return fmt.Sprintf("store %s is in use by another process (pid %d): is another worker running on the same data dir?", e.Dir, e.PID)
	}
	return fmt.Sprintf("store %s is locked by another process (%v): is another worker running on the same data dir?", e.Dir, e.Err)
}

// Is reports ErrLocked.
func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// Unwrap returns Pebble's error.
func (e *LockedError) Unwrap() error { return e.Err }

// lockedError turns the error of pebble.Open on dir into a *LockedError when
// the directory's LOCK is held, and returns nil otherwise.
func lockedError(dir string, err error) *LockedError {
	// Pebble refuses a second lock of one file within a process before it
	// asks the kernel (a POSIX lock would not stop its own process).
	if strings.Contains(err.Error(), "lock held by current process") {
		return &LockedError{Dir: dir, PID: os.Getpid(), Self: true, Err: err}
	}
	if !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EACCES) {
		return nil
	}
	le := &LockedError{Dir: dir, Err: err}
	le.PID = lockHolder(filepath.Join(dir, "LOCK"))
	if le.PID > 0 {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(le.PID) + "/cmdline"); err == nil {
			le.Command = strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return le
}
