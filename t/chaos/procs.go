package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// workerSet runs the worker processes of one chaos run and restarts a worker
// that exits on its own while it should run (as a process supervisor would),
// counting such exits: they are reported, since a worker should ride out
// every fault of the schedule.
type workerSet struct {
	bin  string
	args []string // "worker" and flags
	env  []string // shared environment
	dir  string   // one sub-directory per worker: data/ and worker.log
	logf func(string, ...any)

	mu      sync.Mutex
	procs   map[string]*proc // guarded by mu
	crashes []string         // unexpected exits, guarded by mu
	closed  bool             // guarded by mu
	wg      sync.WaitGroup
}

type proc struct {
	name string
	cmd  *exec.Cmd
	want bool // guarded by workerSet.mu: a supervisor restarts it on an unexpected exit
	done chan struct{}
	// logFrom is the size of the worker's log when this process started:
	// what it wrote is the log from there on.
	logFrom int64
}

func (ws *workerSet) dataDir(name string) string { return filepath.Join(ws.dir, name, "data") }

// LogPath is where worker name writes its stdout and stderr (appended over restarts).
func (ws *workerSet) LogPath(name string) string { return filepath.Join(ws.dir, name, "worker.log") }

// start starts worker name (again) with its data dir.
func (ws *workerSet) start(name string) error {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.startLocked(name)
}

func (ws *workerSet) startLocked(name string) error {
	if ws.closed {
		return errors.New("worker set closed")
	}
	if p := ws.procs[name]; p != nil && p.want {
		return fmt.Errorf("worker %s already running", name)
	}
	if err := os.MkdirAll(ws.dataDir(name), 0o755); err != nil {
		return fmt.Errorf("worker %s: %w", name, err)
	}
	logf, err := os.OpenFile(ws.LogPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("worker %s: %w", name, err)
	}
	fmt.Fprintf(logf, "=== chaos: start %s at %s\n", name, time.Now().UTC().Format(time.RFC3339Nano))
	var logFrom int64 // measured before the start: the worker's output is all after it
	if st, err := logf.Stat(); err == nil {
		logFrom = st.Size()
	}
	cmd := exec.Command(ws.bin, ws.args...)
	cmd.Env = append(append(os.Environ(), ws.env...), "RUNNEL_DATA_DIR="+ws.dataDir(name))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start worker %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, want: true, done: make(chan struct{}), logFrom: logFrom}
	ws.procs[name] = p
	ws.wg.Add(1)
	go func() {
		defer ws.wg.Done()
		err := cmd.Wait()
		fmt.Fprintf(logf, "=== chaos: %s (pid %d) exited at %s: %v\n", name, cmd.Process.Pid, time.Now().UTC().Format(time.RFC3339Nano), cmd.ProcessState)
		logf.Close()
		close(p.done)
		ws.mu.Lock()
		defer ws.mu.Unlock()
		if !p.want || ws.closed || ws.procs[name] != p {
			return
		}
		msg := fmt.Sprintf("%s exited on its own: %v (log %s)", name, err, ws.LogPath(name))
		ws.crashes = append(ws.crashes, msg)
		ws.logf("chaos: %s; restarting it in 1 s", msg)
		p.want = false
		time.AfterFunc(time.Second, func() {
			ws.mu.Lock()
			defer ws.mu.Unlock()
			if cur := ws.procs[name]; cur == p && !ws.closed {
				if err := ws.startLocked(name); err != nil {
					ws.logf("chaos: restart %s: %v", name, err)
				}
			}
		})
	}()
	return nil
}

// errNotRunning: the worker to stop is not running (it exited on its own and
// its restart is pending, or it was stopped before).
var errNotRunning = errors.New("not running")

// stop signals worker name and waits for it to exit; a SIGTERM that does not
// stop it within 60 s is followed by SIGKILL and reported as an error.
func (ws *workerSet) stop(name string, sig syscall.Signal) error {
	ws.mu.Lock()
	p := ws.procs[name]
	if p == nil || !p.want {
		if p != nil {
			delete(ws.procs, name) // cancels a pending supervisor restart
		}
		ws.mu.Unlock()
		return fmt.Errorf("worker %s: %w", name, errNotRunning)
	}
	p.want = false
	ws.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", name, err)
	}
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("worker %s did not exit within 60 s of %v (killed; log %s)", name, sig, ws.LogPath(name))
	}
	if sig == syscall.SIGTERM && !p.cmd.ProcessState.Success() && ws.silentTerm(p) {
		// Signalled before the worker had set up its SIGTERM handling (a
		// restart under load: it had not logged a line yet): it stopped
		// before it started, which is what a clean stop of it is.
		ws.logf("chaos: %s ended by SIGTERM before its first log line (a stop before it started)", name)
		return nil
	}
	if sig == syscall.SIGTERM && !p.cmd.ProcessState.Success() {
		if p.cmd.ProcessState.ExitCode() == raceExitCode {
			b, err := os.ReadFile(ws.LogPath(name))
			if ours, sarama := ourRaces(string(b)); err == nil && len(ours) == 0 && sarama > 0 {
				ws.logf("chaos: %s exited with %v after SIGTERM: %d race report(s), all inside Sarama's transaction manager (IBM/sarama#2913)", name, p.cmd.ProcessState, sarama)
				return nil
			}
		}
		return fmt.Errorf("worker %s exited with %v after SIGTERM (log %s)", name, p.cmd.ProcessState, ws.LogPath(name))
	}
	return nil
}

// silentTerm reports whether p, which has exited, was ended by SIGTERM's
// default action without having written anything to its log.
func (ws *workerSet) silentTerm(p *proc) bool {
	st, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !st.Signaled() || st.Signal() != syscall.SIGTERM {
		return false
	}
	b, err := os.ReadFile(ws.LogPath(p.name))
	if err != nil || int64(len(b)) < p.logFrom {
		return false
	}
	out := string(b[p.logFrom:])
	// The supervisor's own exit line follows the worker's output.
	if i := strings.Index(out, "=== chaos: "); i >= 0 {
		out = out[:i]
	}
	return strings.TrimSpace(out) == ""
}

// wipe deletes worker name's data dir (the worker must be stopped).
func (ws *workerSet) wipe(name string) error { return os.RemoveAll(ws.dataDir(name)) }

// running lists the workers that should be running, sorted.
func (ws *workerSet) running() []string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []string
	for n, p := range ws.procs {
		if p.want {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// unexpected returns the unexpected exits so far.
func (ws *workerSet) unexpected() []string {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return append([]string(nil), ws.crashes...)
}

// close SIGKILLs whatever still runs and waits for the supervisors.
func (ws *workerSet) close() {
	ws.mu.Lock()
	ws.closed = true
	for _, p := range ws.procs {
		_ = p.cmd.Process.Kill()
	}
	ws.mu.Unlock()
	ws.wg.Wait()
}

// supportsFlag reports whether `bin worker --help` lists flag (e.g.
// "--guarantee"): the harness passes the guarantee as a flag only to a build
// that has it, and always through the environment.
func supportsFlag(ctx context.Context, bin, flag string) bool {
	cmd := exec.CommandContext(ctx, bin, "worker", "--help")
	cmd.Env = append(os.Environ(), "CHAOS_APP=chaos-probe")
	out, _ := cmd.CombinedOutput()
	return strings.Contains(string(out), flag+" ")
}

// tail returns the last n lines of the file at path (for failure reports).
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
