#!/usr/bin/env python3
"""Reads `unimoe-bench --ep N` results (docs/expert-parallel.md).

    scripts/analyze_ep.py EP.json [EP.json ...]

Each file holds every rank's rows of one run (one group size, one routing
distribution). A call is as slow as its slowest rank, so each point
(preset, T, group size, routing) is read as the maximum over its ranks of
the call's time and of each step's. Printed per point: that time; the
steps; the share of the two exchanges in it; the dispatch exchange against
the NCCL all-to-all of the same bytes measured in the same run (its time
over the all-to-all's, and the all-to-all's bandwidth to the other ranks);
the largest error against the CPU reference and against the single-GPU
layer over the ranks; and the tokens whose experts sat on one rank that
came out bit for bit, over all of them. Then the geometric mean of the
exchange over the all-to-all, and the points that failed a check, which
make the exit status 1.
"""
import argparse
import json
import math
import sys

STEPS = ["dispatch", "exchange", "experts", "return", "combine"]


def load(paths):
    """{(preset, T, world, routing): [rank rows]} and the devices seen."""
    points, devices = {}, set()
    for path in paths:
        doc = json.load(open(path))
        devices.add(doc.get("device", "?"))
        world, routing = doc.get("world_size", 0), doc.get("routing", "?")
        for p in doc.get("points", []):
            points.setdefault((p["preset"], p["tokens"], world, routing), []).append(p)
    return points, devices


def summarize(rows, world):
    """The point's figures over its ranks."""
    s = {"ranks": len(rows), "us": max(r["us"] for r in rows)}
    for step in STEPS:
        s[step] = max(r["step_us"][step] for r in rows)
    s["a2a_us"] = max(r["nccl_alltoall_us"] for r in rows)
    s["a2a_GBps"] = min(r["nccl_alltoall_GBps"] for r in rows)
    s["rel_err"] = max(r.get("rel_err", 0.0) for r in rows)
    s["vs_single"] = max(r.get("rel_err_vs_single", 0.0) for r in rows)
    s["bitwise"] = sum(r.get("confined_bitwise", 0) for r in rows)
    s["confined"] = sum(r.get("confined_tokens", 0) for r in rows)
    s["failed"] = any(r.get("failed", False) for r in rows) or len(rows) != world
    return s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    points, devices = load(args.files)
    if not points:
        print("no points")
        return 1
    print("device:", ", ".join(sorted(devices)))
    print(f"{'preset':<16} {'T':>6} {'W':>3} {'routing':<8} {'us':>9} "
          + " ".join(f"{s:>9}" for s in STEPS)
          + f" {'xchg%':>6} {'xchg/a2a':>8} {'a2a GB/s':>9} {'rel_err':>9} {'vs_single':>9} {'bitwise':>11}")
    ratios, failed = [], []
    for key in sorted(points):
        preset, t, world, routing = key
        s = summarize(points[key], world)
        share = 100.0 * (s["exchange"] + s["return"]) / s["us"] if s["us"] > 0 else 0.0
        ratio = s["exchange"] / s["a2a_us"] if s["a2a_us"] > 0 else None
        if ratio is not None and world > 1:
            ratios.append(ratio)
        mark = "  FAILED" if s["failed"] else ""
        if s["failed"]:
            failed.append(key)
        print(f"{preset:<16} {t:>6} {world:>3} {routing:<8} {s['us']:>9.1f} "
              + " ".join(f"{s[step]:>9.1f}" for step in STEPS)
              + f" {share:>6.1f} {ratio if ratio is not None else float('nan'):>8.2f}"
              + f" {s['a2a_GBps']:>9.1f} {s['rel_err']:>9.2e} {s['vs_single']:>9.2e}"
              + f" {str(s['bitwise']) + '/' + str(s['confined']):>11}{mark}")
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"exchange over the NCCL all-to-all of the same bytes, geometric mean over "
              f"{len(ratios)} points of 2 or more ranks: {geo:.3f}")
    if failed:
        print(f"{len(failed)} point(s) failed a check or lack a rank's row:")
        for preset, t, world, routing in failed:
            print(f"  {preset} T={t} W={world} {routing}")
        return 1
    print("every point passed its checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
