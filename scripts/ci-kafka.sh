#!/usr/bin/env bash
# scripts/ci-kafka.sh: run a command with a real one-node Kafka broker up, for CI.
#
#   scripts/ci-kafka.sh go test -race ./...
#
# fetches the broker jars (cached in $RUNNEL_KAFKA_HOME, default ~/.cache/runnel/kafka),
# starts a fresh node on 127.0.0.1:39092 (RUNNEL_KAFKA_PORT to change it), exports
# RUNNEL_KAFKA_BROKERS so internal/testbroker selects the real tier (with
# RUNNEL_KAFKA_SECURE=1 the node also gets SASL and TLS listeners, and the variables of
# `scripts/kafka secure-env` are exported for the TLS/SASL tests), runs the command, and
# stops and cleans the broker on exit, also when the command fails or the script is
# interrupted. The exit status is the command's.
#
# It can also be sourced, e.g. from .ci/run:
#
#   source scripts/ci-kafka.sh
#   runnel_kafka_up        # fetch, start, export RUNNEL_KAFKA_BROKERS, trap stop on EXIT
#   go test ./...          # runs against real Kafka
#
# runnel_kafka_up replaces any EXIT trap the caller had set.

runnel_kafka_up() {
  local root
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  RUNNEL_KAFKA_SCRIPT="$root/scripts/kafka"
  "$RUNNEL_KAFKA_SCRIPT" fetch || return 1
  # A stale cluster from an interrupted earlier run would keep its ports and topics.
  "$RUNNEL_KAFKA_SCRIPT" clean || return 1
  trap runnel_kafka_down EXIT
  local addrs
  local secure=()
  [[ "${RUNNEL_KAFKA_SECURE:-0}" == 1 ]] && secure=(--secure)
  addrs="$("$RUNNEL_KAFKA_SCRIPT" start --nodes 1 --port "${RUNNEL_KAFKA_PORT:-39092}" "${secure[@]}")" || {
    local home="${RUNNEL_KAFKA_HOME:-$HOME/.cache/runnel/kafka}"
    echo "ci-kafka: broker did not start; log: $home/run/node1/kafka.log" >&2
    return 1
  }
  export RUNNEL_KAFKA_BROKERS="$addrs"
  if ((${#secure[@]})); then
    local line
    while IFS= read -r line; do export "${line?}"; done < <("$RUNNEL_KAFKA_SCRIPT" secure-env)
  fi
  echo "ci-kafka: RUNNEL_KAFKA_BROKERS=$RUNNEL_KAFKA_BROKERS" >&2
}

runnel_kafka_down() {
  [[ -n "${RUNNEL_KAFKA_SCRIPT:-}" ]] || return 0
  "$RUNNEL_KAFKA_SCRIPT" clean || true
  unset RUNNEL_KAFKA_BROKERS
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  if (($# == 0)); then
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
  fi
  trap 'exit 130' INT TERM
  runnel_kafka_up || exit 1
  "$@"
  exit $?
fi
