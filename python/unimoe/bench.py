"""python -m unimoe.bench: times one config from Python on the GPU.

For each token count: the layer's time per call by CUDA-graph replay (the
GPU time, as unimoe-bench measures it), the wall time per eager call in a
synchronized loop, and the host cost of one eager call against the C
function it makes:

  eager_host   host time of layer(x, logits) (argument checks, torch.empty,
               the current stream, the ctypes call, the C++ forward's launches)
  c_host       host time of the same forward called through ctypes with the
               pointers prepared once: the C++ call plus ctypes' own cost
  ctypes       host time of a ctypes call that does nothing (unimoe_has_cuda)
  overhead     eager_host - (c_host - ctypes): what the Python layer adds
               over the C++ call

Host times come from bursts of calls short enough that the launch queue
never fills, so the GPU does not pace them; each figure is the median burst.
Weights and inputs are random (bf16), so the routing is near uniform.

With --peer PATH (bench/peers/torch_peer.py of the repository) the PyTorch
peer times the same preset in the same run, in a child process, and its
figure (graph replay of a layer of PyTorch operators) stands beside
unimoe's replay time: peer_us. The peer knows the presets by name only.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from . import _lib
from .layer import MoELayer

PRESETS = {
    "qwen3-30b-a3b": "policy=Renormalize E=128 K=8 H=2048 I=768",
    "mixtral-8x7b": "policy=Renormalize E=8 K=2 H=4096 I=14336",
    "dsv3-tp8": "policy=DeepSeekV3 E=256 K=8 n_group=8 topk_group=4 scale=2.5 routing_bias=1 "
                "H=7168 I=256",
    "gpt-oss-120b": "policy=Renormalize E=128 K=4 H=2880 I=2880 act=SwiGLUOai expert_bias=1",
}


def host_per_call(fn, bursts=60, calls=16):
    """Median host seconds per call of fn over bursts of `calls` calls."""
    per = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls)
    torch.cuda.synchronize()
    return statistics.median(per)


def measure(layer, t, iters):
    c = layer.config
    e, h = c.routing.num_experts, c.experts.hidden
    x = (torch.randn(t, h, device="cuda") * 0.5).bfloat16()
    logits = torch.randn(t, e, device="cuda")
    bias = torch.randn(e, device="cuda") * 0.1 if c.routing.has_bias else None
    def call():
        return layer(x, logits, bias)

    for _ in range(3):
        call()
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(x, logits, bias)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(iters):
        graph.replay()
    stop.record()
    torch.cuda.synchronize()
    replay_us = start.elapsed_time(stop) * 1e3 / iters

    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    eager_wall_us = (time.perf_counter() - t0) * 1e6 / iters

    out = torch.empty(t, h, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    f, handle = _lib.lib.unimoe_layer_forward, layer._c
    xp, lp, op = x.data_ptr(), logits.data_ptr(), out.data_ptr()
    bp = None if bias is None else bias.data_ptr()
    def raw():
        return f(handle, t, xp, lp, bp, None, None, op, stream)

    noop = _lib.lib.unimoe_has_cuda
    eager_host = host_per_call(call)
    c_host = host_per_call(raw)
    ctypes_us = host_per_call(noop) * 1e6
    return {
        "tokens": t, "graph_replay_us": replay_us, "eager_wall_us": eager_wall_us,
        "eager_host_us": eager_host * 1e6, "c_host_us": c_host * 1e6, "ctypes_us": ctypes_us,
        "overhead_us": eager_host * 1e6 - (c_host * 1e6 - ctypes_us),
        "describe": layer.describe(t),
    }


def peer_times(path, preset, tokens):
    """{T: us} of the PyTorch peer script for a preset, timed in a child
    process on the same GPU (one JSON line per token count)."""
    cmd = [sys.executable, path, "--shape", preset, "--tokens", ",".join(map(str, tokens))]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"unimoe.bench: the peer failed ({' '.join(cmd)}):\n{done.stderr}")
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {r["T"]: r["torch_grouped_us"] for r in rows}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m unimoe.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3-30b-a3b",
                   help=f"a preset ({', '.join(PRESETS)}) or a config's text form")
    p.add_argument("--tokens", default="1,8,64,512", help="token counts, comma-separated")
    p.add_argument("--iters", type=int, default=200, help="timed calls per figure")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--peer", help="the PyTorch peer script (bench/peers/torch_peer.py), timed "
                   "beside unimoe on the same preset")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("unimoe.bench: no CUDA device")
    tokens = [int(v) for v in args.tokens.split(",")]
    if args.peer and args.config not in PRESETS:
        raise SystemExit(f"unimoe.bench: --peer times presets only ({', '.join(PRESETS)})")
    text = PRESETS.get(args.config, args.config)
    layer = MoELayer(text, max(tokens))
    c = layer.config
    g = torch.Generator(device="cuda").manual_seed(0)
    n1, e, h, i = c.gemm1_cols(), c.local_experts(), c.experts.hidden, c.experts.intermediate
    w = {"w13": (torch.randn(e, n1, h, device="cuda", generator=g) * 0.02).bfloat16(),
         "w2": (torch.randn(e, h, i, device="cuda", generator=g) * 0.02).bfloat16()}
    if c.experts.has_bias:
        w["b13"] = torch.zeros(e, n1, device="cuda")
        w["b2"] = torch.zeros(e, h, device="cuda")
    layer.set_weights(**w)
    print(f"{torch.cuda.get_device_name()}  {c}")
    peer = peer_times(args.peer, args.config, tokens) if args.peer else {}
    head = ("T", "replay us", "eager wall us", "eager host us", "C host us", "ctypes us",
            "overhead us", "peer us")
    print("%6s %10s %14s %14s %10s %10s %12s %9s" % head)
    rows = []
    for t in tokens:
        r = measure(layer, t, args.iters)
        if t in peer:
            r["peer_us"] = peer[t]
        rows.append(r)
        print("%6d %10.2f %14.2f %14.2f %10.2f %10.2f %12.2f %9.1f" % (
            t, r["graph_replay_us"], r["eager_wall_us"], r["eager_host_us"], r["c_host_us"],
            r["ctypes_us"], r["overhead_us"], r.get("peer_us", float("nan"))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "config": str(c), "rows": rows},
                      f, indent=1)


if __name__ == "__main__":
    main()
