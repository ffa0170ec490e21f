//go:build unix

package stores

import (
	"io"
	"os"
	"syscall"
)

// lockHolder returns the pid of the process holding a write lock on file, or
// 0. It must not be called for a file this process has locked: closing any
// descriptor of a file drops the process's POSIX locks on it.
func lockHolder(file string) int {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil || lk.Type == syscall.F_UNLCK {
		return 0
	}
	return int(lk.Pid)
}
