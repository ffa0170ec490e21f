#!/usr/bin/env bash
# Builds Goka's benchmark app (its own module, github.com/lovoo/goka v1.1.13)
# into $1 (a directory) as goka-peer.
set -euo pipefail
out="$(cd "$1" && pwd)"
cd "$(dirname "$0")"
GOWORK=off go build -o "$out/goka-peer" .
