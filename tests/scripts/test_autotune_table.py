#!/usr/bin/env python3
"""scripts/autotune_table.py on synthetic autotune JSON whose answers are
known: per-backend bests, the winner, the 3% check and both geometric means."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "autotune_table.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import autotune_table as at  # noqa: E402


def timed(path, g1, g2, sm90, t):
    return f"timed path={path} gemm1={g1} gemm2={g2} sm90={sm90} time_us={t}"


def point(preset, t, tuned, over_floor, log):
    return {"preset": preset, "T": t, "time_us": tuned, "time_over_floor": over_floor, "tuning_log": log}


def check(cond, what):
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def main():
    a = point("p", 1, 10.1, 2.0, [timed("mma", "m16n64", "m16n64", "coop_128x128x64", 10.0),
                                  timed("stream", "stream_m16", "stream_m16", "coop_128x128x64", 12.0),
                                  timed("cutlass", "m64n128", "m64n128", "coop_128x256x64", 30.0)])
    # Tuned 5% over its best candidate: reported as outside 3%.
    b = point("p", 4096, 105.0, 0.5, [timed("mma", "m64n128", "m16n64", "coop_128x128x64", 200.0),
                                      timed("cutlass", "m64n128", "m64n128", "coop_128x128x64", 120.0),
                                      timed("cutlass", "m64n128", "m64n128", "coop_128x256x64", 100.0)])
    cands = at.candidates(b)
    check(("mma", "m64n128/m16n64", 200.0) in cands, f"mma pair tactic: {cands}")
    check(("cutlass", "coop_128x256x64", 100.0) in cands, f"cutlass tactic: {cands}")
    rule = {("p", 1): {"time_us": 11.0, "time_over_floor": 8.0},
            ("p", 4096): {"time_us": 110.0, "time_over_floor": 2.0}}
    out = at.table({("p", 1): a, ("p", 4096): b}, rule)
    check("within 3% of the best single backend at 1 of 2 points" in out, out)
    check("p T=4096: tuned 105.0 us is 5.0% over" in out, out)
    check("mma wins 1 points: p@1" in out and "cutlass wins 1 points: p@4096" in out, out)
    check("geometric mean of time/floor over 2 points: 1.000" in out, out)  # sqrt(2.0 * 0.5)
    check("time/floor 4.000" in out, out)  # sqrt(8 * 2)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "autotune.json")
        with open(path, "w") as f:
            json.dump({"points": [a, b, {"preset": "untuned", "T": 8, "time_us": 1.0}]}, f)
        out = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True, check=True).stdout
        check("untuned" not in out, "points without a tuning log are left out")
    print("autotune_table: ok")


if __name__ == "__main__":
    main()
