"""Shared pieces of the Python tests: a plain fp64 torch MoE (routing by
docs/routing.md's formulas, experts, FP8 emulation) to check the layer
against, the error metric, and the GPU marker.

Metric (STYLE.md, rule 10): values by relative norm error
||got - want|| / ||want|| over the whole output.
"""

import pytest
import torch
import torch.nn.functional as F

import unimoe


def gpu_skip_reason():
    if not unimoe.has_cuda():
        return "this build of unimoe has no GPU layer (nvcc was not found when it was built)"
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"the GPU is sm_{major}{minor}; the layer needs sm_90 (Hopper)"
    return None


requires_gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))

# Devices a parity test runs on: the CPU reference always, the GPU layer
# where there is one (skipped with the reason elsewhere).
DEVICES = ["cpu", pytest.param("cuda", marks=requires_gpu)]


def rel_err(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).norm() / want.norm()).item()


def bf16_values(*shape, scale=1.0, generator=None):
    """fp32 values that bf16 holds exactly, so both sides start equal."""
    return (torch.randn(*shape, generator=generator) * scale).to(torch.bfloat16).float()


# ------------------------------------------------------------- routing ----

def route(policy, logits, k, bias=None, n_group=1, topk_group=1, scale=1.0):
    """ids [T, K] int64, weights [T, K] fp64: docs/routing.md's formulas."""
    x = logits.double()
    if policy == "Default":
        w, ids = torch.softmax(x, -1).topk(k, -1)
    elif policy == "Renormalize":
        v, ids = x.topk(k, -1)
        w = torch.softmax(v, -1)
    elif policy == "RenormalizeNaive":
        w, ids = torch.softmax(x, -1).topk(k, -1)
        w = w / w.sum(-1, keepdim=True)
    elif policy == "TopK":
        w, ids = x.topk(k, -1)
    elif policy == "Sigmoid":
        w, ids = torch.sigmoid(x).topk(k, -1)
    elif policy == "SigmoidRenorm":
        w, ids = torch.sigmoid(x).topk(k, -1)
        w = w / w.sum(-1, keepdim=True)
    elif policy in ("TopKSigmoid", "Llama4"):
        v, ids = x.topk(k, -1)
        w = torch.sigmoid(v)
    elif policy in ("DeepSeekV3", "MiniMax2"):
        s = torch.sigmoid(x)
        c = s + (bias.double() if bias is not None else 0)
        if n_group > 1:
            t, e = c.shape
            group = c.view(t, n_group, e // n_group).topk(2, -1)[0].sum(-1)
            keep = torch.zeros_like(group).scatter_(1, group.topk(topk_group, -1)[1], 1)
            mask = keep.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e)
            c = c.masked_fill(mask == 0, float("-inf"))
        ids = c.topk(k, -1)[1]
        w = s.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * scale
    else:
        raise ValueError(policy)
    return ids, w


# ------------------------------------------------------------- experts ----

def activate(act, g, u, alpha=1.702, limit=7.0):
    if act == "SwiGLU":
        return F.silu(g) * u
    if act == "GeGLU":
        return F.gelu(g) * u
    if act == "ReLU2":
        return torch.relu(g) ** 2
    if act == "SwiGLUOai":
        g = g.clamp(max=limit)
        u = u.clamp(-limit, limit)
        return g * torch.sigmoid(alpha * g) * (u + 1)
    raise ValueError(act)


def experts(x, ids, w, w13, w2, act="SwiGLU", b13=None, b2=None, local_offset=0,
            quant_input=None, alpha=1.702, limit=7.0):
    """out [T, H] fp64 = sum_k w[t, k] * expert(ids[t, k])(x[t]) over the
    ids this rank serves ([local_offset, local_offset + E_local)).
    quant_input, where given, rounds each GEMM's input as the layer does
    (bf16 between the GEMMs when None)."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    rnd = quant_input or (lambda a: a.to(torch.bfloat16).double())
    if quant_input:
        x = quant_input(x)
    t, h = x.shape
    n_local, n1, _ = w13.shape
    gated = act != "ReLU2"
    inter = n1 // 2 if gated else n1
    rows, cols = torch.nonzero((ids >= local_offset) & (ids < local_offset + n_local),
                               as_tuple=True)
    gemm1 = torch.zeros(rows.numel(), n1, dtype=torch.float64)
    local = ids[rows, cols] - local_offset
    for e in local.unique().tolist():
        sel = local == e
        gemm1[sel] = x[rows[sel]] @ w13[e].T + (b13[e].double() if b13 is not None else 0)
    a = activate(act, gemm1[:, :inter], gemm1[:, inter:] if gated else None, alpha, limit)
    a = rnd(a)
    out = torch.zeros(t, h, dtype=torch.float64)
    for e in local.unique().tolist():
        sel = local == e
        y = a[sel] @ w2[e].T + (b2[e].double() if b2 is not None else 0)
        out.index_add_(0, rows[sel], y * w[rows[sel], cols[sel]].double().unsqueeze(1))
    return out


# ----------------------------------------------------------------- FP8 ----

def quant_blocks(v, block_rows, block_cols):
    """e4m3 codes and fp32 scales (amax / 448 per block, 1 for an all-zero
    block) of v [..., R, C] in blocks of block_rows x block_cols."""
    *lead, r, c = v.shape
    b = v.float().reshape(*lead, r // block_rows, block_rows, c // block_cols, block_cols)
    amax = b.abs().amax(dim=(-3, -1), keepdim=True)
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    codes = (b / scale).to(torch.float8_e4m3fn).reshape(*lead, r, c)
    return codes, scale.reshape(*lead, r // block_rows, c // block_cols)


def dequant_blocks(codes, scale, block_rows, block_cols):
    *lead, r, c = codes.shape
    s = scale.repeat_interleave(block_rows, -2).repeat_interleave(block_cols, -1)
    return codes.float() * s


def quant_rows128(a):
    """FP8Block128's activation rounding: e4m3 with a scale per row and 128 columns."""
    codes, scale = quant_blocks(a, 1, 128)
    return dequant_blocks(codes, scale, 1, 128).double()


def quant_tensor(a):
    """FP8PerTensor's dynamic activation rounding: e4m3, one scale per tensor."""
    codes, scale = quant_blocks(a, a.shape[-2], a.shape[-1])
    return dequant_blocks(codes, scale, a.shape[-2], a.shape[-1]).double()


def static_quant(sx, sa):
    """Rounds GEMM1's input with scale sx, then GEMM2's with sa, saturating at 448."""
    calls = iter([sx, sa])

    def q(a):
        s = next(calls).double()
        return (a / s).clamp(-448, 448).float().to(torch.float8_e4m3fn).double() * s
    return q
