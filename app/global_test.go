package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/changelog"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

const gparts = 3

// globalApp is one process's instance of an app with a global table "latest"
// (key -> last value seen) and a plain table "counts" (key -> records seen),
// both written by one agent from records keyed like the table. Every worker
// gets its own App instance, like separate processes, so each serves HTTP on
// its own address.
type globalApp struct {
	app    *app.App
	in     *agent.Topic[string, string]
	latest *table.GlobalTable[string, int64]
	counts *table.Table[string, int64]
	addr   string
}

func newGlobalApp(t *testing.T, id string) *globalApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	g := &globalApp{addr: addr, app: app.New(id,
		app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
		app.WithCommitInterval(200*time.Millisecond),
		app.WithLogger(testLogger()),
		app.WithTopicPrefix(id+"-"),
		app.WithHTTPAddr(addr))}
	g.in = app.Topic(g.app, "in", codec.String(), codec.String(), app.Partitions(gparts))
	g.latest = table.NewGlobal(g.app, "latest", codec.String(), codec.DecimalInt64())
	g.counts = table.New(g.app, "counts", codec.String(), codec.DecimalInt64())
	agent.New(g.app, "record", g.in, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			n, err := strconv.ParseInt(ev.Value, 10, 64)
			if err != nil {
				return err
			}
			g.latest.Put(ev, ev.Key, n)
			g.counts.Update(ev, ev.Key, func(c int64) int64 { return c + 1 })
		}
		return s.Err()
	}, agent.WritesTo(g.counts, g.latest))
	return g
}

type runningWorker struct {
	g      *globalApp
	w      *app.Worker
	dir    string
	cancel context.CancelFunc
	done   chan error
}

func startGlobalWorker(t *testing.T, brokers []string, id, dir, name string) *runningWorker {
	t.Helper()
	g := newGlobalApp(t, id)
	w, err := g.app.NewWorker(app.WorkerOptions{Brokers: brokers, DataDir: dir, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rw := &runningWorker{g: g, w: w, dir: dir, cancel: cancel, done: make(chan error, 1)}
	go func() { rw.done <- w.Run(ctx) }()
	t.Cleanup(rw.stop)
	return rw
}

func (rw *runningWorker) stop() {
	if rw.cancel == nil {
		return
	}
	rw.cancel()
	<-rw.done
	rw.cancel = nil
}

// producer sends "key -> seq" records to the partition murmur2 gives the key
// and remembers the last value and the count per key.
type gproducer struct {
	t     *testing.T
	topic string
	prod  sarama.SyncProducer
	mu    sync.Mutex
	seq   int64
	last  map[string]int64
	count map[string]int64
}

func newGProducer(t *testing.T, brokers []string, topic string) *gproducer {
	prod := testbroker.SyncProducer(t, brokers)
	t.Cleanup(func() { prod.Close() })
	return &gproducer{t: t, topic: topic, prod: prod, last: map[string]int64{}, count: map[string]int64{}}
}

func (p *gproducer) send(key string) int64 {
	p.mu.Lock()
	p.seq++
	v := p.seq
	p.mu.Unlock()
	_, _, err := p.prod.SendMessage(&sarama.ProducerMessage{Topic: p.topic, Partition: kafka.PartitionFor([]byte(key), gparts),
		Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(strconv.FormatInt(v, 10))})
	if err != nil {
		p.t.Error(err)
		return v
	}
	p.mu.Lock()
	p.last[key] = v
	p.count[key]++
	p.mu.Unlock()
	return v
}

// replica reads every partition of a worker's global replica.
func replica(t *testing.T, w *app.Worker) map[string]string {
	t.Helper()
	gs := w.GlobalReplica("latest")
	m := map[string]string{}
	for p := int32(0); p < gs.Partitions(); p++ {
		if err := gs.Store().Iterate(p, func(k, v []byte) error { m[string(k)] = string(v); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

// converged waits until every worker's replica holds exactly want and has no
// own write left unapplied.
func converged(t *testing.T, ws []*runningWorker, want map[string]int64, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for _, rw := range ws {
		for {
			got := replica(t, rw.w)
			diff := ""
			if len(got) != len(want) {
				diff = fmt.Sprintf("%d keys, want %d", len(got), len(want))
			}
			for k, v := range want {
				if got[k] != strconv.FormatInt(v, 10) {
					diff = fmt.Sprintf("%s = %q, want %d", k, got[k], v)
					break
				}
			}
			if diff == "" && rw.w.GlobalReplica("latest").Pending() == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("worker %s: replica never converged: %s", rw.dir, diff)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func waitAllReady(t *testing.T, ws []*runningWorker) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		ok := true
		for _, rw := range ws {
			ok = ok && rw.w.Ready() && len(rw.w.Assignment().Actives) > 0
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("workers never ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func getJSON(t *testing.T, url string) (int, app.TableAnswer) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a app.TableAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, a
}

// TestGlobalTableThreeWorkers: three workers of one app hold a global table
// written by its partitions' owners. Workers 2 and 3 start (and restore the
// global changelog) while worker 1 and then all of them keep writing; once the
// writes stop every replica equals the last value per key. A key written by
// another worker's agent becomes readable on a worker within a bounded lag
// (measured). The HTTP API answers global keys locally and plain-table keys
// locally or through the owner. A worker restarted on its data dir replays
// exactly the changelog records appended while it was down.
func TestGlobalTableThreeWorkers(t *testing.T) {
	brokers := testbroker.Brokers(t)
	id := testbroker.Topic(t, "gapp")
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%02d", i)
	}

	w1 := startGlobalWorker(t, brokers, id, dirs[0], "w1")
	client := testbroker.Client(t, brokers)
	topic := w1.g.in.Name()
	testbroker.WaitTopic(t, client, topic)
	pr := newGProducer(t, brokers, topic)
	for i := 0; i < 600; i++ {
		pr.send(keys[i%len(keys)])
	}
	testbroker.WaitLag0(t, brokers, id, topic)
	// Commit cycles write one changelog record per key per cycle: what the
	// 600 writes left is what the start-up restores must cover at least.
	var before int64
	for _, hw := range testbroker.Highwaters(t, client, w1.g.latest.Changelog()) {
		before += hw
	}

	// Workers 2 and 3 join while records keep arriving: their start-up
	// restores read a changelog that grows under them.
	stopWriting := make(chan struct{})
	writing := make(chan struct{})
	go func() {
		defer close(writing)
		for i := 0; ; i++ {
			select {
			case <-stopWriting:
				return
			default:
			}
			pr.send(keys[i%len(keys)])
			if i%20 == 0 {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}()
	time.Sleep(200 * time.Millisecond)
	w2 := startGlobalWorker(t, brokers, id, dirs[1], "w2")
	time.Sleep(300 * time.Millisecond)
	w3 := startGlobalWorker(t, brokers, id, dirs[2], "w3")
	ws := []*runningWorker{w1, w2, w3}
	waitAllReady(t, ws)
	time.Sleep(500 * time.Millisecond) // keep writing under the new assignment
	close(stopWriting)
	<-writing
	testbroker.WaitLag0(t, brokers, id, topic)
	// The broker compacts the changelog (kfake ignores min.compaction.lag.ms),
	// so restores are checked by the offset span they covered, not by records.
	r2, s2 := w2.w.GlobalRestored()
	r3, s3 := w3.w.GlobalRestored()
	t.Logf("records sent %d; start-up global restores: w2 %d records over %d offsets, w3 %d over %d", pr.seq, r2, s2, r3, s3)
	if s2 < before || s3 < before || r2 < int64(len(keys)) || r3 < int64(len(keys)) {
		t.Fatalf("start-up restores of w2, w3 covered %d, %d offsets (%d, %d records); want at least the %d written before they started", s2, s3, r2, r3, before)
	}
	converged(t, ws, pr.last, 20*time.Second)

	// Lag: the reader (w3) polls for keys whose partitions other workers own.
	actives := w3.w.Assignment().Actives[topic]
	var foreign []string
	for _, k := range keys {
		if !slices.Contains(actives, kafka.PartitionFor([]byte(k), gparts)) {
			foreign = append(foreign, k)
		}
	}
	if len(foreign) == 0 {
		t.Fatalf("w3 owns every partition (%v); the test needs keys owned elsewhere", actives)
	}
	owner := func(k string) *runningWorker {
		for _, rw := range ws {
			if slices.Contains(rw.w.Assignment().Actives[topic], kafka.PartitionFor([]byte(k), gparts)) {
				return rw
			}
		}
		t.Fatalf("no owner of %s", k)
		return nil
	}
	// A probe consumer on the changelog timestamps each record's arrival at
	// the broker: the replica's lag is measured from there; the owner's own
	// read (read-your-writes) and the end-to-end time are reported too.
	var e2e, followerLag, ownerRead []time.Duration
	probeCons, _ := sarama.NewConsumer(brokers, testbroker.SaramaConfig(t))
	var probes []sarama.PartitionConsumer
	for p := int32(0); p < gparts; p++ {
		pc, _ := probeCons.ConsumePartition(changelog.Topic(id, "latest"), p, sarama.OffsetNewest)
		probes = append(probes, pc)
	}
	for i := 0; i < 30; i++ {
		k := foreign[i%len(foreign)]
		ow := owner(k).w.GlobalReplica("latest")
		rd := w3.w.GlobalReplica("latest")
		sent := time.Now()
		v := pr.send(k)
		want := []byte(strconv.FormatInt(v, 10))
		var arrived time.Time
		arrivedC := make(chan struct{})
		go func() {
			<-probes[kafka.PartitionFor([]byte(k), gparts)].Messages()
			arrived = time.Now()
			close(arrivedC)
		}()
		var atOwner time.Time
		for {
			if atOwner.IsZero() {
				if b, ok, _ := ow.Lookup([]byte(k)); ok && string(b) == string(want) {
					atOwner = time.Now()
				}
			}
			if b, ok, _ := rd.Lookup([]byte(k)); ok && string(b) == string(want) {
				now := time.Now()
				if atOwner.IsZero() {
					atOwner = now
				}
				e2e = append(e2e, now.Sub(sent))
				<-arrivedC
				ownerRead = append(ownerRead, atOwner.Sub(sent))
				followerLag = append(followerLag, max(0, now.Sub(arrived)))
				break
			}
			if time.Since(sent) > 10*time.Second {
				t.Fatalf("%s = %d never visible on w3", k, v)
			}
			time.Sleep(time.Millisecond)
		}
	}
	q := func(d []time.Duration, f float64) time.Duration {
		s := slices.Clone(d)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[int(f*float64(len(s)-1))]
	}
	t.Logf("foreign writes read on w3 (%d): changelog arrival -> w3 read p50 %v p95 %v max %v; input sent -> owner read p50 %v max %v; input sent -> w3 read p50 %v p95 %v max %v",
		len(e2e), q(followerLag, .5), q(followerLag, .95), q(followerLag, 1), q(ownerRead, .5), q(ownerRead, 1), q(e2e, .5), q(e2e, .95), q(e2e, 1))
	if m := q(followerLag, 1); m > time.Second {
		t.Fatalf("max lag of a replica behind the changelog = %v, want < 1 s", m)
	}
	if m := q(e2e, 1); m > 5*time.Second {
		t.Fatalf("max time from input to a foreign replica = %v, want < 5 s", m)
	}

	// HTTP: a global key is served by every worker from its replica; a plain
	// table key by its owner, forwarded by the others, and with forward=0 a
	// non-owner names the owner.
	testbroker.WaitLag0(t, brokers, id, topic)
	converged(t, ws, pr.last, 10*time.Second)
	k := foreign[0]
	for _, rw := range ws {
		code, a := getJSON(t, "http://"+rw.g.addr+"/api/tables/latest/"+k)
		if code != http.StatusOK || !a.Global || fmt.Sprint(a.Value) != strconv.FormatInt(pr.last[k], 10) {
			t.Fatalf("GET latest/%s on %s = %d %+v, want 200 value %d", k, rw.dir, code, a, pr.last[k])
		}
		code, a = getJSON(t, "http://"+rw.g.addr+"/api/tables/counts/"+k)
		if code != http.StatusOK || fmt.Sprint(a.Value) != strconv.FormatInt(pr.count[k], 10) {
			t.Fatalf("GET counts/%s on %s = %d %+v, want 200 value %d", k, rw.dir, code, a, pr.count[k])
		}
	}
	if code, a := getJSON(t, "http://"+w3.g.addr+"/api/tables/counts/"+k+"?forward=0"); code != http.StatusServiceUnavailable || a.Reason != app.ReasonNotOwner || a.Owner != owner(k).g.addr {
		t.Fatalf("GET counts/%s?forward=0 on non-owner w3 = %d %+v, want 503 not-owner, owner %s", k, code, a, owner(k).g.addr)
	}
	if code, _ := getJSON(t, "http://"+w3.g.addr+"/api/tables/latest/no-such-key"); code != http.StatusNotFound {
		t.Fatalf("GET of an absent key = %d, want 404", code)
	}

	// Restart w3 on its data dir after more writes: it replays only the tail
	// (the span from its checkpoints to the highwaters; compaction may have
	// removed some records inside it).
	w3.stop()
	// New keys: kfake moves the log start offset when compaction empties the
	// head of a partition (Kafka never does), which would make the restart
	// rebuild; records of fresh keys after the checkpoint are never compacted.
	for i := 0; i < 90; i++ {
		pr.send(fmt.Sprintf("tail-%02d", i))
	}
	testbroker.WaitLag0(t, brokers, id, topic)
	converged(t, []*runningWorker{w1, w2}, pr.last, 20*time.Second)
	st, err := stores.OpenPebble(filepath.Join(dirs[2], "tables", "latest"), stores.PebbleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var tail, total int64
	cl := changelog.Topic(id, "latest")
	for p := int32(0); p < gparts; p++ {
		ck, err := st.Offset(p)
		if err != nil {
			t.Fatal(err)
		}
		end, err := client.GetOffset(cl, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatal(err)
		}
		tail += end - (ck + 1)
		total += end
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	w3 = startGlobalWorker(t, brokers, id, dirs[2], "w3")
	ws[2] = w3
	waitAllReady(t, ws)
	records, span := w3.w.GlobalRestored()
	t.Logf("restart: changelog holds %d records, %d appended while w3 was down; w3 replayed %d (span %d)", total, tail, records, span)
	if span != tail || records > tail || records < 1 || tail < 90 || tail >= total {
		t.Fatalf("restarted w3 replayed %d records (span %d); want exactly the %d-record tail of %d", records, span, tail, total)
	}
	converged(t, ws, pr.last, 20*time.Second)
}
