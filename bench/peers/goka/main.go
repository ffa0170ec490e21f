// Command goka-peer is Goka's app in the side-by-side benchmarks
// (bench/sidebyside), written from Goka's public documentation. It lives in
// its own module so that Runnel's module does not depend on Goka. Configured
// by the BENCH_* environment the harness sets.
//
// Workloads (BENCH_WORKLOAD):
//   - stateless: BENCH_INPUT to BENCH_OUTPUT with the value upper-cased;
//   - stateful: a count per key in the group table (changelog
//     <BENCH_ID>-table, decimal values; local LevelDB storage).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/lovoo/goka"
	"github.com/lovoo/goka/codec"
	"github.com/lovoo/goka/storage"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "goka-peer:", err)
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
	if env("BENCH_LOG_LEVEL", "") == "debug" {
		goka.Debug(true, false)
	}
	cfg := goka.DefaultConfig()
	cfg.Version = sarama.V3_0_0_0
	cfg.Consumer.Offsets.AutoCommit.Interval = time.Duration(commitMS) * time.Millisecond
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest // Goka's default is newest; the input is loaded before
	cfg.Producer.RequiredAcks = sarama.WaitForAll      // like Runnel (Goka's default: the leader only)
	goka.ReplaceGlobalConfig(cfg)
	tm := goka.NewTopicManagerConfig()
	tm.Table.Replication = 1
	tm.Stream.Replication = 1

	brokers := strings.Split(env("BENCH_BROKERS", "localhost:9092"), ",")
	group := goka.Group(env("BENCH_ID", "bench"))
	input := goka.Stream(env("BENCH_INPUT", "input"))
	var g *goka.GroupGraph
	switch w := env("BENCH_WORKLOAD", "stateless"); w {
	case "stateless":
		output := goka.Stream(env("BENCH_OUTPUT", "output"))
		g = goka.DefineGroup(group,
			goka.Input(input, new(codec.String), func(ctx goka.Context, msg interface{}) {
				ctx.Emit(output, ctx.Key(), strings.ToUpper(msg.(string)))
			}),
			goka.Output(output, new(codec.String)),
		)
	case "stateful":
		g = goka.DefineGroup(group,
			goka.Input(input, new(codec.String), func(ctx goka.Context, msg interface{}) {
				var n int64
				if v := ctx.Value(); v != nil {
					n = v.(int64)
				}
				ctx.SetValue(n + 1)
			}),
			goka.Persist(new(codec.Int64)),
		)
	default:
		return fmt.Errorf("BENCH_WORKLOAD %q: want stateless or stateful", w)
	}
	p, err := goka.NewProcessor(brokers, g,
		goka.WithStorageBuilder(storage.DefaultBuilder(env("BENCH_DATA_DIR", "./var"))),
		goka.WithTopicManagerBuilder(goka.TopicManagerBuilderWithTopicManagerConfig(tm)),
		goka.WithHasher(newMurmur2), // the input is partitioned by Kafka's default partitioner
	)
	if err != nil {
		return fmt.Errorf("new processor: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := p.Run(ctx); err != nil {
		return fmt.Errorf("processor: %w", err)
	}
	return nil
}
