#!/usr/bin/env bash
# Runs the README's main job (the change-audit example on the real data, two
# workers, embedded broker) N times with BUSY busy processes beside it (default
# 2), and compares every table with counts made independently from the input
# (scripts/mainjob-check.py). A count below exact is lost data and fails; under
# at-least-once (RUNNEL_GUARANTEE unset or at_least_once) a table may count
# over by up to MAX_OVER percent of its records (default 0: exact), under
# exactly_once never.
# Usage: [BUSY=3] [RUNNEL_GUARANTEE=exactly_once] [MAX_OVER=1] scripts/mainjob-check.sh [N=30] [input]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-30}
input=${2:-examples/changeaudit/testdata/git-history.jsonl.gz}
bin=$(mktemp -d)/changeaudit
go build -o "$bin" ./examples/changeaudit
busy=()
for _ in $(seq 1 "${BUSY:-2}"); do (while :; do :; done) & busy+=($!); done
max_over=${MAX_OVER:-0}
[ "${RUNNEL_GUARANTEE:-at_least_once}" = exactly_once ] && max_over=0
trap 'kill "${busy[@]}" 2>/dev/null || true' EXIT
fails=0
for i in $(seq 1 "$n"); do
  start=$(date +%s.%N)
  if ! "$bin" dev --input "$input" --workers 2 --dump all --json >"$bin.out" 2>"$bin.log"; then
    echo "run $i: dev failed"; tail -5 "$bin.log"; fails=$((fails + 1)); continue
  fi
  took=$(echo "$(date +%s.%N) - $start" | bc)
  # Member expulsions (issue #26): a commit or session refused because the
  # member is no longer in the group.
  expelled=$(grep -c "member is not known\|group session ended with an error" "$bin.log" || true)
  if out=$(python3 scripts/mainjob-check.py "$input" "$max_over" <"$bin.out"); then
    echo "run $i: ok (${took} s, ${expelled} expulsion lines): $(echo "$out" | tr '\n' ' ')"
  else
    echo "run $i: WRONG (${took} s, ${expelled} expulsion lines)"; echo "$out"; fails=$((fails + 1))
    cp "$bin.log" "/tmp/mainjob-fail-$i.log"
  fi
done
echo "$((n - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
