#!/usr/bin/env python3
"""scripts/analyze_gemm2_gate.py matches the three forced-path runs point by
point, counts the gate's points within 3% of the faster path, compares the
gated layer with the host-only choice on the skewed points, states the T=1
overhead, fits the model's terms, and refuses files of another GPU or of no
gemm2_path."""
import json
import os
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import analyze_gemm2_gate  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import run_main, write_json as write  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


def run_doc(mode, routing, points, device=H100):
    """points: (preset, T, us[, choice, work])."""
    doc = {"device": device, "routing": routing, "dev": f"gemm2_path={mode}" if mode else "", "points": []}
    for p in points:
        row = {"preset": p[0], "T": p[1], "time_us": p[2]}
        if len(p) > 3:
            row["gemm2_gate"] = p[3]
            row["gemm2_work"] = p[4]
        doc["points"].append(row)
    return doc


def run(argv):
    return run_main(analyze_gemm2_gate.main, argv)


def main():
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    def work(tiles, rows, active, chunks):
        return {"tiles": tiles, "rows": rows, "active": active, "chunks": chunks}

    with tempfile.TemporaryDirectory() as d:
        files = []
        # uniform: combine faster at T=1 and 8; hot: expert faster at T=8.
        times = {
            ("uniform", "expert"): [("m", 1, 30.0), ("m", 8, 100.0)],
            ("uniform", "combine"): [("m", 1, 28.0), ("m", 8, 96.0)],
            ("uniform", "gate"): [("m", 1, 28.5, "combine", work(8, 8, 8, 8)),
                                  ("m", 8, 96.5, "combine", work(60, 64, 60, 60))],
            ("hot:0.5", "expert"): [("m", 1, 30.0), ("m", 8, 80.0)],
            ("hot:0.5", "combine"): [("m", 1, 28.0), ("m", 8, 90.0)],
            ("hot:0.5", "gate"): [("m", 1, 28.4, "combine", work(8, 8, 8, 8)),
                                  ("m", 8, 88.0, "combine", work(40, 64, 36, 40))],
        }
        for (routing, mode), pts in times.items():
            files.append(write(d, f"{routing}_{mode}.json", run_doc(mode, routing, pts)))
        code, text = run(files + ["--fit", "--json", os.path.join(d, "out.json")])
        check(code == 0, f"exit {code}")
        # Within 3%: uniform 1 (28.5 <= 28.84), uniform 8 (96.5 <= 98.88), hot 1; hot 8 is
        # 88 against 80 * 1.03 = 82.4: 3 of 4.
        check("3 of 4 points (75%" in text, "within line: " + text)
        # Host-only choice: combine at T=1 (28 < 30 both); at T=8 geomean expert
        # sqrt(100*80) = 89.4 < combine sqrt(96*90) = 92.9: expert. Skewed points:
        # hot T=1 28.4/28, hot T=8 88/80.
        skewed = ((28.4 / 28.0) * (88.0 / 80.0)) ** 0.5
        check(f"geometric mean {skewed:.3f}" in text, "skewed line: " + text)
        check("worst 1.100" in text, "worst line: " + text)
        check("T=1 uniform m: gate minus the same path forced +0.50 us" in text, "t1 line: " + text)
        # The same runs kept as one file's "runs" list read the same.
        combined = write(d, "sweep.json", {"provenance": {"command": "x"},
                                           "runs": [json.load(open(f)) for f in files]})
        code, text_combined = run([combined, "--fit"])
        check(code == 0 and "3 of 4 points (75%" in text_combined, "combined file: " + text_combined)
        out = json.load(open(os.path.join(d, "out.json")))
        check(out["summary"]["points"] == 4, f"summary {out['summary']}")
        check(out["fit"]["m"] == "too few or degenerate points for the fit", f"fit {out['fit']}")
        # --plot draws where matplotlib is, and says what it needs where it is not.
        png = os.path.join(d, "g.png")
        try:
            import matplotlib  # noqa: F401
            code, text = run(files + ["--plot", png])
            check(code == 0 and os.path.getsize(png) > 0, "plot not written: " + text)
        except ImportError:
            try:
                run(files + ["--plot", png])
                check(False, "--plot without matplotlib did not stop")
            except SystemExit as e:
                check("--plot needs matplotlib" in str(e), f"plot refusal: {e}")
        # A file of another GPU, and one with no gemm2_path, are refused.
        other = write(d, "other.json", run_doc("gate", "uniform", [("m", 1, 1.0)], device="NVIDIA H200"))
        for bad, words in ((other, "not 'NVIDIA H100"), (write(d, "none.json", run_doc("", "uniform", [])),
                                                        "names no gemm2_path")):
            try:
                run(files[:1] + [bad])
                check(False, f"{bad} was not refused")
            except SystemExit as e:
                check(words in str(e), f"refusal text: {e}")

    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("analyze_gemm2_gate: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
