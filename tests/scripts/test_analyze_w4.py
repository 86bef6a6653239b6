#!/usr/bin/env python3
"""scripts/analyze_w4.py reads bench and peer files and states each target:
the geometric mean over the target presets only, the points behind the
peer, gpt-oss-120b at T=1, the prefill speed against BF16, NVFP4 against
MXFP4; files from another GPU are refused."""
import os
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import analyze_w4  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import run_main, write_json as write  # noqa: E402


def bench(device, points):
    return {"device": device, "points": [
        {"preset": name, "T": t, "time_us": us, "floor_us": floor, "backend": "auto"}
        for name, t, us, floor in points]}


def run(argv):
    return run_main(analyze_w4.main, argv)


def main():
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        h100 = "NVIDIA H100 80GB HBM3"
        mx = write(d, "mx.json", bench(h100, [
            ("gpt-oss-120b", 1, 18.0, 12.0),     # 1.5
            ("qwen3-30b-a3b", 4096, 600.0, 500.0),  # 1.2
            ("dsv3-tp8", 1, 30.0, 10.0),          # not a target preset
        ]))
        nv = write(d, "nv.json", bench(h100, [("gpt-oss-120b", 1, 19.5, 12.0),
                                              ("qwen3-30b-a3b", 4096, 610.0, 500.0)]))
        bf = write(d, "bf.json", bench(h100, [("qwen3-30b-a3b", 4096, 540.0, 500.0)]))
        peer = write(d, "peer.json", {"provenance": {"device": h100}, "points": [
            {"shape": "gpt-oss-120b", "T": 1, "us": 20.0},
            {"shape": "qwen3-30b-a3b", "T": 4096, "us": 500.0},
            {"shape": "dsv3-tp8", "T": 1, "error": "out of memory"}]})
        code, text = run([mx, "--nvfp4", nv, "--bf16", bf, "--peer", peer])
        check(code == 0, f"exit {code}")
        geomean = (1.5 * 1.2) ** 0.5
        check("over 2 points of" in text and f"{geomean:.3f}" in text, "geomean over the targets: " + text)
        check("gpt-oss-120b T=1: 18.0 us" in text, "T=1 line: " + text)
        check("points slower than the peer: qwen3-30b-a3b T=4096 (+20.0%)" in text, "peer line: " + text)
        check("qwen3-30b-a3b T=4096 0.90" in text, "prefill line: " + text)
        check("NVFP4 over MXFP4 above 1.05: gpt-oss-120b T=1 (1.083)" in text, "nvfp4 line: " + text)
        h200 = write(d, "h200.json", bench("NVIDIA H200", [("gpt-oss-120b", 1, 10.0, 9.0)]))
        try:
            run([mx, "--bf16", h200])
            check(False, "a BF16 file of another GPU was not refused")
        except SystemExit as e:
            check("ran on NVIDIA H200" in str(e), f"refusal text: {e}")

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("analyze_w4: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
