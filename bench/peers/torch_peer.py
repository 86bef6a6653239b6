#!/usr/bin/env python3
"""The PyTorch peer: the BF16 MoE layer as a PyTorch user writes it, timed
the way unimoe-bench times unimoe, so that the two can be compared on the
same card in the same run.

The layer uses PyTorch operators only:
  routing   softmax over all experts (fp32), top-k, weights renormalized
            to sum to 1 per token;
  permute   the (token, slot) pairs sorted by expert (stable), each
            expert's end row found by searchsorted;
  experts   torch._grouped_mm for the gate/up projection, SiLU(gate) * up,
            torch._grouped_mm for the down projection;
  finalize  each row scaled by its routing weight and added into its
            token's output row (index_add_).
Weights: w13 [E, 2I, H] (the I gate rows, then the I up rows), w2 [E, H, I].

Timing: the whole layer (routing included) captured in a CUDA graph and
replayed, median of triton.testing.do_bench_cudagraph.

    python3 bench/peers/torch_peer.py --shape qwen3-30b-a3b --tokens 1,64,4096 [--check]

Output: one JSON line per token count, flushed as it is measured:
    {"shape": "qwen3-30b-a3b", "T": 64, "torch_grouped_us": 501.4}
With --check, each line also has "torch_grouped_err": the relative error
(Frobenius norm) of the first tokens' outputs against an fp32 loop over
the experts. unimoe-bench --peer PATH runs this script for each preset it
times and reads the torch_grouped_us of each line.
"""
import argparse
import json
import sys
from typing import NamedTuple

from peer_util import parse_tokens  # a sibling module: the script's folder is on sys.path


class Shape(NamedTuple):
    experts: int       # E
    hidden: int        # H
    intermediate: int  # I
    top_k: int         # K


# The model presets of unimoe-bench that the peer knows (same E, H, I, K).
SHAPES = {
    "mixtral-8x7b": Shape(8, 4096, 14336, 2),
    "qwen3-30b-a3b": Shape(128, 2048, 768, 8),
    "qwen3-235b-a22b": Shape(128, 4096, 1536, 8),
    "dsv3-tp8": Shape(256, 7168, 256, 8),
    "gpt-oss-120b": Shape(128, 2880, 2880, 4),
}

DEFAULT_TOKENS = "1,8,64,512,4096,16384"
CHECKED_TOKENS = 8  # tokens compared with the fp32 loop under --check


def make_weights(shape, device, torch):
    """Random BF16 expert weights scaled by 1/sqrt(fan-in), so that the
    activations stay near unit size."""
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    w13 = (torch.randn(e, 2 * i, h, device=device) * h ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, device=device) * i ** -0.5).to(torch.bfloat16)
    return w13, w2


def route(logits, top_k, torch):
    """Softmax top-k with the chosen weights renormalized: (weights, ids)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), ids


def grouped_layer(x, logits, w13, w2, top_k, torch):
    """One forward pass of the layer; w13 and w2 as make_weights returns them."""
    experts = w13.shape[0]
    weights, ids = route(logits, top_k, torch)
    expert_of_slot, slot = torch.sort(ids.reshape(-1), stable=True)
    token_of_slot = slot // top_k
    bounds = torch.arange(experts, device=x.device, dtype=expert_of_slot.dtype)
    ends = torch.searchsorted(expert_of_slot, bounds, right=True, out_int32=True)
    # torch._grouped_mm multiplies rows [ends[e-1], ends[e]) by the e-th
    # [K, N] matrix; the transposed views keep the weights K-major.
    gate_up = torch._grouped_mm(x[token_of_slot], w13.transpose(-2, -1), offs=ends)
    gate, up = gate_up.chunk(2, dim=-1)
    down = torch._grouped_mm(torch.nn.functional.silu(gate) * up, w2.transpose(-2, -1), offs=ends)
    scale = weights.reshape(-1)[slot].to(down.dtype).unsqueeze(-1)
    out = torch.zeros_like(x)
    out.index_add_(0, token_of_slot, down * scale)
    return out


def reference(x, logits, w13, w2, top_k, torch):
    """The same layer in fp32, token by token and expert by expert."""
    weights, ids = route(logits, top_k, torch)
    inter = w2.shape[-1]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for t in range(x.shape[0]):
        xt = x[t].float()
        for k in range(top_k):
            e = int(ids[t, k])
            gate_up = w13[e].float() @ xt
            act = torch.nn.functional.silu(gate_up[:inter]) * gate_up[inter:]
            out[t] += weights[t, k] * (w2[e].float() @ act)
    return out


def relative_error(got, want, torch):
    return float(torch.linalg.norm(got.float() - want) / torch.linalg.norm(want))


def main(argv):
    ap = argparse.ArgumentParser(description="Time a PyTorch grouped-mm MoE layer (the peer of unimoe-bench --peer).")
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES), help="model preset")
    ap.add_argument("--tokens", type=parse_tokens, default=parse_tokens(DEFAULT_TOKENS),
                    help=f"token counts T, comma-separated (default {DEFAULT_TOKENS})")
    ap.add_argument("--rep", type=int, default=100, help="milliseconds of graph replays per point (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs (default 0)")
    ap.add_argument("--check", action="store_true",
                    help=f"also print the relative error of the first {CHECKED_TOKENS} tokens against an fp32 loop")
    args = ap.parse_args(argv)

    import torch
    import triton.testing

    if not torch.cuda.is_available():
        print("torch_peer: no CUDA device", file=sys.stderr)
        return 1
    shape = SHAPES[args.shape]
    device = "cuda"
    torch.manual_seed(args.seed)
    w13, w2 = make_weights(shape, device, torch)
    for tokens in args.tokens:
        x = torch.randn(tokens, shape.hidden, device=device).to(torch.bfloat16)
        logits = torch.randn(tokens, shape.experts, device=device)

        def forward():
            return grouped_layer(x, logits, w13, w2, shape.top_k, torch)

        ms = triton.testing.do_bench_cudagraph(forward, rep=args.rep, return_mode="median")
        row = {"shape": args.shape, "T": tokens, "torch_grouped_us": round(ms * 1e3, 1)}
        if args.check:
            n = min(tokens, CHECKED_TOKENS)
            got = forward()[:n]
            want = reference(x[:n], logits[:n], w13, w2, shape.top_k, torch)
            row["torch_grouped_err"] = relative_error(got, want, torch)
        print(json.dumps(row), flush=True)
        del x, logits
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
