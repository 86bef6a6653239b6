#!/usr/bin/env python3
"""Reads the W4A16 layer's benchmark against its targets (docs/quantization.md).

    scripts/analyze_w4.py MXFP4.json [--nvfp4 NVFP4.json] [--bf16 BF16.json]
                          [--peer PEER.json]

MXFP4.json, NVFP4.json and BF16.json are `unimoe-bench --quant MXFP4`,
`--quant NVFP4` and BF16 results over the same presets and token counts of
one run (one file may hold several variants: each is read by the quant its
points' configs name); PEER.json is `bench/peers/oai_mxfp4_peer.py --json`
output of the same call (OpenAI's triton_kernels MXFP4 experts: experts
only, routing given). Without --peer, the peer the run measured beside each
point (`unimoe-bench --mxfp4-peer`) is read from the MXFP4 points. Prints, point by point: MXFP4 time, floor, time over floor, the
peer's time and MXFP4's over it, BF16's time over MXFP4's, NVFP4's over
MXFP4's. Then the lines the targets are stated in:
  - the geometric mean of MXFP4's time over floor over gpt-oss-120b,
    kimi-k2, qwen3-235b-a22b and qwen3-30b-a3b (target <= 1.3);
  - the points slower than the peer (target: none);
  - gpt-oss-120b at T=1 (target <= 20 us);
  - at T >= 4096, MXFP4's speed over BF16's (target >= 0.85);
  - NVFP4 within 5% of MXFP4 at every point.
A file's points on another GPU than MXFP4.json's are refused.
"""
import argparse
import json
import math
import sys

TARGET_PRESETS = ["gpt-oss-120b", "kimi-k2", "qwen3-235b-a22b", "qwen3-30b-a3b"]
GEOMEAN_BOUND = 1.3
T1_BOUND_US = 20.0
PREFILL_T = 4096
PREFILL_SPEED_BOUND = 0.85
NVFP4_BOUND = 1.05


def load_bench(path, quant=None):
    """(run, {(preset, T): point}) keeping the fastest backend of each point;
    with `quant`, only the points of that variant (a file may hold several:
    a point's config names its quant)."""
    run = json.load(open(path))
    best = {}
    for p in run["points"]:
        config = p.get("config", "")
        if quant and "quant=" in config and f"quant={quant} " not in config + " ":
            continue
        key = (p["preset"], p["T"])
        if key not in best or p["time_us"] < best[key]["time_us"]:
            best[key] = p
    return run, best


def load_peer(path):
    """({(shape, T): us}, device) of a peer file; failed points left out."""
    doc = json.load(open(path))
    points = {(p["shape"], p["T"]): p["us"] for p in doc.get("points", []) if "us" in p}
    return points, doc.get("provenance", {}).get("device", "")


def same_card(a, b):
    return any(card in a and card in b for card in ("H100", "H200")) or a == b


def fmt(v, width, digits):
    return f"{v:>{width}.{digits}f}" if v is not None else f"{'-':>{width}}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mxfp4")
    ap.add_argument("--nvfp4")
    ap.add_argument("--bf16")
    ap.add_argument("--peer")
    a = ap.parse_args(argv)
    run, mx = load_bench(a.mxfp4, "MXFP4")
    device = run.get("device", "")
    others = {}
    for name, path in (("NVFP4", a.nvfp4), ("BF16", a.bf16)):
        if path:
            other_run, points = load_bench(path, name)
            if not same_card(device, other_run.get("device", "")):
                sys.exit(f"analyze_w4: {path} ran on {other_run.get('device')}, {a.mxfp4} on {device}")
            others[name] = points
    # Without --peer: the peer the run measured beside each point (--mxfp4-peer).
    peer = {k: p["peers_us"]["oai_mxfp4"] for k, p in mx.items() if "oai_mxfp4" in p.get("peers_us", {})}
    if a.peer:
        peer, peer_device = load_peer(a.peer)
        if not same_card(device, peer_device):
            sys.exit(f"analyze_w4: {a.peer} ran on {peer_device}, {a.mxfp4} on {device}")
    nv, bf = others.get("NVFP4", {}), others.get("BF16", {})
    print(f"device: {device}")
    print(f"{'preset':17}{'T':>6}{'mxfp4_us':>10}{'floor_us':>10}{'t/floor':>8}"
          f"{'peer_us':>9}{'mx/peer':>8}{'bf16/mx':>8}{'nv/mx':>7}")
    ratios, slower, slow_nv, prefill = [], [], [], []
    for (name, t), p in sorted(mx.items()):
        r = p["time_us"] / p["floor_us"]
        if name in TARGET_PRESETS:
            ratios.append(r)
        pu = peer.get((name, t))
        if pu is not None and p["time_us"] > pu:
            slower.append(f"{name} T={t} (+{100 * (p['time_us'] / pu - 1):.1f}%)")
        b = bf.get((name, t))
        speed = b["time_us"] / p["time_us"] if b else None
        if b and t >= PREFILL_T:
            prefill.append(f"{name} T={t} {speed:.2f}")
        n = nv.get((name, t))
        nvr = n["time_us"] / p["time_us"] if n else None
        if n and nvr > NVFP4_BOUND:
            slow_nv.append(f"{name} T={t} ({nvr:.3f})")
        print(f"{name:17}{t:>6}{p['time_us']:>10.1f}{p['floor_us']:>10.1f}{r:>8.2f}"
              f"{fmt(pu, 9, 1)}{fmt(p['time_us'] / pu if pu else None, 8, 2)}"
              f"{fmt(speed, 8, 2)}{fmt(nvr, 7, 3)}")
    if ratios:
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"MXFP4 geometric mean of time/floor over {len(ratios)} points of "
              f"{', '.join(TARGET_PRESETS)}: {g:.3f} (target <= {GEOMEAN_BOUND})")
    g1 = mx.get(("gpt-oss-120b", 1))
    if g1:
        print(f"gpt-oss-120b T=1: {g1['time_us']:.1f} us (target <= {T1_BOUND_US})")
    if peer:
        print("points slower than the peer: " + (", ".join(slower) or "none"))
    if bf:
        print(f"MXFP4 speed over BF16 at T >= {PREFILL_T} (target >= {PREFILL_SPEED_BOUND}): " +
              (", ".join(prefill) or "no such point"))
    if nv:
        print(f"NVFP4 over MXFP4 above {NVFP4_BOUND}: " + (", ".join(slow_nv) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
