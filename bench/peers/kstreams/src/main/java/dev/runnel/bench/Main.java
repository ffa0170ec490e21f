package dev.runnel.bench;

import java.time.Duration;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * Kafka Streams' app in Runnel's side-by-side benchmarks (bench/sidebyside),
 * written from the Kafka Streams documentation. Configured by the BENCH_*
 * environment the harness sets.
 *
 * <p>stateless: BENCH_INPUT to BENCH_OUTPUT with the value upper-cased.
 * stateful: groupByKey().count() into the RocksDB store "counts" (changelog
 * BENCH_ID-counts-changelog, 8-byte big-endian longs).
 */
public final class Main {
  private Main() {}

  private static String env(String name, String def) {
    String v = System.getenv(name);
    return v == null || v.isEmpty() ? def : v;
  }

  public static void main(String[] args) throws InterruptedException {
    Properties p = new Properties();
    p.put(StreamsConfig.APPLICATION_ID_CONFIG, env("BENCH_ID", "bench"));
    p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, env("BENCH_BROKERS", "localhost:9092"));
    p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(env("BENCH_THREADS", "1")));
    // Matched to Runnel's commit interval (Kafka Streams' own default is 30 s under at-least-once).
    p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(env("BENCH_COMMIT_MS", "30000")));
    p.put(StreamsConfig.STATE_DIR_CONFIG, env("BENCH_DATA_DIR", "./var"));
    // at_least_once (Kafka Streams' default) or exactly_once_v2.
    p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, env("BENCH_GUARANTEE", "at_least_once"));
    p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
    p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
    // The same group session timeout as the Go systems (Kafka's consumer default is 45 s).
    p.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 10_000);
    p.put(StreamsConfig.producerPrefix(ProducerConfig.ACKS_CONFIG), "all");

    String input = env("BENCH_INPUT", "input");
    StreamsBuilder b = new StreamsBuilder();
    KStream<String, String> in = b.stream(input);
    String workload = env("BENCH_WORKLOAD", "stateless");
    switch (workload) {
      case "stateless" -> in.mapValues(v -> v.toUpperCase(Locale.ROOT)).to(env("BENCH_OUTPUT", "output"));
      case "stateful" -> in.groupByKey().count(
          Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts")
              .withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()));
      default -> throw new IllegalArgumentException("BENCH_WORKLOAD " + workload + ": want stateless or stateful");
    }

    KafkaStreams streams = new KafkaStreams(b.build(), p);
    CountDownLatch done = new CountDownLatch(1);
    streams.setUncaughtExceptionHandler(e -> {
      e.printStackTrace();
      return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
    });
    streams.setStateListener((now, before) -> {
      if (now == KafkaStreams.State.ERROR) {
        new Thread(() -> System.exit(1)).start(); // the harness sees the exit and reports the log
      }
    });
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      // SIGTERM: leave the group so the partitions move at once (a clean hand-over).
      streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
          .withTimeout(Duration.ofSeconds(60)));
      done.countDown();
    }));
    streams.start();
    done.await();
  }
}
