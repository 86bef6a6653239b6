#!/usr/bin/env python3
"""bench/peers/oai_mxfp4_peer.py on the CPU: its shapes against unimoe-bench's
presets, the padding and weight-copy rules, and, where PyTorch and the
vendored triton_kernels (.deps/peers) are present, its dequantization against
the library's and its Hopper weight conversion against the library's."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench", "peers"))
import oai_mxfp4_peer as peer  # noqa: E402
from presets_cpp import presets_from_cpp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import check  # noqa: E402
from peer_util import Shape  # noqa: E402


def main():
    cpp = presets_from_cpp()
    check(len(cpp) >= 9, f"presets parsed from presets.cpp: {sorted(cpp)}")
    for name, shape in peer.SHAPES.items():
        check(cpp.get(name) == (shape.experts, shape.hidden, shape.intermediate, shape.top_k),
              f"{name}: peer {shape[:4]} vs presets.cpp {cpp.get(name)}")
    check(peer.SHAPES["gpt-oss-120b"].activation == "swiglu_oai", "gpt-oss uses its own SwiGLU")

    gpt = peer.SHAPES["gpt-oss-120b"]
    pad = peer.pad_shape(gpt)
    check(pad == peer.Padded(2880, 2880, 92, 92), f"gpt-oss padding {pad}")
    check(pad.note(gpt) == {"H_scale_groups": 92, "I_scale_groups": 92}, f"{pad.note(gpt)}")
    odd = Shape(8, 100, 100, 2, "silu")
    check(peer.pad_shape(odd) == peer.Padded(128, 128, 4, 4), f"{peer.pad_shape(odd)}")
    check(peer.pad_shape(peer.SHAPES["qwen3-30b-a3b"]).note(peer.SHAPES["qwen3-30b-a3b"]) is None, "no padding")

    qwen = peer.SHAPES["qwen3-30b-a3b"]
    qpad = peer.pad_shape(qwen)
    l2 = 50 * 2**20
    copies, rotated = peer.weight_copies(qwen, qpad, [1, 64], l2, 16, 40 * 2**30)
    hit = qwen.top_k * peer.expert_bytes(qpad)  # T=1 hits K experts
    check(rotated and (copies - 1) * hit >= 2 * l2 and (copies - 2) * hit < 2 * l2, f"copies {copies}")
    copies, rotated = peer.weight_copies(qwen, qpad, [1], l2, 3, 40 * 2**30)
    check(copies == 3 and not rotated, "--max-copies caps the rotation and says so")
    copies, rotated = peer.weight_copies(qwen, qpad, [1], l2, 16, 1.5 * qwen.experts * peer.expert_bytes(qpad))
    check(copies == 1 and not rotated, "the memory budget caps the copies")

    try:
        import torch
        tk, _ = peer.import_triton_kernels(peer.DEFAULT_DEPS)
    except Exception as exc:  # PyTorch, Triton or .deps/peers absent
        print(f"skipped the torch checks: {type(exc).__name__}: {exc}")
        print("ok")
        return
    from triton_kernels.numerics_details.mxfp import upcast_from_mxfp_torch
    gen = torch.Generator()
    gen.manual_seed(1)
    packed = torch.randint(0, 256, (64, 96), generator=gen, dtype=torch.uint8)
    scales = torch.randint(115, 135, (64, 6), generator=gen, dtype=torch.int32).to(torch.uint8)
    want = upcast_from_mxfp_torch(packed, scales, torch.float32, axis=-1)
    check(torch.equal(peer.dequantize(torch, packed, scales), want), "dequantize equals the library's")
    check(peer.layout_self_test(tk, torch), "Hopper conversion equals tk.convert_layout and round-trips")
    print("ok")


if __name__ == "__main__":
    main()
