#!/usr/bin/env python3
"""Reads the FP8 layer's benchmark against the FP8 targets of docs/quantization.md.

    scripts/analyze_fp8.py BLOCK128.json[,MORE.json...] [PERTENSOR.json[,MORE.json...]]
                           [--peers PEERS.json]

BLOCK128.json and PERTENSOR.json are `unimoe-bench --quant FP8Block128` and
`--quant FP8PerTensor` results (e.g. bench/results/h200/layer-fp8-block128.json);
a comma-separated list reads several runs of one machine as one (one run a
preset, say); PATH#KEY reads the run stored under KEY of a results file
(bench/results/h200/layer-fp8.json#per_tensor). Prints, point by point: time, floor, time over floor, the
stage times, FP8PerTensor's time over FP8Block128's, and the FP8 peer:
the fastest peer the run measured beside the point (`--vllm-peer`: vLLM's
Triton fused_moe, experts only, its metadata built beforehand), else, with
--peers, the FP8 block-128 peer of a peers file (bench/peers/h100-peers.json)
where that file was measured on the same GPU model as the run. Then the
summary lines the targets are stated in:
  - the geometric mean of FP8Block128's time over floor over the target
    presets (dsv3-tp8, deepseek-v3, qwen3-30b-a3b, qwen3-235b-a22b);
  - dsv3-tp8 at T=1 against 17 us;
  - deepseek-v3 at T=16384: each GEMM stage's rate against the e4m3 rate
    measured in the run;
  - FP8PerTensor within 5% of FP8Block128 at every point;
  - the points of each variant slower than the peer measured beside them.
"""
import argparse
import json
import math
import sys

TARGET_PRESETS = ["dsv3-tp8", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b"]
GEOMEAN_BOUND = 1.25
T1_BOUND_US = 17.0
GEMM_RATE_BOUND = 0.70
PER_TENSOR_BOUND = 1.05
STAGES = ["routing", "permute", "gemm1", "gemm2", "finalize"]


def load(paths):
    """The first run's header and the fastest point of every (preset, T)
    over the comma-separated runs `paths` (one device)."""
    run, best = None, {}
    for item in paths.split(","):
        path, _, key = item.partition("#")
        doc = json.load(open(path))
        if key:
            doc = doc[key]
        if run is None:
            run = doc
        elif doc["device"] != run["device"]:
            raise SystemExit(f"{path} ran on {doc['device']}, not {run['device']}")
        for p in doc["points"]:
            key = (p["preset"], p["T"])
            if key not in best or p["time_us"] < best[key]["time_us"]:
                best[key] = p
    return run, best


def in_run_peer(point):
    """(us, name) of the fastest peer measured beside the point, or None:
    its experts-only times (not the anchors', not those rebuilding the
    routing metadata in the call)."""
    times = [(us, name) for name, us in point.get("peers_us", {}).items()
             if not name.startswith("anchor_") and not name.endswith(("_align", "_meta"))]
    return min(times) if times else None


def config_field(config, name):
    """The value of `name=` in the config's text form, as an int."""
    for item in config.split():
        key, _, value = item.partition("=")
        if key == name:
            return int(value)
    raise KeyError(name)


def gemm_flops(point):
    """(GEMM1, GEMM2) flops of a point: T*K rows of each expert GEMM."""
    c = point["config"]
    rows = point["T"] * config_field(c, "K")
    h, i = config_field(c, "H"), config_field(c, "I")
    n1 = i if "act=ReLU2" in c else 2 * i
    return 2.0 * rows * n1 * h, 2.0 * rows * h * i


def peer_points(path, device):
    """{(shape, T): us} of the FP8 block-128 peer, or {} with the reason."""
    doc = json.load(open(path))
    what = doc.get("what", "") + json.dumps(doc.get("provenance", {}))
    card = "H200" if "H200" in device else "H100" if "H100" in device else device
    if card not in what:
        return {}, f"peers file measured on another GPU than this run's {device}: not compared"
    rows = doc.get("points", doc.get("rows", []))
    return ({(r["shape"], r["T"]): r["vllm_fp8_block_us"] for r in rows if "vllm_fp8_block_us" in r},
            "peer: vllm_fp8_block_us of " + path + " (experts only, routing given; another run)")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("block128")
    ap.add_argument("per_tensor", nargs="?")
    ap.add_argument("--peers")
    a = ap.parse_args(argv)
    run, block = load(a.block128)
    tensor = load(a.per_tensor)[1] if a.per_tensor else {}
    peers, peer_note = peer_points(a.peers, run["device"]) if a.peers else ({}, "")
    ceil = run["ceilings"]
    print(f"device: {run['device']}; ceilings: {ceil['bandwidth_TBps']:.3f} TB/s, "
          f"e4m3 {ceil.get('fp8_matmul_TFLOPs', float('nan')):.1f} TFLOP/s")
    if peer_note:
        print(peer_note)
    print(f"{'preset':17}{'T':>6}{'time_us':>10}{'floor_us':>10}{'t/floor':>8}"
          f"{'pt/blk':>8}{'peer_us':>9}  stages (us)")
    ratios, slow_tensor, slower_than_peer, in_run_names = [], [], [], set()
    for (name, t), p in sorted(block.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        r = p["time_us"] / p["floor_us"]
        if name in TARGET_PRESETS:
            ratios.append(r)
        q = tensor.get((name, t))
        pt = q["time_us"] / p["time_us"] if q else float("nan")
        if q and pt > PER_TENSOR_BOUND:
            slow_tensor.append(f"{name} T={t} ({pt:.3f})")
        here = in_run_peer(p)
        peer = here[0] if here else peers.get((name, t))
        if here:
            in_run_names.add(here[1])
        if peer is not None and p["time_us"] > peer:
            slower_than_peer.append(f"{name} T={t} (+{100 * (p['time_us'] / peer - 1):.1f}%)")
        stages = " ".join(f"{s} {p['stages_us'][s]:.1f}" for s in STAGES if s in p.get("stages_us", {}))
        print(f"{name:17}{t:>6}{p['time_us']:>10.1f}{p['floor_us']:>10.1f}{r:>8.2f}"
              f"{pt:>8.3f}{(peer if peer is not None else float('nan')):>9.1f}  {stages}")
    if ratios:
        g = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"FP8Block128 geometric mean of time/floor over {len(ratios)} points of "
              f"{', '.join(TARGET_PRESETS)}: {g:.3f} (target <= {GEOMEAN_BOUND})")
    d1 = block.get(("dsv3-tp8", 1))
    if d1:
        print(f"dsv3-tp8 T=1: {d1['time_us']:.1f} us (target <= {T1_BOUND_US})")
    big = block.get(("deepseek-v3", 16384))
    rate = ceil.get("fp8_matmul_TFLOPs")
    if big and rate and "stages_us" in big:
        f1, f2 = gemm_flops(big)
        for stage, flops in (("gemm1", f1), ("gemm2", f2)):
            us = big["stages_us"][stage]
            got = flops / us / 1e6
            print(f"deepseek-v3 T=16384 {stage}: {us:.0f} us, {got:.0f} TFLOP/s = "
                  f"{got / rate:.2f} of the e4m3 rate (target >= {GEMM_RATE_BOUND}; the stage "
                  "includes its quantize, gather and activation kernels)")
    if tensor:
        print("FP8PerTensor over FP8Block128 above 1.05: " + (", ".join(slow_tensor) or "none"))
    if in_run_names:
        print("peers measured in the run: " + ", ".join(sorted(in_run_names)))
    if peers or in_run_names:
        print("points slower than the peer: " + (", ".join(slower_than_peer) or "none"))
    tensor_slower, tensor_peers = [], set()
    for (name, t), q in sorted(tensor.items()):
        here = in_run_peer(q)
        if here:
            tensor_peers.add(here[1])
            if q["time_us"] > here[0]:
                tensor_slower.append(f"{name} T={t} (+{100 * (q['time_us'] / here[0] - 1):.1f}%)")
    if tensor_peers:
        print(f"FP8PerTensor points slower than the peer ({', '.join(sorted(tensor_peers))}): " +
              (", ".join(tensor_slower) or "none"))


if __name__ == "__main__":
    sys.exit(main())
