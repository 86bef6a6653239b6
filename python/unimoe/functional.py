"""fused_experts: the experts of an MoE layer as one function of the
weights and a routing the caller computed, the shape of call that model
code written for other MoE libraries makes (hidden states, w13, w2, top-k
weights and ids). It keeps one MoELayer per set of weights (made on the
first call, with the weights set once) and reuses it.

Layers it makes hold their own buffers, sized for max_tokens: the largest
T seen so far rounded up to a power of two (at least 64), or the
max_tokens given. A call with more tokens than a layer was made for makes
it again, which allocates: do that before capturing a CUDA graph (a call
with the largest T, or max_tokens=), since inside a capture a new layer is
refused with RuntimeError. clear_fused_experts_cache() drops the layers and
their references to the weights.
"""

from typing import Optional

import torch

from ._lib import Error
from .layer import MoELayer

_ACTIVATIONS = {"silu": "SwiGLU", "swiglu": "SwiGLU", "gelu": "GeGLU", "geglu": "GeGLU",
                "relu2": "ReLU2", "swigluoai": "SwiGLUOai"}

# (config text, device, the weight tensors' addresses and shapes) -> (layer,
# the tensors it was given, which the entry keeps alive so that their
# addresses are not reused by other tensors while it exists).
_cache = {}


def clear_fused_experts_cache():
    """Drops every layer fused_experts made and its references to the weights."""
    _cache.clear()


def _quant_of(w13, w13_scale, w13_block_scale):
    if w13.dtype == torch.bfloat16:
        return "BF16"
    if w13.dtype == torch.float8_e4m3fn:
        if w13_scale is None:
            raise Error("w13_scale: FP8 weights need their scales", "w13_scale")
        return "FP8Block128" if w13_scale.dim() == 3 else "FP8PerTensor"
    if w13.dtype == torch.uint8 or str(w13.dtype) == "torch.float4_e2m1fn_x2":
        if w13_block_scale is None:
            raise Error("w13_block_scale: 4-bit weights need their block scales",
                        "w13_block_scale")
        blocks = w13_block_scale.shape[-1]
        return "MXFP4" if blocks * 32 == 2 * w13.shape[-1] else "NVFP4"
    raise Error(f"w13: {w13.dtype} is no weight dtype unimoe serves (bf16, float8_e4m3fn, "
                "uint8 e2m1 pairs)", "w13")


def fused_experts(x, w13, w2, topk_weights, topk_ids, *, activation="SwiGLU",
                  num_experts=None, local_expert_offset=0, b13=None, b2=None,
                  w13_scale=None, w2_scale=None, x_scale=None, act_scale=None,
                  w13_block_scale=None, w2_block_scale=None, w13_interleaved=False,
                  swiglu_alpha=None, swiglu_limit=None, max_tokens=None):
    """out [T, H] bf16 = sum over k of topk_weights[t, k] * expert
    topk_ids[t, k] (x[t]), for the experts of w13 [E_local, gemm1_cols, H]
    (gate rows, then up rows) and w2 [E_local, H, I] in the layouts of
    MoELayer.set_weights (docs/python.md); the variant follows the weights:
    bf16 is BF16, float8_e4m3fn with 3-D scales FP8Block128 and with
    [E_local] scales FP8PerTensor, uint8 codes with block scales MXFP4 (one
    per 32 values) or NVFP4 (per 16).

    x [T, H] bf16; topk_ids [T, K] int32 (int64 is converted) and
    topk_weights [T, K] fp32, ids outside [local_expert_offset,
    local_expert_offset + E_local) skipped (an expert-parallel rank's
    slice of num_experts experts; num_experts defaults to E_local).
    activation: "SwiGLU" (or "silu"), "GeGLU" ("gelu"), "ReLU2",
    "SwiGLUOai" (with biases b13, b2 and swiglu_alpha, swiglu_limit);
    w13_interleaved: 4-bit w13 rows alternating gate and up (gpt-oss's). The
    computation runs on x's device: the GPU layer on a CUDA device, the CPU
    reference on the CPU. It is the custom op unimoe::fused_experts, so
    torch.compile(fullgraph=True) takes a model that calls it."""
    return _fused_experts_op(x, w13, w2, topk_weights, topk_ids, str(activation), num_experts,
                             local_expert_offset, b13, b2, w13_scale, w2_scale, x_scale,
                             act_scale, w13_block_scale, w2_block_scale, bool(w13_interleaved),
                             swiglu_alpha, swiglu_limit, max_tokens)


@torch.library.custom_op("unimoe::fused_experts", mutates_args=())
def _fused_experts_op(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str,
                      num_experts: Optional[int], local_expert_offset: int,
                      b13: Optional[torch.Tensor], b2: Optional[torch.Tensor],
                      w13_scale: Optional[torch.Tensor], w2_scale: Optional[torch.Tensor],
                      x_scale: Optional[torch.Tensor], act_scale: Optional[torch.Tensor],
                      w13_block_scale: Optional[torch.Tensor],
                      w2_block_scale: Optional[torch.Tensor], w13_interleaved: bool,
                      swiglu_alpha: Optional[float], swiglu_limit: Optional[float],
                      max_tokens: Optional[int]) -> torch.Tensor:
    """fused_experts with every argument positional."""
    if x.dim() != 2:
        raise Error(f"x: {tuple(x.shape)}; expected [T, H]", "x")
    if topk_ids.dtype == torch.int64:
        topk_ids = topk_ids.to(torch.int32)
    act = _ACTIVATIONS.get(str(activation).lower(), activation)
    quant = _quant_of(w13, w13_scale, w13_block_scale)
    e_local = w13.shape[0]
    e = e_local if num_experts is None else num_experts
    k = topk_ids.shape[-1] if topk_ids.dim() == 2 else 0
    inter = w2.shape[-1] * (2 if quant in ("MXFP4", "NVFP4") else 1)
    text = (f"policy=TopK E={e} K={k} H={x.shape[-1]} I={inter} act={act} quant={quant} "
            f"local_offset={local_expert_offset} local_experts={e_local} "
            f"expert_bias={int(b13 is not None)}")
    if swiglu_alpha is not None:
        text += f" alpha={swiglu_alpha}"
    if swiglu_limit is not None:
        text += f" limit={swiglu_limit}"
    weights = dict(w13=w13, w2=w2, b13=b13, b2=b2, w13_scale=w13_scale, w2_scale=w2_scale,
                   x_scale=x_scale, act_scale=act_scale, w13_block_scale=w13_block_scale,
                   w2_block_scale=w2_block_scale)
    given = {n: v for n, v in weights.items() if v is not None}
    key = (text, str(x.device), w13_interleaved) + tuple((n, v.data_ptr(), tuple(v.shape), str(v.dtype))
                                        for n, v in sorted(given.items()))
    t = x.shape[0]
    entry = _cache.get(key)
    if entry is None or entry[0].max_tokens < t:
        if max_tokens is not None:
            if t > max_tokens:
                raise Error(f"x: {t} tokens; max_tokens is {max_tokens}", "x")
            want = max_tokens
        else:
            want = max(64, 1 << max(t - 1, 0).bit_length())
            if entry is not None:
                want = max(want, 2 * entry[0].max_tokens)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"unimoe.fused_experts: a layer for {t} tokens would be made during CUDA-graph "
                "capture (it allocates): call it once before capturing with the largest token "
                "count, or pass max_tokens")
        layer = MoELayer(text, want, device=x.device)
        layer.set_weights(w13_interleaved=w13_interleaved, **given)
        entry = (layer, given)
        _cache[key] = entry
    return entry[0](x, topk_ids=topk_ids, topk_weights=topk_weights)


@_fused_experts_op.register_fake
def _fused_experts_fake(x, w13, w2, topk_weights, topk_ids, *args):
    return x.new_empty((x.shape[0], x.shape[-1]), dtype=torch.bfloat16)
