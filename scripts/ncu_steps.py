#!/usr/bin/env python3
"""ncu_steps.py - where a GPU step's time goes, from ncu's CSV of zr bench model.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        --launch-count N zr bench model --device cuda > ncu.csv
    python3 scripts/ncu_steps.py ncu.csv [--units 14]

A step of zr bench model ends with AdamW on each of its units (14 for GPT-2
124M: the embedding, 12 blocks, the head), so the AdamW launches mark the
steps. The first step (with the set-up before it) and any unfinished last step
are left out; the rest are summed by kernel name and divided by their count.
Prints a table, heaviest first, and the launches per step.
"""
import csv
import sys

UNIT = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
        "second": 1e3, "s": 1e3}


def short(name):
    name = name.split("(")[0].strip()
    for prefix in ("void ", "static "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name[:70]


def main():
    path = sys.argv[1]
    units = int(sys.argv[sys.argv.index("--units") + 1]) if "--units" in sys.argv else 14
    rows = []
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", "")) * UNIT.get(r["Metric Unit"], 1.0)
        rows.append((short(r["Kernel Name"]), v))
    adam = [i for i, (n, _) in enumerate(rows) if "adamw" in n.lower()]
    ends = [adam[k] + 1 for k in range(units - 1, len(adam), units)]
    if len(ends) < 2:
        print(f"ncu_steps: {len(rows)} launches, {len(adam)} AdamW: fewer than two whole steps")
        return 1
    lo, hi, steps = ends[0], ends[-1], len(ends) - 1
    agg = {}
    for n, v in rows[lo:hi]:
        c, t = agg.get(n, (0, 0.0))
        agg[n] = (c + 1, t + v)
    total = sum(t for _, t in agg.values()) / steps
    print(f"{steps} steps profiled (launches {lo}-{hi - 1} of {len(rows)}): "
          f"{(hi - lo) / steps:.0f} launches a step, kernels' GPU time {total:.2f} ms a step")
    print(f"{'kernel':<70} {'per step':>8} {'ms/step':>9} {'share':>6}")
    for n, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{n:<70} {c / steps:8.1f} {t / steps:9.3f} {t / steps / total:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
