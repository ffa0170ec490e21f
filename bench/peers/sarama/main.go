// Command sarama-peer is the raw Sarama loop of the side-by-side benchmarks
// (bench/sidebyside): a consumer group whose claims hand every record to an
// async producer, the ceiling of what any Sarama-based framework can reach.
// It tracks no deliveries: an offset is marked once its output is handed to
// the producer (acks=all), so a crash may lose records. Configured by the
// BENCH_* environment the harness sets; BENCH_SARAMA_SAFE=1 gives its
// producer Runnel's settings (idempotent, one request in flight, successes
// returned: the harness's sarama-safe system), BENCH_CPUPROFILE writes a
// pprof CPU profile of the run.
//
// Workloads (BENCH_WORKLOAD):
//   - stateless: BENCH_INPUT to BENCH_OUTPUT with the value upper-cased, on
//     the input record's partition;
//   - stateful: a count per key kept in memory only (no store, no restore),
//     each new count produced to <BENCH_ID>-counts-changelog as a decimal
//     (the harness creates that topic).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sarama-peer:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run() error {
	commitMS, err := strconv.Atoi(env("BENCH_COMMIT_MS", "2800"))
	if err != nil {
		return fmt.Errorf("BENCH_COMMIT_MS: %w", err)
	}
	workload := env("BENCH_WORKLOAD", "stateless")
	out := env("BENCH_OUTPUT", "output")
	if workload == "stateful" {
		out = env("BENCH_ID", "bench") + "-counts-changelog"
	} else if workload != "stateless" {
		return fmt.Errorf("BENCH_WORKLOAD %q: want stateless or stateful", workload)
	}
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V3_0_0_0
	cfg.ClientID = "sarama-peer"
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Interval = time.Duration(commitMS) * time.Millisecond
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Return.Successes = false
	cfg.Producer.Flush.Frequency = 2 * time.Millisecond
	cfg.Producer.Flush.Bytes = 256 << 10
	if os.Getenv("BENCH_SARAMA_SAFE") != "" {
		// Runnel's producer settings (internal/kafka.NewConfig): idempotent,
		// one request in flight, every success returned.
		cfg.Producer.Idempotent = true
		cfg.Net.MaxOpenRequests = 1
		cfg.Producer.Return.Successes = true
		cfg.Producer.Retry.Max = 10
	}
	brokers := strings.Split(env("BENCH_BROKERS", "localhost:9092"), ",")

	producer, err := sarama.NewAsyncProducer(brokers, cfg)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	group, err := sarama.NewConsumerGroup(brokers, env("BENCH_ID", "bench"), cfg)
	if err != nil {
		return fmt.Errorf("consumer group: %w", err)
	}
	if cfg.Producer.Return.Successes {
		go func() {
			for range producer.Successes() {
			}
		}()
	}
	if path := os.Getenv("BENCH_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	perr := make(chan error, 1)
	go func() {
		for e := range producer.Errors() {
			select {
			case perr <- e:
				stop() // a lost output record: end the run with the error
			default:
			}
		}
	}()
	h := &handler{producer: producer, out: out, stateful: workload == "stateful", counts: map[int32]map[string]int64{}}
	var runErr error
	for ctx.Err() == nil {
		if err := group.Consume(ctx, []string{env("BENCH_INPUT", "input")}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
			runErr = fmt.Errorf("consume: %w", err)
			break
		}
		select {
		case err := <-perr:
			runErr = fmt.Errorf("produce: %w", err)
		default:
		}
		if runErr != nil {
			break
		}
	}
	if err := group.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("close group: %w", err)
	}
	if err := producer.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("close producer: %w", err)
	}
	return runErr
}

// handler is the consumer-group handler; counts holds the stateful
// workload's counts per partition (each map is owned by that partition's
// ConsumeClaim goroutine; mu guards the outer map only).
type handler struct {
	producer sarama.AsyncProducer
	out      string
	stateful bool
	mu       sync.Mutex
	counts   map[int32]map[string]int64
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (h *handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	h.mu.Lock()
	counts := h.counts[claim.Partition()]
	if counts == nil {
		counts = map[string]int64{}
		h.counts[claim.Partition()] = counts
	}
	h.mu.Unlock()
	for m := range claim.Messages() {
		var v []byte
		if h.stateful {
			k := string(m.Key)
			counts[k]++
			v = strconv.AppendInt(nil, counts[k], 10)
		} else {
			v = []byte(strings.ToUpper(string(m.Value)))
		}
		h.producer.Input() <- &sarama.ProducerMessage{Topic: h.out, Partition: m.Partition,
			Key: sarama.ByteEncoder(m.Key), Value: sarama.ByteEncoder(v)}
		sess.MarkMessage(m, "")
	}
	return nil
}
