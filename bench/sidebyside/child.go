package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// child is one worker process of a system under test.
type child struct {
	cmd    *exec.Cmd
	start  time.Time
	exited chan struct{} // closed when the process ended
	err    error         // Wait's result, set before exited closes
	log    *os.File
	hwmKB  atomic.Int64 // VmHWM of the process, sampled every 100 ms
}

// live is every child not yet ended, so that an interrupted harness can
// end them (they run in their own process groups and would survive it).
var live struct {
	sync.Mutex
	m map[*child]bool
}

// killLive sends SIGKILL to every live child.
func killLive() {
	live.Lock()
	defer live.Unlock()
	for c := range live.m {
		_ = c.cmd.Process.Kill()
	}
}

// usage is what getrusage reports for one ended child.
type usage struct {
	cpu   float64 // user + system CPU seconds
	rssMB float64 // peak resident set size
}

// startChild starts bin with the BENCH_* environment, logging to logPath.
func startChild(bin string, env []string, logPath string) (*child, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("log dir: %w", err)
	}
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("child log: %w", err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c := &child{cmd: cmd, exited: make(chan struct{}), log: f}
	c.start = time.Now()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	live.Lock()
	if live.m == nil {
		live.m = map[*child]bool{}
	}
	live.m[c] = true
	live.Unlock()
	go func() {
		c.err = cmd.Wait()
		f.Close()
		live.Lock()
		delete(live.m, c)
		live.Unlock()
		close(c.exited)
	}()
	go c.sampleHWM()
	return c, nil
}

// stop sends sig (SIGTERM: a clean stop; SIGKILL: a crash), waits up to
// grace for the exit, then kills, and returns the child's resource usage.
func (c *child) stop(sig syscall.Signal, grace time.Duration) (usage, error) {
	select {
	case <-c.exited:
		return c.usage(), fmt.Errorf("exited before it was stopped: %v (log %s)", c.err, c.log.Name())
	default:
	}
	_ = c.cmd.Process.Signal(sig)
	var err error
	select {
	case <-c.exited:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.exited
		err = fmt.Errorf("did not exit within %s of %v (log %s)", grace, sig, c.log.Name())
	}
	return c.usage(), err
}

// usage reads the CPU time from getrusage (wait4) and the peak RSS from the
// sampled VmHWM: getrusage's ru_maxrss is no use here, because Linux keeps
// the high-water mark across execve, so a child forked from the harness
// (which holds kfake and its data) reports at least the harness's RSS.
func (c *child) usage() usage {
	ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return usage{}
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return usage{cpu: tv(ru.Utime) + tv(ru.Stime), rssMB: float64(c.hwmKB.Load()) / 1024}
}

// snapshot is the usage of the running child so far: CPU from
// /proc/<pid>/stat (utime + stime of every thread, in clock ticks of
// 1/100 s, Linux's USER_HZ), peak RSS from the sampled VmHWM. Zero CPU
// when /proc cannot be read.
func (c *child) snapshot() usage {
	u := usage{rssMB: float64(c.hwmKB.Load()) / 1024}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
	if err != nil {
		return u
	}
	// The fields after the command name (in parentheses, which may hold
	// spaces): state is field 3, utime 14 and stime 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return u
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return u
	}
	var ut, st int64
	if _, err := fmt.Sscan(f[11], &ut); err != nil {
		return u
	}
	if _, err := fmt.Sscan(f[12], &st); err != nil {
		return u
	}
	u.cpu = float64(ut+st) / 100
	return u
}

// sampleHWM reads VmHWM (the peak RSS of the process's own address space)
// from /proc every 100 ms until the process exits; the last reading is the
// peak up to then, so a peak in the last 100 ms can be missed.
func (c *child) sampleHWM() {
	path := fmt.Sprintf("/proc/%d/status", c.cmd.Process.Pid)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if b, err := os.ReadFile(path); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
					var kb int64
					if _, err := fmt.Sscanf(strings.TrimSpace(v), "%d kB", &kb); err == nil && kb > c.hwmKB.Load() {
						c.hwmKB.Store(kb)
					}
				}
			}
		}
		select {
		case <-c.exited:
			return
		case <-t.C:
		}
	}
}

// anyExited is closed when one of cs exits.
func anyExited(cs ...*child) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	for _, c := range cs {
		go func() {
			<-c.exited
			once.Do(func() { close(ch) })
		}()
	}
	return ch
}
