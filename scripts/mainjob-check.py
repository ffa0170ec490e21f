#!/usr/bin/env python3
"""Compare the main job's tables (dev --dump all --json on stdin) with counts
made here from the input file, independently of Runnel. Exit 1 on any
difference; a count below the independent one is reported as LOST."""
import gzip, json, sys
from collections import Counter

path = sys.argv[1]
got = json.load(sys.stdin)
actor, lines, dirs = Counter(), Counter(), Counter()
with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
    for line in f:
        if not line.strip():
            continue
        e = json.loads(line)
        actor[e["actor"]] += 1
        lines[e["actor"]] += e["added"] + e["deleted"]
        for d in e["dirs"]:
            dirs[d] += 1
want = {"commits-per-actor": actor, "lines-per-actor": lines, "events-per-dir": dirs}
bad = 0
for name, exp in want.items():
    tab = got.get(name, {})
    lost = [k for k in exp if int(tab.get(k, 0)) < exp[k]]
    over = [k for k in exp if int(tab.get(k, 0)) > exp[k]]
    extra = [k for k in tab if k not in exp]
    if lost or over or extra:
        bad += 1
        print(f"{name}: {len(lost)} keys LOST (below exact), {len(over)} over, {len(extra)} unexpected;"
              f" e.g. {[(k, tab.get(k), exp[k]) for k in (lost + over)[:3]]}")
    else:
        print(f"{name}: {len(exp)} keys exact")
sys.exit(1 if bad else 0)
