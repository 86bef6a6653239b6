#!/usr/bin/env python3
"""scripts/compare_routing_sweeps.py on synthetic sweeps with known ratios."""
import gzip
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import compare_routing_sweeps as crs  # noqa: E402


def point(policy, t, split, fused, cluster):
    return {"policy": policy, "E": 256, "K": 8, "T": t, "split_us": split, "fused_us": fused,
            "cluster_us": cluster}


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def write(folder, name, points, compress=False):
    path = os.path.join(folder, name)
    opener = gzip.open if compress else open
    with opener(path, "wt") as f:
        json.dump({"points": points}, f)
    return path


def main():
    with tempfile.TemporaryDirectory() as d:
        # A: two repeats; each variant keeps its minimum over them.
        a1 = write(d, "a1.json", [point("DeepSeekV3", 1, 10.0, 4.0, 5.0), point("TopK", 8, 10.0, 8.0, 4.0)])
        a2 = write(d, "a2.json.gz", [point("DeepSeekV3", 1, 12.0, 5.0, 4.0), point("TopK", 8, 9.0, 9.0, 5.0)],
                   compress=True)
        b1 = write(d, "b1.json", [point("DeepSeekV3", 1, 10.0, 2.0, 4.0), point("TopK", 8, 9.0, 8.0, 3.0),
                                  point("TopK", 100, 1.0, 1.0, 1.0)])
        # No fused time (beyond its limits) on one side: that variant is left out.
        a3 = write(d, "a3.json", [point("TopK", 9000, 20.0, None, 30.0)])
        b3 = write(d, "b3.json", [point("TopK", 9000, 10.0, 5.0, 30.0)])
        big = crs.compare(crs.load([a3]), crs.load([b3]))
        rows = {tuple(l.split()[:2]): l.split()[2:] for l in big.splitlines()[2:]}
        check(crs.load([a3])[("TopK", 256, 8, 9000)] == {"split": 20.0, "cluster": 30.0, "best": 20.0},
              "a missing variant has no time")
        check(rows[("split", "other")] == ["0.500"] and rows[("fused", "other")] == ["-"], big)
        a, b = crs.load([a1, a2]), crs.load([b1])
        check(a[("DeepSeekV3", 256, 8, 1)] == {"split": 10.0, "fused": 4.0, "cluster": 4.0, "best": 4.0},
              "minimum over the repeats")
        out = crs.compare(a, b)
        lines = {tuple(l.split()[:2]): l.split()[2:] for l in out.splitlines()[2:]}
        check(out.startswith("2 common points"), out)
        # DeepSeek T=1: fused 2/4, cluster 4/4, best 2/4; TopK T=8: cluster 3/4, best 3/4.
        check(lines[("fused", "deepseek")][0] == "0.500", out)
        check(lines[("cluster", "deepseek")][0] == "1.000", out)
        check(lines[("best", "deepseek")][0] == "0.500", out)
        check(lines[("cluster", "other")][1] == "0.750", out)
        check(lines[("split", "other")][1] == "1.000", out)
        check(lines[("fused", "deepseek")][1] == "-", "no DeepSeek point at T=5-16")
        check("T=1" in out.splitlines()[1] and "T=5-16" in out.splitlines()[1], out)
    print("compare_routing_sweeps: ok")


if __name__ == "__main__":
    main()
