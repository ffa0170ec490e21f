#!/usr/bin/env bash
# scripts/ci-kafka.sh: run a command with a real one-node Kafka broker up, for CI.
#
#   scripts/ci-kafka.sh go test -race ./...
#
# fetches the broker jars (cached in $RUNNEL_KAFKA_HOME, default ~/.cache/runnel/kafka),
# starts a fresh node on 127.0.0.1 (RUNNEL_KAFKA_PORT chooses the port; unset, the first of
# 29092, 27092, 25092, 23092 whose ports are all free: below Linux's ephemeral range, so no
# test's client connection can hold one of them), exports
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
  local addrs="" port
  local secure=()
  [[ "${RUNNEL_KAFKA_SECURE:-0}" == 1 ]] && secure=(--secure)
  local candidates=(29092 27092 25092 23092)
  [[ -n "${RUNNEL_KAFKA_PORT:-}" ]] && candidates=("$RUNNEL_KAFKA_PORT")
  for port in "${candidates[@]}"; do
    if ! runnel_kafka_ports_free "$port"; then
      echo "ci-kafka: a port of base $port is in use; trying the next base" >&2
      continue
    fi
    # Another process can still take a port between the check and the broker's bind:
    # then the start fails and the next base is tried.
    if addrs="$("$RUNNEL_KAFKA_SCRIPT" start --nodes 1 --port "$port" "${secure[@]}")"; then
      break
    fi
    addrs=""
    "$RUNNEL_KAFKA_SCRIPT" clean || return 1
  done
  if [[ -z "$addrs" ]]; then
    local home="${RUNNEL_KAFKA_HOME:-$HOME/.cache/runnel/kafka}"
    echo "ci-kafka: broker did not start on any of ${candidates[*]}; log: $home/run/node1/kafka.log" >&2
    return 1
  fi
  export RUNNEL_KAFKA_BROKERS="$addrs"
  if ((${#secure[@]})); then
    local line
    while IFS= read -r line; do export "${line?}"; done < <("$RUNNEL_KAFKA_SCRIPT" secure-env)
  fi
  echo "ci-kafka: RUNNEL_KAFKA_BROKERS=$RUNNEL_KAFKA_BROKERS" >&2
}

# runnel_kafka_ports_free P: whether every port a one-node broker with base port P binds
# (P, the controller's P+100 and the secure listeners' P+200..P+400) can be bound on
# 127.0.0.1 now. A bind, not a connect: a client socket holding the port as its local
# port blocks the broker's listener just as much as another listener does.
runnel_kafka_ports_free() {
  command -v python3 >/dev/null || return 0 # no check: the start's own failure moves on
  python3 - "$1" <<'PY'
import socket, sys
base = int(sys.argv[1])
for p in (base, base + 100, base + 200, base + 300, base + 400):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        sys.exit(1)
    finally:
        s.close()
PY
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
