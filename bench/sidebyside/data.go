package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
)

// dataset is the input of a run: n records whose 16-byte keys are drawn
// uniformly, with replacement, from a space of keys keys, and whose values
// are 100 lower-case letters, the same sequence (fixed seed) for every system
// and round. Two are used: the hot-key one (-keys, 10k: every key repeats
// ~n/10k times) and the distinct-key one (-distinct-keys, as many keys as
// records: 1 − 1/e ≈ 63% as many distinct keys as records, ~316k in 500k as
// in issue #28's rerun; a key occurs 1.58 times on average, 58% of them
// once).
type dataset struct {
	n, partitions int
	keys          []string
	keyPart       []int32 // partition of keys[i] (murmur2, Kafka's default)
	keyOf         []int32 // index into keys of record i
	counts        map[string]int64
	probes        []string // probes[p]: a key outside keys that lands on partition p
}

func newDataset(n, keys, partitions int) *dataset {
	d := &dataset{n: n, partitions: partitions, counts: map[string]int64{}}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range keys {
		k := fmt.Sprintf("key-%012d", i)
		d.keys = append(d.keys, k)
		d.keyPart = append(d.keyPart, kafka.PartitionFor([]byte(k), int32(partitions)))
	}
	for range n {
		i := int32(rng.IntN(keys))
		d.keyOf = append(d.keyOf, i)
		d.counts[d.keys[i]]++
	}
	d.probes = make([]string, partitions)
	for i, found := 0, 0; found < partitions; i++ {
		k := fmt.Sprintf("probe-%010d", i)
		if p := kafka.PartitionFor([]byte(k), int32(partitions)); d.probes[p] == "" {
			d.probes[p] = k
			found++
		}
	}
	return d
}

// records yields the dataset's records for topic.
func (d *dataset) records(topic string) func(yield func(*kgo.Record) bool) {
	return func(yield func(*kgo.Record) bool) {
		rng := rand.New(rand.NewPCG(3, 4))
		for _, ki := range d.keyOf {
			v := make([]byte, 100)
			for j := range v {
				v[j] = byte('a' + rng.IntN(26))
			}
			if !yield(&kgo.Record{Topic: topic, Partition: d.keyPart[ki], Key: []byte(d.keys[ki]), Value: v}) {
				return
			}
		}
	}
}

// partitionCount returns how many of the dataset's records go to partition p.
func (d *dataset) partitionCount(p int32) int {
	n := 0
	for _, ki := range d.keyOf {
		if d.keyPart[ki] == p {
			n++
		}
	}
	return n
}

// load produces the dataset to topic.
func (d *dataset) load(ctx context.Context, addrs []string, topic string) error {
	p, err := newProducer(addrs)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.produce(ctx, d.records(topic)); err != nil {
		return fmt.Errorf("load %d records into %s: %w", d.n, topic, err)
	}
	return nil
}

// watcher consumes a topic from its start (it may not exist yet) and keeps,
// per key, either the number of records (counting: an output topic) or the
// last decoded value (a changelog), compared with an expectation.
type watcher struct {
	cl       *kgo.Client
	counting bool
	decode   func([]byte) (int64, error)
	key      func([]byte) string
	cancel   context.CancelFunc
	stopped  chan struct{}
	only     bool // ignore keys without an expectation (watchOnly)

	mu       sync.Mutex           // guards everything below
	expect   map[string]int64     // expected value per key
	got      map[string]int64     // count or last value per key
	under    int                  // keys with got < expect
	over     int                  // keys with got > expect
	total    int64                // records seen
	bad      int64                // records failing check or decode
	badMsg   string               // the first of those
	first    time.Time            // first record seen
	complete time.Time            // when under and over last became 0 (zero while not)
	seenAt   map[string]time.Time // per key, when got last changed
	after    time.Time            // zero, or the time firstAfter counts from
	// afterTS: a record whose timestamp is after it also counts for
	// firstAfter, whenever it arrives (resumeAfter).
	afterTS time.Time
	// firstAfter is, per partition, when the first record observed after
	// `after` arrived.
	firstAfter map[int32]time.Time
}

// watch starts a watcher of topic; expect is copied. key reads the topic's
// keys (nil: as they are).
func watch(addrs []string, topic string, counting, committed bool, decode func([]byte) (int64, error), key func([]byte) string, expect map[string]int64) (*watcher, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.MetadataMinAge(100 * time.Millisecond), kgo.MetadataMaxAge(time.Second)}
	if committed {
		// An exactly-once system's output and changelog count only once
		// committed: aborted records are not its answer.
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", topic, err)
	}
	if key == nil {
		key = func(b []byte) string { return string(b) }
	}
	w := &watcher{cl: cl, counting: counting, decode: decode, key: key, stopped: make(chan struct{}),
		expect: map[string]int64{}, got: map[string]int64{}, seenAt: map[string]time.Time{}, firstAfter: map[int32]time.Time{}}
	for k, v := range expect {
		w.expect[k] = v
		if v > 0 {
			w.under++
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.loop(ctx)
	return w, nil
}

// watchOnly starts a watcher of a changelog that looks at the keys of
// expect only (the other keys' records are ignored).
func watchOnly(addrs []string, topic string, decode func([]byte) (int64, error), key func([]byte) string, expect map[string]int64) (*watcher, error) {
	w, err := watch(addrs, topic, false, false, decode, key, nil)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.only = true
	now := time.Now()
	for k, v := range expect {
		w.setExpect(k, v, now)
	}
	return w, nil
}

func (w *watcher) loop(ctx context.Context) {
	defer close(w.stopped)
	for {
		fs := w.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		w.mu.Lock()
		fs.EachRecord(func(r *kgo.Record) {
			w.total++
			if w.first.IsZero() {
				w.first = now
			}
			if !w.after.IsZero() && (now.After(w.after) || (!w.afterTS.IsZero() && r.Timestamp.After(w.afterTS))) {
				if _, ok := w.firstAfter[r.Partition]; !ok {
					w.firstAfter[r.Partition] = now
				}
			}
			k := w.key(r.Key)
			if _, ok := w.expect[k]; w.only && !ok {
				return
			}
			var v int64
			if w.counting {
				if !upper100(r.Value) {
					w.failf("output of key %s: value %q is not the input upper-cased", k, r.Value)
				}
				v = w.got[k] + 1
			} else {
				if r.Value == nil {
					return // a tombstone: no system deletes counts
				}
				var err error
				if v, err = w.decode(r.Value); err != nil {
					w.failf("changelog key %s: %v", k, err)
					return
				}
			}
			w.setGot(k, v, now)
		})
		w.mu.Unlock()
	}
}

func upper100(b []byte) bool {
	if len(b) != 100 {
		return false
	}
	for _, c := range b {
		if c < 'A' || c > 'Z' {
			return false
		}
	}
	return true
}

// failf records a bad record; callers hold mu.
func (w *watcher) failf(format string, args ...any) {
	w.bad++
	if w.badMsg == "" {
		w.badMsg = fmt.Sprintf(format, args...)
	}
}

// classify returns -1, 0 or 1 for got below, at or above expect.
func classify(got, expect int64) int {
	switch {
	case got < expect:
		return -1
	case got > expect:
		return 1
	}
	return 0
}

// setGot and setExpect keep under, over and complete true; callers hold mu.
func (w *watcher) setGot(k string, v int64, now time.Time) {
	w.adjust(k, -1)
	w.got[k] = v
	w.seenAt[k] = now
	w.adjust(k, 1)
	w.mark(now)
}

func (w *watcher) setExpect(k string, v int64, now time.Time) {
	w.adjust(k, -1)
	w.expect[k] = v
	w.adjust(k, 1)
	w.mark(now)
}

func (w *watcher) adjust(k string, sign int) {
	switch classify(w.got[k], w.expect[k]) {
	case -1:
		w.under += sign
	case 1:
		w.over += sign
	}
}

func (w *watcher) mark(now time.Time) {
	if w.under == 0 && w.over == 0 {
		if w.complete.IsZero() {
			w.complete = now
		}
	} else {
		w.complete = time.Time{}
	}
}

// addExpect raises the expectation of key k by one (a probe was produced).
func (w *watcher) addExpect(k string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.setExpect(k, w.expect[k]+1, time.Now())
}

// addExpectAll raises the expectation of each of keys by one.
func (w *watcher) addExpectAll(keys []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for _, k := range keys {
		w.setExpect(k, w.expect[k]+1, now)
	}
}

// state is a snapshot of the watcher.
type state struct {
	under, over      int
	total, bad       int64
	badMsg           string
	first, complete  time.Time
	sum, expectedSum int64 // of got and expect over all keys
	excess           int64 // sum of got − expect over keys above expect
}

func (w *watcher) state() state {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := state{under: w.under, over: w.over, total: w.total, bad: w.bad, badMsg: w.badMsg, first: w.first, complete: w.complete}
	for k, v := range w.got {
		s.sum += v
		if e := w.expect[k]; v > e {
			s.excess += v - e
		}
	}
	for _, v := range w.expect {
		s.expectedSum += v
	}
	return s
}

// sample describes up to n keys whose value differs from the expectation.
func (w *watcher) sample(n int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k, e := range w.expect {
		if g := w.got[k]; g != e && len(out) < n {
			out = append(out, fmt.Sprintf("%s: %d, want %d", k, g, e))
		}
	}
	return strings.Join(out, ", ")
}

// resumeAfter starts recording, per partition, the first record observed
// after t, or observed earlier but with a timestamp after ts (zero: none).
func (w *watcher) resumeAfter(t, ts time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.after, w.afterTS = t, ts
	clear(w.firstAfter)
}

// resumed returns when each partition that has one saw its first record
// after the resumeAfter time.
func (w *watcher) resumed() map[int32]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[int32]time.Time, len(w.firstAfter))
	for p, t := range w.firstAfter {
		out[p] = t
	}
	return out
}

// waitFor polls cond on the watcher's state every 20 ms until it holds,
// the child exits, or timeout passes.
func (w *watcher) waitFor(timeout time.Duration, exited <-chan struct{}, cond func(state) bool) (state, error) {
	deadline := time.Now().Add(timeout)
	for {
		s := w.state()
		if cond(s) {
			return s, nil
		}
		if s.bad > 0 {
			return s, fmt.Errorf("%d bad records, first: %s", s.bad, s.badMsg)
		}
		select {
		case <-exited:
			return s, fmt.Errorf("a worker exited early")
		default:
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("timeout after %s: %d keys below and %d above their expected value (sum %d of %d; %s)",
				timeout, s.under, s.over, s.sum, s.expectedSum, w.sample(3))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops the watcher.
func (w *watcher) Close() {
	w.cancel()
	<-w.stopped
	w.cl.Close()
}

// watchChangelog watches the changelog of s's table in run r for the
// expected counts (read_committed for an exactly-once system).
func (h *harness) watchChangelog(r *run, s *system) (*watcher, error) {
	return watch(r.b.addrs, s.changelog(r.id), false, s.eos, s.decode, s.key, r.data.counts)
}
