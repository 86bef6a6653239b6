"""load_fp8_block_experts on the per-expert tensors of a block-scaled FP8
checkpoint (DeepSeek-V3's names, and MiniMax-M2's w1/w3/w2): the stacked
codes and scales are exactly the per-expert ones, gate rows before up rows;
a layer given them matches conftest.py's fp64 MoE on the dequantized
per-expert weights; an expert-parallel rank's range loads its slice; and
the refusals name the tensor.

Bound: test_reference.py's FP8_BOUND (2^-6) on the CPU, where both sides
take the same e4m3 weights and quantize each GEMM input the same way; the
GPU layer's 1e-2 (docs/quantization.md) where there is a Hopper GPU.
"""

import pytest
import torch

import unimoe
from conftest import (DEVICES, bf16_values, dequant_blocks, experts, quant_blocks,
                      quant_rows128, rel_err, route)

E, H, I, K, T = 4, 256, 128, 2, 6
PREFIX = "model.layers.3.mlp.experts."


def checkpoint(names=("gate_proj", "up_proj", "down_proj"), seed=31, e=E, inter=I):
    """{name: tensor} of e experts quantized per 128 x 128 block, and the
    dequantized per-expert weights [(gate, up, down)]."""
    g = torch.Generator().manual_seed(seed)
    tensors, plain = {}, []
    for ex in range(e):
        dq = []
        for name, shape in zip(names, ((inter, H), (inter, H), (H, inter))):
            codes, scale = quant_blocks(torch.randn(*shape, generator=g) * 0.1, 128, 128)
            tensors[f"{PREFIX}{ex}.{name}.weight"] = codes
            tensors[f"{PREFIX}{ex}.{name}.weight_scale_inv"] = scale
            dq.append(dequant_blocks(codes, scale, 128, 128))
        plain.append(dq)
    # What a checkpoint holds beside the experts: left alone.
    tensors[PREFIX.replace("experts.", "gate.weight")] = torch.randn(e, H, generator=g)
    return tensors, plain


def stacked(plain):
    w13 = torch.stack([torch.cat([gate, up]) for gate, up, _ in plain])
    w2 = torch.stack([down for _, _, down in plain])
    return w13, w2


@pytest.mark.parametrize("names", [("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")],
                         ids=["deepseek", "minimax"])
def test_stacks_the_experts_exactly(names):
    tensors, _ = checkpoint(names)
    got = unimoe.load_fp8_block_experts(tensors, PREFIX)
    assert got["w13"].dtype == torch.float8_e4m3fn and got["w13"].shape == (E, 2 * I, H)
    assert got["w2"].shape == (E, H, I) and got["w2_scale"].shape == (E, H // 128, I // 128)
    assert got["w13_scale"].dtype == torch.float32 and got["w13_scale"].shape == (E, 2 * I // 128,
                                                                                  H // 128)
    gate, up, down = names
    for e in range(E):
        w = lambda n: tensors[f"{PREFIX}{e}.{n}.weight"].view(torch.uint8)  # noqa: E731
        s = lambda n: tensors[f"{PREFIX}{e}.{n}.weight_scale_inv"]  # noqa: E731
        assert torch.equal(got["w13"][e].view(torch.uint8), torch.cat([w(gate), w(up)]))
        assert torch.equal(got["w2"][e].view(torch.uint8), w(down))
        assert torch.equal(got["w13_scale"][e], torch.cat([s(gate), s(up)]))
        assert torch.equal(got["w2_scale"][e], s(down))


@pytest.mark.parametrize("device", DEVICES)
def test_layer_on_the_loaded_weights(device):
    tensors, plain = checkpoint(seed=32)
    tensors = {k: v.to(device) for k, v in tensors.items()}
    layer = unimoe.MoELayer(f"policy=Renormalize E={E} K={K} H={H} I={I} quant=FP8Block128", 32,
                            device=device)
    layer.set_weights(**unimoe.load_fp8_block_experts(tensors, PREFIX))
    g = torch.Generator().manual_seed(33)
    x, logits = bf16_values(T, H, generator=g).bfloat16(), torch.randn(T, E, generator=g)
    w13, w2 = stacked(plain)
    want = experts(x, *route("Renormalize", logits, K), w13, w2, quant_input=quant_rows128)
    got = layer(x.to(device), logits.to(device))
    assert rel_err(got, want) < (2 ** -6 if device == "cpu" else 1e-2)


def test_a_module_state_dict_with_no_prefix():
    # A ModuleList of expert MLPs whose Linear layers hold e4m3 weights and
    # their weight_scale_inv: its state_dict's names start at the index.
    tensors, _ = checkpoint(seed=38)
    experts_only = {k[len(PREFIX):]: v for k, v in tensors.items() if k.startswith(PREFIX)}
    got = unimoe.load_fp8_block_experts(experts_only)
    want = unimoe.load_fp8_block_experts(tensors, PREFIX)
    for name in want:
        assert torch.equal(got[name].view(torch.uint8), want[name].view(torch.uint8)), name


def test_an_expert_parallel_rank_loads_its_range():
    tensors, plain = checkpoint(seed=34, e=6)
    got = unimoe.load_fp8_block_experts(tensors, PREFIX, experts=range(2, 4))
    assert got["w13"].shape == (2, 2 * I, H)
    layer = unimoe.MoELayer(f"policy=Renormalize E=6 K={K} H={H} I={I} quant=FP8Block128 "
                            "local_offset=2 local_experts=2", 32, device="cpu")
    layer.set_weights(**got)
    g = torch.Generator().manual_seed(35)
    x, logits = bf16_values(T, H, generator=g).bfloat16(), torch.randn(T, 6, generator=g)
    w13, w2 = stacked(plain[2:4])
    want = experts(x, *route("Renormalize", logits, K), w13, w2, local_offset=2,
                   quant_input=quant_rows128)
    assert rel_err(layer(x, logits), want) < 2 ** -6


def refused(tensors, match, **kw):
    with pytest.raises(unimoe.Error, match=match) as e:
        unimoe.load_fp8_block_experts(tensors, PREFIX, **kw)
    assert e.value.field == "tensors"


def test_refusals_name_the_tensor():
    tensors, _ = checkpoint(seed=36)
    refused(tensors, "no expert", experts=[])
    with pytest.raises(unimoe.Error, match="model.layers.4.mlp.experts.0.gate_proj") as e:
        unimoe.load_fp8_block_experts(tensors, "model.layers.4.mlp.experts.", experts=[0])
    assert e.value.field == "tensors"
    missing = dict(tensors)
    del missing[f"{PREFIX}1.up_proj.weight_scale_inv"]
    refused(missing, "1.up_proj.weight_scale_inv")
    gap = {k: v for k, v in tensors.items() if not k.startswith(f"{PREFIX}2.")}
    refused(gap, r"not 0\.\.3 \(missing \[2\]\)")
    bf16 = dict(tensors)
    bf16[f"{PREFIX}0.down_proj.weight"] = torch.zeros(H, I, dtype=torch.bfloat16)
    refused(bf16, "0.down_proj.weight is torch.bfloat16")
    wrong_scale = dict(tensors)
    wrong_scale[f"{PREFIX}3.gate_proj.weight_scale_inv"] = torch.ones(2, H // 128)
    refused(wrong_scale, "3.gate_proj.weight_scale_inv is torch.float32 \\(2, 2\\)")
    odd = {f"{PREFIX}0.gate_proj.weight": torch.zeros(192, H, dtype=torch.float8_e4m3fn)}
    refused(odd, "I = 192 is not a multiple of 128")
