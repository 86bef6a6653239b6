#!/usr/bin/env python3
"""bench/peers/vllm_fused_moe_peer.py on the CPU: its shapes against
unimoe-bench's presets, the FP8 block padding, the weight-copy rule; with
PyTorch, its pure-PyTorch moe_align_block_size against a plain loop over
random top-k ids (odd T, E and block sizes, empty experts, ids out of
range), and its emulating reference against a token-by-token model of the
call's roundings; `--dry-run` printing a plan; and where .deps/peers holds vLLM's
files, the plan's configs read from them. Without PyTorch here, it runs
again under the repository's .venv (scripts/setup.sh --python) where that
has it; the checks that need what is absent are skipped with a message."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PEER = os.path.join(ROOT, "bench", "peers", "vllm_fused_moe_peer.py")
sys.path.insert(0, os.path.dirname(PEER))
import vllm_fused_moe_peer as peer  # noqa: E402
from presets_cpp import presets_from_cpp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import check  # noqa: E402


def reference_align(ids, block, experts):
    """moe_align_block_size's layout by a plain loop: each expert's flat
    indices ascending, its run padded with numel to a multiple of block."""
    flat = [int(v) for v in ids.reshape(-1).tolist()]
    numel = len(flat)
    max_padded = numel + experts * (block - 1)
    if numel < experts:
        max_padded = min(numel * block, max_padded)
    sorted_ids, expert_ids = [], []
    for e in range(experts):
        rows = [i for i, v in enumerate(flat) if v == e]
        if not rows:
            continue
        padded = -(-len(rows) // block) * block
        sorted_ids += rows + [numel] * (padded - len(rows))
        expert_ids += [e] * (padded // block)
    total = len(sorted_ids)
    blocks = -(-max_padded // block)
    return (sorted_ids + [numel] * (max_padded - total), expert_ids + [0] * (blocks - len(expert_ids)), total)


def check_align(torch):
    gen = torch.Generator()
    gen.manual_seed(7)
    cases = [  # (T, E, K, block): odd sizes, E > T*K (empty experts), T*K < E, one expert, a block of 1
        (1, 8, 2, 16), (3, 7, 2, 4), (5, 128, 8, 16), (17, 9, 3, 8), (33, 64, 6, 32), (7, 257, 4, 64),
        (129, 60, 8, 128), (2, 1, 1, 16), (11, 5, 5, 1), (64, 256, 8, 16)]
    for t, e, k, block in cases:
        ids = torch.rand(t, e, generator=gen).argsort(dim=-1)[:, :k].to(torch.int32)
        got = peer.moe_align_block_size(ids, block, e)
        want = reference_align(ids, block, e)
        what = f"align T={t} E={e} K={k} block={block}"
        check(got[0].dtype == torch.int32 and got[1].dtype == torch.int32 and got[2].dtype == torch.int32,
              f"{what}: int32 outputs")
        check(got[0].tolist() == want[0], f"{what}: sorted_token_ids")
        check(got[1].tolist() == want[1], f"{what}: expert_ids")
        check(got[2].tolist() == [want[2]], f"{what}: num_tokens_post_padded")
    # Repeated ids (no top-k produces them; the op counts them all) and ids
    # past E, which the op leaves out.
    ids = torch.tensor([[2, 2], [9, 0], [2, 5]], dtype=torch.int32)
    got = peer.moe_align_block_size(ids, 4, 6)
    want = reference_align(ids, 4, 6)
    check([got[0].tolist(), got[1].tolist(), got[2].tolist()] == [want[0], want[1], [want[2]]],
          f"align with repeated and out-of-range ids: {got} vs {want}")
    check(peer.align_self_test(), "the dry run's align self-test")


def peer_pipeline(torch, shape, pad, quant, w, bufs, n):
    """The first n tokens of one peer call as its steps round, token by token
    in fp32 (the Triton GEMMs' fp32 accumulation, then bf16): x quantized,
    GEMM1 to bf16, the PyTorch activation stand-in on bf16, its output
    quantized, GEMM2 times the routing weight to bf16, the sum over k."""
    out = torch.zeros(n, pad.hidden)
    for t in range(n):
        xq = peer.quant_dequant(quant, bufs.x[t:t + 1], bufs.a1_scale)
        for k in range(shape.top_k):
            e = int(bufs.ids[t, k])
            h = xq @ peer.dequantize(w, "w13", quant, e).t()
            if w["b13"] is not None:
                h = h + w["b13"][e].float()
            a = torch.empty(1, pad.intermediate, dtype=torch.bfloat16)
            peer.activation(shape, h.bfloat16(), a)
            y = peer.quant_dequant(quant, a, bufs.a2_scale) @ peer.dequantize(w, "w2", quant, e).t()
            if w["b2"] is not None:
                y = y + w["b2"][e].float()
            out[t] += (y * bufs.weights[t, k])[0].bfloat16().float()
    return out[:, :shape.hidden]


def check_emulating_reference(torch):
    """The emulating reference rounds where the peer's steps round: against
    peer_pipeline it differs by fp32 summation order only, for the silu and
    the gpt-oss activations in each quant variant."""
    from peer_util import Shape
    for shape in (Shape(6, 256, 384, 2, "silu"), Shape(5, 128, 256, 3, "swiglu_oai")):
        for quant in peer.QUANTS.values():
            pad = peer.pad_shape(shape, quant)
            w = peer.make_weights(shape, pad, quant, 7, "cpu")
            bufs = peer.make_buffers(shape, pad, quant, 5, 11, "cpu")
            want = peer_pipeline(torch, shape, pad, quant, w, bufs, 5)
            got = peer.reference(shape, pad, quant, w, bufs, 5, emulate=True)
            err = float(torch.linalg.norm(got - want) / torch.linalg.norm(want))
            check(err < 1e-5, f"{shape.activation} {quant.name}: emulating reference off the peer's "
                              f"roundings by {err:.2e}")


def check_results_file():
    """peer_util.write_results: the provenance fields in order, the rows as given."""
    import tempfile
    import types
    import peer_util
    torch = types.SimpleNamespace(__version__="2.11.0", cuda=types.SimpleNamespace(get_device_name=lambda: "GPU X"))
    triton = types.SimpleNamespace(__version__="3.6.0")
    rows = []
    emit = peer_util.emitter(rows)
    emit({"T": 1, "us": 2.0})
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "p.json")
        peer_util.write_results(path, "peer P", ["src"], rows, ["--tokens", "1"], torch, triton,
                                extra={"config_device_name": "X"})
        doc = json.load(open(path))
    check(list(doc["provenance"]) == ["peer", "source", "device", "config_device_name", "torch", "triton",
                                      "timing", "command"], f"provenance fields {list(doc['provenance'])}")
    check(doc["provenance"]["device"] == "GPU X" and doc["provenance"]["command"].endswith("--tokens 1"),
          f"provenance {doc['provenance']}")
    check(doc["points"] == [{"T": 1, "us": 2.0}], f"points {doc['points']}")


def dry_run(args):
    run = subprocess.run([sys.executable, PEER, "--dry-run", *args], capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return run.returncode, lines, run.stderr


def main():
    check_results_file()
    cpp = presets_from_cpp()
    check(len(cpp) >= 9, f"presets parsed from presets.cpp: {sorted(cpp)}")
    for name, shape in peer.SHAPES.items():
        check(cpp.get(name) == (shape.experts, shape.hidden, shape.intermediate, shape.top_k),
              f"{name}: peer {shape[:4]} vs presets.cpp {cpp.get(name)}")
    gpt = peer.SHAPES["gpt-oss-120b"]
    block, tensor = peer.QUANTS["fp8_block"], peer.QUANTS["fp8_tensor"]
    check(peer.pad_shape(gpt, block).note(gpt) == {"H": 2944, "I": 2944}, "gpt-oss FP8 block pads 2880 to 2944")
    check(peer.pad_shape(gpt, tensor).note(gpt) is None, "FP8 per tensor does not pad")
    dsv3 = peer.SHAPES["dsv3-tp8"]
    check(peer.pad_shape(dsv3, block).note(dsv3) is None, "dsv3-tp8 needs no padding")
    qwen, bf16 = peer.SHAPES["qwen3-30b-a3b"], peer.QUANTS["bf16"]
    pad = peer.pad_shape(qwen, bf16)
    l2 = 50 * 2**20
    copies, rotated = peer.weight_copies(qwen, pad, bf16, [1, 64], l2, 16, 40 * 2**30)
    hit = qwen.top_k * peer.expert_bytes(qwen, pad, bf16)  # T=1 hits K experts
    check(rotated and copies * hit >= 2 * l2 and (copies - 1) * hit < 2 * l2, f"copies {copies}")
    check(peer.weight_copies(qwen, pad, bf16, [1], l2, 1, 0) == (1, False), "--max-copies caps and says so")
    check(peer.naive_assignment(qwen, 1) and not peer.naive_assignment(qwen, 8), "vLLM's naive assignment rule")

    code, lines, err = dry_run(["--shapes", "gpt-oss-120b,qwen3-30b-a3b", "--quant", "bf16,fp8_block",
                                "--tokens", "1,64"])
    plans = [line for line in lines if "plan" in line]
    check(len(plans) == 4 and {(p["plan"], p["quant"]) for p in plans} ==
          {(s, q) for s in ("gpt-oss-120b", "qwen3-30b-a3b") for q in ("bf16", "fp8_block")},
          f"--dry-run prints a plan per (shape, quant): {lines} {err}")
    check(all(p["from_vllm"] and p["pytorch_stand_ins"] for p in plans), "the plan names vLLM's steps and stand-ins")
    status = lines[-1]
    if status.get("vllm_files") != "loaded":
        print(f"skipped the config checks: {status.get('error')}")
    else:
        check(code == 0, f"--dry-run exit {code}: {err}")
        gpt_bf16 = next(p for p in plans if p["plan"] == "gpt-oss-120b" and p["quant"] == "bf16")
        check(gpt_bf16["configs"]["1"]["source"].startswith("E=128,N=2880,device_name=NVIDIA_H100_80GB_HBM3.json"),
              f"gpt-oss bf16 reads vLLM's H100 file: {gpt_bf16['configs']['1']}")
        gpt_fp8 = next(p for p in plans if p["plan"] == "gpt-oss-120b" and p["quant"] == "fp8_block")
        check(gpt_fp8["configs"]["64"]["source"].startswith("default (no E=128,N=2944,") and
              gpt_fp8["configs"]["64"]["config"]["BLOCK_SIZE_K"] == 128, f"{gpt_fp8['configs']['64']}")

    try:
        import torch
    except ImportError:
        venv = os.path.join(ROOT, ".venv", "bin", "python")
        # A venv's python links to the interpreter it was made from, so compare
        # the environments (sys.prefix), not the executables.
        if os.path.exists(venv) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(ROOT, ".venv")):
            os.execv(venv, [venv, __file__])
        print("skipped the alignment checks: PyTorch is not installed (scripts/setup.sh --python)")
        print("ok")
        return
    check_align(torch)
    check_emulating_reference(torch)
    if status.get("vllm_files") == "loaded":
        check(status.get("align_self_test") is True, f"dry run under PyTorch: {status}")
    print("ok")


if __name__ == "__main__":
    main()
