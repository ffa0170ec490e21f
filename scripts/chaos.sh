#!/usr/bin/env bash
# scripts/chaos.sh: the long chaos schedule of issue #11 (docs/chaos.md).
#
#   scripts/chaos.sh kfake [flags]   on kfake, in the harness process
#   scripts/chaos.sh kafka [flags]   on a fresh one-node Kafka 4.4 (scripts/ci-kafka.sh),
#                                    with one broker stop/restart in the schedule
#
# Flags go to the harness (`go run ./t/chaos -long`) (e.g. -seed 42 -guarantee exactly_once -race).
# RUNNEL_KAFKA_HOME and RUNNEL_KAFKA_PORT choose the broker's cache dir and port, as for
# scripts/ci-kafka.sh. The exit status is the harness's: 0 pass, 1 the guarantee failed,
# 2 the run could not be carried out.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=${1:-}
shift || true
# A built binary, not go run: go run turns every failing exit status into 1.
bin=tmp/chaos-harness
mkdir -p tmp
go build -o "$bin" ./t/chaos
case "$tier" in
  kfake)
    exec "$bin" -long "$@"
    ;;
  kafka)
    export RUNNEL_KAFKA_HOME="${RUNNEL_KAFKA_HOME:-$HOME/.cache/runnel/kafka}"
    # shellcheck source=scripts/ci-kafka.sh
    source scripts/ci-kafka.sh
    runnel_kafka_up
    "$bin" -long -brokers "$RUNNEL_KAFKA_BROKERS" -kafka-home "$RUNNEL_KAFKA_HOME" "$@"
    ;;
  *)
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
