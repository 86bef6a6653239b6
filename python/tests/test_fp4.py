"""MXFP4 and NVFP4 (W4A16) weights through set_weights: the CPU reference
path against a plain torch dequantization (a 16-entry e2m1 table times
2^(code - 127) per 32 values, or times the e4m3 block scale per 16 and the
matrix scale) and conftest.py's fp64 MoE, with and without gpt-oss's
interleaved gate/up rows; the argument refusals; load_gpt_oss_mxfp4 on a
checkpoint's *_blocks and *_scales tensors; load_nvfp4_experts on an
NVFP4 checkpoint's per-expert tensors; and, where there is a
Hopper GPU, the GPU layer against the CPU path on the same weights, eagerly
and inside a CUDA graph.

Bound, CPU: the dequantized weights are exact in fp64 here and within 2^-24
relative in the reference (NVFP4's one fp32 multiply by the matrix scale);
activations are bf16 on both sides and the intermediate is rounded to bf16,
as docs/quantization.md's W4A16 rule says; so BF16's 2^-8 (test_reference.py).
Bound, GPU: BF16's 1e-2 (docs/quantization.md, the W4A16 layer).
"""

import pytest
import torch

import unimoe
from conftest import bf16_values, experts, rel_err, requires_gpu, route

CPU_BOUND = 2 ** -8
GPU_BOUND = 1e-2
E, H, I, T = 16, 64, 32, 13
BLOCK = {"MXFP4": 32, "NVFP4": 16}
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                    dtype=torch.float64)


def random_fp4(quant, e, rows, k, g):
    """codes uint8 [e, rows, k/2], block scales uint8 [e, rows, k/block] and,
    for NVFP4, matrix scales fp32 [e] (None for MXFP4)."""
    codes = torch.randint(0, 256, (e, rows, k // 2), generator=g, dtype=torch.uint8)
    shape = (e, rows, k // BLOCK[quant])
    if quant == "MXFP4":  # 2^-7 .. 2^-3
        return codes, torch.randint(120, 125, shape, generator=g, dtype=torch.uint8), None
    scales = (torch.rand(shape, generator=g) * 2 + 0.25).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes, scales, torch.rand(e, generator=g) * 0.05 + 0.01


def dequant(quant, codes, scales, matrix_scale):
    """[e, rows, k] fp64: e2m1 value times its block's scale."""
    nibbles = torch.stack([codes & 0xF, codes >> 4], dim=-1).flatten(-2).long()
    v = E2M1[nibbles]
    if quant == "MXFP4":
        s = torch.exp2(scales.double() - 127)
    else:
        s = scales.view(torch.float8_e4m3fn).double() * matrix_scale.double().view(-1, 1, 1)
    return v * s.repeat_interleave(BLOCK[quant], -1)


def gate_then_up(v):
    """Interleaved rows (gate, up, gate, up, ...) of [e, 2I, ...] as gate rows then up rows."""
    return torch.cat([v[:, 0::2], v[:, 1::2]], dim=1)


def fp4_weights(quant, n1, g, bias=False):
    c13, s13, m13 = random_fp4(quant, E, n1, H, g)
    c2, s2, m2 = random_fp4(quant, E, H, I, g)
    w = dict(w13=c13, w2=c2, w13_block_scale=s13, w2_block_scale=s2)
    if quant == "NVFP4":
        w.update(w13_scale=m13, w2_scale=m2)
    if bias:
        w.update(b13=torch.randn(E, n1, generator=g), b2=torch.randn(E, H, generator=g))
    return w


@pytest.mark.parametrize("quant", ["MXFP4", "NVFP4"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_fp4_reference_path(quant, interleaved):
    g = torch.Generator().manual_seed(20 + interleaved)
    act = "SwiGLUOai" if interleaved else "SwiGLU"  # gpt-oss: SwiGLUOai, biases, interleaved
    w = fp4_weights(quant, 2 * I, g, bias=interleaved)
    x = bf16_values(T, H, generator=g)
    logits = torch.randn(T, E, generator=g)
    config = (f"policy=Renormalize E={E} K=4 H={H} I={I} quant={quant} act={act} "
              f"expert_bias={int(interleaved)}")
    layer = unimoe.MoELayer(config, 32, device="cpu")
    layer.set_weights(w13_interleaved=interleaved, **w)
    got = layer(x.bfloat16(), logits)
    w13 = dequant(quant, w["w13"], w["w13_block_scale"], w.get("w13_scale"))
    w2 = dequant(quant, w["w2"], w["w2_block_scale"], w.get("w2_scale"))
    b13 = w.get("b13")
    if interleaved:
        w13, b13 = gate_then_up(w13), gate_then_up(b13)
    ids, rw = route("Renormalize", logits, 4)
    want = experts(x, ids, rw, w13, w2, act, b13, w.get("b2"))
    assert rel_err(got, want) < CPU_BOUND


def test_interleaved_is_the_reordered_layout():
    """Interleaved rows give what the same rows in gate-then-up order give, bit for bit."""
    g = torch.Generator().manual_seed(22)
    w = fp4_weights("MXFP4", 2 * I, g, bias=True)
    x, logits = bf16_values(T, H, generator=g).bfloat16(), torch.randn(T, E, generator=g)
    config = f"policy=Renormalize E={E} K=2 H={H} I={I} quant=MXFP4 expert_bias=1"
    a = unimoe.MoELayer(config, 32, device="cpu")
    a.set_weights(w13_interleaved=True, **w)
    ordered = dict(w, w13=gate_then_up(w["w13"]).contiguous(),
                   w13_block_scale=gate_then_up(w["w13_block_scale"]).contiguous(),
                   b13=gate_then_up(w["b13"]).contiguous())
    b = unimoe.MoELayer(config, 32, device="cpu")
    b.set_weights(**ordered)
    assert torch.equal(a(x, logits), b(x, logits))


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2") or not hasattr(torch, "float8_e8m0fnu"),
                    reason="this torch has no float4_e2m1fn_x2 or float8_e8m0fnu")
@pytest.mark.parametrize("quant", ["MXFP4", "NVFP4"])
def test_fp4_and_fp8_scale_dtypes_are_their_bytes(quant):
    g = torch.Generator().manual_seed(23)
    w = fp4_weights(quant, 2 * I, g)
    x, logits = bf16_values(T, H, generator=g).bfloat16(), torch.randn(T, E, generator=g)
    config = f"policy=Renormalize E={E} K=2 H={H} I={I} quant={quant}"
    a = unimoe.MoELayer(config, 32, device="cpu")
    a.set_weights(**w)
    scale_dtype = torch.float8_e8m0fnu if quant == "MXFP4" else torch.float8_e4m3fn
    typed = dict(w, w13=w["w13"].view(torch.float4_e2m1fn_x2),
                 w2=w["w2"].view(torch.float4_e2m1fn_x2),
                 w13_block_scale=w["w13_block_scale"].view(scale_dtype),
                 w2_block_scale=w["w2_block_scale"].view(scale_dtype))
    b = unimoe.MoELayer(config, 32, device="cpu")
    b.set_weights(**typed)
    assert torch.equal(a(x, logits), b(x, logits))


def refused(config, w, field, error=unimoe.Error, **extra):
    layer = unimoe.MoELayer(config, 8, device="cpu")
    with pytest.raises(error) as e:
        layer.set_weights(**w, **extra)
    if error is unimoe.Error:
        assert e.value.field == field, str(e.value)
    else:
        assert field in str(e.value)


def test_fp4_argument_refusals():
    g = torch.Generator().manual_seed(24)
    mx_config = f"policy=Renormalize E={E} K=2 H={H} I={I} quant=MXFP4"
    nv_config = f"policy=Renormalize E={E} K=2 H={H} I={I} quant=NVFP4"
    mx, nv = fp4_weights("MXFP4", 2 * I, g), fp4_weights("NVFP4", 2 * I, g)
    refused(mx_config, dict(mx, w13_scale=torch.ones(E)), "w13_scale")
    refused(nv_config, {k: v for k, v in nv.items() if k != "w2_scale"}, "w2_scale")
    refused(nv_config, dict(nv, w13_scale=torch.ones(E, 1)), "w13_scale")
    refused(mx_config, {k: v for k, v in mx.items() if k != "w2_block_scale"}, "w2_block_scale")
    refused(mx_config, dict(mx, w13_block_scale=mx["w13_block_scale"][:, :, :1].contiguous()),
            "w13_block_scale")
    refused(mx_config, dict(mx, w13=torch.zeros(E, 2 * I, H, dtype=torch.uint8)), "w13")
    refused(mx_config, dict(mx, w2=mx["w2"].float()), "w2", TypeError)
    if hasattr(torch, "float8_e8m0fnu"):  # e8m0 is MXFP4's scale type, not NVFP4's
        refused(nv_config, dict(nv, w2_block_scale=torch.ones(E, H, I // 16,
                                                              dtype=torch.float8_e8m0fnu)),
                "w2_block_scale", TypeError)
    refused(mx_config, mx, "w13_interleaved", TypeError, w13_interleaved=1)
    relu2 = f"policy=Renormalize E={E} K=2 H={H} I={I} quant=MXFP4 act=ReLU2"
    refused(relu2, fp4_weights("MXFP4", I, g), "w13_interleaved", w13_interleaved=True)

    bf16 = dict(w13=torch.zeros(E, 2 * I, H, dtype=torch.bfloat16),
                w2=torch.zeros(E, H, I, dtype=torch.bfloat16))
    bf16_config = f"policy=Renormalize E={E} K=2 H={H} I={I}"
    refused(bf16_config, dict(bf16, w13_block_scale=mx["w13_block_scale"]), "w13_block_scale")
    refused(bf16_config, bf16, "w13_interleaved", w13_interleaved=True)
    fp8 = {k: v.to(torch.float8_e4m3fn) for k, v in bf16.items()}
    fp8_config = f"policy=Renormalize E={E} K=2 H={H} I={I} quant=FP8PerTensor"
    refused(fp8_config, dict(fp8, w13_scale=torch.ones(E), w2_scale=torch.ones(E),
                             w2_block_scale=mx["w2_block_scale"]), "w2_block_scale")
    refused(fp8_config, dict(fp8, w13_scale=torch.ones(E), w2_scale=torch.ones(E)),
            "w13_interleaved", w13_interleaved=True)


def test_gpt_oss_mxfp4_checkpoint_tensors():
    """load_gpt_oss_mxfp4 reads a gpt-oss checkpoint's *_blocks and *_scales:
    the same output as the codes passed in unimoe's layout, interleaved."""
    g = torch.Generator().manual_seed(25)
    w = fp4_weights("MXFP4", 2 * I, g, bias=True)
    prefix = "model.layers.3.mlp.experts."
    tensors = {
        prefix + "gate_up_proj_blocks": w["w13"].view(E, 2 * I, H // 32, 16),
        prefix + "gate_up_proj_scales": w["w13_block_scale"],
        prefix + "gate_up_proj_bias": w["b13"].bfloat16(),
        prefix + "down_proj_blocks": w["w2"].view(E, H, I // 32, 16),
        prefix + "down_proj_scales": w["w2_block_scale"],
        prefix + "down_proj_bias": w["b2"].bfloat16(),
    }
    got = unimoe.load_gpt_oss_mxfp4(tensors, prefix)
    assert got["w13_interleaved"] is True
    for name in ("w13", "w2", "w13_block_scale", "w2_block_scale"):
        assert torch.equal(got[name], w[name]), name
    assert got["b13"].dtype == torch.float32
    config = f"policy=Renormalize E={E} K=4 H={H} I={I} quant=MXFP4 act=SwiGLUOai expert_bias=1"
    layer = unimoe.MoELayer(config, 32, device="cpu")
    layer.set_weights(**got)
    x, logits = bf16_values(T, H, generator=g).bfloat16(), torch.randn(T, E, generator=g)
    w13 = gate_then_up(dequant("MXFP4", w["w13"], w["w13_block_scale"], None))
    w2 = dequant("MXFP4", w["w2"], w["w2_block_scale"], None)
    b13 = gate_then_up(w["b13"].bfloat16().float())
    ids, rw = route("Renormalize", logits, 4)
    want = experts(x, ids, rw, w13, w2, "SwiGLUOai", b13, w["b2"].bfloat16().float())
    assert rel_err(layer(x, logits), want) < CPU_BOUND
    with pytest.raises(unimoe.Error) as e:
        unimoe.load_gpt_oss_mxfp4(tensors, "model.layers.4.mlp.experts.")
    assert e.value.field == "tensors" and "gate_up_proj_blocks" in str(e.value)


def test_load_hf_experts_refuses_swizzled_mxfp4_modules():
    class Mxfp4GptOssExperts(torch.nn.Module):  # the loaded form: uint8, not the checkpoint's
        def __init__(self):
            super().__init__()
            self.gate_up_proj = torch.nn.Parameter(
                torch.zeros(E, 2 * I, H // 32, 16, dtype=torch.uint8), requires_grad=False)
            self.down_proj = torch.nn.Parameter(
                torch.zeros(E, H, I // 32, 16, dtype=torch.uint8), requires_grad=False)

    with pytest.raises(unimoe.Error) as e:
        unimoe.load_hf_experts(Mxfp4GptOssExperts())
    assert e.value.field == "module" and "load_gpt_oss_mxfp4" in str(e.value)


# ----------------------------------------------------------------- GPU ----

GE, GH, GI = 16, 256, 128


def gpu_layer(quant, interleaved, seed, max_tokens=64):
    g = torch.Generator().manual_seed(seed)
    act = "SwiGLUOai" if interleaved else "SwiGLU"
    config = (f"policy=Renormalize E={GE} K=4 H={GH} I={GI} quant={quant} act={act} "
              f"expert_bias={int(interleaved)}")
    c13, s13, m13 = random_fp4(quant, GE, 2 * GI, GH, g)
    c2, s2, m2 = random_fp4(quant, GE, GH, GI, g)
    w = dict(w13=c13, w2=c2, w13_block_scale=s13, w2_block_scale=s2)
    if quant == "NVFP4":
        w.update(w13_scale=m13, w2_scale=m2)
    if interleaved:
        w.update(b13=torch.randn(GE, 2 * GI, generator=g) * 0.1,
                 b2=torch.randn(GE, GH, generator=g) * 0.1)
    layer = unimoe.MoELayer(config, max_tokens, device="cuda")
    layer.set_weights(w13_interleaved=interleaved, **{k: v.cuda() for k, v in w.items()})
    return layer


def gpu_inputs(t, seed):
    g = torch.Generator().manual_seed(seed)
    return bf16_values(t, GH, generator=g).bfloat16(), torch.randn(t, GE, generator=g)


@requires_gpu
@pytest.mark.parametrize("quant", ["MXFP4", "NVFP4"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_fp4_gpu_equals_the_reference(quant, interleaved):
    layer = gpu_layer(quant, interleaved, seed=30)
    for t in (1, 7, 64):
        x, logits = gpu_inputs(t, seed=t)
        got = layer(x.cuda(), logits.cuda())
        assert got.dtype == torch.bfloat16 and got.shape == (t, GH)
        want = layer(x, logits)  # CPU tensors: the reference, on host copies of the weights
        assert rel_err(got, want) < GPU_BOUND


@requires_gpu
@pytest.mark.parametrize("quant", ["MXFP4", "NVFP4"])
def test_fp4_cuda_graph_replay(quant):
    layer = gpu_layer(quant, True, seed=31)
    t = 12
    static_x, static_logits = (v.cuda() for v in gpu_inputs(t, seed=40))
    layer(static_x, static_logits)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = layer(static_x, static_logits)
    for seed in (41, 42):
        x, logits = gpu_inputs(t, seed=seed)
        static_x.copy_(x.cuda())
        static_logits.copy_(logits.cuda())
        graph.replay()
        assert torch.equal(static_out, layer(x.cuda(), logits.cuda()))
        assert rel_err(static_out, layer(x, logits)) < GPU_BOUND


# ------------------------------------------- NVFP4 checkpoint tensors ----

def nvfp4_checkpoint(seed, names=("gate_proj", "up_proj", "down_proj"), same_global=False):
    """Per-expert NVFP4 tensors as a ModelOpt export holds them (codes, e4m3
    block scales, one fp32 weight_scale_2 a projection; the gate's and up's
    differ unless same_global) and their fp64 values [(gate, up, down)]."""
    g = torch.Generator().manual_seed(seed)
    prefix = "model.layers.5.mlp.experts."
    tensors, plain = {}, []
    for e in range(E):
        values = []
        for j, (name, (rows, k)) in enumerate(zip(names, ((I, H), (I, H), (H, I)))):
            codes, scales, m = random_fp4("NVFP4", 1, rows, k, g)
            if same_global and j == 1:
                m = tensors[f"{prefix}{e}.{names[0]}.weight_scale_2"].reshape(1)
            key = f"{prefix}{e}.{name}"
            tensors[key + ".weight"] = codes[0]
            tensors[key + ".weight_scale"] = scales[0].view(torch.float8_e4m3fn)
            tensors[key + ".weight_scale_2"] = m.reshape(())
            tensors[key + ".input_scale"] = torch.tensor(1.0)  # W4A4's; not read
            values.append(dequant("NVFP4", codes, scales, m)[0])
        plain.append(values)
    return tensors, prefix, plain


@pytest.mark.parametrize("same_global", [True, False], ids=["shared", "different"])
def test_nvfp4_checkpoint_tensors(same_global):
    """load_nvfp4_experts stacks gate rows then up rows; with one
    weight_scale_2 for gate and up the layer matches the fp64 MoE on the
    checkpoint's values; with two, the smaller one's block scales move to
    the larger by at most half an e4m3 step."""
    tensors, prefix, plain = nvfp4_checkpoint(26, same_global=same_global)
    got = unimoe.load_nvfp4_experts(tensors, prefix)
    assert got["w13"].shape == (E, 2 * I, H // 2) and got["w13"].dtype == torch.uint8
    assert got["w13_block_scale"].shape == (E, 2 * I, H // 16)
    assert got["w13_scale"].shape == (E,) and got["w2_scale"].shape == (E,)
    w13 = dequant("NVFP4", got["w13"], got["w13_block_scale"].view(torch.uint8), got["w13_scale"])
    w2 = dequant("NVFP4", got["w2"], got["w2_block_scale"].view(torch.uint8), got["w2_scale"])
    want13 = torch.stack([torch.cat([gate, up]) for gate, up, _ in plain])
    want2 = torch.stack([down for _, _, down in plain])
    assert torch.equal(w2, want2)
    if same_global:
        assert torch.equal(w13, want13)
    else:
        # Each value moves by at most half an e4m3 step of its block scale.
        moved = (w13 - want13).abs()
        assert (moved <= want13.abs() * 2 ** -4 * (1 + 1e-6) + 1e-12).all()
        assert moved.max() > 0
    config = f"policy=Renormalize E={E} K=2 H={H} I={I} quant=NVFP4"
    layer = unimoe.MoELayer(config, 32, device="cpu")
    layer.set_weights(**got)
    g = torch.Generator().manual_seed(27)
    x, logits = bf16_values(T, H, generator=g).bfloat16(), torch.randn(T, E, generator=g)
    want = experts(x, *route("Renormalize", logits, 2), w13, w2)
    assert rel_err(layer(x, logits), want) < CPU_BOUND


def test_nvfp4_checkpoint_refusals():
    tensors, prefix, _ = nvfp4_checkpoint(28, names=("w1", "w3", "w2"))
    assert unimoe.load_nvfp4_experts(tensors, prefix, experts=range(1, 3))["w13"].shape[0] == 2
    missing = dict(tensors)
    del missing[prefix + "3.w2.weight_scale_2"]
    with pytest.raises(unimoe.Error, match="no model.layers.5.mlp.experts.3.w2.weight_scale_2") \
            as e:
        unimoe.load_nvfp4_experts(missing, prefix)
    assert e.value.field == "tensors"
    wrong = dict(tensors)
    wrong[prefix + "0.w1.weight_scale"] = torch.zeros(I, H // 32, dtype=torch.float8_e4m3fn)
    with pytest.raises(unimoe.Error, match=r"0.w1.weight_scale is torch.float8_e4m3fn \(32, 2\)"):
        unimoe.load_nvfp4_experts(wrong, prefix)
