package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/app"
	"github.com/runnel-dev/runnel/client"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/stores"
	"github.com/runnel-dev/runnel/table"
)

var (
	tableReadKeys  = flag.Int("tableread-keys", 10_000, "keys of the table BenchmarkTableReads reads")
	tableReadReads = flag.Int("tableread-reads", 20_000, "reads per path and mode of BenchmarkTableReads")
	tableReadConc  = flag.Int("tableread-concurrency", 8, "concurrent readers of BenchmarkTableReads' throughput mode")
)

// tableReadParts is the partition count of BenchmarkTableReads' table.
const tableReadParts = 6

// BenchmarkTableReads measures point reads of a table (issue #27): two
// workers A and B on testbroker (kfake unless RUNNEL_KAFKA_BROKERS is set),
// Pebble stores, one standby each, a table of -tableread-keys keys (default
// 10 000) filled and committed before the timer. Each path reads keys whose
// partition A is active for, -tableread-reads times (default 20 000), first
// one read at a time (latency: p50-us and p99-us, microseconds per read),
// then from -tableread-concurrency goroutines (throughput: reads/s):
//
//   - http-direct: GET /api/tables/counts/{key} on A (no hop);
//   - http-forwarded: the same on B, which forwards to A (one hop);
//   - client: client.Query (owner map cached, asks A directly);
//   - store: stores.Pebble Get of the same keys in a store of their own
//     (the floor: no HTTP, no JSON, no codec).
//
// Run with -benchtime 1x; each sub-benchmark runs its reads once:
//
//	go test -run xxx -bench TableReads -benchtime 1x ./bench/
func BenchmarkTableReads(b *testing.B) {
	brokers := testbroker.Brokers(b)
	dir := b.TempDir()
	id := testbroker.Topic(b, "reads")
	addrs := [2]string{}
	var workers [2]*runningWorker
	var counts *table.Table[string, int64]
	var events string
	for i, name := range []string{"a", "b"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addrs[i] = ln.Addr().String()
		ln.Close()
		a := app.New(id,
			app.WithGroupTimeouts(testbroker.SessionTimeout, testbroker.HeartbeatInterval, testbroker.RebalanceTimeout, testbroker.MaxWaitTime),
			app.WithCommitInterval(200*time.Millisecond),
			app.WithReplicas(1),
			app.WithLogger(benchLogger()),
			app.WithTopicPrefix(id+"-"),
			app.WithHTTPAddr(addrs[i]))
		in := app.Topic(a, "events", codec.String(), codec.String(), app.Partitions(tableReadParts))
		events = in.Name()
		c := table.New(a, "counts", codec.String(), codec.DecimalInt64())
		counts = c
		agent.New(a, "count", in, func(ctx context.Context, s *agent.Stream[string, string]) error {
			for ev := range s.Events() {
				c.Update(ev, ev.Key, func(n int64) int64 { return n + 1 })
			}
			return s.Err()
		}, agent.WritesTo(c))
		workers[i] = startWorker(b, a, brokers, dir, name)
	}
	changelog := counts.Changelog()
	testbroker.WaitTopic(b, testbroker.Client(b, brokers), events)
	cfg := testbroker.SaramaConfig(b)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	prod, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, *tableReadKeys)
	var msgs []*sarama.ProducerMessage
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%06d", i)
		msgs = append(msgs, &sarama.ProducerMessage{Topic: events, Partition: kafka.PartitionFor([]byte(keys[i]), tableReadParts),
			Key: sarama.StringEncoder(keys[i]), Value: sarama.StringEncoder("x")})
	}
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		if err := prod.SendMessages(msgs[:n]); err != nil {
			b.Fatal(err)
		}
		msgs = msgs[n:]
	}
	prod.Close()
	testbroker.WaitLag0(b, brokers, id, events)
	waitFor(b, 60*time.Second, "both workers ready, each active for some partitions", func() bool {
		a0, a1 := workers[0].w.Assignment(), workers[1].w.Assignment()
		return workers[0].w.Ready() && workers[1].w.Ready() && a0.Generation == a1.Generation &&
			len(a0.Actives[changelog]) > 0 && len(a1.Actives[changelog]) > 0 && len(a0.Actives[changelog])+len(a1.Actives[changelog]) == tableReadParts
	})
	var mine []string // keys A is active for
	for _, k := range keys {
		if slices.Contains(workers[0].w.Assignment().Actives[changelog], kafka.PartitionFor([]byte(k), tableReadParts)) {
			mine = append(mine, k)
		}
	}
	st, err := stores.OpenPebble(b.TempDir(), stores.PebbleOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	batch := &stores.Batch{Offset: stores.NoOffset}
	for _, k := range mine {
		batch.Put([]byte(k), []byte("1"))
	}
	if err := st.Apply(0, batch); err != nil {
		b.Fatal(err)
	}

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	get := func(addr string) func(k string) error {
		return func(k string) error {
			resp, err := hc.Get("http://" + addr + "/api/tables/counts/" + k)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("GET %s on %s: status %d", k, addr, resp.StatusCode)
			}
			return nil
		}
	}
	c := client.New(addrs[0], addrs[1])
	c.HTTP = hc
	paths := []struct {
		name string
		read func(k string) error
	}{
		{"http-direct", get(addrs[0])},
		{"http-forwarded", get(addrs[1])},
		{"client", func(k string) error {
			v, ok, err := c.Query(context.Background(), "counts", k)
			if err == nil && (!ok || string(v) != "1") {
				err = fmt.Errorf("client %s: %s %v", k, v, ok)
			}
			return err
		}},
		{"store", func(k string) error {
			_, ok, err := st.Get(0, []byte(k))
			if err == nil && !ok {
				err = fmt.Errorf("store %s: absent", k)
			}
			return err
		}},
	}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			n := *tableReadReads
			lat := make([]time.Duration, n)
			for i := range n {
				t0 := time.Now()
				if err := p.read(mine[i%len(mine)]); err != nil {
					b.Fatal(err)
				}
				lat[i] = time.Since(t0)
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[n/2].Nanoseconds())/1e3, "p50-us")
			b.ReportMetric(float64(lat[n*99/100].Nanoseconds())/1e3, "p99-us")
			var wg sync.WaitGroup
			errs := make(chan error, *tableReadConc)
			t0 := time.Now()
			for g := range *tableReadConc {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := g; i < n; i += *tableReadConc {
						if err := p.read(mine[i%len(mine)]); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(n)/time.Since(t0).Seconds(), "reads/s")
		})
	}
}
