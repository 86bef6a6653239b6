"""The layer's CPU reference path (the C ABI's ref::moe_forward) against a
plain fp64 torch MoE written in conftest.py, for every routing policy, each
activation, expert biases, a rank's share of the experts, precomputed
routing and both FP8 variants.

Bound, BF16: both sides start from the same bf16 x and weights and round
the activated intermediate to bf16; the layer then rounds its output to
bf16 once, at most 2^-9 relative per element. 2^-8 leaves room for the rare
intermediate that rounds differently through fp32 (the reference) than
straight from fp64 (the test).
"""

import pytest
import torch

import unimoe
from conftest import (bf16_values, dequant_blocks, experts, quant_blocks, quant_rows128,
                      quant_tensor, rel_err, route, static_quant)

BF16_BOUND = 2 ** -8
E, H, I, T = 16, 64, 32, 13


def run_layer(config, w13, w2, x, logits=None, bias=None, ids=None, weights=None, **w):
    layer = unimoe.MoELayer(config, 32, device="cpu")
    layer.set_weights(w13, w2, **w)
    return layer(x.bfloat16(), logits, bias, ids, weights)


POLICIES = [
    ("Default", 4, {}),
    ("Renormalize", 4, {}),
    ("RenormalizeNaive", 4, {}),
    ("TopK", 4, {}),
    ("Sigmoid", 4, {}),
    ("SigmoidRenorm", 4, {}),
    ("TopKSigmoid", 4, {}),
    ("Llama4", 1, {}),
    ("DeepSeekV3", 4, dict(n_group=4, topk_group=2, scale=2.5)),
    ("MiniMax2", 4, dict(scale=1.5)),
]


@pytest.mark.parametrize("policy, k, extra", POLICIES, ids=[p[0] for p in POLICIES])
def test_every_policy(policy, k, extra):
    g = torch.Generator().manual_seed(1)
    x = bf16_values(T, H, generator=g)
    logits = torch.randn(T, E, generator=g) * 2
    w13 = bf16_values(E, 2 * I, H, scale=0.2, generator=g)
    w2 = bf16_values(E, H, I, scale=0.2, generator=g)
    biased = policy in ("DeepSeekV3", "MiniMax2")
    bias = torch.randn(E, generator=g) * 0.1 if biased else None
    config = (f"policy={policy} E={E} K={k} H={H} I={I} routing_bias={int(biased)} "
              + " ".join(f"{key}={v}" for key, v in extra.items()))
    got = run_layer(config, w13.bfloat16(), w2.bfloat16(), x, logits, bias)
    ids, w = route(policy, logits, k, bias, extra.get("n_group", 1), extra.get("topk_group", 1),
                   extra.get("scale", 1.0))
    want = experts(x, ids, w, w13, w2)
    assert rel_err(got, want) < BF16_BOUND


@pytest.mark.parametrize("act", ["SwiGLU", "GeGLU", "ReLU2", "SwiGLUOai"])
def test_every_activation_with_expert_biases(act):
    g = torch.Generator().manual_seed(2)
    n1 = I if act == "ReLU2" else 2 * I
    x = bf16_values(T, H, generator=g)
    logits = torch.randn(T, E, generator=g)
    w13 = bf16_values(E, n1, H, scale=0.3, generator=g)
    w2 = bf16_values(E, H, I, scale=0.3, generator=g)
    b13, b2 = torch.randn(E, n1, generator=g), torch.randn(E, H, generator=g)
    config = f"policy=Renormalize E={E} K=2 H={H} I={I} act={act} expert_bias=1"
    got = run_layer(config, w13.bfloat16(), w2.bfloat16(), x, logits, b13=b13, b2=b2)
    ids, w = route("Renormalize", logits, 2)
    want = experts(x, ids, w, w13, w2, act, b13, b2)
    assert rel_err(got, want) < BF16_BOUND


def test_a_rank_serves_its_experts_only():
    g = torch.Generator().manual_seed(3)
    x = bf16_values(T, H, generator=g)
    logits = torch.randn(T, E, generator=g)
    w13 = bf16_values(6, 2 * I, H, scale=0.2, generator=g)
    w2 = bf16_values(6, H, I, scale=0.2, generator=g)
    config = f"policy=Renormalize E={E} K=4 H={H} I={I} local_offset=5 local_experts=6"
    got = run_layer(config, w13.bfloat16(), w2.bfloat16(), x, logits)
    ids, w = route("Renormalize", logits, 4)
    assert ((ids >= 5) & (ids < 11)).any() and ((ids < 5) | (ids >= 11)).any()
    want = experts(x, ids, w, w13, w2, local_offset=5)
    assert rel_err(got, want) < BF16_BOUND


def test_precomputed_routing_and_ids_out_of_range():
    g = torch.Generator().manual_seed(4)
    x = bf16_values(T, H, generator=g)
    w13 = bf16_values(E, 2 * I, H, scale=0.2, generator=g)
    w2 = bf16_values(E, H, I, scale=0.2, generator=g)
    ids = torch.randint(0, E, (T, 3), generator=g, dtype=torch.int32)
    ids[0, 1], ids[2, 0] = -1, E  # no expert: contribute nothing
    w = torch.rand(T, 3, generator=g)
    got = run_layer(f"policy=Renormalize E={E} K=3 H={H} I={I}", w13.bfloat16(), w2.bfloat16(),
                    x, ids=ids, weights=w)
    want = experts(x, ids.long(), w, w13, w2)
    assert rel_err(got, want) < BF16_BOUND
    # bf16 logits are taken as the fp32 values they hold
    logits = torch.randn(T, E, generator=g).bfloat16()
    got = run_layer(f"policy=Renormalize E={E} K=3 H={H} I={I} logits=BF16", w13.bfloat16(),
                    w2.bfloat16(), x, logits)
    want = experts(x, *route("Renormalize", logits.float(), 3), w13, w2)
    assert rel_err(got, want) < BF16_BOUND


# FP8: both sides take the same e4m3 weights and quantize each GEMM input
# the same way (fp32 scales amax / 448). Bound 2^-6: an input value whose
# fp64 (test) and fp32 (reference) GEMM results sit on either side of an
# e4m3 rounding boundary moves by one e4m3 step, 2^-3 relative, and the
# output's bf16 rounding adds 2^-9; a few such values in the intermediate
# stay well under 2^-6 of the output's norm.
FP8_BOUND = 2 ** -6


def test_fp8_block128():
    g = torch.Generator().manual_seed(5)
    e, h, i, t = 4, 256, 128, 6
    x = bf16_values(t, h, generator=g)
    logits = torch.randn(t, e, generator=g)
    c13, s13 = quant_blocks(torch.randn(e, 2 * i, h, generator=g) * 0.1, 128, 128)
    c2, s2 = quant_blocks(torch.randn(e, h, i, generator=g) * 0.1, 128, 128)
    got = run_layer(f"policy=Renormalize E={e} K=2 H={h} I={i} quant=FP8Block128", c13, c2, x,
                    logits, w13_scale=s13, w2_scale=s2)
    want = experts(x, *route("Renormalize", logits, 2), dequant_blocks(c13, s13, 128, 128),
                   dequant_blocks(c2, s2, 128, 128), quant_input=quant_rows128)
    assert rel_err(got, want) < FP8_BOUND


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_fp8_per_tensor(static):
    g = torch.Generator().manual_seed(6)
    e, h, i, t = 4, 64, 32, 6
    x = bf16_values(t, h, generator=g)
    logits = torch.randn(t, e, generator=g)
    c13, s13 = quant_blocks(torch.randn(e, 2 * i, h, generator=g) * 0.1, 2 * i, h)
    c2, s2 = quant_blocks(torch.randn(e, h, i, generator=g) * 0.1, h, i)
    s13, s2 = s13.reshape(e), s2.reshape(e)
    scales = {}
    quant_input = quant_tensor
    if static:
        # a calibrated scale for x, a deliberately small one for GEMM2's
        # input: values beyond 448 * scale saturate
        sx, sa = x.abs().max() / 448, torch.tensor(0.002)
        scales = dict(x_scale=sx.reshape(1), act_scale=sa.reshape(1))
        quant_input = static_quant(sx, sa)
    got = run_layer(f"policy=Renormalize E={e} K=2 H={h} I={i} quant=FP8PerTensor", c13, c2, x,
                    logits, w13_scale=s13, w2_scale=s2, **scales)
    w13 = c13.float() * s13.view(e, 1, 1)
    w2 = c2.float() * s2.view(e, 1, 1)
    want = experts(x, *route("Renormalize", logits, 2), w13, w2, quant_input=quant_input)
    assert rel_err(got, want) < FP8_BOUND
