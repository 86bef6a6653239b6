#!/usr/bin/env python3
"""The MXFP4 peer: the experts of an MoE layer with 4-bit weights (MXFP4:
e2m1 values, one e8m0 scale per 32 along the reduction) and bf16
activations, run by OpenAI's triton_kernels `matmul_ogs` the way vLLM 0.26.0
runs gpt-oss on Hopper. The triton_kernels sources are the copy vendored in
the vllm==0.26.0 wheel (vllm/third_party/triton_kernels), fetched into
.deps/peers by `scripts/setup.sh --peers`; vLLM itself is not needed.

What one call does (both figures):
  GEMM1   matmul_ogs over the rows gathered by expert, the SwiGLU fused in
          its epilogue, into a bf16 [T*K, I] buffer;
  GEMM2   matmul_ogs over those rows, each scaled by its routing weight and
          summed into its token's row (the library's scatter + reduce).
`us` times those two calls with the routing metadata (the token order by
expert, the tile map) built once beforehand; `us_incl_routing_metadata`
also builds it in every call: the top-k ids packed into a bitmatrix (a
small Triton kernel of this file, where vLLM has its own) and
triton_kernels.routing.routing_from_bitmatrix. Neither figure has the router
(logits, softmax, top-k): the top-k is given, random and uniform over the
experts (seeded), its K weights a softmax of random values.

Activations: gpt-oss shapes use gpt-oss's SwiGLU, the library's
`swiglu_fn` (alpha 1.702, clamp limit 7.0) with fp32 biases on both GEMMs,
as vLLM does. triton_kernels ships no other fused activation (FusedActivation
takes any Triton function; swiglu_fn is the only one in the package), and
swiglu_fn computes gate*sigmoid(alpha*gate)*(up + 1); the other shapes get
the plain SiLU-and-multiply from it exactly: alpha 1, a limit too large to
clamp (1e30), and a bias of -1 on the up rows of GEMM1 (0 on the gate rows),
so that (up - 1) + 1 = up. That bias read is the only work a bias-free layer
would not do. The output reports which one ran ("activation").

Weights, as vLLM 0.26.0 prepares a gpt-oss checkpoint for its Triton MXFP4
backend on sm_90 (oracle/mxfp4.py, utils/mxfp4_utils.py): w13 [E, 2I, H/2]
uint8 (two e2m1 per byte, the lower nibble first; rows alternate gate, up)
with scales [E, 2I, H/32], w2 [E, H, I/2] with scales [E, H, I/32]; each
scale tensor's group axis padded to a multiple of 4 (vLLM's Hopper
workaround), each weight and scale viewed K-major ([E, K, N]) and converted
to triton_kernels' HopperMXValueLayout / HopperMXScaleLayout (mx_axis 1,
8 warps); split-k pinned to 1. I is padded to a multiple of 64 and H to a
multiple of 32 where needed (vLLM's padding for this backend); the output
says so ("padded").

Timing: all calls of one point captured in one CUDA graph, one call per copy
of the weights: C copies (identical values, separate memory), C chosen so
that the other copies' touched experts pass at least 2x the L2 size between
two uses of one copy (the weights are read from HBM, not L2). Each replay is
timed with CUDA events; the figure is the median replay over C. Routing,
input and output buffers are shared by the copies.

Correctness: `rel_err`, the relative error (Frobenius norm) of the first
--check-tokens tokens' outputs against a PyTorch reference on the GPU: the
same routing and bf16-rounded routing weights, the weights dequantized to
fp32, the activation and biases in fp32.

    python3 bench/peers/oai_mxfp4_peer.py --shapes gpt-oss-120b,qwen3-30b-a3b --tokens 1,64,4096
    python3 bench/peers/oai_mxfp4_peer.py --dry-run    # the plan, no GPU

Output: one JSON line per (shape, T), flushed as measured, e.g.
    {"peer": "oai_mxfp4_w4a16", "shape": "gpt-oss-120b", "T": 64, "us": 310.2,
     "us_incl_routing_metadata": 331.5, "rel_err": 0.0035, ...}
A point that fails prints {"shape", "T", "error"} and the run goes on; the
exit status is 1 if any point failed. --json FILE also writes every line,
with the run's provenance, as one JSON document.
"""
import argparse
import json
import math
import sys
import traceback
from pathlib import Path
from typing import NamedTuple

from peer_util import (SHAPES, add_timing_arguments, check_timing_arguments, emitter, expected_hit_experts,
                       parse_names, parse_tokens, round_up, time_graph, write_results)

VLLM_VERSION = "0.26.0"
PEER = "oai_mxfp4_w4a16"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEPS = REPO_ROOT / ".deps" / "peers"
DEFAULT_TOKENS = "1,8,64,512,4096,16384"
DEFAULT_SHAPES = "gpt-oss-120b,qwen3-30b-a3b,qwen3-235b-a22b,dsv3-tp8,deepseek-v3,kimi-k2,mixtral-8x7b"

MX_BLOCK = 32            # values per e8m0 scale
INTER_ALIGN = 64         # vLLM 0.26.0 rounds I up to this for its Triton MXFP4 backend
SCALE_GROUP_ALIGN = 4    # vLLM pads the scale groups of each K to this on sm_90
SCALE_NUM_WARPS = 8      # HopperMXScaleLayout's warps, as vLLM converts
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0
NO_LIMIT = 1.0e30        # a clamp limit no value reaches
E2M1_RMS = math.sqrt(sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8)


class Padded(NamedTuple):
    hidden: int
    intermediate: int
    h_groups: int      # scale groups of GEMM1's K (H), padded to SCALE_GROUP_ALIGN
    i_groups: int      # scale groups of GEMM2's K (I), padded likewise

    def note(self, shape):
        """The padding applied, or None."""
        out = {}
        if self.hidden != shape.hidden:
            out["H"] = self.hidden
        if self.intermediate != shape.intermediate:
            out["I"] = self.intermediate
        if self.h_groups * MX_BLOCK != self.hidden:
            out["H_scale_groups"] = self.h_groups
        if self.i_groups * MX_BLOCK != self.intermediate:
            out["I_scale_groups"] = self.i_groups
        return out or None


def pad_shape(shape):
    h = round_up(shape.hidden, MX_BLOCK)
    i = round_up(shape.intermediate, INTER_ALIGN)
    return Padded(h, i, round_up(h // MX_BLOCK, SCALE_GROUP_ALIGN), round_up(i // MX_BLOCK, SCALE_GROUP_ALIGN))


def expert_bytes(pad):
    """Bytes of one expert's packed weights and scales (biases left out)."""
    w13 = 2 * pad.intermediate * (pad.hidden // 2 + pad.h_groups)
    w2 = pad.hidden * (pad.intermediate // 2 + pad.i_groups)
    return w13 + w2


def weight_copies(shape, pad, tokens, l2_bytes, max_copies, budget_bytes):
    """Copies of the weights so that, between two uses of one copy, the
    other copies' touched experts pass at least 2x L2; the smallest T
    decides. Returns (copies, whether that rotation was reached)."""
    hit = min(expected_hit_experts(shape, t) for t in tokens) * expert_bytes(pad)
    want = 1 + math.ceil(2 * l2_bytes / hit)
    per_copy = shape.experts * expert_bytes(pad)
    fit = max(1, int(budget_bytes // per_copy)) if budget_bytes else want
    copies = max(1, min(want, max_copies, fit))
    return copies, copies >= want


def parse_shapes(text):
    return parse_names(text, SHAPES, "shape(s)")


def import_triton_kernels(deps):
    """Puts `deps` first on sys.path and imports the vendored package.
    Returns (namespace, the SOURCE file's text)."""
    pkg = Path(deps) / "triton_kernels"
    if not (pkg / "matmul_ogs.py").is_file():
        raise RuntimeError(f"no triton_kernels under {deps}; run `scripts/setup.sh --peers` "
                           f"(it fetches the copy in vllm=={VLLM_VERSION}) and carry .deps/peers")
    sys.path.insert(0, str(Path(deps).resolve()))
    import triton_kernels
    if Path(triton_kernels.__file__).resolve().parent != pkg.resolve():
        raise RuntimeError(f"`import triton_kernels` found {triton_kernels.__file__}, not the copy under {deps}")
    import triton_kernels.matmul_ogs as mo
    import triton_kernels.matmul_ogs_details.opt_flags as opt_flags
    import triton_kernels.routing as routing
    import triton_kernels.swiglu as swiglu
    import triton_kernels.tensor as tensor
    from triton_kernels.numerics import InFlexData
    from triton_kernels.tensor_details import layout

    tk = argparse.Namespace(
        matmul_ogs=mo.matmul_ogs, FnSpecs=mo.FnSpecs, FusedActivation=mo.FusedActivation,
        PrecisionConfig=mo.PrecisionConfig, FlexCtx=mo.FlexCtx, InFlexData=InFlexData,
        routing_from_bitmatrix=routing.routing_from_bitmatrix, swiglu_fn=swiglu.swiglu_fn,
        Bitmatrix=tensor.Bitmatrix, FP4=tensor.FP4, wrap_torch_tensor=tensor.wrap_torch_tensor,
        Tensor=tensor.Tensor, Storage=tensor.Storage,
        convert_layout=tensor.convert_layout, ValueLayout=layout.HopperMXValueLayout,
        ScaleLayout=layout.HopperMXScaleLayout, opt_flags=opt_flags)
    source = (Path(deps) / "SOURCE").read_text() if (Path(deps) / "SOURCE").is_file() else "(no SOURCE file)"
    return tk, source


# ---- weights -------------------------------------------------------------------


def swizzle(tk, torch, layout_cls, tensor, chunk_bytes, **layout_kwargs):
    """tk.convert_layout(tensor, layout_cls, ...) for a tensor in the strided
    layout, done a block of experts at a time: the swizzle treats the leading
    (expert) axis as a batch, and its temporaries (int32 copies of the whole
    tensor) would otherwise take several times the weights' memory."""
    data = tensor.storage.data                                        # (E, K-ish, N), the strided view
    layout = layout_cls(list(data.shape), **layout_kwargs)
    per_expert = max(1, data[0].numel() * data.element_size())
    step = max(1, chunk_bytes // per_expert)
    parts = [layout.swizzle_data(data[i:i + step]) for i in range(0, data.shape[0], step)]
    if len(parts) == 1:
        swizzled = parts[0]
    elif parts[0].is_contiguous():
        swizzled = torch.cat(parts)
    else:  # a transposed view of contiguous memory: keep those strides, which the kernel reads
        swizzled = torch.cat([part.mT.contiguous() for part in parts]).mT
    return tk.Tensor(tk.Storage(swizzled, layout), dtype=tensor.dtype, shape=list(tensor.shape),
                     shape_max=list(tensor.shape_max))


def to_hopper_layout(tk, torch, packed, scales, groups, chunk_bytes=256 * 2**20):
    """One GEMM's weights as matmul_ogs takes them on sm_90: packed [E, N, K/2]
    uint8 and scales [E, N, K/32] uint8 in, (weight Tensor, PrecisionConfig)
    out. The scale groups are zero-padded to `groups`; both are viewed as
    [E, K, N] (K-major, the MX axis 1) and swizzled."""
    scales = torch.nn.functional.pad(scales, (0, groups - scales.shape[-1]))
    w = tk.wrap_torch_tensor(packed.transpose(-2, -1), dtype=tk.FP4)
    w = swizzle(tk, torch, tk.ValueLayout, w, chunk_bytes, mx_axis=1)
    s = tk.wrap_torch_tensor(scales.transpose(-2, -1))
    s = swizzle(tk, torch, tk.ScaleLayout, s, chunk_bytes, mx_axis=1, num_warps=SCALE_NUM_WARPS)
    return w, tk.PrecisionConfig(weight_scale=s, flex_ctx=tk.FlexCtx(rhs_data=tk.InFlexData()))


def random_mxfp4(torch, gen, experts, rows, cols, fan_in, device):
    """Random packed e2m1 [experts, rows, cols/2] (every code equally likely)
    and e8m0 scales [experts, rows, cols/32] that keep the values near
    fan_in^-1/2: a base exponent, -1, 0 or +1 per block."""
    packed = torch.randint(0, 256, (experts, rows, cols // 2), generator=gen, device=device, dtype=torch.uint8)
    base = 127 + round(math.log2(fan_in ** -0.5 / E2M1_RMS))
    scales = torch.randint(base - 1, base + 2, (experts, rows, -(-cols // MX_BLOCK)), generator=gen,
                           device=device, dtype=torch.int32).to(torch.uint8)
    return packed, scales


def make_raw_weights(torch, shape, pad, seed, device):
    """The checkpoint-form weights (see the module text), padded with zeros."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    w13, s13 = random_mxfp4(torch, gen, e, 2 * i, h, h, device)
    w2, s2 = random_mxfp4(torch, gen, e, h, i, i, device)
    dh, di = pad.hidden - h, pad.intermediate - i
    raw = {
        "w13": torch.nn.functional.pad(w13, (0, dh // 2, 0, 2 * di)),
        "s13": torch.nn.functional.pad(s13, (0, pad.hidden // MX_BLOCK - s13.shape[-1], 0, 2 * di), value=127),
        "w2": torch.nn.functional.pad(w2, (0, di // 2, 0, dh)),
        "s2": torch.nn.functional.pad(s2, (0, pad.intermediate // MX_BLOCK - s2.shape[-1], 0, dh), value=127),
    }
    if shape.activation == "swiglu_oai":
        b13 = torch.randn(e, 2 * i, generator=gen, device=device) * 0.1
        b2 = torch.randn(e, h, generator=gen, device=device) * 0.1
        raw["b13"] = torch.nn.functional.pad(b13, (0, 2 * di)).float()
        raw["b2"] = torch.nn.functional.pad(b2, (0, dh)).float()
    else:
        b13 = torch.zeros(e, pad.intermediate, 2, device=device)
        b13[:, :, 1] = -1.0  # up rows: (up - 1) + 1 inside swiglu_fn
        raw["b13"] = b13.reshape(e, 2 * pad.intermediate).contiguous()
        raw["b2"] = None
    return raw


def prepare_copy(tk, torch, raw, pad):
    """One copy of the weights in triton_kernels' Hopper layout."""
    w13, pc13 = to_hopper_layout(tk, torch, raw["w13"], raw["s13"], pad.h_groups)
    w2, pc2 = to_hopper_layout(tk, torch, raw["w2"], raw["s2"], pad.i_groups)
    b2 = None if raw["b2"] is None else raw["b2"].clone()
    return {"w13": w13, "pc13": pc13, "b13": raw["b13"].clone(), "w2": w2, "pc2": pc2, "b2": b2}


def fused_activation(tk, shape):
    alpha, limit = (OAI_ALPHA, OAI_LIMIT) if shape.activation == "swiglu_oai" else (1.0, NO_LIMIT)
    specs = tk.FnSpecs("swiglu", tk.swiglu_fn, ("alpha", "limit"))
    return tk.FusedActivation(specs, (alpha, limit), 2)


def activation_label(shape):
    if shape.activation == "swiglu_oai":
        return f"swiglu_oai (swiglu_fn alpha {OAI_ALPHA}, limit {OAI_LIMIT}, fp32 biases on both GEMMs)"
    return "silu_and_mul (swiglu_fn alpha 1, no clamp, up-row bias -1)"


# ---- routing -------------------------------------------------------------------


def random_topk(torch, shape, tokens, seed, device):
    """Top-k ids uniform over the experts (K distinct per token) and their
    weights, a softmax of random values: ids int16 [T, K], weights bf16."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    ids = torch.rand(tokens, shape.experts, generator=gen).argsort(dim=-1)[:, :shape.top_k]
    weights = torch.softmax(torch.randn(tokens, shape.top_k, generator=gen), dim=-1)
    return ids.to(torch.int16).to(device), weights.to(torch.bfloat16).to(device)


try:  # Triton is needed to run; --help works without it
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:

    @triton.jit
    def _bitwise_or(a, b):
        return a | b

    @triton.jit
    def topk_to_bitmatrix_kernel(ids_ptr, bits_ptr, n_tokens, TOP_K: tl.constexpr, TOP_K_P2: tl.constexpr,
                                 WORDS: tl.constexpr, WORDS_P2: tl.constexpr, BLOCK_T: tl.constexpr):
        """Row t of bits: bit (e % 32) of word e // 32 set for each of token t's
        experts e. One program per BLOCK_T tokens."""
        tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)             # (BLOCK_T,)
        slot = tl.arange(0, TOP_K_P2)                                         # (TOP_K_P2,)
        word = tl.arange(0, WORDS_P2)                                         # (WORDS_P2,)
        in_tok = tok < n_tokens
        ids = tl.load(ids_ptr + tok[:, None] * TOP_K + slot[None, :],
                      mask=in_tok[:, None] & (slot[None, :] < TOP_K), other=-1).to(tl.int32)  # (BLOCK_T, TOP_K_P2)
        one = tl.full(ids.shape, 1, tl.uint32)
        bit = tl.where(ids >= 0, one << (ids & 31).to(tl.uint32), 0)          # (BLOCK_T, TOP_K_P2)
        hit = (ids >= 0)[:, :, None] & ((ids >> 5)[:, :, None] == word[None, None, :])
        parts = tl.where(hit, bit[:, :, None], 0).to(tl.uint32)               # (BLOCK_T, TOP_K_P2, WORDS_P2)
        words = tl.reduce(parts, 1, _bitwise_or)                              # (BLOCK_T, WORDS_P2)
        tl.store(bits_ptr + tok[:, None] * WORDS + word[None, :], words,
                 mask=in_tok[:, None] & (word[None, :] < WORDS))


def next_pow2(n):
    return 1 << max(0, (n - 1).bit_length())


def build_routing(tk, torch, ids, weights, experts):
    """triton_kernels' routing metadata from a given top-k: the bitmatrix,
    then routing_from_bitmatrix. Returns (RoutingData, GatherIndx, ScatterIndx)."""
    tokens, top_k = ids.shape
    words = (experts + 31) // 32
    bits = torch.empty(tokens, words, dtype=torch.uint32, device=ids.device)
    block_t = 64
    topk_to_bitmatrix_kernel[(triton.cdiv(tokens, block_t),)](
        ids, bits, tokens, TOP_K=top_k, TOP_K_P2=next_pow2(top_k), WORDS=words, WORDS_P2=next_pow2(words),
        BLOCK_T=block_t)
    bitmatrix = tk.Bitmatrix(bits, shape=[tokens, words * 32], shape_max=[tokens, None], scratchpad=None)
    return tk.routing_from_bitmatrix(bitmatrix, weights, ids, experts, top_k)


# ---- the layer and its reference -------------------------------------------------


def experts_forward(tk, act, copy, routing, x, inter, y):
    """GEMM1 (gather, fused activation) into inter [1, T*K, I], GEMM2
    (routing weights, scatter and sum) into y [1, T, H]."""
    rdata, gather, scatter = routing
    tk.matmul_ogs(x, copy["w13"], copy["b13"], rdata, gather_indx=gather,
                  precision_config=copy["pc13"], fused_activation=act, y=inter)
    tk.matmul_ogs(inter.view(inter.shape[1], inter.shape[2]), copy["w2"], copy["b2"], rdata,
                  scatter_indx=scatter, precision_config=copy["pc2"], gammas=rdata.gate_scal, y=y)


def dequantize(torch, packed, scales):
    """packed [R, C/2] uint8 and scales [R, C/32] uint8 -> fp32 [R, C]."""
    lut = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                       dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(packed.shape[0], -1)
    scale = torch.exp2(scales.float() - 127).repeat_interleave(MX_BLOCK, dim=-1)
    return lut[codes.long()] * scale[:, :codes.shape[1]]


def reference(torch, shape, pad, raw, x, ids, weights):
    """The layer's output [n, H] in fp32, expert by expert."""
    n = x.shape[0]
    xf = x.float()
    out = torch.zeros(n, pad.hidden, dtype=torch.float32, device=x.device)
    for e in torch.unique(ids.long()).tolist():
        tok, slot = (ids.long() == e).nonzero(as_tuple=True)
        w13 = dequantize(torch, raw["w13"][e], raw["s13"][e])                      # [2I, H]
        h = xf[tok] @ w13.t() + raw["b13"][e]
        gate, up = h[:, 0::2], h[:, 1::2]
        if shape.activation == "swiglu_oai":
            gate = gate.clamp(max=OAI_LIMIT)
            up = up.clamp(-OAI_LIMIT, OAI_LIMIT)
            a = gate * torch.sigmoid(OAI_ALPHA * gate) * (up + 1)
        else:
            a = torch.nn.functional.silu(gate) * (up + 1)  # up carries the -1 bias
        down = a @ dequantize(torch, raw["w2"][e], raw["s2"][e]).t()                # [rows, H]
        if raw["b2"] is not None:
            down = down + raw["b2"][e]
        out.index_add_(0, tok, down * weights[tok, slot].float()[:, None])
    return out[:, :shape.hidden]


# ---- timing --------------------------------------------------------------------


def run_shape(tk, torch, name, args, device, emit):
    shape = SHAPES[name]
    pad = pad_shape(shape)
    base = {"peer": PEER, "shape": name, "E": shape.experts, "H": shape.hidden, "I": shape.intermediate,
            "K": shape.top_k, "activation": activation_label(shape), "padded": pad.note(shape)}
    try:
        props = torch.cuda.get_device_properties(device)
        free, _ = torch.cuda.mem_get_info(device)
        raw = make_raw_weights(torch, shape, pad, args.seed, device)
        budget = args.weight_budget_gib * 2**30 if args.weight_budget_gib else 0.5 * free
        copies, rotated = weight_copies(shape, pad, args.tokens, props.L2_cache_size, args.max_copies, budget)
        weights = [prepare_copy(tk, torch, raw, pad) for _ in range(copies)]
        act = fused_activation(tk, shape)
    except Exception as exc:  # a shape that cannot be set up fails its points only
        msg = f"{type(exc).__name__}: {exc}"
        for t in args.tokens:
            emit(dict(base, T=t, error=f"setup: {msg}"))
        if args.verbose:
            traceback.print_exc()
        return
    base.update(weight_copies=copies, l2_rotated=rotated, replays=args.replays)
    for t in args.tokens:
        try:
            emit(dict(base, **run_point(tk, torch, shape, pad, raw, weights, act, t, args, device)))
        except Exception as exc:
            emit(dict(base, T=t, error=f"{type(exc).__name__}: {exc}"))
            if args.verbose:
                traceback.print_exc()
        torch.cuda.empty_cache()
    del weights, raw
    torch.cuda.empty_cache()


def run_point(tk, torch, shape, pad, raw, weights, act, tokens, args, device):
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed + tokens)
    x = torch.zeros(tokens, pad.hidden, dtype=torch.bfloat16, device=device)
    x[:, :shape.hidden] = torch.randn(tokens, shape.hidden, generator=gen, device=device).to(torch.bfloat16)
    ids, gate_w = random_topk(torch, shape, tokens, args.seed + 1 + tokens, device)
    inter = torch.empty(1, tokens * shape.top_k, pad.intermediate, dtype=torch.bfloat16, device=device)
    y = torch.empty(1, tokens, pad.hidden, dtype=torch.bfloat16, device=device)
    routing = build_routing(tk, torch, ids, gate_w, shape.experts)

    experts_forward(tk, act, weights[0], routing, x, inter, y)
    torch.cuda.synchronize()
    n = min(tokens, args.check_tokens)
    want = reference(torch, shape, pad, raw, x[:n], ids[:n], gate_w[:n])
    got = y[0, :n, :shape.hidden].float()
    rel_err = float(torch.linalg.norm(got - want) / torch.linalg.norm(want))

    def experts_only():
        for copy in weights:
            experts_forward(tk, act, copy, routing, x, inter, y)

    def with_routing():
        for copy in weights:
            r = build_routing(tk, torch, ids, gate_w, shape.experts)
            experts_forward(tk, act, copy, r, x, inter, y)

    copies = len(weights)
    us = time_graph(torch, experts_only, args.replays, args.warmup) * 1e3 / copies
    us_routing = time_graph(torch, with_routing, args.replays, args.warmup) * 1e3 / copies
    return {"T": tokens, "us": round(us, 1), "us_incl_routing_metadata": round(us_routing, 1),
            "rel_err": round(rel_err, 5), "checked_tokens": n}


# ---- dry run and main ------------------------------------------------------------


def plan_lines(args):
    l2 = args.l2_mib * 2**20
    budget = args.weight_budget_gib * 2**30 if args.weight_budget_gib else 40 * 2**30
    for name in args.shapes:
        shape = SHAPES[name]
        pad = pad_shape(shape)
        copies, rotated = weight_copies(shape, pad, args.tokens, l2, args.max_copies, budget)
        yield {"plan": name, "E": shape.experts, "H": shape.hidden, "I": shape.intermediate, "K": shape.top_k,
               "activation": activation_label(shape), "padded": pad.note(shape),
               "weight_gib_per_copy": round(shape.experts * expert_bytes(pad) / 2**30, 3),
               "weight_copies": copies, "l2_rotated": rotated, "tokens": args.tokens,
               "assumed": {"l2_mib": args.l2_mib, "weight_budget_gib": budget / 2**30}}


def layout_self_test(tk, torch):
    """On the CPU, for a small random expert set: the conversion done an
    expert at a time equals the library's tk.convert_layout of the whole,
    and the library's unswizzle gives every byte back."""
    gen = torch.Generator()
    gen.manual_seed(0)
    e, n, k = 3, 320, 256
    packed = torch.randint(0, 256, (e, n, k // 2), generator=gen, dtype=torch.uint8)
    scales = torch.randint(120, 130, (e, n, k // MX_BLOCK), generator=gen, dtype=torch.int32).to(torch.uint8)
    w, pc = to_hopper_layout(tk, torch, packed, scales, k // MX_BLOCK, chunk_bytes=1)
    s = pc.weight_scale
    whole_w = tk.convert_layout(tk.wrap_torch_tensor(packed.transpose(-2, -1), dtype=tk.FP4), tk.ValueLayout, mx_axis=1)
    whole_s = tk.convert_layout(tk.wrap_torch_tensor(scales.transpose(-2, -1)), tk.ScaleLayout, mx_axis=1,
                                num_warps=SCALE_NUM_WARPS)
    same = all(torch.equal(a.storage.data, b.storage.data) and a.storage.data.stride() == b.storage.data.stride()
               for a, b in ((w, whole_w), (s, whole_s)))
    back_w = w.storage.layout.unswizzle_data(w.storage.data)
    back_s = s.storage.layout.unswizzle_data(s.storage.data)
    kept = (torch.equal(back_w[..., :k // 2, :n].contiguous(), packed.transpose(-2, -1).contiguous()) and
            torch.equal(back_s[..., :k // MX_BLOCK, :n].contiguous(), scales.transpose(-2, -1).contiguous()))
    return same and kept and list(w.shape) == [e, k, n]


def dry_run(args):
    for line in plan_lines(args):
        print(json.dumps(line), flush=True)
    try:
        tk, source = import_triton_kernels(args.deps)
    except Exception as exc:
        print(json.dumps({"triton_kernels": "not importable", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    import torch
    ok = layout_self_test(tk, torch)
    print(json.dumps({"triton_kernels": "imported", "source": source.split(), "hopper_layout_round_trip": ok}),
          flush=True)
    return 0 if ok else 1


def main(argv):
    ap = argparse.ArgumentParser(
        description=f"Time OpenAI triton_kernels' MXFP4 W4A16 MoE experts (matmul_ogs, as vendored in "
                    f"vllm=={VLLM_VERSION}) on an sm_90 GPU; one JSON line per (shape, T).",
        epilog="Needs `scripts/setup.sh --peers` (the vendored triton_kernels under .deps/peers), "
               "PyTorch and Triton; not vLLM.")
    ap.add_argument("--shapes", type=parse_shapes, default=parse_shapes(DEFAULT_SHAPES),
                    help=f"presets, comma-separated (default {DEFAULT_SHAPES}; known: {', '.join(SHAPES)})")
    ap.add_argument("--tokens", type=parse_tokens, default=parse_tokens(DEFAULT_TOKENS),
                    help=f"token counts T, comma-separated (default {DEFAULT_TOKENS})")
    ap.add_argument("--deps", default=str(DEFAULT_DEPS),
                    help="folder holding triton_kernels/ (default: the repository's .deps/peers)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan (padding, activation, weight copies), import triton_kernels and check "
                         "its Hopper weight layout on the CPU; no GPU needed")
    add_timing_arguments(ap)
    args = ap.parse_args(argv)
    check_timing_arguments(ap, args)

    if args.dry_run:
        return dry_run(args)

    try:
        if triton is None:
            raise RuntimeError("Triton is not installed")
        tk, source = import_triton_kernels(args.deps)
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        cap = torch.cuda.get_device_capability()
        if cap[0] != 9:
            raise RuntimeError(f"needs an sm_90 GPU (the Hopper weight layout); this one is sm_{cap[0]}{cap[1]}")
    except Exception as exc:
        print(f"oai_mxfp4_peer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    # vLLM 0.26.0 pins split-k to 1 for this backend on sm_90.
    tk.opt_flags.update_opt_flags_constraints({"split_k": 1})
    device = torch.device("cuda")
    rows = []

    emit = emitter(rows)
    for name in args.shapes:
        run_shape(tk, torch, name, args, device, emit)
    if args.json:
        write_results(args.json, f"OpenAI triton_kernels matmul_ogs, MXFP4 W4A16, as vendored in vllm=={VLLM_VERSION}",
                      source.split(), rows, argv, torch, triton)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
