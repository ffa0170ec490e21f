package procs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/runnel-dev/runnel/client"
	"github.com/runnel-dev/runnel/internal/embedded"
	"github.com/runnel-dev/runnel/internal/kafka"
	"github.com/runnel-dev/runnel/internal/testbroker"
)

// retryable are the reasons of a refusal a reader may get while a worker
// restarts or dies: the key may exist, and the answer says so.
var retryable = []string{"restoring", "rebalancing", "not-owner", "stale-beyond-bound"}

// readStats counts the answers of the readers of TestServeDuringRestarts.
type readStats struct {
	mu sync.Mutex
	// ok counts right values; refused the typed retryable refusals by
	// reader and reason; unreachable the requests to a worker that was
	// down (no answer at all).
	ok          map[string]int
	refused     map[string]int
	unreachable map[string]int
	// bad holds what must never happen: a wrong value, a "not found" of
	// an existing key, an answer that is neither a value nor a typed
	// retryable refusal.
	bad []string
}

func (s *readStats) add(m map[string]int, k string) {
	s.mu.Lock()
	m[k]++
	s.mu.Unlock()
}

func (s *readStats) fail(format string, args ...any) {
	s.mu.Lock()
	if len(s.bad) < 20 {
		s.bad = append(s.bad, fmt.Sprintf(format, args...))
	} else {
		s.bad[19] = "… more"
	}
	s.mu.Unlock()
}

func (s *readStats) total(m map[string]int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// readHTTP reads key from the worker at addr with query q and checks the
// answer against want.
func (s *readStats) readHTTP(hc *http.Client, reader, addr, key, q string, want int64) {
	resp, err := hc.Get("http://" + addr + "/api/tables/counts/" + url.PathEscape(key) + q)
	if err != nil {
		s.add(s.unreachable, reader)
		return
	}
	defer resp.Body.Close()
	var a struct {
		Found  bool            `json:"found"`
		Value  json.RawMessage `json:"value"`
		Reason string          `json:"reason"`
		Role   string          `json:"role"`
		Lag    *int64          `json:"lag"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		s.fail("%s %s %s: status %d, body not JSON: %v", reader, addr, key, resp.StatusCode, err)
		return
	}
	switch {
	case resp.StatusCode == http.StatusOK && a.Found:
		if string(a.Value) != strconv.FormatInt(want, 10) {
			s.fail("%s %s %s: value %s from %s (lag %v), want %d", reader, addr, key, a.Value, a.Role, a.Lag, want)
			return
		}
		s.add(s.ok, reader)
	case resp.StatusCode == http.StatusNotFound && a.Reason == "":
		s.fail("%s %s %s: not found from %s (lag %v); it holds %d", reader, addr, key, a.Role, a.Lag, want)
	case (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusBadGateway) &&
		slices.Contains(retryable, a.Reason) && resp.Header.Get("Retry-After") != "":
		s.add(s.refused, reader+" "+a.Reason)
	default:
		s.fail("%s %s %s: status %d reason %q: neither a value nor a typed retryable refusal", reader, addr, key, resp.StatusCode, a.Reason)
	}
}

// readClient reads key through the Go client and checks the answer.
func (s *readStats) readClient(ctx context.Context, c *client.Client, reader, key string, want int64, opts ...client.QueryOption) {
	v, found, err := c.Query(ctx, "counts", key, opts...)
	var re *client.RetryableError
	switch {
	case errors.As(err, &re) && slices.Contains(retryable, re.Reason):
		s.add(s.refused, reader+" "+re.Reason)
	case err != nil && ctx.Err() != nil:
	case err != nil:
		s.fail("%s %s: %v: neither a value nor a typed retryable error", reader, key, err)
	case !found:
		s.fail("%s %s: not found; it holds %d", reader, key, want)
	case string(v) != strconv.FormatInt(want, 10):
		s.fail("%s %s: value %s, want %d", reader, key, v, want)
	default:
		s.add(s.ok, reader)
	}
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeDuringRestarts (issue #27, measured): three worker processes
// (one standby per partition) hold a table of 300 keys with known counts.
// Four readers read every key over and over (HTTP to a worker in turn, HTTP
// with consistency=any&maxLag=0, the Go client, the Go client with
// MaxLag(0)) while (a) the three workers restart one after the other
// (SIGTERM, restart on the same data dir and address, settle) and (b) one
// is killed with SIGKILL and the others take its partitions over, then it
// comes back. Every answer must be the key's count or a typed retryable
// refusal (restoring, rebalancing, not-owner, stale-beyond-bound with
// Retry-After; a client RetryableError): never a wrong value, never a "not
// found", never an untyped error. A request to a worker that is down gets
// no answer at all and is counted apart.
func TestServeDuringRestarts(t *testing.T) {
	start := time.Now()
	dir := t.TempDir()
	bin := filepath.Join(dir, "testapp")
	if out, err := exec.Command("go", "build", "-o", bin, "./testapp").CombinedOutput(); err != nil {
		t.Fatalf("build testapp: %v\n%s", err, out)
	}
	appID := testbroker.Topic(t, "serve")
	cl := &cluster{t: t, bin: bin, app: appID, topic: testbroker.Topic(t, "in"), changelog: appID + "-counts-changelog",
		// No compaction on kfake during the test (as TestStandbyFailoverUnderLoad).
		brokers: testbroker.BrokersWith(t, embedded.Options{CleanerBackoff: time.Hour}), root: dir,
		http: map[string]string{"a": freeAddr(t), "b": freeAddr(t), "c": freeAddr(t)}}
	addrs := []string{cl.http["a"], cl.http["b"], cl.http["c"]}
	children := []*child{cl.start("a"), cl.start("b"), cl.start("c")}
	cl.settle(children)

	// Fill: key kI counted I%7+1 times.
	const keys = 300
	want := map[string]int64{}
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	prod, err := sarama.NewSyncProducer(cl.brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []*sarama.ProducerMessage
	for i := range keys {
		k := "k" + strconv.Itoa(i)
		want[k] = int64(i%7 + 1)
		for range want[k] {
			msgs = append(msgs, &sarama.ProducerMessage{Topic: cl.topic, Partition: kafka.PartitionFor([]byte(k), 6),
				Key: sarama.StringEncoder(k), Value: sarama.StringEncoder("x")})
		}
	}
	if err := prod.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
	prod.Close()
	testbroker.WaitLag0(t, cl.brokers, appID, cl.topic)
	t.Logf("filled %d keys with %d records in %v", keys, len(msgs), time.Since(start).Round(time.Millisecond))

	st := &readStats{ok: map[string]int{}, refused: map[string]int{}, unreachable: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	hc := &http.Client{Timeout: 10 * time.Second}
	c := client.New(addrs...)
	c.HTTP = hc
	var wg sync.WaitGroup
	readers := map[string]func(i int, k string){
		"http": func(i int, k string) { st.readHTTP(hc, "http", addrs[i%3], k, "", want[k]) },
		"http-any": func(i int, k string) {
			st.readHTTP(hc, "http-any", addrs[(i+1)%3], k, "?consistency=any&maxLag=0", want[k])
		},
		"client":     func(i int, k string) { st.readClient(ctx, c, "client", k, want[k]) },
		"client-any": func(i int, k string) { st.readClient(ctx, c, "client-any", k, want[k], client.MaxLag(0)) },
	}
	for name, read := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				read(i, "k"+strconv.Itoa(i%keys))
				if name == "client" || name == "client-any" {
					time.Sleep(time.Millisecond) // leave the cores to the workers
				}
			}
		}()
	}
	phase := func(what string, do func()) {
		before := st.total(st.ok)
		began := time.Now()
		do()
		t.Logf("%s: %v, %d right values meanwhile", what, time.Since(began).Round(time.Millisecond), st.total(st.ok)-before)
		if st.total(st.ok) == before {
			t.Errorf("%s: no reader got a value", what)
		}
	}
	phase("warm", func() { time.Sleep(time.Second) })
	// (a) Rolling restart.
	for i, name := range []string{"a", "b", "c"} {
		phase("restart "+name, func() {
			children[i].stop(t)
			children[i] = cl.start(name)
			cl.settle(children)
		})
	}
	// (b) kill -9 of c, take-over by a and b, then c back.
	phase("kill -9 c, take-over", func() {
		if err := children[2].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-children[2].done
		cl.settle(children[:2])
	})
	phase("c back", func() {
		children[2] = cl.start("c")
		cl.settle(children)
	})
	cancel()
	wg.Wait()

	st.mu.Lock()
	defer st.mu.Unlock()
	var refused []string
	for k, n := range st.refused {
		refused = append(refused, fmt.Sprintf("%s=%d", k, n))
	}
	slices.Sort(refused)
	t.Logf("answers: right values %v; retryable refusals %s; unreachable %v", st.ok, strings.Join(refused, " "), st.unreachable)
	for name := range readers {
		if st.ok[name] == 0 {
			t.Errorf("reader %s got no value", name)
		}
	}
	if len(st.bad) > 0 {
		t.Errorf("%d answers broke the rule, e.g.:\n%s", len(st.bad), strings.Join(st.bad, "\n"))
	}
	t.Logf("test took %v", time.Since(start).Round(time.Millisecond))
}
