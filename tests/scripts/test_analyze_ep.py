#!/usr/bin/env python3
"""scripts/analyze_ep.py: a point is its slowest rank's time and steps; the
errors are the largest over the ranks and the bitwise counts their sum; a
failed rank, or a missing one, fails the point and the exit status."""
import os
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import analyze_ep  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import check, run_main, write_json as write  # noqa: E402


def rank_row(preset, t, rank, us, exchange, a2a, failed=False, bitwise=(3, 4), err=1e-3):
    return {"preset": preset, "tokens": t, "rank": rank, "us": us,
            "step_us": {"dispatch": 5.0, "exchange": exchange, "experts": us - exchange - 20.0,
                        "return": 10.0, "combine": 5.0},
            "nccl_alltoall_us": a2a, "nccl_alltoall_GBps": 100.0 + rank,
            "rel_err": err, "rel_err_vs_single": err / 2, "confined_bitwise": bitwise[0],
            "confined_tokens": bitwise[1], "failed": failed}


def main():
    with tempfile.TemporaryDirectory() as d:
        ok = write(d, "ok.json", {"device": "NVIDIA H100 80GB HBM3", "world_size": 2,
                                  "routing": "uniform", "points": [
            rank_row("mixtral-8x7b", 64, 0, 300.0, 40.0, 20.0, err=2e-3),
            rank_row("mixtral-8x7b", 64, 1, 320.0, 30.0, 25.0),
        ]})
        code, out = run_main(analyze_ep.main, [ok])
        check(code == 0, f"a passing run exits 0: {code}\n{out}")
        line = next(l for l in out.splitlines() if l.startswith("mixtral-8x7b"))
        fields = line.split()
        # us 320 (the slower rank), exchange 40 (the slower rank's), a2a 25.
        check(fields[4] == "320.0", f"the point's time is its slowest rank's: {line}")
        check(fields[6] == "40.0", f"each step's time is its slowest rank's: {line}")
        check(fields[11] == "1.60", f"exchange over the all-to-all is 40 / 25: {line}")
        check(fields[12] == "100.0", f"the all-to-all's bandwidth is the slowest rank's: {line}")
        check(fields[13] == "2.00e-03", f"the error is the largest rank's: {line}")
        check(fields[15] == "6/8", f"bitwise counts add up over ranks: {line}")
        check("geometric mean over 1 points" in out and ": 1.600" in out, out)

        bad = write(d, "bad.json", {"device": "NVIDIA H100 80GB HBM3", "world_size": 2,
                                    "routing": "hot:0.5", "points": [
            rank_row("dsv3-tp8", 7, 0, 100.0, 20.0, 10.0),
            rank_row("dsv3-tp8", 7, 1, 100.0, 20.0, 10.0, failed=True),
            rank_row("dsv3-tp8", 64, 0, 100.0, 20.0, 10.0),  # rank 1's row is missing
        ]})
        code, out = run_main(analyze_ep.main, [ok, bad])
        check(code == 1, f"a failed or incomplete point exits 1: {code}\n{out}")
        check("2 point(s) failed" in out, out)
        check("dsv3-tp8 T=7 W=2 hot:0.5" in out and "dsv3-tp8 T=64 W=2 hot:0.5" in out, out)
    print("test_analyze_ep: ok")


if __name__ == "__main__":
    main()
