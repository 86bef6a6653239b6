#!/usr/bin/env python3
"""Two builds' routing sweeps side by side (an A/B on one machine):
per variant (split, fused, cluster, and the best of the three), the
geometric mean of B/A over the points both have, by policy family
(DeepSeek policies or the others) and range of T. Each side may be
several sweeps of the same build (interleaved repeats); a point keeps the
minimum of each variant over them.

  scripts/compare_routing_sweeps.py --a A1.json [A2.json ...] --b B1.json [B2.json ...]

Sweep files as `unimoe-bench --routing-sweep --json` writes them (.json or
.json.gz).
"""
import argparse
import gzip
import json
import math

VARIANTS = ("split", "fused", "cluster")
T_RANGES = ((1, 1), (2, 4), (5, 16), (17, 64), (65, 256), (257, 1 << 30))
DEEPSEEK = ("DeepSeekV3", "MiniMax2")


def load(paths):
    """{(policy, E, K, T): {variant: min us}} over the files."""
    points = {}
    for path in paths:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            for p in json.load(f)["points"]:
                key = (p["policy"], p["E"], p["K"], p["T"])
                # A variant that cannot serve the point (fused beyond its
                # limits) has no time.
                times = {v: p[v + "_us"] for v in VARIANTS if p.get(v + "_us") is not None}
                times["best"] = min(times.values())
                old = points.get(key, {})
                points[key] = {v: min(old.get(v, t), t) for v, t in times.items()}
    return points


def t_range(t):
    for lo, hi in T_RANGES:
        if lo <= t <= hi:
            return (lo, hi)
    raise ValueError(f"T={t}")


def range_name(r):
    lo, hi = r
    return f"T={lo}" if lo == hi else (f"T>={lo}" if hi >= 1 << 30 else f"T={lo}-{hi}")


def compare(a, b):
    common = sorted(set(a) & set(b))
    groups = {}
    for key in common:
        family = "deepseek" if key[0] in DEEPSEEK else "other"
        for v in VARIANTS + ("best",):
            if v in a[key] and v in b[key]:
                groups.setdefault((v, family, t_range(key[3])), []).append(b[key][v] / a[key][v])
    ranges = sorted({r for (_, _, r) in groups})
    lines = [f"{len(common)} common points; geometric mean of B/A (below 1: B faster)",
             f"{'variant':<9}{'family':<10}" + "".join(f"{range_name(r):>11}" for r in ranges)]
    for v in VARIANTS + ("best",):
        for family in ("deepseek", "other"):
            cells = []
            for r in ranges:
                xs = groups.get((v, family, r))
                cells.append(f"{math.exp(sum(map(math.log, xs)) / len(xs)):>11.3f}" if xs else f"{'-':>11}")
            lines.append(f"{v:<9}{family:<10}" + "".join(cells))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", nargs="+", required=True, help="sweeps of build A (the base)")
    ap.add_argument("--b", nargs="+", required=True, help="sweeps of build B")
    args = ap.parse_args()
    print(compare(load(args.a), load(args.b)))


if __name__ == "__main__":
    main()
