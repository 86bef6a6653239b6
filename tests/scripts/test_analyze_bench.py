#!/usr/bin/env python3
"""scripts/analyze_bench.py's slower-than-peer note and stage accounting on
known inputs."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import analyze_bench as ab  # noqa: E402


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def main():
    same = ab.slower_note("p", 64, 103.0, 100.0, 8.0, 8)
    check(same == "p T=64 (+3.0%)", same)
    more = ab.slower_note("p", 8, 102.0, 100.0, 7.0, 6)
    check(more == "p T=8 (+2.0%; 7 active experts here, 6 in the peer's run)", more)
    unknown = ab.slower_note("p", 8, 110.0, 100.0, None, 6)
    check(unknown == "p T=8 (+10.0%)", unknown)
    point = {"time_us": 100.0, "floor_us": 60.0,
             "stages_us": {"routing": 3.0, "permute": 2.0, "gemm1": 50.0, "gemm2": 40.0, "finalize": 5.0},
             "stage_floors": {n: {"floor_us": f} for n, f in
                              [("routing", 0.5), ("permute", 0.5), ("gemm1", 40.0), ("gemm2", 25.0),
                               ("finalize", 4.0)]}}
    rows, layer = ab.stage_accounting(point)
    check([r[0] for r in rows] == ab.STAGES, rows)
    check(rows[3] == ("gemm2", 40.0, 25.0, 15.0), rows[3])
    check(layer == (100.0, 60.0, 40.0), layer)
    check(ab.stage_accounting({"time_us": 1.0, "floor_us": 1.0}) is None, "no stage floors: no accounting")
    print("analyze_bench: ok")


if __name__ == "__main__":
    main()
