#!/usr/bin/env bash
# Builds the raw Sarama loop into $1 (a directory) as sarama-peer.
set -euo pipefail
out="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../../.."
go build -o "$out/sarama-peer" ./bench/peers/sarama
