#!/usr/bin/env python3
"""Two unimoe-bench runs side by side: per (preset, T, backend) point the
time of each, their ratio, each stage's difference, and what served each
(the plan). For A/B measurements (an environment variable on and off, a
kernel change), which should be measured on one machine, one right after
the other: on two machines of the same model the same plan reads 2-5%
apart.

  scripts/compare_runs.py A.json B.json [--stages]
"""
import argparse
import json
import math
import sys


def load(path):
    with open(path) as f:
        return {(p["preset"], p["T"], p.get("backend", "auto")): p for p in json.load(f)["points"]}


def compare(a, b, stages=False):
    common = sorted(set(a) & set(b), key=lambda k: (k[0], k[1], k[2]))
    lines = [f"{'preset':<16}{'T':>6} {'backend':<8}{'A_us':>10}{'B_us':>10}{'B/A':>8}  plan (A -> B where it differs)"]
    ratios = []
    for k in common:
        pa, pb = a[k], b[k]
        r = pb["time_us"] / pa["time_us"]
        ratios.append(r)
        plan = pa.get("plan", "")
        if pb.get("plan", "") != plan:
            plan = f"{plan} -> {pb.get('plan', '')}"
        lines.append(f"{k[0]:<16}{k[1]:>6} {k[2]:<8}{pa['time_us']:>10.1f}{pb['time_us']:>10.1f}{r:>8.3f}  {plan}")
        if stages:
            sa, sb = pa.get("stages_us", {}), pb.get("stages_us", {})
            diffs = " ".join(f"{s} {sb[s] - sa[s]:+.1f}" for s in sa if s in sb)
            lines.append(f"{'':<31}stage differences B-A (us): {diffs}")
    if ratios:
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        lines.append(f"{len(ratios)} common points: geometric mean of B/A {g:.3f}, "
                     f"best {min(ratios):.3f}, worst {max(ratios):.3f}")
    only = sorted((set(a) ^ set(b)), key=lambda k: (k[0], k[1], k[2]))
    if only:
        lines.append("in one run only: " + ", ".join(f"{k[0]} T={k[1]} {k[2]}" for k in only))
    return "\n".join(lines)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--stages", action="store_true", help="also each stage's difference")
    args = ap.parse_args(argv)
    a, b = load(args.a), load(args.b)
    if not set(a) & set(b):
        print("the two runs share no point", file=sys.stderr)
        return 1
    print(compare(a, b, args.stages))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
