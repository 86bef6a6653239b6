#!/usr/bin/env python3
"""Which backend wins where: a table from unimoe-bench --autotune JSON.

For every (preset, T) of the autotune runs given: the best time of each
backend (mma, stream, cutlass, with the tactic that got it), the winner,
the tuned layer's time measured after tuning, how far it sits from the best
single backend (target: within 3%), and its time over the floor. With
--rule BENCH.json (a plain unimoe-bench run, no tuning cache), the rule's
time at the same points and both geometric means of time/floor.

  scripts/autotune_table.py AUTOTUNE.json [AUTOTUNE2.json ...] [--rule RULE.json]
"""
import argparse
import json
import math
import re
import sys

BACKENDS = ("mma", "stream", "cutlass")
TIMED = re.compile(r"^timed path=(\w+) gemm1=(\S+) gemm2=(\S+) sm90=(\S+) time_us=([0-9.eE+-]+)")


def tactic(path, g1, g2, sm90):
    if path == "cutlass":
        return sm90
    if path == "stream":
        return g1
    return g1 if g1 == g2 else f"{g1}/{g2}"


def candidates(point):
    """(backend, tactic, time_us) for every timed candidate of a point."""
    out = []
    for line in point.get("tuning_log", []):
        m = TIMED.match(line.strip())
        if m:
            path, g1, g2, sm90, t = m.groups()
            out.append((path, tactic(path, g1, g2, sm90), float(t)))
    return out


def load_points(paths):
    points = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        for p in doc.get("points", []):
            if p.get("tuning_log"):
                points[(p["preset"], p["T"])] = p
    return points


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def table(points, rule=None):
    lines = []
    head = f"{'preset':<16}{'T':>6}"
    head += "".join(f"{b + ' (us, tactic)':>30}" for b in BACKENDS)
    head += f"{'winner':>9}{'tuned_us':>10}{'vs_best':>8}{'t/floor':>8}"
    if rule is not None:
        head += f"{'rule_us':>9}{'rule/tuned':>11}"
    lines.append(head)
    off = []
    for key in sorted(points, key=lambda k: (k[0], k[1])):
        p = points[key]
        cands = candidates(p)
        best = {}
        for b, tac, t in cands:
            if b not in best or t < best[b][1]:
                best[b] = (tac, t)
        best_single = min(t for _, t in best.values())
        winner = min(best, key=lambda b: best[b][1])
        tuned = p["time_us"]
        ratio = tuned / best_single
        if ratio > 1.03:
            off.append(f"{key[0]} T={key[1]}: tuned {tuned:.1f} us is {100 * (ratio - 1):.1f}% "
                       f"over the best single backend ({best_single:.1f})")
        row = f"{key[0]:<16}{key[1]:>6}"
        for b in BACKENDS:
            cell = f"{best[b][1]:.1f} {best[b][0]}" if b in best else "-"
            row += f"{cell:>30}"
        row += f"{winner:>9}{tuned:>10.1f}{ratio:>8.3f}{p['time_over_floor']:>8.2f}"
        if rule is not None:
            r = rule.get(key)
            row += f"{r['time_us']:>9.1f}{r['time_us'] / tuned:>11.3f}" if r else f"{'-':>9}{'-':>11}"
        lines.append(row)
    lines.append("")
    wins = {}
    for key, p in points.items():
        best = min(candidates(p), key=lambda c: c[2])
        wins.setdefault(best[0], []).append(f"{key[0]}@{key[1]}")
    for b in BACKENDS:
        lines.append(f"{b} wins {len(wins.get(b, []))} points: {' '.join(sorted(wins.get(b, [])))}")
    lines.append(f"tuned layer within 3% of the best single backend at "
                 f"{len(points) - len(off)} of {len(points)} points")
    lines.extend("  " + o for o in off)
    lines.append(f"tuned layer: geometric mean of time/floor over {len(points)} points: "
                 f"{geomean(p['time_over_floor'] for p in points.values()):.3f}")
    if rule is not None:
        common = [k for k in points if k in rule]
        lines.append(f"rule (no tuning) at the same {len(common)} points: geometric mean of "
                     f"time/floor {geomean(rule[k]['time_over_floor'] for k in common):.3f}")
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("autotune", nargs="+", help="unimoe-bench --autotune JSON files")
    ap.add_argument("--rule", help="unimoe-bench JSON of the same points without tuning")
    args = ap.parse_args(argv)
    points = load_points(args.autotune)
    if not points:
        print("no tuned points (with a tuning_log) in " + ", ".join(args.autotune), file=sys.stderr)
        return 1
    rule = None
    if args.rule:
        with open(args.rule) as f:
            rule = {(p["preset"], p["T"]): p for p in json.load(f)["points"]}
    print(table(points, rule))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
