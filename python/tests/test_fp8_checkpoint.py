"""load_fp8_block_experts on the per-expert tensors of a block-scaled FP8
checkpoint (DeepSeek-V3's names, and MiniMax-M2's w1/w3/w2): the stacked
codes and scales are exactly the per-expert ones, gate rows before up rows;
a layer given them matches conftest.py's fp64 MoE on the dequantized
per-expert weights; an expert-parallel rank's range loads its slice; and
the refusals name the tensor. load_fp8_tensor_experts on a per-tensor
checkpoint: gate and up take the larger of their scales (the other
requantized within half an e4m3 step), the static scales are the largest
input_scale, and the layer matches the fp64 MoE on the loaded weights.

Bound: test_reference.py's FP8_BOUND (2^-6) on the CPU, where both sides
take the same e4m3 weights and quantize each GEMM input the same way; the
GPU layer's 1e-2 (docs/quantization.md) where there is a Hopper GPU.
"""

import pytest
import torch

import unimoe
from conftest import (DEVICES, bf16_values, dequant_blocks, experts, quant_blocks,
                      quant_rows128, quant_tensor, rel_err, route, static_quant)

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


# ------------------------------------------------- per-tensor checkpoints ----

def tensor_checkpoint(static, names=("w1", "w3", "w2"), seed=41):
    """Per-tensor FP8 experts: each projection with its own weight_scale (the
    gate's and up's differ) and, static, its input_scale; and their
    dequantized per-expert weights [(gate, up, down)]."""
    g = torch.Generator().manual_seed(seed)
    tensors, plain = {}, []
    for ex in range(E):
        dq = []
        for name, shape in zip(names, ((I, H), (I, H), (H, I))):
            codes, scale = quant_blocks(torch.randn(*shape, generator=g) * 0.1, *shape)
            key = f"{PREFIX}{ex}.{name}"
            tensors[key + ".weight"] = codes
            tensors[key + ".weight_scale"] = scale.reshape(())
            if static:
                tensors[key + ".input_scale"] = torch.rand((), generator=g) * 0.01 + 0.001
            dq.append(codes.float() * scale)
        plain.append(dq)
    return tensors, plain


def test_per_tensor_gate_and_up_share_the_larger_scale():
    tensors, plain = tensor_checkpoint(static=False)
    got = unimoe.load_fp8_tensor_experts(tensors, PREFIX)
    assert set(got) == {"w13", "w2", "w13_scale", "w2_scale"}
    assert got["w13_scale"].shape == (E,) and got["w2_scale"].shape == (E,)
    for e in range(E):
        sg = tensors[f"{PREFIX}{e}.w1.weight_scale"]
        su = tensors[f"{PREFIX}{e}.w3.weight_scale"]
        assert got["w13_scale"][e] == torch.maximum(sg, su)
        assert got["w2_scale"][e] == tensors[f"{PREFIX}{e}.w2.weight_scale"]
        w13 = got["w13"][e].float() * got["w13_scale"][e]
        keeps = 0 if sg >= su else 1  # the half whose codes stay as they are
        half = slice(keeps * I, (keeps + 1) * I)
        assert torch.equal(got["w13"][e, half].view(torch.uint8),
                           tensors[f"{PREFIX}{e}.{('w1', 'w3')[keeps]}.weight"].view(torch.uint8))
        # The other half is requantized: in units of the shared scale, each
        # value moves by at most half an e4m3 step (2^-4 of it; 2^-10 below
        # the normal range, where the step is the subnormal 2^-9).
        other = slice((1 - keeps) * I, (2 - keeps) * I)
        v = plain[e][1 - keeps].double() / got["w13_scale"][e].double()
        moved = (w13[other].double() / got["w13_scale"][e].double() - v).abs()
        assert (moved <= torch.clamp(v.abs() * 2 ** -4, min=2 ** -10) * (1 + 1e-6)).all()
        assert moved.max() > 0  # the scales differ, so some codes change


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_per_tensor_layer_on_the_loaded_weights(static):
    tensors, _ = tensor_checkpoint(static, names=("gate_proj", "up_proj", "down_proj"), seed=42)
    got = unimoe.load_fp8_tensor_experts(tensors, PREFIX)
    assert ("x_scale" in got) == static and ("act_scale" in got) == static
    if static:
        ins = lambda n: torch.stack([tensors[f"{PREFIX}{e}.{n}.input_scale"]  # noqa: E731
                                     for e in range(E)])
        assert got["x_scale"] == torch.maximum(ins("gate_proj"), ins("up_proj")).max()
        assert got["act_scale"] == ins("down_proj").max()
    layer = unimoe.MoELayer(f"policy=Renormalize E={E} K={K} H={H} I={I} quant=FP8PerTensor", 32,
                            device="cpu")
    layer.set_weights(**got)
    g = torch.Generator().manual_seed(43)
    x, logits = bf16_values(T, H, generator=g).bfloat16(), torch.randn(T, E, generator=g)
    w13 = got["w13"].float() * got["w13_scale"].view(E, 1, 1)
    w2 = got["w2"].float() * got["w2_scale"].view(E, 1, 1)
    quant_input = quant_tensor
    if static:
        quant_input = static_quant(got["x_scale"], got["act_scale"])
    want = experts(x, *route("Renormalize", logits, K), w13, w2, quant_input=quant_input)
    assert rel_err(layer(x, logits), want) < 2 ** -6


def test_per_tensor_refusals():
    tensors, _ = tensor_checkpoint(static=True, seed=44)
    partial = dict(tensors)
    del partial[f"{PREFIX}2.w2.input_scale"]
    with pytest.raises(unimoe.Error, match="some projections .* have an input_scale") as e:
        unimoe.load_fp8_tensor_experts(partial, PREFIX)
    assert e.value.field == "tensors"
    no_scale = dict(tensors)
    del no_scale[f"{PREFIX}1.w3.weight_scale"]
    with pytest.raises(unimoe.Error, match="no model.layers.3.mlp.experts.1.w3.weight_scale"):
        unimoe.load_fp8_tensor_experts(no_scale, PREFIX)
    vector = dict(tensors)
    vector[f"{PREFIX}0.w1.weight_scale"] = torch.ones(I)
    with pytest.raises(unimoe.Error, match=r"0.w1.weight_scale is torch.float32 \(128,\)"):
        unimoe.load_fp8_tensor_experts(vector, PREFIX)
