#!/usr/bin/env python3
"""Compare the main job's tables (dev --dump all --json on stdin) with counts
made here from the input file, independently of Runnel. Usage:
mainjob-check.py INPUT [MAX_OVER_PERCENT=0]. Exit 1 on a count below the
independent one (LOST), an unexpected key, or a table whose counts exceed the
independent ones by more than MAX_OVER_PERCENT of its total (at-least-once
may count a record twice, never once less)."""
import gzip, json, sys
from collections import Counter

path = sys.argv[1]
max_over = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
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
    total = sum(exp.values())
    surplus = sum(int(tab.get(k, 0)) - exp[k] for k in over)
    pct = 100.0 * surplus / total if total else 0.0
    if lost or extra or pct > max_over:
        bad += 1
        print(f"{name}: {len(lost)} keys LOST (below exact), {len(over)} over (+{surplus}, {pct:.3f} %), {len(extra)} unexpected;"
              f" e.g. {[(k, tab.get(k), exp[k]) for k in (lost + over)[:3]]}")
    elif over:
        print(f"{name}: {len(exp)} keys, none below, {len(over)} over (+{surplus}, {pct:.3f} %)")
    else:
        print(f"{name}: {len(exp)} keys exact")
sys.exit(1 if bad else 0)
