package replay

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/runnel-dev/runnel/agent"
	"github.com/runnel-dev/runnel/codec"
	"github.com/runnel-dev/runnel/internal/testbroker"
	"github.com/runnel-dev/runnel/internal/topicdecl"
)

// day0 is the start of the test's calendar day.
var day0 = time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)

// fixture is a broker with a client, an admin and a producer.
type fixture struct {
	t       *testing.T
	brokers []string
	client  sarama.Client
	admin   sarama.ClusterAdmin
	prod    sarama.SyncProducer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	brokers := testbroker.Brokers(t)
	cfg := testbroker.SaramaConfig(t)
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	admin, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close() })
	prod, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prod.Close() })
	return &fixture{t: t, brokers: brokers, client: client, admin: admin, prod: prod}
}

// topic creates a topic with n partitions, no retention limit and the
// given configs.
func (f *fixture) topic(base string, n int32, configs map[string]string) string {
	f.t.Helper()
	name := testbroker.Topic(f.t, base)
	// The tests produce records with timestamps in the past: keep them
	// (Kafka's retention would delete closed segments by timestamp; scripts/kafka
	// rolls segments every second).
	cfg := map[string]string{"retention.ms": "-1"}
	for k, v := range configs {
		cfg[k] = v
	}
	testbroker.CreateTopic(f.t, f.brokers, name, n, cfg)
	f.t.Cleanup(func() { _ = f.admin.DeleteTopic(name) })
	testbroker.WaitTopic(f.t, f.client, name)
	return name
}

// produce writes one record to partition p with timestamp ts and returns its offset.
func (f *fixture) produce(topic string, p int32, key, value string, ts time.Time) int64 {
	f.t.Helper()
	_, off, err := f.prod.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: p, Key: sarama.StringEncoder(key),
		Value: sarama.StringEncoder(value), Timestamp: ts})
	if err != nil {
		f.t.Fatal(err)
	}
	return off
}

// committed returns group's committed offsets of topic's partitions (absent: none).
func (f *fixture) committed(group, topic string, n int32) map[int32]int64 {
	f.t.Helper()
	var ps []int32
	for p := int32(0); p < n; p++ {
		ps = append(ps, p)
	}
	out := map[int32]int64{}
	resp, err := f.admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: ps})
	if errors.Is(err, sarama.ErrGroupIDNotFound) {
		return out // Kafka 4: a group that never committed does not exist
	}
	if err != nil {
		f.t.Fatal(err)
	}
	for _, p := range ps {
		if b := resp.GetBlock(topic, p); b != nil && b.Offset >= 0 {
			out[p] = b.Offset
		}
	}
	return out
}

// host is the minimal agent.Host of the tests.
type host struct{ agents []agent.Def }

func (h *host) AppID() string                { return "replay-test" }
func (h *host) RegisterTopic(agent.TopicDef) {}
func (h *host) RegisterAgent(r agent.Def)    { h.agents = append(h.agents, r) }

// newTopic declares a topic on h as app.Topic declares one on an App (replay
// cannot import app, which imports replay).
func newTopic[K, V any](h agent.Host, name string, kc codec.Codec[K], vc codec.Codec[V], partitions int32) *agent.Topic[K, V] {
	t := new(agent.Topic[K, V])
	topicdecl.Init(t, name, partitions, kc, vc)
	h.RegisterTopic(t)
	return t
}

// probe is an agent under replay: it applies the "audit" effect (recording
// each record's partition and offset), calls a "notify" effect that must
// stay skipped, and sends every record to an output topic (a sink that a
// replay suppresses).
type probe struct {
	mu      sync.Mutex
	applied map[string]bool // "p/offset" → true
	order   map[int32][]int64
	notify  int
	// failAt makes the audit effect fail at this partition/offset once.
	failAt   string
	block    bool // the audit effect waits for ctx
	runner   agent.Def
	audit    *agent.Effect
	notifyFx *agent.Effect
}

func newProbe(topic string, partitions int32, opts ...agent.Option) *probe {
	pr := &probe{applied: map[string]bool{}, order: map[int32][]int64{}}
	h := &host{}
	src := newTopic(h, topic, codec.String(), codec.String(), partitions)
	out := newTopic(h, topic+"-out", codec.String(), codec.String(), partitions)
	pr.audit = agent.NewEffect("audit")
	pr.notifyFx = agent.NewEffect("notify")
	pr.runner = agent.New(h, "probe", src, func(ctx context.Context, s *agent.Stream[string, string]) error {
		for ev := range s.Events() {
			if _, err := pr.notifyFx.Apply(ev, func() (bool, error) {
				pr.mu.Lock()
				pr.notify++
				pr.mu.Unlock()
				return true, nil
			}); err != nil {
				return err
			}
			out.Send(ev, ev.Key, ev.Value)
			_, err := pr.audit.Apply(ev, func() (bool, error) {
				if pr.block {
					<-ctx.Done()
					return false, ctx.Err()
				}
				k := fmt.Sprintf("%d/%d", ev.Partition(), ev.Offset())
				pr.mu.Lock()
				defer pr.mu.Unlock()
				if k == pr.failAt {
					pr.failAt = ""
					return false, errors.New("database unavailable")
				}
				if pr.applied[k] {
					return false, nil
				}
				pr.applied[k] = true
				pr.order[ev.Partition()] = append(pr.order[ev.Partition()], ev.Offset())
				return true, nil
			})
			if err != nil {
				return err
			}
		}
		return s.Err()
	}, append([]agent.Option{agent.OnError(agent.StopWorker), agent.SendsTo(out)}, opts...)...)
	return pr
}

// offsets returns the audited offsets of partition p, sorted.
func (pr *probe) offsets(p int32) []int64 {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	out := append([]int64(nil), pr.order[p]...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func span(a, b int64) []int64 {
	var out []int64
	for i := a; i < b; i++ {
		out = append(out, i)
	}
	return out
}
