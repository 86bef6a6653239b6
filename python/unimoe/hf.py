"""Hugging Face transformers models: their MoE experts in unimoe's layout.

unimoe's layer is the routed experts and their routing: a model's router
weights (the gate Linear that makes the logits) stay with the model, which
computes router_logits with it, and so do shared experts (Qwen2-MoE,
DeepSeek-V3, Llama-4), which the caller adds to the layer's output.
"""

import json
import os
import pathlib

import torch

from . import _lib
from ._lib import Error
from .config import MoEConfig

# Experts classes that store their matrices transposed ([E, H, 2I] and
# [E, I, H]) without saying so in an is_transposed attribute.
_TRANSPOSED = ("Llama4TextExperts",)


def _experts_of(module):
    experts = getattr(module, "experts", module)
    if experts is None:
        raise Error(f"module: {type(module).__name__} has no experts", "module")
    return experts


def _refuse_fp8(weight, name):
    """FP8 weights hold codes whose scales live beside them: converting
    them to bf16 would drop the scales."""
    if weight.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise Error(f"module: {name}'s weights are {weight.dtype} codes; their scales live "
                    "beside them, so they are not converted: read them with "
                    "load_fp8_block_experts (weight_scale_inv per 128 x 128 block) or "
                    "load_fp8_tensor_experts (one weight_scale), e.g. of "
                    "block.experts.state_dict()", "module")


def _fused(experts, dtype):
    """Experts with 3-D parameters gate_up_proj (or up_proj) and down_proj,
    as transformers 5 stores them. Their layout attributes (is_transposed,
    is_concatenated, has_gate, has_bias) say how; classes without them are
    [E, 2I, H] with the gate half first, except those in _TRANSPOSED."""
    name = type(experts).__name__
    transposed = getattr(experts, "is_transposed", name in _TRANSPOSED)
    concatenated = getattr(experts, "is_concatenated", True)
    gated = getattr(experts, "has_gate", True)
    w13 = experts.gate_up_proj if gated else experts.up_proj
    w2 = experts.down_proj
    if not isinstance(w13, torch.Tensor) or not w13.is_floating_point():
        raise Error(f"module: {name}'s experts are quantized ({type(w13).__name__} "
                    f"{getattr(w13, 'dtype', '')}); for gpt-oss's MXFP4 read the checkpoint's "
                    "tensors with load_gpt_oss_mxfp4", "module")
    _refuse_fp8(w13, name)
    if w13.dim() != 3 or w2.dim() != 3:
        raise Error(f"module: {name}'s expert matrices are not 3-D", "module")
    if transposed:  # [E, H, 2I] and [E, I, H]
        w13, w2 = w13.transpose(1, 2), w2.transpose(1, 2)
    e, n1, h = w13.shape
    if tuple(w2.shape[:2]) != (e, h):
        read_as = "transposed" if transposed else "not transposed"
        raise Error(f"module: {name}'s down_proj {tuple(w2.shape)} does not match "
                    f"gate_up_proj {tuple(w13.shape)} (read as {read_as})", "module")
    b13 = getattr(experts, "gate_up_proj_bias" if gated else "up_proj_bias", None)
    b2 = getattr(experts, "down_proj_bias", None)
    if gated and not concatenated:  # gate and up columns interleaved: g0 u0 g1 u1 ...
        w13 = torch.cat([w13[:, 0::2], w13[:, 1::2]], dim=1)
        if b13 is not None:
            b13 = torch.cat([b13[:, 0::2], b13[:, 1::2]], dim=1)
    out = {"w13": w13.detach().to(dtype).contiguous(), "w2": w2.detach().to(dtype).contiguous()}
    if b13 is not None and b2 is not None:
        out["b13"] = b13.detach().float().contiguous()
        out["b2"] = b2.detach().float().contiguous()
    return out


# Names of the gate, up and down Linear of one expert module, by checkpoint style.
_PER_EXPERT = (("w1", "w3", "w2"), ("gate_proj", "up_proj", "down_proj"))


def _per_expert(experts, dtype):
    """A ModuleList of expert MLPs, each with a gate, up and down Linear
    (older Mixtral: w1, w3, w2; older Qwen and DeepSeek: gate_proj,
    up_proj, down_proj)."""
    first = experts[0]
    for gate, up, down in _PER_EXPERT:
        if all(hasattr(first, n) for n in (gate, up, down)):
            break
    else:
        raise Error(f"module: the expert {type(first).__name__} has none of the known "
                    "gate/up/down Linear names (w1/w3/w2, gate_proj/up_proj/down_proj)", "module")
    _refuse_fp8(getattr(first, gate).weight, type(first).__name__)
    w13 = torch.stack([torch.cat([getattr(m, gate).weight, getattr(m, up).weight])
                       for m in experts])
    w2 = torch.stack([getattr(m, down).weight for m in experts])
    out = {"w13": w13.detach().to(dtype).contiguous(), "w2": w2.detach().to(dtype).contiguous()}
    if getattr(first, gate).bias is not None:
        out["b13"] = torch.stack([torch.cat([getattr(m, gate).bias, getattr(m, up).bias])
                                  for m in experts]).detach().float().contiguous()
        out["b2"] = torch.stack([getattr(m, down).bias
                                 for m in experts]).detach().float().contiguous()
    return out


def load_hf_experts(module, dtype=torch.bfloat16):
    """The routed experts of a transformers MoE block (or of its experts
    module) as set_weights' keyword arguments, on the module's device:
    w13 [E, gemm1_cols, H] (gate rows, then up rows), w2 [E, H, I] in
    `dtype`, and fp32 biases b13 [E, gemm1_cols], b2 [E, H] where the model
    has them (gpt-oss).

    Reads transformers 5's fused experts (gate_up_proj [E, 2I, H] and
    down_proj [E, H, I]: Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3; the
    transposed [E, H, 2I] / [E, I, H] of Llama-4; gpt-oss's transposed,
    interleaved gate/up columns with biases) and a ModuleList of per-expert
    Linear layers (w1/w3/w2 or gate_proj/up_proj/down_proj). Not the router
    and not the shared experts: see the module's docstring."""
    experts = _experts_of(module)
    if isinstance(experts, torch.nn.ModuleList):
        return _per_expert(experts, dtype)
    if hasattr(experts, "down_proj") and (hasattr(experts, "gate_up_proj")
                                          or hasattr(experts, "up_proj")):
        return _fused(experts, dtype)
    raise Error(f"module: {type(experts).__name__} is no experts layout this function knows "
                "(gate_up_proj/down_proj parameters, or a ModuleList of expert MLPs)", "module")


def load_gpt_oss_mxfp4(tensors, prefix=""):
    """set_weights' keyword arguments for a quant=MXFP4 layer from the
    MXFP4 experts of a gpt-oss checkpoint. tensors maps names to tensors
    (a state dict, or safetensors.torch.load_file of a checkpoint file);
    prefix is the experts module's, e.g. "model.layers.0.mlp.experts.".
    Reads {prefix}gate_up_proj_blocks [E, 2I, H/32, 16] and
    down_proj_blocks [E, H, I/32, 16] (uint8, e2m1 pairs), their _scales
    [E, 2I, H/32] and [E, H, I/32] (uint8, e8m0) and the biases
    gate_up_proj_bias [E, 2I] and down_proj_bias [E, H]. Returns the codes
    and scales as they are (w13 and w2 viewed as [E, rows, K/2], no copy),
    the biases as fp32 copies, and w13_interleaved=True: gpt-oss's w13 rows
    alternate gate and up, and set_weights reorders them. Not for a loaded
    transformers model: its Mxfp4GptOssExperts holds triton_kernels'
    swizzled layout, not these tensors."""
    def get(name):
        key = prefix + name
        if key not in tensors:
            raise Error(f"tensors: no {key}", "tensors")
        return tensors[key]

    out = {"w13_interleaved": True}
    for proj, codes, scales, bias in (("gate_up_proj", "w13", "w13_block_scale", "b13"),
                                      ("down_proj", "w2", "w2_block_scale", "b2")):
        blocks, s = get(proj + "_blocks"), get(proj + "_scales")
        if (blocks.dtype != torch.uint8 or blocks.dim() != 4 or blocks.shape[-1] != 16
                or s.dtype != torch.uint8 or tuple(s.shape) != tuple(blocks.shape[:3])):
            raise Error(f"tensors: {prefix}{proj}_blocks {blocks.dtype} {tuple(blocks.shape)} "
                        f"and _scales {s.dtype} {tuple(s.shape)}; expected uint8 "
                        "[E, rows, K/32, 16] and [E, rows, K/32]", "tensors")
        e, rows, k_blocks, _ = blocks.shape
        out[codes] = blocks.contiguous().view(e, rows, k_blocks * 16)
        out[scales] = s.contiguous()
        out[bias] = get(proj + "_bias").detach().float().contiguous()
    return out


# Names of one expert's gate, up and down projections in the FP8
# checkpoints: DeepSeek-V3/R1, Kimi-K2, Qwen3-FP8, GLM-4.5 (gate_proj,
# up_proj, down_proj); MiniMax-M2 and Mixtral-style experts (w1, w3, w2).
_FP8_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


def load_fp8_block_experts(tensors, prefix="", experts=None):
    """set_weights' keyword arguments for a quant=FP8Block128 layer from the
    per-expert tensors of a block-scaled FP8 checkpoint (DeepSeek-V3/R1,
    Kimi-K2, Qwen3-FP8, MiniMax-M2, GLM-4.5). tensors maps names to tensors
    (a state dict, or what safetensors.torch.load_file gives); prefix is the
    experts module's, e.g. "model.layers.3.mlp.experts.". For each expert e
    it reads {prefix}{e}.gate_proj.weight and up_proj.weight [I, H] and
    down_proj.weight [H, I] (float8_e4m3fn; or w1, w3 and w2), each with its
    weight_scale_inv, the fp32 factor of each 128 x 128 block
    ([I/128, H/128] and [H/128, I/128]; the checkpoint multiplies by it, as
    unimoe's scales do). experts: the indices to take, in order (an
    expert-parallel rank's range, e.g. range(32, 64)); by default every
    index the tensors hold, which must be 0..E-1.

    Returns new tensors on the checkpoint tensors' device: w13 [E, 2I, H]
    (each expert's gate rows, then its up rows) and w2 [E, H, I] in
    float8_e4m3fn, w13_scale [E, 2I/128, H/128] and w2_scale
    [E, H/128, I/128] in fp32. H and I must be multiples of 128, as the
    layer needs: otherwise the gate's last block row would hold rows of
    the up projection once they are stacked."""
    experts, (gate, up, down), w = _first_expert(tensors, prefix, experts, "[I, H]")
    inter, hidden = w.shape
    for name, v in (("H", hidden), ("I", inter)):
        if v % 128:
            raise Error(f"tensors: {name} = {v} is not a multiple of 128, which FP8Block128 "
                        "needs (the gate's and up's last 128-row scale blocks would mix once "
                        "stacked)", "tensors")
    codes = (torch.float8_e4m3fn,)
    scales = (torch.float32, torch.bfloat16, torch.float16)
    w13, w2, s13, s2 = [], [], [], []
    for e in experts:
        gate_up = []
        for proj, rows, cols in ((gate, inter, hidden), (up, inter, hidden),
                                 (down, hidden, inter)):
            key = f"{prefix}{e}.{proj}"
            c = _checked(tensors, key + ".weight", codes, (rows, cols),
                         f"float8_e4m3fn [{rows}, {cols}]")
            sc = _checked(tensors, key + ".weight_scale_inv", scales, (rows // 128, cols // 128),
                          f"fp32 [{rows // 128}, {cols // 128}]")
            gate_up.append((c, sc.float()))
        (gc, gs), (uc, us), (dc, ds) = gate_up
        w13.append(torch.cat([gc, uc]))
        s13.append(torch.cat([gs, us]))
        w2.append(dc)
        s2.append(ds)
    return {"w13": torch.stack(w13).contiguous(), "w2": torch.stack(w2).contiguous(),
            "w13_scale": torch.stack(s13).contiguous(), "w2_scale": torch.stack(s2).contiguous()}


def load_fp8_tensor_experts(tensors, prefix="", experts=None):
    """set_weights' keyword arguments for a quant=FP8PerTensor layer from the
    per-expert tensors of a per-tensor FP8 checkpoint (compressed-tensors
    and AutoFP8 exports of Mixtral, Qwen-MoE and others). For each expert e
    it reads {prefix}{e}.w1.weight, w3.weight [I, H] and w2.weight [H, I]
    (float8_e4m3fn; or gate_proj, up_proj, down_proj), each with its
    weight_scale (one fp32 factor) and, in a checkpoint of static
    activation scales, its input_scale. experts: as for
    load_fp8_block_experts.

    unimoe's FP8PerTensor has one scale per expert for w13, so where the
    gate's and up's scales differ the one with the smaller scale is
    requantized to the larger (its codes times its scale over the larger,
    rounded to e4m3 at nearest, ties to even: it loses at most half an e4m3
    step a value; the other keeps its codes), as other engines load these
    checkpoints. The static scales are the largest over the experts (the
    layer takes one for x and one for the intermediate): x_scale from the
    gate's and up's input_scale, act_scale from the down projection's. A
    checkpoint without input_scale gives no static scales (the layer then
    computes them per call). Returns new tensors: w13 [E, 2I, H], w2
    [E, H, I] (float8_e4m3fn), w13_scale, w2_scale [E] (fp32), and x_scale,
    act_scale [1] (fp32) where the checkpoint has them."""
    experts, (gate, up, down), w = _first_expert(tensors, prefix, experts, "[I, H]")
    inter, hidden = w.shape

    def scalar(key, required):
        if key not in tensors:
            if required:
                raise Error(f"tensors: no {key}", "tensors")
            return None
        v = tensors[key]
        if not v.is_floating_point() or v.numel() != 1:
            raise Error(f"tensors: {key} is {v.dtype} {tuple(v.shape)}; expected one float",
                        "tensors")
        return v.reshape(1).float()

    w13, w2, s13, s2, x_in, act_in = [], [], [], [], [], []
    for e in experts:
        codes, scales, inputs = [], [], []
        for proj, rows, cols in ((gate, inter, hidden), (up, inter, hidden),
                                 (down, hidden, inter)):
            key = f"{prefix}{e}.{proj}"
            c = tensors.get(key + ".weight")
            if c is None:
                raise Error(f"tensors: no {key}.weight", "tensors")
            if c.dtype != torch.float8_e4m3fn or tuple(c.shape) != (rows, cols):
                raise Error(f"tensors: {key}.weight is {c.dtype} {tuple(c.shape)}; expected "
                            f"float8_e4m3fn [{rows}, {cols}]", "tensors")
            codes.append(c)
            scales.append(scalar(key + ".weight_scale", True))
            inputs.append(scalar(key + ".input_scale", False))
        (gc, uc, dc), (gs, us, ds) = codes, scales
        shared = torch.maximum(gs, us)
        w13.append(torch.cat([_requantized(gc, gs, shared), _requantized(uc, us, shared)]))
        s13.append(shared)
        w2.append(dc)
        s2.append(ds)
        x_in += inputs[:2]
        act_in.append(inputs[2])
    out = {"w13": torch.stack(w13).contiguous(), "w2": torch.stack(w2).contiguous(),
           "w13_scale": torch.cat(s13).contiguous(), "w2_scale": torch.cat(s2).contiguous()}
    given = [v is not None for v in x_in + act_in]
    if any(given) and not all(given):
        raise Error(f"tensors: some projections of {prefix!r} have an input_scale and some do "
                    "not; a static scale needs all of them", "tensors")
    if all(given):
        out["x_scale"] = torch.stack(x_in).max().reshape(1)
        out["act_scale"] = torch.stack(act_in).max().reshape(1)
    return out


def load_nvfp4_experts(tensors, prefix="", experts=None):
    """set_weights' keyword arguments for a quant=NVFP4 layer from the
    per-expert tensors of an NVFP4 checkpoint (NVIDIA ModelOpt exports, e.g.
    of DeepSeek-R1 and Qwen3). For each expert e it reads
    {prefix}{e}.gate_proj, up_proj and down_proj (or w1, w3, w2):
    .weight (uint8 [rows, cols/2], e2m1 codes two a byte, the even index in
    the low nibble), .weight_scale (float8_e4m3fn [rows, cols/16], one per
    16 values along K) and .weight_scale_2 (one fp32 factor): a weight is
    its e2m1 value times its block's weight_scale times weight_scale_2, as
    unimoe's NVFP4 is. The input_scale of W4A4 checkpoints is not read (the
    layer's activations are bf16). experts: as for load_fp8_block_experts.

    unimoe's NVFP4 has one matrix scale per expert for w13, so where the
    gate's and up's weight_scale_2 differ, the block scales of the one with
    the smaller factor are multiplied by the ratio of the two and rounded to
    e4m3 (at most half an e4m3 step, 2^-4, a block; the codes and the other
    projection are unchanged). Returns new tensors: w13 [E, 2I, H/2] and w2
    [E, H, I/2] (uint8), w13_block_scale [E, 2I, H/16] and w2_block_scale
    [E, H, I/16] (float8_e4m3fn), w13_scale and w2_scale [E] (fp32)."""
    experts, (gate, up, down), w = _first_expert(tensors, prefix, experts, "[I, H/2]")
    inter, hidden = w.shape[0], 2 * w.shape[1]
    for name, v in (("H", hidden), ("I", inter)):
        if v % 16:
            raise Error(f"tensors: {name} = {v} is not a multiple of 16 (one e4m3 scale per 16 "
                        "values)", "tensors")

    w13, w2, b13, b2, s13, s2 = [], [], [], [], [], []
    for e in experts:
        parts = []
        for proj, rows, cols in ((gate, inter, hidden), (up, inter, hidden),
                                 (down, hidden, inter)):
            key = f"{prefix}{e}.{proj}"
            c = _checked(tensors, key + ".weight", (torch.uint8,), (rows, cols // 2),
                         f"uint8 [{rows}, {cols // 2}]")
            b = _checked(tensors, key + ".weight_scale", (torch.float8_e4m3fn, torch.uint8),
                         (rows, cols // 16),
                         f"float8_e4m3fn [{rows}, {cols // 16}]").view(torch.float8_e4m3fn)
            m = tensors.get(key + ".weight_scale_2")
            if m is None:
                raise Error(f"tensors: no {key}.weight_scale_2", "tensors")
            if not m.is_floating_point() or m.numel() != 1:
                raise Error(f"tensors: {key}.weight_scale_2 is {m.dtype} {tuple(m.shape)}; "
                            "expected one float", "tensors")
            parts.append((c, b, m.reshape(1).float()))
        (gc, gb, gm), (uc, ub, um), (dc, db, dm) = parts
        shared = torch.maximum(gm, um)
        w13.append(torch.cat([gc, uc]))
        b13.append(torch.cat([_requantized(gb, gm, shared), _requantized(ub, um, shared)]))
        s13.append(shared)
        w2.append(dc)
        b2.append(db)
        s2.append(dm)
    return {"w13": torch.stack(w13).contiguous(), "w2": torch.stack(w2).contiguous(),
            "w13_block_scale": torch.stack(b13).contiguous(),
            "w2_block_scale": torch.stack(b2).contiguous(),
            "w13_scale": torch.cat(s13).contiguous(), "w2_scale": torch.cat(s2).contiguous()}


def _requantized(codes, scale, target):
    """e4m3 codes of codes * scale at the scale `target` (>= scale): the
    same codes where the scales are equal (FP8 weights, and NVFP4's e4m3
    block scales under their matrix scale)."""
    if torch.equal(scale, target):
        return codes
    return (codes.float() * (scale / target)).to(torch.float8_e4m3fn)


def _checked(tensors, key, dtypes, shape, what):
    """tensors[key], which must exist with one of `dtypes` and `shape`."""
    if key not in tensors:
        raise Error(f"tensors: no {key}", "tensors")
    t = tensors[key]
    if t.dtype not in dtypes or tuple(t.shape) != shape:
        raise Error(f"tensors: {key} is {t.dtype} {tuple(t.shape)}; expected {what}", "tensors")
    return t


def _first_expert(tensors, prefix, experts, shape):
    """The expert indices to load (every one there when None), the
    projection names they use, and the first expert's gate weight, which
    must be 2-D (`shape` says how)."""
    if experts is None:
        experts = _expert_indices(tensors, prefix)
    experts = list(experts)
    if not experts:
        raise Error(f"tensors: no expert of {prefix!r} to load", "tensors")
    names = _fp8_names(tensors, prefix, experts[0])
    key = prefix + f"{experts[0]}.{names[0]}.weight"
    w = tensors[key]
    if w.dim() != 2:
        raise Error(f"tensors: {key} is {tuple(w.shape)}; expected {shape}", "tensors")
    return experts, names, w


def _fp8_names(tensors, prefix, first):
    """The (gate, up, down) projection names of expert `first`."""
    for names in _FP8_NAMES:
        if prefix + f"{first}.{names[0]}.weight" in tensors:
            return names
    raise Error(f"tensors: no {prefix}{first}.gate_proj.weight (nor .w1.weight)", "tensors")


def _expert_indices(tensors, prefix):
    """The expert indices of {prefix}{e}.<gate>.weight names, which must be
    0..E-1."""
    found = set()
    for key in tensors:
        if not key.startswith(prefix):
            continue
        head, _, rest = key[len(prefix):].partition(".")
        if head.isdigit() and rest in (f"{g}.weight" for g, _, _ in _FP8_NAMES):
            found.add(int(head))
    if found and found != set(range(len(found))):
        missing = sorted(set(range(max(found) + 1)) - found)
        raise Error(f"tensors: the experts of {prefix!r} are not 0..{max(found)} (missing "
                    f"{missing[:8]}); pass experts= the indices to load", "tensors")
    return sorted(found)


def _config_dict(hf_config):
    """A PretrainedConfig's dict with its attribute_map's aliases filled in:
    transformers 5 writes some keys under another name than the published
    config.json files (Qwen3-MoE's num_experts as num_local_experts)."""
    d = hf_config.to_dict()
    for alias in getattr(hf_config, "attribute_map", {}):
        if alias not in d and hasattr(hf_config, alias):
            d[alias] = getattr(hf_config, alias)
    return d


def from_hf_config(hf_config):
    """The MoEConfig of a transformers model's routed experts, from its
    config: a PretrainedConfig, the dict of a config.json, or the path of a
    config.json (or of the folder holding it). The C++ config_from_hf_json
    reads it (docs/hf-configs.md: the model types, the mapping, and what is
    refused, as unimoe.Error naming the key, e.g. "hf_config.model_type")."""
    if isinstance(hf_config, (str, os.PathLike)):
        path = pathlib.Path(hf_config)
        if path.is_dir():
            path = path / "config.json"
        text = path.read_text()
    elif isinstance(hf_config, dict):
        text = json.dumps(hf_config)
    elif hasattr(hf_config, "to_dict"):
        text = json.dumps(_config_dict(hf_config), default=str)
    else:
        raise TypeError(f"hf_config: {type(hf_config).__name__} is neither a PretrainedConfig, "
                        "a dict nor a path")
    return MoEConfig.parse(_lib.call_str(_lib.lib.unimoe_config_from_hf_json, text.encode()))
