#!/usr/bin/env bash
# scripts/chaos3.sh: the three-broker tier of the chaos suite (docs/chaos.md): starts a
# three-node Kafka 4.4 cluster (scripts/kafka start --nodes 3: replication factor 3,
# min.insync.replicas=2), runs the broker schedules at the guarantees given, with live input
# to 3 workers of the README's app, and stops and deletes the cluster on exit.
#
#   scripts/chaos3.sh [SCHEDULES [GUARANTEES]] [harness flags]
#
#   SCHEDULES   comma-separated: rolling, leaderkill, sigstop, quota, all; default all
#   GUARANTEES  comma-separated: at_least_once, exactly_once; default both
#
#   scripts/chaos3.sh rolling                          what CI runs: the rolling restart, twice, both guarantees
#   scripts/chaos3.sh leaderkill exactly_once -seed 7
#
# One run per schedule and guarantee, one after the other on the same cluster (each run has
# topics and a group of its own). Flags go to every run of the harness (go run ./t/chaos
# -brokers3). The cluster's node dirs are $RUNNEL_KAFKA_RUN (default
# $RUNNEL_KAFKA_HOME/run-chaos3, beside the one-node cluster of scripts/ci-kafka.sh, which
# it leaves alone), its ports RUNNEL_KAFKA_PORT (default 21092: clients 21092-21094,
# controllers 21192-21194). The exit status is the worst of the runs': 0 every run passed,
# 1 a run failed its guarantee, 2 a run could not be carried out.
set -euo pipefail
cd "$(dirname "$0")/.."
schedules=all
guarantees=at_least_once,exactly_once
if (($#)) && [[ "$1" != -* ]]; then schedules=$1; shift; fi
if (($#)) && [[ "$1" != -* ]]; then guarantees=$1; shift; fi
export RUNNEL_KAFKA_HOME="${RUNNEL_KAFKA_HOME:-$HOME/.cache/runnel/kafka}"
export RUNNEL_KAFKA_RUN="${RUNNEL_KAFKA_RUN:-$RUNNEL_KAFKA_HOME/run-chaos3}"
port="${RUNNEL_KAFKA_PORT:-21092}"

# A built binary, not go run: go run turns every failing exit status into 1.
bin=tmp/chaos3-harness
mkdir -p tmp
go build -o "$bin" ./t/chaos
scripts/kafka fetch
scripts/kafka clean # a stale cluster from an interrupted run would hold the ports
trap 'scripts/kafka clean' EXIT
brokers="$(scripts/kafka start --nodes 3 --port "$port")"
echo "chaos3: three-node cluster at $brokers (node dirs in $RUNNEL_KAFKA_RUN)" >&2

worst=0
summary=()
IFS=, read -ra scheds <<<"$schedules"
IFS=, read -ra guars <<<"$guarantees"
for s in "${scheds[@]}"; do
  for g in "${guars[@]}"; do
    echo "chaos3: === schedule $s, $g" >&2
    t0=$(date +%s)
    rc=0
    "$bin" -brokers3 -broker-schedule "$s" -guarantee "$g" -brokers "$brokers" -kafka-home "$RUNNEL_KAFKA_HOME" "$@" || rc=$?
    summary+=("$s $g: exit $rc, $(($(date +%s) - t0)) s")
    ((rc > worst)) && worst=$rc
  done
done
printf 'chaos3: %s\n' "${summary[@]}" >&2
exit "$worst"
