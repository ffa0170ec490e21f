#!/usr/bin/env bash
# Runs the README's main job (the change-audit example on the real data, two
# workers, embedded broker) N times with two busy processes beside it, and
# compares every table with counts made independently from the input
# (scripts/mainjob-check.py). Any difference fails; a count below exact is lost
# data. Usage: scripts/mainjob-check.sh [N=30] [input]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-30}
input=${2:-examples/changeaudit/testdata/git-history.jsonl.gz}
bin=$(mktemp -d)/changeaudit
go build -o "$bin" ./examples/changeaudit
busy=()
for _ in 1 2; do (while :; do :; done) & busy+=($!); done
trap 'kill "${busy[@]}" 2>/dev/null || true' EXIT
fails=0
for i in $(seq 1 "$n"); do
  start=$(date +%s.%N)
  if ! "$bin" dev --input "$input" --workers 2 --dump all --json >"$bin.out" 2>"$bin.log"; then
    echo "run $i: dev failed"; tail -5 "$bin.log"; fails=$((fails + 1)); continue
  fi
  took=$(echo "$(date +%s.%N) - $start" | bc)
  if out=$(python3 scripts/mainjob-check.py "$input" <"$bin.out"); then
    echo "run $i: exact (${took} s)"
  else
    echo "run $i: WRONG (${took} s)"; echo "$out"; fails=$((fails + 1))
    cp "$bin.log" "/tmp/mainjob-fail-$i.log"
  fi
done
echo "$((n - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
