#!/usr/bin/env python3
"""The vLLM Triton peer: the experts of an MoE layer run by vLLM 0.26.0's own
Triton `fused_moe_kernel`, in BF16, FP8 block-128 (W8A8) and FP8 per tensor,
with vLLM's shipped tuned configs. The vLLM sources are the files of the
vllm==0.26.0 wheel that `scripts/setup.sh --peers` extracts into
.deps/peers/vllm_fused_moe (the fused_moe Triton file with its configs
folder, the FP8 quantization utilities); the `vllm` package itself is never
imported: its compiled `vllm._C` is not usable here. The functions named
below are read from those files (Python's `ast`: each named top-level
function, compiled from the file itself, so Triton reads the kernel's source
from vLLM's file) into a namespace where the few vLLM objects they consult
(the platform, the environment flags, the logger) are small stand-ins.

What one call does, the way vLLM's TritonExperts runs it (no LoRA, no expert
parallelism, the routing weights applied on GEMM2):
  quant x    fp8_block: vLLM's Triton `_per_token_group_quant_fp8` (one scale
             per token and 128 columns), launched by vLLM's
             `per_token_group_quant_fp8`; on CUDA vLLM itself calls its
             `_C` op of the same math. fp8_tensor: a static scale, a PyTorch
             stand-in for vLLM's `scaled_fp8_quant` (a `_C` op).
  GEMM1      vLLM's `fused_moe_kernel` through its launcher
             `invoke_fused_moe_triton_kernel`: x rows by expert, x W13^T ->
             [T, K, 2I] bf16 (biases added in the kernel for gpt-oss).
  activation PyTorch stand-in for vLLM's `_C` ops: silu(gate) * up
             (`silu_and_mul`), or gpt-oss's clamped SwiGLU on interleaved
             gate/up rows (`swigluoai_and_mul`), into [T*K, I] bf16.
  quant a    as for x (fp8_block: vLLM fuses the activation and this step in
             one `_C` op, `silu_and_mul_per_block_quant`; here they are the
             PyTorch activation, then vLLM's Triton quant kernel).
  GEMM2      `fused_moe_kernel` again, top_k 1, MUL_ROUTED_WEIGHT: each row
             times its routing weight -> [T, K, H] bf16.
  moe_sum    PyTorch stand-in for vLLM's `_C` `moe_sum`: torch.sum over K.
The routing metadata comes from vLLM's `_prepare_expert_assignment`: where
T*K*4 <= E it skips the alignment (one row per block, the kernel's
`naive_block_assignment`); else it calls `moe_align_block_size`, whose
`_C` op is replaced by `moe_align_block_size` below, pure PyTorch with the
same outputs (sorted_token_ids, expert_ids, num_tokens_post_padded).
`us` times the call with that metadata built once beforehand;
`us_incl_align` builds it in every call. Neither has the router: the top-k
is given, random and uniform over the experts (seeded), its K weights a
softmax of random values.

Configs: vLLM's own selection, `get_config_file_name` and `get_moe_configs`
(configs/E=..,N=..,device_name=..[,dtype=fp8_w8a8][,block_shape=[128,128]].json,
N the intermediate size, the card name as vLLM spells it; the entry of the
nearest token count), else `get_default_config`; vLLM's `get_config()`
override hook is not consulted. Each line says which (`config_source`).

Weights: random normal (std fan_in^-1/2) quantized per expert: BF16; FP8
block: e4m3 with an fp32 scale per 128x128 block (amax / 448); FP8 per
tensor: e4m3 with one fp32 scale per expert and matrix; static activation
scales (fp8_tensor) calibrated on the point's own input: amax(x) / 448, and
amax of the activation of one untimed call / 448. w13 is [E, 2I, H] (gate
rows then up rows; gpt-oss: interleaved, with bf16 biases on both GEMMs),
w2 [E, H, I]. FP8 block needs H and I multiples of 128 (the quant kernel's
groups): gpt-oss-120b's 2880 is zero-padded to 2944 ("padded").

Timing: all calls of one point captured in one CUDA graph, one call per copy
of the weights: C copies (identical values, separate memory), C chosen so
that one pass over the copies reads at least twice the L2 size of weights
at the smallest T (the bytes between two reads of one weight line), so the
weights come from HBM. Each replay is timed with CUDA events; the figure is
the median replay over C. Routing, input and work buffers are shared.

Correctness, on the first --check-tokens tokens, relative Frobenius error
against fp32 references on the GPU with the same (dequantized) weights and
routing: `rel_err` with activations unquantized (the error a user sees);
`rel_err_emulated` with the activations quantized, the activation run on
bf16 and the GEMM outputs rounded to bf16 as the peer does (a check of the
kernels' wiring).

    python3 bench/peers/vllm_fused_moe_peer.py --shapes qwen3-30b-a3b,dsv3-tp8 --quant bf16,fp8_block --tokens 1,64,4096
    python3 bench/peers/vllm_fused_moe_peer.py --dry-run    # the plan, no GPU

Output: one JSON line per (shape, quant, T), flushed as measured, of the form
    {"peer": "vllm_fused_moe_fp8_block", "shape": "dsv3-tp8", "quant": "fp8_block", "T": 64,
     "us": ..., "us_incl_align": ..., "rel_err": ..., "rel_err_emulated": ..., "config": {...},
     "config_source": "default (no E=256,N=256,...)", "assignment": "aligned", "padded": null, ...}
A point that fails prints its `error` and the run goes on; the exit status
is 1 if any point failed. --json FILE also writes every line, with the
run's provenance, as one JSON document.
"""
import __future__
import argparse
import ast
import functools
import json
import math
import os
import re
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from peer_util import (SHAPES, add_timing_arguments, check_timing_arguments, emitter, expected_hit_experts,
                       parse_names, parse_tokens, round_up, time_graph, write_results)

try:  # PyTorch and Triton are needed to run; --help and the plan work without them
    import torch
except ImportError:
    torch = None
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

VLLM_VERSION = "0.26.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEPS = REPO_ROOT / ".deps" / "peers"
VLLM_FILES = "vllm_fused_moe"  # under the deps folder, the wheel's paths kept
FUSED_MOE_PY = "vllm/model_executor/layers/fused_moe/fused_moe.py"
MOE_UTILS_PY = "vllm/model_executor/layers/fused_moe/utils.py"
FP8_UTILS_PY = "vllm/model_executor/layers/quantization/utils/fp8_utils.py"
QUANT_UTILS_PY = "vllm/model_executor/layers/quantization/utils/quant_utils.py"
DEFAULT_TOKENS = "1,8,64,512,4096,16384"
DEFAULT_SHAPES = "mixtral-8x7b,qwen3-30b-a3b,qwen3-235b-a22b,deepseek-v3,dsv3-tp8,gpt-oss-120b,kimi-k2,minimax-m2"
DEFAULT_QUANTS = "bf16,fp8_block,fp8_tensor"
DRY_RUN_DEVICE = "NVIDIA H100 80GB HBM3"

FP8_BLOCK = 128          # the block of FP8 block-128: weights 128x128, activations 1x128
FP8_MAX = 448.0          # largest e4m3 magnitude
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0


class Quant(NamedTuple):
    name: str           # the --quant value
    peer: str           # the "peer" of its lines
    fp8: bool           # use_fp8_w8a8
    block_shape: Any    # [128, 128] for block-128, else None
    config_dtype: Any   # vLLM's config file selector (_get_config_dtype_str)


QUANTS = {
    "bf16": Quant("bf16", "vllm_fused_moe_bf16", False, None, None),
    "fp8_block": Quant("fp8_block", "vllm_fused_moe_fp8_block", True, [FP8_BLOCK, FP8_BLOCK], "fp8_w8a8"),
    "fp8_tensor": Quant("fp8_tensor", "vllm_fused_moe_fp8_tensor", True, None, "fp8_w8a8"),
}


def steps(quant, shape):
    """Which steps of a call run vLLM's code (its Triton kernels and their Python) and which PyTorch stand-ins."""
    vllm = ["fused_moe_kernel (GEMM1, GEMM2) via invoke_fused_moe_triton_kernel",
            "_prepare_expert_assignment", "get_moe_configs / get_default_config"]
    act = "swigluoai_and_mul" if shape.activation == "swiglu_oai" else "silu_and_mul"
    if quant.name == "fp8_block" and act == "silu_and_mul":  # vLLM fuses the activation and its quant
        act = "silu_and_mul_per_block_quant: PyTorch silu_and_mul, then vLLM's Triton quant"
    stand_ins = ["moe_align_block_size (_C op)", f"{act} (_C op)", "moe_sum (_C op)"]
    if quant.name == "fp8_block":
        vllm.append("_per_token_group_quant_fp8 (x and the activation) via per_token_group_quant_fp8")
    if quant.name == "fp8_tensor":
        stand_ins.append("scaled_fp8_quant with a static scale (_C op)")
    return {"from_vllm": vllm, "pytorch_stand_ins": stand_ins}


class Padded(NamedTuple):
    hidden: int
    intermediate: int

    def note(self, shape):
        """The padding applied, or None."""
        out = {}
        if self.hidden != shape.hidden:
            out["H"] = self.hidden
        if self.intermediate != shape.intermediate:
            out["I"] = self.intermediate
        return out or None


def pad_shape(shape, quant):
    """FP8 block-128 quantizes activations in groups of 128 along H and I,
    and vLLM's quant kernel asserts whole groups: both round up to 128."""
    if quant.block_shape is None:
        return Padded(shape.hidden, shape.intermediate)
    return Padded(round_up(shape.hidden, FP8_BLOCK), round_up(shape.intermediate, FP8_BLOCK))


def expert_bytes(shape, pad, quant):
    """Bytes of one expert's weights, scales and biases."""
    h, i = pad.hidden, pad.intermediate
    values = 3 * h * i * (1 if quant.fp8 else 2)
    if quant.name == "fp8_block":
        values += 4 * 3 * (h // FP8_BLOCK) * (i // FP8_BLOCK)
    elif quant.name == "fp8_tensor":
        values += 4 * 2
    if shape.activation == "swiglu_oai":
        values += 2 * (2 * i + h)
    return values


def weight_copies(shape, pad, quant, tokens, l2_bytes, max_copies, budget_bytes):
    """Copies of the weights such that one pass over them reads at least 2x
    L2 (the bytes read between two reads of one weight line); the smallest T
    decides. Returns (copies, whether that rotation was reached)."""
    hit = min(expected_hit_experts(shape, t) for t in tokens) * expert_bytes(shape, pad, quant)
    want = max(1, math.ceil(2 * l2_bytes / hit))
    per_copy = shape.experts * expert_bytes(shape, pad, quant)
    fit = max(1, int(budget_bytes // per_copy)) if budget_bytes else want
    copies = max(1, min(want, max_copies, fit))
    return copies, copies >= want


# ---- the alignment (vLLM's is a _C op) ------------------------------------------


def moe_align_block_size(topk_ids, block_size, num_experts, expert_map=None, pad_sorted_ids=False,
                         ignore_invalid_experts=False):
    """vLLM's moe_align_block_size (fused_moe/moe_align_block_size.py) with
    its `_C` op done in PyTorch: same arguments, same buffer sizes, same
    layout, no host synchronization (CUDA-graph capturable).
      sorted_token_ids [max_num_tokens_padded] int32: the flat (token*K + k)
        indices grouped by expert in expert order, each expert's run padded
        to a multiple of block_size with topk_ids.numel();
      expert_ids [cdiv(max_num_tokens_padded, block_size)] int32: each
        block's expert; 0 past the last used block (the kernel returns
        before reading those);
      num_tokens_post_padded [1] int32: the padded total.
    Ids >= num_experts are left out, as the op leaves them. Within an
    expert the indices ascend (the op's order there depends on its atomics;
    the kernel's result does not)."""
    if expert_map is not None:
        raise NotImplementedError("expert_map (expert parallelism) is not modelled")
    device = topk_ids.device
    numel = topk_ids.numel()
    max_padded = numel + num_experts * (block_size - 1)
    if pad_sorted_ids:
        max_padded = round_up(max_padded, block_size)
    if numel < num_experts:
        max_padded = min(numel * block_size, max_padded)
    max_blocks = -(-max_padded // block_size)

    ids = topk_ids.reshape(-1).to(torch.int64).clamp(max=num_experts)        # (numel,), E = left out
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, ids, torch.ones_like(ids))                         # (E+1,)
    padded = (counts + block_size - 1) // block_size * block_size
    padded[num_experts:].zero_()  # a kernel: an indexed assignment would copy from the host (not in a graph)
    padded_end = torch.cumsum(padded, 0)                                      # (E+1,)
    first = torch.cumsum(counts, 0) - counts                                  # (E+1,) unpadded starts
    order = torch.sort(ids, stable=True).indices                              # (numel,) flat indices by expert
    expert = ids[order]
    rank = torch.arange(numel, device=device) - first[expert]
    dest = torch.where(expert < num_experts, padded_end[expert] - padded[expert] + rank, max_padded)
    sorted_ids = torch.full((max_padded + 1,), numel, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(max_blocks, device=device) * block_size
    expert_ids = torch.searchsorted(padded_end[:num_experts], block_start, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, 0).to(torch.int32)
    total = padded_end[num_experts - 1:num_experts].to(torch.int32)
    return sorted_ids[:max_padded], expert_ids, total


# ---- vLLM's files, without the vllm package --------------------------------------


class Platform:
    """The vllm.platforms.current_platform queries the loaded functions make,
    answered for one CUDA GPU of the given compute capability."""

    def __init__(self, capability):
        self.capability = capability

    def is_device_capability(self, capability, device_id=0):
        if isinstance(capability, tuple):
            return self.capability == capability
        return self.capability[0] * 10 + self.capability[1] == capability

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cuda_alike(self):
        # False, so that per_token_group_quant_fp8 takes its Triton branch:
        # its CUDA branch is an op of vllm._C.
        return False

    def is_fp8_fnuz(self):
        return False

    def fp8_dtype(self):
        return torch.float8_e4m3fn


class QuietLogger:
    """vllm.logger's calls in the loaded functions, kept silent."""

    def _ignore(self, *args, **kwargs):
        pass

    debug = info = warning = info_once = warning_once = debug_once = _ignore


def load_functions(path, names, namespace, jit):
    """Compiles the top-level functions `names` of the file at `path` into
    `namespace` (their globals). Python functions are compiled with
    postponed annotations (they name vLLM types); @triton.jit functions as
    they are, from the file itself, so Triton reads vLLM's source."""
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    found = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = [n for n in names if n not in found]
    if missing:
        raise RuntimeError(f"{path} has no function {', '.join(missing)} (not the vllm=={VLLM_VERSION} file?)")
    module = ast.Module(body=[found[n] for n in names], type_ignores=[])
    flags = 0 if jit else __future__.annotations.compiler_flag
    exec(compile(module, str(path), "exec", flags=flags, dont_inherit=True), namespace)


def load_vllm(deps, device_name, capability=(9, 0)):
    """vLLM's functions from the extracted files. The kernels (and their
    launchers' needs) are defined only where Triton imports. Returns a
    namespace; `kernels` says whether the Triton functions exist."""
    root = Path(deps) / VLLM_FILES
    if not (root / FUSED_MOE_PY).is_file():
        raise RuntimeError(f"no vLLM files under {root}; run `scripts/setup.sh --peers` (it extracts them "
                           f"from the vllm=={VLLM_VERSION} wheel) and carry .deps/peers")
    platform = Platform(capability)
    envs = SimpleNamespace(VLLM_BATCH_INVARIANT=False, VLLM_TUNED_CONFIG_FOLDER=None)
    common = {"torch": torch, "triton": triton, "tl": tl, "Any": Any,
              "functools": functools, "json": json, "os": os, "envs": envs, "current_platform": platform,
              "logger": QuietLogger()}
    moe = dict(common, __file__=str(root / FUSED_MOE_PY), __name__="vllm_fused_moe",
               moe_align_block_size=moe_align_block_size,
               # vllm.utils.platform_utils.get_device_name_as_file_name, for the given name
               get_device_name_as_file_name=lambda device_id=0: re.sub(r"[\s/]+", "_", device_name))
    load_functions(root / MOE_UTILS_PY, ["enable_swap_ab"], moe, jit=False)
    load_functions(root / FUSED_MOE_PY, ["get_config_file_name", "get_moe_configs", "get_default_config",
                                         "_prepare_expert_assignment", "invoke_fused_moe_triton_kernel"],
                   moe, jit=False)
    fp8 = dict(common, __file__=str(root / FP8_UTILS_PY), __name__="vllm_fp8_utils")
    load_functions(root / QUANT_UTILS_PY, ["get_fp8_min_max"], fp8, jit=False)
    load_functions(root / FP8_UTILS_PY, ["per_token_group_quant_fp8"], fp8, jit=False)
    if triton is not None:
        load_functions(root / FUSED_MOE_PY, ["write_zeros_to_output", "fused_moe_kernel"], moe, jit=True)
        load_functions(root / FP8_UTILS_PY, ["_per_token_group_quant_fp8"], fp8, jit=True)
    source = root / "SOURCE"
    return SimpleNamespace(
        kernels=triton is not None, configs_dir=root / Path(FUSED_MOE_PY).parent / "configs",
        source=source.read_text().splitlines() if source.is_file() else ["(no SOURCE file)"],
        get_config_file_name=moe["get_config_file_name"], get_moe_configs=moe["get_moe_configs"],
        get_default_config=moe["get_default_config"], prepare_assignment=moe["_prepare_expert_assignment"],
        invoke=moe["invoke_fused_moe_triton_kernel"], fused_moe_kernel=moe.get("fused_moe_kernel"),
        per_token_group_quant_fp8=fp8["per_token_group_quant_fp8"],
        quant_kernel=fp8.get("_per_token_group_quant_fp8"))


def choose_config(v, shape, pad, quant, tokens):
    """vLLM's try_get_optimal_moe_config (without its get_config() override):
    the tuned file's entry nearest T, else the default. Returns (config,
    where it came from)."""
    e, n = shape.experts, pad.intermediate
    block_n, block_k = quant.block_shape or (0, 0)
    configs = v.get_moe_configs(e, n, quant.config_dtype, block_n, block_k)
    name = v.get_config_file_name(e, n, quant.config_dtype, quant.block_shape)
    if configs:
        m = min(configs, key=lambda key: abs(key - tokens))
        return dict(configs[m]), f"{name} (M={m})"
    return (v.get_default_config(tokens, e, n, pad.hidden, shape.top_k, quant.config_dtype, quant.block_shape),
            f"default (no {name})")


def naive_assignment(shape, tokens):
    """vLLM's _prepare_expert_assignment skips the alignment here."""
    return tokens * shape.top_k * 4 <= shape.experts


# ---- weights ---------------------------------------------------------------------


def gate_up_rows(gate, up, interleaved):
    """gate, up [I, H] -> w13 rows [2I, H]: gate then up, or alternating."""
    if interleaved:
        return torch.stack((gate, up), dim=1).reshape(-1, gate.shape[-1])
    return torch.cat((gate, up))


def quantize_fp8_blocks(w):
    """fp32 [R, C] (multiples of 128) -> e4m3 [R, C], fp32 scales [R/128, C/128]."""
    r, c = w.shape
    blocks = w.view(r // FP8_BLOCK, FP8_BLOCK, c // FP8_BLOCK, FP8_BLOCK)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(r, c), scale


def make_weights(shape, pad, quant, seed, device):
    """w13 [E, 2I, H], w2 [E, H, I] in the quant's form, with their scales
    (fp8) and biases (gpt-oss); zero-padded to `pad`. Built an expert at a
    time (fp32 temporaries of one expert)."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    hp, ip = pad.hidden, pad.intermediate
    dtype = torch.float8_e4m3fn if quant.fp8 else torch.bfloat16
    interleaved = shape.activation == "swiglu_oai"
    w = {"w13": torch.empty(e, 2 * ip, hp, dtype=dtype, device=device),
         "w2": torch.empty(e, hp, ip, dtype=dtype, device=device), "s13": None, "s2": None,
         "b13": None, "b2": None}
    if quant.name == "fp8_block":
        w["s13"] = torch.empty(e, 2 * ip // FP8_BLOCK, hp // FP8_BLOCK, device=device)
        w["s2"] = torch.empty(e, hp // FP8_BLOCK, ip // FP8_BLOCK, device=device)
    elif quant.name == "fp8_tensor":
        w["s13"] = torch.empty(e, device=device)
        w["s2"] = torch.empty(e, device=device)
    for x in range(e):
        gate, up = (torch.nn.functional.pad(torch.randn(i, h, generator=gen, device=device) * h ** -0.5,
                                            (0, hp - h, 0, ip - i)) for _ in range(2))
        down = torch.nn.functional.pad(torch.randn(h, i, generator=gen, device=device) * i ** -0.5,
                                       (0, ip - i, 0, hp - h))
        for key, rows in (("w13", gate_up_rows(gate, up, interleaved)), ("w2", down)):
            skey = "s" + key[1:]
            if quant.name == "fp8_block":
                w[key][x], w[skey][x] = quantize_fp8_blocks(rows)
            elif quant.name == "fp8_tensor":
                w[skey][x] = rows.abs().amax().clamp(min=1e-12) / FP8_MAX
                w[key][x] = (rows / w[skey][x]).clamp(-FP8_MAX, FP8_MAX).to(dtype)
            else:
                w[key][x] = rows.to(dtype)
    if interleaved:
        b_gate, b_up = (torch.nn.functional.pad(torch.randn(e, i, generator=gen, device=device) * 0.1, (0, ip - i))
                        for _ in range(2))
        w["b13"] = torch.stack((b_gate, b_up), dim=2).reshape(e, 2 * ip).to(torch.bfloat16)
        w["b2"] = torch.nn.functional.pad(torch.randn(e, h, generator=gen, device=device) * 0.1,
                                          (0, hp - h)).to(torch.bfloat16)
    return w


def copy_weights(w):
    return {k: None if t is None else t.clone() for k, t in w.items()}


def dequantize(w, key, quant, expert):
    """One expert's matrix `key` ("w13" or "w2") in fp32."""
    m = w[key][expert].float()
    scale = w["s" + key[1:]]
    if quant.name == "fp8_block":
        s = scale[expert].repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)
        return m * s[:m.shape[0], :m.shape[1]]
    if quant.name == "fp8_tensor":
        return m * scale[expert]
    return m


# ---- routing and the layer ---------------------------------------------------------


def random_topk(shape, tokens, seed, device):
    """Top-k ids uniform over the experts (K distinct per token) and their
    weights, a softmax of random values: ids int32 [T, K], weights fp32
    [T, K] (the types of vLLM's top-k)."""
    gen = torch.Generator()
    gen.manual_seed(seed)
    ids = torch.rand(tokens, shape.experts, generator=gen).argsort(dim=-1)[:, :shape.top_k]
    weights = torch.softmax(torch.randn(tokens, shape.top_k, generator=gen), dim=-1)
    return ids.to(torch.int32).to(device), weights.to(device)


def static_fp8(a, scale):
    """PyTorch stand-in for vLLM's scaled_fp8_quant with a static scale [1]."""
    return (a.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def quantize_input(v, quant, a, static_scale):
    """GEMM input [rows, cols] bf16 -> (kernel input, its scale or None)."""
    if quant.name == "fp8_block":
        return v.per_token_group_quant_fp8(a, FP8_BLOCK, column_major_scales=False, use_ue8m0=False)
    if quant.name == "fp8_tensor":
        return static_fp8(a, static_scale), static_scale
    return a, None


def activation(shape, h, out):
    """PyTorch stand-in for vLLM's silu_and_mul / swigluoai_and_mul:
    h [rows, 2I] bf16 -> out [rows, I] bf16."""
    if shape.activation == "swiglu_oai":
        gate = h[:, 0::2].float().clamp(max=OAI_LIMIT)
        up = h[:, 1::2].float().clamp(-OAI_LIMIT, OAI_LIMIT)
        out.copy_(gate * torch.sigmoid(OAI_ALPHA * gate) * (up + 1))
    else:
        half = h.shape[-1] // 2
        torch.mul(torch.nn.functional.silu(h[:, :half]), h[:, half:], out=out)


class Buffers(NamedTuple):
    x: Any        # [T, H] bf16
    ids: Any      # [T, K] int32
    weights: Any  # [T, K] fp32
    cache1: Any   # [T, K, 2I] bf16, GEMM1's output
    cache2: Any   # [T*K, I] bf16, the activation
    cache3: Any   # [T, K, H] bf16, GEMM2's output
    out: Any      # [T, H] bf16
    a1_scale: Any  # [1] fp32, fp8_tensor's static scales (else None)
    a2_scale: Any


def assignment(v, shape, quant, config, bufs):
    """vLLM's _prepare_expert_assignment: (sorted_token_ids or None,
    expert_ids, num_tokens_post_padded)."""
    tokens = bufs.x.shape[0]
    return v.prepare_assignment(bufs.ids, config, tokens, shape.top_k, shape.experts, None,
                                block_shape=quant.block_shape)


def experts_forward(v, shape, quant, config, w, route, bufs):
    """One call of the experts, as vLLM's TritonExperts.apply runs it."""
    sorted_ids, expert_ids, post_padded = route
    kind = dict(compute_type=tl.bfloat16, use_fp8_w8a8=quant.fp8, use_int8_w8a8=False, use_int8_w8a16=False,
                use_int4_w4a16=False, per_channel_quant=False, block_shape=quant.block_shape)
    a1, a1_scale = quantize_input(v, quant, bufs.x, bufs.a1_scale)
    v.invoke(a1, w["w13"], bufs.cache1, a1_scale, w["s13"], None, sorted_ids, expert_ids, post_padded,
             False, shape.top_k, config, B_bias=w["b13"], **kind)
    activation(shape, bufs.cache1.view(-1, bufs.cache1.shape[-1]), bufs.cache2)
    a2, a2_scale = quantize_input(v, quant, bufs.cache2, bufs.a2_scale)
    v.invoke(a2, w["w2"], bufs.cache3, a2_scale, w["s2"], bufs.weights, sorted_ids, expert_ids, post_padded,
             True, 1, config, B_bias=w["b2"], **kind)
    torch.sum(bufs.cache3, dim=1, out=bufs.out)


def quant_dequant(quant, a, static_scale):
    """The activation quantization of quantize_input, in fp32, for the
    emulating reference."""
    if quant.name == "fp8_block":
        g = a.float().view(a.shape[0], -1, FP8_BLOCK)
        s = g.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
        return ((g / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * s).view(a.shape)
    if quant.name == "fp8_tensor":
        return static_fp8(a, static_scale).float() * static_scale
    return a.float()


def reference(shape, pad, quant, w, bufs, n, emulate):
    """The first n tokens' output [n, H] in fp32, expert by expert, with the
    dequantized weights. emulate: the activations quantized and the GEMM
    outputs rounded to bf16 as the peer's call does."""
    x, ids, weights = bufs.x[:n], bufs.ids[:n].long(), bufs.weights[:n]
    xf = quant_dequant(quant, x, bufs.a1_scale) if emulate else x.float()
    out = torch.zeros(n, pad.hidden, dtype=torch.float32, device=x.device)
    rnd = (lambda t: t.bfloat16().float()) if emulate else (lambda t: t)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        h = xf[tok] @ dequantize(w, "w13", quant, e).t()                      # [rows, 2I]
        if w["b13"] is not None:
            h = h + w["b13"][e].float()
        if emulate:
            # As the call runs it: the stand-in activation on GEMM1's bf16
            # output, into bf16 (silu rounds once, the product again).
            a = torch.empty(h.shape[0], pad.intermediate, dtype=torch.bfloat16, device=x.device)
            activation(shape, h.bfloat16(), a)
            a = quant_dequant(quant, a, bufs.a2_scale)
        else:
            a = torch.empty(h.shape[0], pad.intermediate, dtype=torch.float32, device=x.device)
            activation(shape, h, a)
        y = a @ dequantize(w, "w2", quant, e).t()                             # [rows, H]
        if w["b2"] is not None:
            y = y + w["b2"][e].float()
        out.index_add_(0, tok, rnd(y * weights[tok, slot][:, None]))
    return out[:, :shape.hidden]


def rel_error(got, want):
    """Relative Frobenius error, rounded; None for a NaN or infinite one
    (JSON has no NaN)."""
    err = float(torch.linalg.norm(got - want) / torch.linalg.norm(want))
    return round(err, 5) if math.isfinite(err) else None


def make_buffers(shape, pad, quant, tokens, seed, device):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + tokens)
    x = torch.zeros(tokens, pad.hidden, dtype=torch.bfloat16, device=device)
    x[:, :shape.hidden] = torch.randn(tokens, shape.hidden, generator=gen, device=device).to(torch.bfloat16)
    ids, weights = random_topk(shape, tokens, seed + 1 + tokens, device)
    k, bf16 = shape.top_k, torch.bfloat16
    scales = (None, None)
    if quant.name == "fp8_tensor":
        scales = (x.float().abs().amax().reshape(1) / FP8_MAX, torch.ones(1, device=device))
    return Buffers(x, ids, weights, torch.empty(tokens, k, 2 * pad.intermediate, dtype=bf16, device=device),
                   torch.empty(tokens * k, pad.intermediate, dtype=bf16, device=device),
                   torch.empty(tokens, k, pad.hidden, dtype=bf16, device=device),
                   torch.empty(tokens, pad.hidden, dtype=bf16, device=device), *scales)


# ---- timing --------------------------------------------------------------------


def run_point(v, shape, pad, quant, weights, tokens, args, device):
    bufs = make_buffers(shape, pad, quant, tokens, args.seed, device)
    config, source = choose_config(v, shape, pad, quant, tokens)
    route = assignment(v, shape, quant, config, bufs)
    experts_forward(v, shape, quant, config, weights[0], route, bufs)
    if quant.name == "fp8_tensor":  # the static activation scale: amax of this untimed call's activation
        bufs.a2_scale.copy_(bufs.cache2.float().abs().amax().reshape(1) / FP8_MAX)
        experts_forward(v, shape, quant, config, weights[0], route, bufs)
    torch.cuda.synchronize()
    n = min(tokens, args.check_tokens)
    got = bufs.out[:n, :shape.hidden].float()
    rel_err = rel_error(got, reference(shape, pad, quant, weights[0], bufs, n, emulate=False))
    rel_emulated = rel_error(got, reference(shape, pad, quant, weights[0], bufs, n, emulate=True))

    def experts_only():
        for w in weights:
            experts_forward(v, shape, quant, config, w, route, bufs)

    def with_align():
        for w in weights:
            experts_forward(v, shape, quant, config, w, assignment(v, shape, quant, config, bufs), bufs)

    copies = len(weights)
    us = time_graph(torch, experts_only, args.replays, args.warmup) * 1e3 / copies
    us_align = time_graph(torch, with_align, args.replays, args.warmup) * 1e3 / copies
    return {"T": tokens, "us": round(us, 1), "us_incl_align": round(us_align, 1), "rel_err": rel_err,
            "rel_err_emulated": rel_emulated, "checked_tokens": n, "config": config,
            "config_source": source, "assignment": "naive" if naive_assignment(shape, tokens) else "aligned"}


def run_shape(v, name, quant, args, device, emit):
    shape = SHAPES[name]
    pad = pad_shape(shape, quant)
    base = {"peer": quant.peer, "shape": name, "quant": quant.name, "E": shape.experts, "H": shape.hidden,
            "I": shape.intermediate, "K": shape.top_k, "activation": shape.activation, "padded": pad.note(shape)}
    try:
        props = torch.cuda.get_device_properties(device)
        free, _ = torch.cuda.mem_get_info(device)
        budget = args.weight_budget_gib * 2**30 if args.weight_budget_gib else 0.5 * free
        copies, rotated = weight_copies(shape, pad, quant, args.tokens, props.L2_cache_size, args.max_copies,
                                        budget)
        first = make_weights(shape, pad, quant, args.seed, device)
        weights = [first] + [copy_weights(first) for _ in range(copies - 1)]
    except Exception as exc:  # a shape that cannot be set up fails its points only
        for t in args.tokens:
            emit(dict(base, T=t, error=f"setup: {type(exc).__name__}: {exc}"))
        if args.verbose:
            traceback.print_exc()
        return
    base.update(weight_copies=copies, l2_rotated=rotated, replays=args.replays, **steps(quant, shape))
    for t in args.tokens:
        try:
            emit(dict(base, **run_point(v, shape, pad, quant, weights, t, args, device)))
        except Exception as exc:
            emit(dict(base, T=t, error=f"{type(exc).__name__}: {exc}"))
            if args.verbose:
                traceback.print_exc()
        torch.cuda.empty_cache()
    del weights, first
    torch.cuda.empty_cache()


# ---- dry run and main ------------------------------------------------------------


def align_self_test():
    """moe_align_block_size on a small CPU case against the layout vLLM's
    docstring gives: every flat index once, in its expert's padded run."""
    gen = torch.Generator()
    gen.manual_seed(0)
    ids = torch.randint(0, 7, (13, 3), generator=gen, dtype=torch.int32)
    sorted_ids, expert_ids, total = moe_align_block_size(ids, 4, 9)
    flat, n = ids.reshape(-1), ids.numel()
    valid = sorted_ids[:int(total)] < n
    ok = sorted(sorted_ids[:int(total)][valid].tolist()) == list(range(n))
    rows = torch.arange(int(total))
    ok &= bool((flat[sorted_ids[:int(total)][valid].long()] == expert_ids[rows[valid] // 4]).all())
    return ok and int(total) % 4 == 0 and sorted_ids.numel() == n + 9 * 3


def plan_lines(args, v):
    l2 = args.l2_mib * 2**20
    budget = args.weight_budget_gib * 2**30 if args.weight_budget_gib else 40 * 2**30
    for qname in args.quant:
        quant = QUANTS[qname]
        for name in args.shapes:
            shape = SHAPES[name]
            pad = pad_shape(shape, quant)
            copies, rotated = weight_copies(shape, pad, quant, args.tokens, l2, args.max_copies, budget)
            line = {"plan": name, "quant": qname, "peer": quant.peer, "E": shape.experts, "H": shape.hidden,
                    "I": shape.intermediate, "K": shape.top_k, "activation": shape.activation,
                    "padded": pad.note(shape),
                    "weight_gib_per_copy": round(shape.experts * expert_bytes(shape, pad, quant) / 2**30, 3),
                    "weight_copies": copies, "l2_rotated": rotated, "tokens": args.tokens}
            if v is not None:
                line["configs"] = {}
                for t in args.tokens:
                    config, source = choose_config(v, shape, pad, quant, t)
                    line["configs"][t] = {"source": source, "config": config,
                                          "assignment": "naive" if naive_assignment(shape, t) else "aligned"}
            line["assumed"] = {"device_name": args.device_name or DRY_RUN_DEVICE, "l2_mib": args.l2_mib,
                               "weight_budget_gib": budget / 2**30}
            line.update(steps(quant, shape))
            yield line


def dry_run(args):
    try:
        v = load_vllm(args.deps, args.device_name or DRY_RUN_DEVICE)
        status = {"vllm_files": "loaded", "source": v.source, "configs_dir": str(v.configs_dir),
                  "kernels": "defined (Triton JIT functions)" if v.kernels else "not defined: Triton is not installed"}
    except Exception as exc:
        v, status = None, {"vllm_files": "not loadable", "error": f"{type(exc).__name__}: {exc}"}
    for line in plan_lines(args, v):
        print(json.dumps(line), flush=True)
    status["align_self_test"] = align_self_test() if torch is not None else "skipped: PyTorch is not installed"
    print(json.dumps(status), flush=True)
    return 0 if v is not None and status["align_self_test"] is not False else 1


def main(argv):
    ap = argparse.ArgumentParser(
        description=f"Time vLLM {VLLM_VERSION}'s Triton fused_moe_kernel (BF16, FP8 block-128, FP8 per tensor; "
                    f"its tuned configs) on an sm_90 GPU; one JSON line per (shape, quant, T).",
        epilog="Needs `scripts/setup.sh --peers` (vLLM's files under .deps/peers), PyTorch and Triton; "
               "not the vllm package.")
    ap.add_argument("--shapes", type=lambda s: parse_names(s, SHAPES, "shape(s)"), default=DEFAULT_SHAPES.split(","),
                    help=f"presets, comma-separated (default {DEFAULT_SHAPES}; known: {', '.join(SHAPES)})")
    ap.add_argument("--quant", type=lambda s: parse_names(s, QUANTS, "quant(s)"), default=DEFAULT_QUANTS.split(","),
                    help=f"variants, comma-separated (default {DEFAULT_QUANTS})")
    ap.add_argument("--tokens", type=parse_tokens, default=parse_tokens(DEFAULT_TOKENS),
                    help=f"token counts T, comma-separated (default {DEFAULT_TOKENS})")
    ap.add_argument("--device-name", default="",
                    help="the card name for vLLM's config lookup (default: the GPU's; the dry run assumes "
                         f"{DRY_RUN_DEVICE})")
    ap.add_argument("--deps", default=str(DEFAULT_DEPS),
                    help=f"folder holding {VLLM_FILES}/ (default: the repository's .deps/peers)")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the plan (padding, weight copies, each T's config and its source, which steps "
                         "are vLLM's), load vLLM's files and check the alignment on the CPU; no GPU needed")
    add_timing_arguments(ap, "the fp32 references")
    args = ap.parse_args(argv)
    check_timing_arguments(ap, args)

    if args.dry_run:
        return dry_run(args)

    try:
        if torch is None or triton is None:
            raise RuntimeError("PyTorch and Triton are needed")
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        capability = torch.cuda.get_device_capability()
        device_name = args.device_name or torch.cuda.get_device_name()
        v = load_vllm(args.deps, device_name, capability)
    except Exception as exc:
        print(f"vllm_fused_moe_peer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    rows = []

    emit = emitter(rows)
    for qname in args.quant:
        for name in args.shapes:
            run_shape(v, name, QUANTS[qname], args, device, emit)
    if args.json:
        write_results(args.json, f"vLLM {VLLM_VERSION} Triton fused_moe_kernel, experts only, precomputed top-k",
                      v.source, rows, argv, torch, triton, extra={"config_device_name": device_name})
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
