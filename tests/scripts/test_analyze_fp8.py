#!/usr/bin/env python3
"""scripts/analyze_fp8.py reads several runs as one (the fastest point of
each preset and T), takes the peer measured beside a point over a peers
file, leaves out the anchors' and the metadata-building peer times, states
the targets' summary lines (geometric mean over the target presets,
dsv3-tp8 at T=1, FP8PerTensor over FP8Block128, FP8PerTensor's points
slower than the peer beside them), reads a run stored under a key of a
results file (PATH#KEY) and refuses runs of two devices."""
import os
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import analyze_fp8  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import check, run_main, write_json  # noqa: E402

H200 = "NVIDIA H200"
CEILINGS = {"bandwidth_TBps": 4.2, "fp8_matmul_TFLOPs": 1500.0}


def point(preset, t, us, floor, peers=None):
    p = {"preset": preset, "T": t, "time_us": us, "floor_us": floor,
         "config": "E=256 K=8 H=7168 I=256", "stages_us": {"routing": 3.0, "gemm1": us / 2}}
    if peers:
        p["peers_us"] = peers
    return p


def run_doc(points, device=H200):
    return {"device": device, "ceilings": CEILINGS, "points": points}


def main():
    with tempfile.TemporaryDirectory() as d:
        a = write_json(d, "a.json", run_doc([
            point("dsv3-tp8", 1, 20.0, 10.0, {"vllm_fused_moe": 30.0, "vllm_fused_moe_align": 18.0,
                                              "anchor_vllm_triton": 5.0}),
            point("dsv3-tp8", 8, 40.0, 20.0, {"vllm_fused_moe": 35.0}),
        ]))
        # A second run: a faster dsv3-tp8 T=8 and another preset.
        b = write_json(d, "b.json", run_doc([
            point("dsv3-tp8", 8, 30.0, 20.0, {"vllm_fused_moe": 35.0}),
            point("qwen3-30b-a3b", 1, 12.0, 10.0),
        ]))
        t = write_json(d, "t.json", run_doc([point("dsv3-tp8", 1, 22.0, 10.0),
                                             point("dsv3-tp8", 8, 30.5, 20.0)]))
        code, out = run_main(analyze_fp8.main, [a + "," + b, t])
        check(code in (0, None), f"exit code {code}")
        # geomean over 2.0 (T=1), 1.5 (T=8, the faster run), 1.2 (qwen): 1.533
        check("geometric mean of time/floor over 3 points" in out and "1.533" in out, out)
        check("dsv3-tp8 T=1: 20.0 us (target <= 17.0)" in out, out)
        # T=1: 22 / 20 = 1.1 over the bound; T=8: 30.5 / 30 within it.
        check("above 1.05: dsv3-tp8 T=1 (1.100)" in out, out)
        # The in-run peer is its experts-only time (30 us), not the anchor or the align time.
        check("peers measured in the run: vllm_fused_moe" in out, out)
        check("points slower than the peer: none" in out, out)
        lines = [l for l in out.splitlines() if l.startswith("dsv3-tp8") and l.split()[1] == "1"]
        check(lines and "30.0" in lines[0], f"the T=1 line shows the peer's 30.0 us: {lines}")

        slow = write_json(d, "slow.json", run_doc([point("dsv3-tp8", 8, 50.0, 20.0,
                                                         {"vllm_fused_moe": 35.0})]))
        code, out = run_main(analyze_fp8.main, [slow])
        check("points slower than the peer: dsv3-tp8 T=8 (+42.9%)" in out, out)

        # Runs stored under keys of one results file; FP8PerTensor's peer.
        stored = write_json(d, "stored.json", dict(run_doc([point("dsv3-tp8", 8, 40.0, 20.0)]),
                                                   per_tensor=run_doc([point("dsv3-tp8", 8, 42.0, 20.0,
                                                                             {"vllm_fp8_tensor": 41.0})])))
        code, out = run_main(analyze_fp8.main, [stored, stored + "#per_tensor"])
        check("above 1.05: none" in out, out)  # 42 / 40 = 1.05
        check("FP8PerTensor points slower than the peer (vllm_fp8_tensor): dsv3-tp8 T=8 (+2.4%)" in out, out)

        other = write_json(d, "other.json", run_doc([point("dsv3-tp8", 1, 20.0, 10.0)],
                                                    device="NVIDIA H100 80GB HBM3"))
        try:
            run_main(analyze_fp8.main, [a + "," + other])
            check(False, "runs of two devices were read as one")
        except SystemExit as e:
            check("ran on NVIDIA H100" in str(e), str(e))
    print("analyze_fp8: ok")


if __name__ == "__main__":
    main()
