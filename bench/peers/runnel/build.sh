#!/usr/bin/env bash
# Builds Runnel's benchmark app into $1 (a directory) as runnel-peer.
set -euo pipefail
out="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../../.."
go build -o "$out/runnel-peer" ./bench/peers/runnel
