"""unimoe.fused_experts: the experts as one function of the weights and the
caller's routing. On the CPU (the reference layer) and, where there is a
Hopper GPU, the GPU layer: against conftest.py's fp64 MoE for BF16, both
FP8 variants (told apart by their scales) and an expert-parallel slice;
the layer cache (one layer per set of weights, made again for more tokens,
cleared on request); the refusals.

Bounds: test_reference.py's (BF16 2^-8, FP8 2^-6) on the CPU; the GPU
layer's 1e-2 (docs/quantization.md).
"""

import pytest
import torch

import unimoe
import unimoe.functional as functional
from conftest import (DEVICES, bf16_values, dequant_blocks, experts, quant_blocks,
                      quant_rows128, quant_tensor, rel_err, route)

E, H, I, K, T = 8, 256, 128, 2, 9


def bound(device, fp8=False):
    return 1e-2 if device != "cpu" else (2 ** -6 if fp8 else 2 ** -8)


def inputs(t, e=E, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = bf16_values(t, H, generator=g).bfloat16()
    ids, weights = route("Renormalize", torch.randn(t, e, generator=g), K)
    return x, weights.float(), ids


@pytest.fixture(autouse=True)
def empty_cache():
    unimoe.clear_fused_experts_cache()
    yield
    unimoe.clear_fused_experts_cache()


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_against_the_fp64_moe(device):
    g = torch.Generator().manual_seed(2)
    w13 = bf16_values(E, 2 * I, H, scale=0.05, generator=g)
    w2 = bf16_values(E, H, I, scale=0.05, generator=g)
    x, weights, ids = inputs(T)
    out = unimoe.fused_experts(x.to(device), w13.bfloat16().to(device), w2.bfloat16().to(device),
                               weights.to(device), ids.to(device))  # int64 ids are taken too
    assert out.shape == (T, H) and out.dtype == torch.bfloat16 and out.device.type == device
    assert rel_err(out, experts(x, ids, weights, w13, w2)) < bound(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("quant", ["FP8Block128", "FP8PerTensor"])
def test_fp8_variants_follow_the_scales(device, quant):
    g = torch.Generator().manual_seed(3)
    block = quant == "FP8Block128"
    c13, s13 = quant_blocks(torch.randn(E, 2 * I, H, generator=g) * 0.1,
                            *((128, 128) if block else (2 * I, H)))
    c2, s2 = quant_blocks(torch.randn(E, H, I, generator=g) * 0.1, *((128, 128) if block else (H, I)))
    if not block:
        s13, s2 = s13.reshape(E), s2.reshape(E)
    x, weights, ids = inputs(T, seed=4)
    out = unimoe.fused_experts(x.to(device), c13.to(device), c2.to(device), weights.to(device),
                               ids.to(device), w13_scale=s13.to(device), w2_scale=s2.to(device))
    if block:
        w13, w2, q = dequant_blocks(c13, s13, 128, 128), dequant_blocks(c2, s2, 128, 128), \
            quant_rows128
    else:
        w13, w2, q = c13.float() * s13.view(E, 1, 1), c2.float() * s2.view(E, 1, 1), quant_tensor
    (layer, _), = functional._cache.values()
    assert f"quant={quant}" in str(layer.config)
    assert rel_err(out, experts(x, ids, weights, w13, w2, quant_input=q)) < bound(device, True)


def test_an_expert_parallel_slice():
    g = torch.Generator().manual_seed(5)
    w13 = bf16_values(4, 2 * I, H, scale=0.05, generator=g)
    w2 = bf16_values(4, H, I, scale=0.05, generator=g)
    x, weights, ids = inputs(T, e=16, seed=6)
    out = unimoe.fused_experts(x, w13.bfloat16(), w2.bfloat16(), weights, ids, num_experts=16,
                               local_expert_offset=4)
    want = experts(x, ids, weights, w13, w2, local_offset=4)
    assert rel_err(out, want) < 2 ** -8


def test_one_layer_per_set_of_weights():
    g = torch.Generator().manual_seed(7)
    w13 = bf16_values(E, 2 * I, H, scale=0.05, generator=g).bfloat16()
    w2 = bf16_values(E, H, I, scale=0.05, generator=g).bfloat16()
    x, weights, ids = inputs(T)
    first = unimoe.fused_experts(x, w13, w2, weights, ids)
    (layer, _), = functional._cache.values()
    assert layer.max_tokens == 64
    assert torch.equal(unimoe.fused_experts(x, w13, w2, weights, ids), first)
    assert len(functional._cache) == 1 and functional._cache[next(iter(functional._cache))][0] \
        is layer
    # More tokens than the layer was made for: made again, larger.
    xl, wl, il = inputs(100, seed=8)
    unimoe.fused_experts(xl, w13, w2, wl, il)
    (bigger, _), = functional._cache.values()
    assert bigger is not layer and bigger.max_tokens == 128
    # Other weights: another layer beside it.
    unimoe.fused_experts(x, w13.clone(), w2, weights, ids)
    assert len(functional._cache) == 2
    unimoe.clear_fused_experts_cache()
    assert not functional._cache


def test_refusals():
    g = torch.Generator().manual_seed(9)
    w13 = bf16_values(E, 2 * I, H, scale=0.05, generator=g)
    w2 = bf16_values(E, H, I, scale=0.05, generator=g)
    x, weights, ids = inputs(T)
    with pytest.raises(unimoe.Error) as e:
        unimoe.fused_experts(x, w13, w2.bfloat16(), weights, ids)  # fp32 weights
    assert e.value.field == "w13"
    with pytest.raises(unimoe.Error) as e:
        unimoe.fused_experts(x, w13.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn), weights,
                             ids)
    assert e.value.field == "w13_scale"
    with pytest.raises(unimoe.Error) as e:
        unimoe.fused_experts(x, w13.bfloat16(), w2.bfloat16(), weights, ids, max_tokens=4)
    assert e.value.field == "x" and "max_tokens" in str(e.value)
    with pytest.raises(unimoe.Error) as e:
        unimoe.fused_experts(x[0], w13.bfloat16(), w2.bfloat16(), weights, ids)
    assert e.value.field == "x"


def test_the_custom_op_compiles_whole():
    # unimoe::fused_experts passes torch.library.opcheck (its schema, fake
    # implementation and dispatch) and a function calling it compiles with
    # fullgraph=True, giving the eager bits.
    g = torch.Generator().manual_seed(10)
    w13 = bf16_values(E, 2 * I, H, scale=0.05, generator=g).bfloat16()
    w2 = bf16_values(E, H, I, scale=0.05, generator=g).bfloat16()
    x, weights, ids = inputs(T)
    ids = ids.to(torch.int32)
    args = (x, w13, w2, weights, ids, "SwiGLU", None, 0, None, None, None, None, None, None,
            None, None, False, None, None, None)
    torch.library.opcheck(torch.ops.unimoe.fused_experts.default, args)

    def moe(x, weights, ids):
        return unimoe.fused_experts(x, w13, w2, weights, ids).float() * 2

    compiled = torch.compile(moe, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, weights, ids), moe(x, weights, ids))


def test_gpt_oss_mxfp4_interleaved():
    # 4-bit weights with gpt-oss's interleaved gate/up rows, biases and its
    # activation: the layer on the same arguments, bit for bit.
    from test_fp4 import fp4_weights
    g = torch.Generator().manual_seed(11)
    w = fp4_weights("MXFP4", 2 * 32, g, bias=True)
    e, h = w["w13"].shape[0], 2 * w["w13"].shape[-1]
    x = bf16_values(T, h, generator=g).bfloat16()
    ids, weights = route("Renormalize", torch.randn(T, e, generator=g), K)
    out = unimoe.fused_experts(x, w["w13"], w["w2"], weights.float(), ids, activation="SwiGLUOai",
                               b13=w["b13"], b2=w["b2"], w13_block_scale=w["w13_block_scale"],
                               w2_block_scale=w["w2_block_scale"], w13_interleaved=True)
    layer = unimoe.MoELayer(f"policy=TopK E={e} K={K} H={h} I=32 act=SwiGLUOai quant=MXFP4 "
                            "expert_bias=1", 16, device="cpu")
    layer.set_weights(w13_interleaved=True, **w)
    assert torch.equal(out, layer(x, topk_ids=ids.to(torch.int32), topk_weights=weights.float()))
