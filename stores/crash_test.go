package stores

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// crashChildEnv, when set to a directory, turns TestPebbleCrash into the
// child process that writes to a store there until it is killed.
const crashChildEnv = "RUNNEL_STORES_CRASH_CHILD_DIR"

// crashParts are the partitions the crash child writes, round-robin; 255 and
// 256 differ in one prefix byte.
var crashParts = []int32{0, 1, 255, 256}

// crashEpoch: before batch n of a partition with n%crashEpoch == 0 (n > 0)
// the child drops the partition, so the partition then holds batches
// crashEpoch*k .. n only. A crash between the drop and the batch leaves the
// partition empty with NoOffset, which is also a consistent state.
const crashEpoch = 40

// crashBatch is the deterministic batch n of partition p, with Offset n and
// marks that follow it: a
// mix of puts and tombstones over keys that are prefixes of each other
// ("k1", "k10", "k100"), and every 25th batch big enough to fill memtables.
func crashBatch(p int32, n int64) *Batch {
	r := rand.New(rand.NewPCG(uint64(p), uint64(n)))
	ops := 1 + r.IntN(30)
	if n%25 == 7 {
		ops = 3000
	}
	b := &Batch{Offset: n}
	// Marks: "n" is the batch number, so it must always equal the offset;
	// "epoch" changes every crashEpoch batches.
	b.Mark("n", n)
	if n%crashEpoch == 0 {
		b.Mark("epoch", n/crashEpoch)
	}
	for i := range ops {
		key := []byte("k" + strconv.Itoa(r.IntN(150)))
		if r.IntN(5) == 0 {
			b.Delete(key)
			continue
		}
		v := fmt.Sprintf("%d:%d:%d:", p, n, i)
		b.Put(key, append([]byte(v), bytes.Repeat([]byte{'x'}, r.IntN(200))...))
	}
	return b
}

// crashExpected is the data partition p must hold when its stored offset is
// off: the batches of off's epoch up to and including off.
func crashExpected(p int32, off int64) (*Memory, error) {
	m := NewMemory()
	if off == NoOffset {
		return m, nil
	}
	for n := off / crashEpoch * crashEpoch; n <= off; n++ {
		if err := m.Apply(p, crashBatch(p, n)); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// runCrashChild continues every partition from its stored offset, applying
// batches forever. After the first synced round of 20 batches per partition
// it prints "ready" so the parent knows progress is durable.
func runCrashChild(dir string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(3)
	}
	s, err := OpenPebble(dir, PebbleOptions{MemTableSize: 1 << 20})
	if err != nil {
		fail(err)
	}
	next := make(map[int32]int64)
	for _, p := range crashParts {
		off, err := s.Offset(p)
		if err != nil {
			fail(err)
		}
		next[p] = off + 1
	}
	for round := 0; ; round++ {
		for _, p := range crashParts {
			n := next[p]
			if n > 0 && n%crashEpoch == 0 {
				if err := s.DropPartition(p); err != nil {
					fail(err)
				}
			}
			if err := s.Apply(p, crashBatch(p, n)); err != nil {
				fail(err)
			}
			next[p] = n + 1
		}
		if round == 20 {
			if err := s.Sync(); err != nil {
				fail(err)
			}
			fmt.Println("ready")
		}
	}
}

// TestPebbleCrash SIGKILLs a child process writing batches (committed NoSync)
// and checks, after reopening, that every partition's data is exactly what the
// batches up to its stored offset wrote: a crash never leaves data and offset
// out of step. Three rounds, each continuing from the state the last crash
// left.
func TestPebbleCrash(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		runCrashChild(dir)
		return
	}
	dir := t.TempDir()
	prev := make(map[int32]int64)
	for _, p := range crashParts {
		prev[p] = NoOffset
	}
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPebbleCrash$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		must(t, err)
		must(t, cmd.Start())
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == "ready" {
					ready <- true
					break
				}
			}
			ready <- false
			for sc.Scan() {
			}
		}()
		select {
		case ok := <-ready:
			if !ok {
				_ = cmd.Wait()
				t.Fatalf("round %d: child exited before ready: %s", round, stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("round %d: child not ready after 30 s: %s", round, stderr.String())
		}
		time.Sleep(time.Duration(50+rand.IntN(300)) * time.Millisecond)
		must(t, cmd.Process.Signal(syscall.SIGKILL))
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child did not die of SIGKILL (err %v): %s", round, err, stderr.String())
		}

		s, err := OpenPebble(dir, PebbleOptions{})
		must(t, err)
		var listed []int32
		for _, p := range crashParts {
			off, err := s.Offset(p)
			must(t, err)
			// The child synced 21 batches per partition before "ready", so
			// each round moves every partition forward by at least that
			// much, unless the kill fell between a drop and the next batch
			// (NoOffset, consistent: the child restarts the partition at 0).
			if off != NoOffset && off < prev[p]+21 {
				t.Errorf("round %d partition %d: offset %d, was %d; synced progress lost", round, p, off, prev[p])
			}
			want, err := crashExpected(p, off)
			must(t, err)
			got, exp := dump(t, s, p), dump(t, want, p)
			if !slices.Equal(got, exp) {
				t.Fatalf("round %d partition %d at offset %d: %d entries, want %d; first difference: %s",
					round, p, off, len(got), len(exp), firstDiff(got, exp))
			}
			// Marks never run ahead of or behind the data: they are exactly
			// those of the batches up to the stored offset.
			gm, err := s.Marks(p)
			must(t, err)
			wm, err := want.Marks(p)
			must(t, err)
			if !maps.Equal(gm, wm) {
				t.Fatalf("round %d partition %d at offset %d: marks %v, want %v", round, p, off, gm, wm)
			}
			if off != NoOffset || len(got) > 0 {
				listed = append(listed, p)
			}
			t.Logf("round %d partition %d: offset %d, %d keys", round, p, off, len(got))
			prev[p] = off
		}
		wantPartitions(t, s, listed...)
		must(t, s.Close())
	}
}

func firstDiff(got, want []string) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("got %.60q want %.60q", got[i], want[i])
		}
	}
	return fmt.Sprintf("lengths %d vs %d", len(got), len(want))
}
