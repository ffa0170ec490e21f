"""Faust's app in Runnel's side-by-side benchmarks (bench/sidebyside).

Written from the faust-streaming documentation; configured by the BENCH_*
environment the harness sets. stateless: BENCH_INPUT to BENCH_OUTPUT with the
value upper-cased. stateful: a count per key in the RocksDB-backed table
"counts" (changelog BENCH_ID-counts-changelog, JSON keys and values).
"""
import os
import sys

import faust


def env(name, default):
    return os.environ.get(name) or default


app = faust.App(
    env("BENCH_ID", "bench"),
    broker="kafka://" + env("BENCH_BROKERS", "localhost:9092").replace(",", ";kafka://"),
    store="rocksdb://",
    datadir=env("BENCH_DATA_DIR", "./var"),
    topic_partitions=int(env("BENCH_PARTITIONS", "8")),
    topic_replication_factor=1,
    broker_commit_interval=int(env("BENCH_COMMIT_MS", "2800")) / 1000,
    consumer_auto_offset_reset="earliest",
    broker_session_timeout=10.0,
    producer_acks=-1,
    web_enabled=False,
)
source = app.topic(env("BENCH_INPUT", "input"), key_type=bytes, value_type=bytes,
                   key_serializer="raw", value_serializer="raw")
workload = env("BENCH_WORKLOAD", "stateless")

if workload == "stateless":
    output = app.topic(env("BENCH_OUTPUT", "output"), key_type=bytes, value_type=bytes,
                       key_serializer="raw", value_serializer="raw")

    @app.agent(source)
    async def transform(stream):
        async for key, value in stream.items():
            await output.send(key=key, value=value.upper())

elif workload == "stateful":
    counts = app.Table("counts", default=int, partitions=int(env("BENCH_PARTITIONS", "8")))

    @app.agent(source)
    async def count(stream):
        async for key, _ in stream.items():
            k = key.decode()
            counts[k] += 1

else:
    sys.exit(f"BENCH_WORKLOAD {workload!r}: want stateless or stateful")

if __name__ == "__main__":
    app.main()
