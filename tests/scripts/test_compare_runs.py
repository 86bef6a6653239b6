#!/usr/bin/env python3
"""scripts/compare_runs.py on two synthetic runs with known ratios."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import compare_runs as cr  # noqa: E402


def point(preset, t, us, plan, routing):
    return {"preset": preset, "T": t, "backend": "auto", "time_us": us, "plan": plan,
            "stages_us": {"routing": routing, "gemm1": us - routing}}


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def main():
    a = {("p", 1, "auto"): point("p", 1, 10.0, "x", 2.0), ("p", 8, "auto"): point("p", 8, 40.0, "y", 2.0),
         ("q", 1, "auto"): point("q", 1, 5.0, "z", 1.0)}
    b = {("p", 1, "auto"): point("p", 1, 9.0, "x", 1.0), ("p", 8, "auto"): point("p", 8, 40.0, "y2", 2.0)}
    out = cr.compare(a, b, stages=True)
    check("0.900" in out and "1.000" in out, out)
    check("y -> y2" in out, "a changed plan is shown")
    check("routing -1.0" in out, "stage differences")
    check("2 common points: geometric mean of B/A 0.949" in out, out)  # sqrt(0.9)
    check("in one run only: q T=1 auto" in out, out)
    print("compare_runs: ok")


if __name__ == "__main__":
    main()
