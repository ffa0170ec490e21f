// Package procs runs Runnel workers as separate processes against
// testbroker.Brokers (kfake, or real Kafka with RUNNEL_KAFKA_BROKERS).
package procs

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/testbroker"
)

// line mirrors testapp.Line.
type line struct {
	Generation   int32              `json:"generation"`
	Member       string             `json:"member"`
	Actives      map[string][]int32 `json:"actives"`
	Standbys     map[string][]int32 `json:"standbys"`
	Pending      map[string][]int32 `json:"pending"`
	Claims       map[string][]int32 `json:"claims"`
	Followed     map[string][]int32 `json:"followed"`
	Ready        bool               `json:"ready"`
	Restored     int64              `json:"restored"`
	RestoredSpan int64              `json:"restored_span"`
}

type child struct {
	name string
	cmd  *exec.Cmd
	mu   sync.Mutex
	last line
	// history holds every line the child printed, with when it arrived.
	history []timedLine
	done    chan struct{}
}

type timedLine struct {
	at time.Time
	line
}

func (c *child) latest() line {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

type cluster struct {
	t                *testing.T
	bin, app, topic  string
	changelog        string
	brokers          []string
	root             string
	protocolEnvEager bool
	static           bool // each child's name is its group.instance.id (KIP-345)
	// http is each child's HTTP address by name (PROCS_HTTP), none when
	// absent.
	http map[string]string
}

func (cl *cluster) start(name string) *child {
	t := cl.t
	c := &child{name: name, done: make(chan struct{})}
	c.cmd = exec.Command(cl.bin)
	eager := "0"
	if cl.protocolEnvEager {
		eager = "1"
	}
	c.cmd.Env = append(os.Environ(), "RUNNEL_BROKERS="+strings.Join(cl.brokers, ","), "PROCS_APP="+cl.app,
		"PROCS_TOPIC="+cl.topic, "PROCS_DIR="+filepath.Join(cl.root, name), "PROCS_EAGER="+eager)
	if cl.static {
		c.cmd.Env = append(c.cmd.Env, "PROCS_INSTANCE="+cl.app+"-"+name)
	}
	if addr := cl.http[name]; addr != "" {
		c.cmd.Env = append(c.cmd.Env, "PROCS_HTTP="+addr)
	}
	c.cmd.Stderr = &prefixWriter{t: t, prefix: name}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var l line
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("%s: bad line %q: %v", name, sc.Text(), err)
				continue
			}
			c.mu.Lock()
			c.last = l
			c.history = append(c.history, timedLine{time.Now(), l})
			c.mu.Unlock()
		}
		_ = c.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// stop sends SIGTERM and waits for a clean exit.
func (c *child) stop(t *testing.T) {
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit after SIGTERM", c.name)
	}
	if !c.cmd.ProcessState.Success() {
		t.Fatalf("%s exited with %v", c.name, c.cmd.ProcessState)
	}
}

type prefixWriter struct {
	t      *testing.T
	prefix string
}

func (w *prefixWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Logf("%s: %s", w.prefix, l)
	}
	return len(b), nil
}

func nonEmpty(m map[string][]int32) map[string][]int32 {
	out := map[string][]int32{}
	for k, v := range m {
		if len(v) > 0 {
			out[k] = v
		}
	}
	return out
}

// settle waits until every child reports one generation, nothing pending,
// ready, its running claims equal to its source actives and its followers
// equal to its standbys, with every partition active exactly once and one
// standby each. It returns the lines by child name.
func (cl *cluster) settle(children []*child) map[string]line {
	t := cl.t
	t.Helper()
	var why string
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		lines := map[string]line{}
		why = ""
		active := map[int32]int{}
		standby := map[int32]int{}
		for _, c := range children {
			l := c.latest()
			lines[c.name] = l
			switch {
			case l.Generation <= 0 || l.Generation != lines[children[0].name].Generation:
				why = fmt.Sprintf("%s generation %d", c.name, l.Generation)
			case len(nonEmpty(l.Pending)) > 0:
				why = fmt.Sprintf("%s pending %v", c.name, l.Pending)
			case !l.Ready:
				why = c.name + " not ready"
			case !slices.Equal(l.Claims[cl.topic], l.Actives[cl.topic]):
				why = fmt.Sprintf("%s claims %v, actives %v", c.name, l.Claims, l.Actives)
			case !slices.Equal(l.Actives[cl.topic], l.Actives[cl.changelog]):
				why = fmt.Sprintf("%s not co-partitioned: %v", c.name, l.Actives)
			case !reflect.DeepEqual(nonEmpty(l.Followed), nonEmpty(l.Standbys)):
				why = fmt.Sprintf("%s follows %v, standbys %v", c.name, l.Followed, l.Standbys)
			}
			if why != "" {
				break
			}
			for _, p := range l.Actives[cl.topic] {
				active[p]++
			}
			for _, p := range l.Standbys[cl.changelog] {
				standby[p]++
			}
		}
		if why != "" {
			continue
		}
		ok := len(active) == 6
		for p := range int32(6) {
			ok = ok && active[p] == 1 && standby[p] == 1
		}
		if ok {
			return lines
		}
		why = fmt.Sprintf("actives %v standbys %v", active, standby)
	}
	t.Fatalf("workers did not settle: %s", why)
	return nil
}

func runJoinLeaveRejoin(t *testing.T, eager bool) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "testapp")
	if out, err := exec.Command("go", "build", "-o", bin, "./testapp").CombinedOutput(); err != nil {
		t.Fatalf("build testapp: %v\n%s", err, out)
	}
	appID := testbroker.Topic(t, "procs")
	cl := &cluster{t: t, bin: bin, app: appID, topic: testbroker.Topic(t, "in"), changelog: appID + "-counts-changelog",
		brokers: testbroker.Brokers(t), root: dir, protocolEnvEager: eager}
	a, b, c := cl.start("a"), cl.start("b"), cl.start("c")
	three := cl.settle([]*child{a, b, c})
	for name, l := range three {
		if len(l.Actives[cl.topic]) != 2 {
			t.Fatalf("%s has %v, want 2 partitions", name, l.Actives[cl.topic])
		}
	}
	// c leaves (SIGTERM): its actives go to their standby holders; a and b
	// keep theirs.
	c.stop(t)
	two := cl.settle([]*child{a, b})
	for _, p := range three["c"].Actives[cl.topic] {
		for _, name := range []string{"a", "b"} {
			if slices.Contains(two[name].Actives[cl.topic], p) && !slices.Contains(three[name].Standbys[cl.changelog], p) {
				t.Errorf("%s[%d] of c went to %s, which held no standby", cl.topic, p, name)
			}
		}
	}
	for _, name := range []string{"a", "b"} {
		for _, p := range three[name].Actives[cl.topic] {
			if !slices.Contains(two[name].Actives[cl.topic], p) {
				t.Errorf("%s lost %s[%d] when c left", name, cl.topic, p)
			}
		}
	}
	// c comes back with its data dir (same process ID): balanced again, and
	// a and b only give partitions away.
	c = cl.start("c")
	again := cl.settle([]*child{a, b, c})
	for name, l := range again {
		if len(l.Actives[cl.topic]) != 2 {
			t.Errorf("after rejoin %s has %v, want 2 partitions", name, l.Actives[cl.topic])
		}
		if name != "c" {
			for _, p := range l.Actives[cl.topic] {
				if !slices.Contains(two[name].Actives[cl.topic], p) {
					t.Errorf("%s gained %s[%d] when c rejoined", name, cl.topic, p)
				}
			}
		}
	}
}

// TestJoinLeaveRejoin: three worker processes (cooperative protocol, the
// default) join, one leaves on SIGTERM and rejoins; after each change every
// process runs exactly the claims and standby followers its assignment names.
func TestJoinLeaveRejoin(t *testing.T) { runJoinLeaveRejoin(t, false) }

// TestJoinLeaveRejoinEager is the same with the eager protocol.
func TestJoinLeaveRejoinEager(t *testing.T) { runJoinLeaveRejoin(t, true) }
