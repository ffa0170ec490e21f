package procs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/internal/testtool"
)

// TestDiskFullWorker runs a worker process whose data dir lies on a small
// tmpfs that fills up while it processes large values (issue #12: Pebble's
// WAL write once failed with a Go panic). The worker must exit non-zero with
// an error naming the cause (ENOSPC), without a panic; once space is freed,
// a new process on the same data dir must finish the input with every count
// exact: nothing lost, nothing counted twice. Needs root (mount).
func TestDiskFullWorker(t *testing.T) {
	if os.Geteuid() != 0 {
		testtool.Missing(t, "tmpfs", "mounting a small tmpfs needs root", "run the test as root")
	}
	cl := newCluster(t, "diskfull")
	mnt := filepath.Join(t.TempDir(), "fs")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", mnt).CombinedOutput(); err != nil {
		testtool.Missing(t, "tmpfs", fmt.Sprintf("mount tmpfs: %v: %s", err, bytes.TrimSpace(out)), "run as root where mount is allowed")
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v\n%s", err, out)
		}
	})
	// The filler leaves about 40 MB: enough to start and restore, not for
	// the input's 24 MB of values above the stores' free-space reserve
	// (stores.PebbleOptions.MinFreeBytes: two 16 MiB memtables).
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 120<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(mnt, "w1")

	start := func(stderr *testbroker.LockedBuffer) (*exec.Cmd, chan error) {
		cmd := exec.Command(cl.bin)
		cmd.Env = append(os.Environ(), "RUNNEL_BROKERS="+strings.Join(cl.brokers, ","), "PROCS_APP="+cl.app,
			"PROCS_TOPIC="+cl.topic, "PROCS_DIR="+dataDir, "PROCS_FILL=1", "PROCS_LOG_LEVEL=info")
		cmd.Stderr = stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
		})
		return cmd, done
	}

	// 768 records of 32 KB, each with a key of its own (the write cache
	// cannot fold them): 24 MB of values in the "last" table's WAL,
	// memtables and SSTs.
	client, err := sarama.NewClient(cl.brokers, testbroker.SaramaConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	var stderr1 testbroker.LockedBuffer
	_, done1 := start(&stderr1)
	waitTopic(t, client, cl.topic)
	sent := produceLarge(t, cl.brokers, cl.topic, 768, 768, 32<<10)

	var exitErr error
	select {
	case exitErr = <-done1:
	case <-time.After(3 * time.Minute):
		df, _ := exec.Command("df", "-h", mnt).CombinedOutput()
		du, _ := exec.Command("du", "-sh", dataDir).CombinedOutput()
		t.Fatalf("the worker did not stop on a full disk within 3 min (%s; %s); stderr:\n%s", df, du, tail(stderr1.String(), 30))
	}
	out := stderr1.String()
	t.Logf("first worker: %v; last lines:\n%s", exitErr, tail(out, 12))
	if exitErr == nil {
		t.Fatal("the worker exited 0 on a full disk")
	}
	if strings.Contains(out, "panic:") || strings.Contains(out, "goroutine ") {
		t.Fatalf("the worker panicked on a full disk:\n%s", tail(out, 40))
	}
	if !strings.Contains(out, "no space left on device") {
		t.Fatalf("the worker's error does not name the cause (no space left on device):\n%s", tail(out, 20))
	}

	// Space returns: a new process on the same data dir finishes the input.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var stderr2 testbroker.LockedBuffer
	cmd2, done2 := start(&stderr2)
	waitCommitted(t, client, cl.app, cl.topic, 2*time.Minute, func() string { return tail(stderr2.String(), 20) })
	if err := cmd2.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done2:
		if err != nil {
			t.Fatalf("second worker: %v\n%s", err, tail(stderr2.String(), 20))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("second worker did not stop after SIGTERM")
	}
	wantExact(t, "after the restart", readCounts(t, client, cl.app), sent)
}

// produceLarge sends n records of size-byte values over keys keys "k0"... to
// the six partitions of topic and returns the acknowledged count per key.
func produceLarge(t *testing.T, brokers []string, topic string, n, keys, size int) map[string]int64 {
	t.Helper()
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.MaxMessageBytes = 4 << 20
	prod, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	sent := map[string]int64{}
	value := bytes.Repeat([]byte("v"), size)
	for i := 0; i < n; i += 16 {
		var msgs []*sarama.ProducerMessage
		for j := i; j < min(n, i+16); j++ {
			k := "k" + strconv.Itoa(j%keys)
			msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: kafka.PartitionFor([]byte(k), 6),
				Key: sarama.StringEncoder(k), Value: sarama.ByteEncoder(value)})
		}
		if err := prod.SendMessages(msgs); err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			sent[string(m.Key.(sarama.StringEncoder))]++
		}
	}
	return sent
}

// waitTopic waits until the worker created topic.
func waitTopic(t *testing.T, client sarama.Client, topic string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; {
		_ = client.RefreshMetadata(topic)
		if ps, err := client.Partitions(topic); err == nil && len(ps) == 6 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s not created within a minute", topic)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitCommitted waits until group's committed offset on every partition of
// topic reached the partition's highwater.
func waitCommitted(t *testing.T, client sarama.Client, group, topic string, within time.Duration, logs func() string) {
	t.Helper()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	parts := []int32{0, 1, 2, 3, 4, 5}
	var lag int64
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		offs, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
		if err != nil {
			continue
		}
		lag = 0
		for _, p := range parts {
			hw, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				lag = -1
				break
			}
			b := offs.GetBlock(topic, p)
			if b == nil || b.Offset < hw {
				committed := int64(0)
				if b != nil && b.Offset > 0 {
					committed = b.Offset
				}
				lag += hw - committed
			}
		}
		if lag == 0 {
			return
		}
	}
	t.Fatalf("group %s: lag %d on %s after %s; worker:\n%s", group, lag, topic, within, logs())
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
