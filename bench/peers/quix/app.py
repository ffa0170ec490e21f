"""Quix Streams' app in Runnel's side-by-side benchmarks (bench/sidebyside).

Written from the Quix Streams documentation; configured by the BENCH_*
environment the harness sets. stateless: BENCH_INPUT to BENCH_OUTPUT with the
value upper-cased. stateful: a count per key in the default RocksDB state
store (changelog changelog__BENCH_ID--BENCH_INPUT--default; the key is the
message key, "|" and the JSON state key; JSON values).
"""
import os
import sys

from quixstreams import Application


def env(name, default):
    return os.environ.get(name) or default


app = Application(
    broker_address=env("BENCH_BROKERS", "localhost:9092"),
    consumer_group=env("BENCH_ID", "bench"),
    auto_offset_reset="earliest",
    commit_interval=int(env("BENCH_COMMIT_MS", "2800")) / 1000,
    state_dir=env("BENCH_DATA_DIR", "./var"),
    consumer_extra_config={"session.timeout.ms": 10000},
    producer_extra_config={"acks": "all"},
    loglevel=env("BENCH_LOG_LEVEL", "warn").upper().replace("WARN", "WARNING"),
)
source = app.topic(env("BENCH_INPUT", "input"), key_deserializer="str", value_deserializer="str")
sdf = app.dataframe(source)
workload = env("BENCH_WORKLOAD", "stateless")

if workload == "stateless":
    output = app.topic(env("BENCH_OUTPUT", "output"), key_serializer="str", value_serializer="str")
    sdf = sdf.apply(lambda value: value.upper())
    sdf.to_topic(output)
elif workload == "stateful":
    def count(value, state):
        n = state.get("count", 0) + 1
        state.set("count", n)
        return n

    sdf = sdf.apply(count, stateful=True)
else:
    sys.exit(f"BENCH_WORKLOAD {workload!r}: want stateless or stateful")

if __name__ == "__main__":
    app.run()
