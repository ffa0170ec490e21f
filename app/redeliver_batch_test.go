package app

import (
	"sync"
	"testing"
	"testing/synctest"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent/source"
)

// bareClaimProducer is a claim producer with only what emitFetched, Pause,
// Resume and seekBack use.
func bareClaimProducer(start int64) *claimProducer {
	c := &claimProducer{wm: source.NewWatermark(start), epoch: &epoch{}, rewind: -1, marked: -1,
		stop: make(chan struct{}), rewindCh: make(chan struct{}, 1), flushed: start, nextFetch: start}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func fetched(offsets ...int64) []*sarama.ConsumerMessage {
	var ms []*sarama.ConsumerMessage
	for _, o := range offsets {
		ms = append(ms, &sarama.ConsumerMessage{Topic: "in", Offset: o})
	}
	return ms
}

// A batch fetched while a commit cycle is being cut waits as a whole: none of
// its records is handed out or counted below the cycle's commit point, and
// after Resume all of them are, in order, in one batch.
func TestEmitFetchedBatchWaitsForPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := bareClaimProducer(100)
		c.handedRecords(t, fetched(100, 101), 2)
		if got := c.Pause(); got != 102 {
			t.Fatalf("Pause returned %d, want 102", got)
		}
		var mu sync.Mutex
		var got []int64
		done := make(chan error, 1)
		go func() {
			done <- c.emitFetched(fetched(102, 103, 105, 106), make([]source.Emit, 0, 4), func() {}, func(b []source.Emit) error {
				mu.Lock()
				defer mu.Unlock()
				for _, it := range b {
					if it.Payload != any(c.epoch) {
						t.Errorf("record %d: payload is not the current epoch", it.Record.Offset)
					}
					got = append(got, it.Record.Offset)
				}
				return nil
			})
		}()
		synctest.Wait()
		mu.Lock()
		if len(got) != 0 {
			t.Fatalf("records %v handed out during a cycle's cut", got)
		}
		mu.Unlock()
		if h := c.Handed(); h != 2 {
			t.Fatalf("Handed %d during the cut, want 2 (the waiting batch must not count)", h)
		}
		if p := c.Pause(); p != 102 {
			t.Fatalf("commit point %d during the cut, want 102", p)
		}
		c.Resume()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if want := []int64{102, 103, 105, 106}; !equalInts(got, want) {
			t.Fatalf("handed out %v, want %v", got, want)
		}
		if h := c.Handed(); h != 6 {
			t.Fatalf("Handed %d, want 6", h)
		}
		if p := c.Pause(); p != 107 {
			t.Fatalf("commit point %d after the batch, want 107", p)
		}
		c.Resume()
		if n := c.wm.Pending(); n != 6 {
			t.Fatalf("watermark tracks %d records, want 6", n)
		}
	})
}

// A seek back (a failed record) while a fetched batch waits discards the
// whole batch: its records were fetched before the seek and are read again.
func TestEmitFetchedBatchDiscardedBySeekBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := bareClaimProducer(0)
		c.handedRecords(t, fetched(0, 1, 2), 3)
		c.Pause()
		done := make(chan error, 1)
		emitted, released := 0, 0
		go func() {
			done <- c.emitFetched(fetched(3, 4), make([]source.Emit, 0, 2), func() { released++ }, func(b []source.Emit) error {
				emitted += len(b)
				return nil
			})
		}()
		synctest.Wait()
		c.seekBack(1)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if released != 1 {
			t.Fatalf("hand-out gate released %d times, want 1", released)
		}
		if emitted != 0 {
			t.Fatalf("%d records of a batch fetched before the seek back were handed out", emitted)
		}
		if next := c.wm.Next(); next != 1 {
			t.Fatalf("watermark at %d after the seek back, want 1", next)
		}
	})
}

// Fetching stopped (revoke, failure) while a fetched batch waits through a
// cycle's cut: the batch is not handed out at all, so none of its records can
// reach a group that no longer delivers them; the hand-out gate is released.
func TestEmitFetchedBatchNotHandedOutAfterStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := bareClaimProducer(0)
		c.handedRecords(t, fetched(0, 1), 2)
		c.Pause()
		done := make(chan error, 1)
		emitted, released := 0, 0
		go func() {
			done <- c.emitFetched(fetched(2, 3, 4), make([]source.Emit, 0, 3), func() { released++ }, func(b []source.Emit) error {
				emitted += len(b)
				return nil
			})
		}()
		synctest.Wait()
		c.stopFetching()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if emitted != 0 {
			t.Fatalf("%d records of a batch handed out after fetching stopped", emitted)
		}
		if released != 1 {
			t.Fatalf("hand-out gate released %d times, want 1", released)
		}
		if h := c.Handed(); h != 2 {
			t.Fatalf("Handed %d, want 2 (the stopped batch must not count)", h)
		}
		if n, next := c.wm.Pending(), c.wm.Next(); n != 2 || next != 0 {
			t.Fatalf("watermark pending %d next %d, want 2 and 0", n, next)
		}
	})
}

// handedRecords hands msgs out and checks the handed count. The hand-out gate
// (group.TxnCommitter.HandOut) must be released once, after the whole batch is
// registered and before any of it is fanned out.
func (c *claimProducer) handedRecords(t *testing.T, msgs []*sarama.ConsumerMessage, want int64) {
	t.Helper()
	released := 0
	release := func() {
		released++
		if h := c.Handed(); h != want {
			t.Errorf("hand-out gate released with Handed %d, want %d (the whole batch registered)", h, want)
		}
	}
	if err := c.emitFetched(msgs, nil, release, func([]source.Emit) error {
		if released != 1 {
			t.Errorf("batch fanned out with the hand-out gate released %d times, want 1", released)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if released != 1 {
		t.Fatalf("hand-out gate released %d times, want 1", released)
	}
	if h := c.Handed(); h != want {
		t.Fatalf("Handed %d, want %d", h, want)
	}
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
