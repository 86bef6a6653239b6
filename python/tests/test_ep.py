"""EPLayer from Python (docs/expert-parallel.md): its argument checks
everywhere, and on a GPU a group of one over NCCL against MoELayer on the
same weights and routing. Groups of several GPUs are checked by
scripts/ep_check.sh (unimoe-bench --ep), one process a GPU.

Bound: bit for bit. A group of one gives its local layer the caller's T
tokens and routing, so it plans as MoELayer does, and its combine adds the
one partial sum to -0.
"""

import pytest
import torch

import unimoe
from conftest import bf16_values, gpu_skip_reason

E, H, I, K, T = 16, 256, 128, 4, 48
CONFIG = f"policy=Renormalize E={E} K={K} H={H} I={I}"


def test_nccl_support_says_why_not():
    why = unimoe.nccl_support()
    assert isinstance(why, str)
    if why:
        assert "NCCL" in why or "CUDA" in why or "nccl" in why


def test_arguments_are_checked_first():
    with pytest.raises(unimoe.Error) as e:
        unimoe.EPLayer(CONFIG, T, b"short", 1, 0)
    assert e.value.field == "nccl_id"
    with pytest.raises(TypeError):
        unimoe.EPLayer(CONFIG, T, bytes(128), True, 0)
    with pytest.raises(TypeError):
        unimoe.EPLayer(CONFIG, T, bytes(128), 1, 0.0)
    with pytest.raises(unimoe.Error) as e:
        unimoe.EPLayer(CONFIG, T, bytes(128), 1, 0, device="cpu")
    assert e.value.field == "device"


def test_ep_scratch_bytes_checks_its_arguments():
    with pytest.raises(TypeError):
        unimoe.ep_scratch_bytes(CONFIG, True, 1)
    with pytest.raises(TypeError):
        unimoe.ep_scratch_bytes(CONFIG, T, 1.0)
    if gpu_skip_reason() is not None:
        with pytest.raises(RuntimeError):
            unimoe.ep_scratch_bytes(CONFIG, T, 1)
        return
    assert unimoe.ep_scratch_bytes(CONFIG, T, 2) > unimoe.ep_scratch_bytes(CONFIG, T, 1) > 0
    with pytest.raises(unimoe.Error) as e:
        unimoe.ep_scratch_bytes(CONFIG, T, 0)
    assert e.value.field == "world_size"


def _skip_reason():
    reason = gpu_skip_reason()
    if reason is None and unimoe.nccl_support():
        reason = "NCCL not usable here: " + unimoe.nccl_support()
    return reason


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_group_of_one_is_the_single_layer_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    w13 = bf16_values(E, 2 * I, H, scale=0.05, generator=g).bfloat16().cuda()
    w2 = bf16_values(E, H, I, scale=0.05, generator=g).bfloat16().cuda()
    x = bf16_values(T, H, generator=g).bfloat16().cuda()
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int().cuda()
    weights = torch.rand(T, K, generator=g).cuda()
    single = unimoe.MoELayer(CONFIG, T, device="cuda")
    single.set_weights(w13, w2)
    ep = unimoe.EPLayer(CONFIG, T, unimoe.nccl_unique_id(), 1, 0, device="cuda")
    ep.set_weights(w13, w2)
    assert ep.bytes_sent_per_call == 0  # no other rank
    want = single(x, topk_ids=ids, topk_weights=weights)
    got = ep(x, topk_ids=ids, topk_weights=weights)
    torch.cuda.synchronize()
    assert torch.equal(got, want)
    # From logits too (the EP layer routes with its own kernel): within the bound.
    logits = torch.randn(T, E, generator=g).cuda()
    diff = (ep(x, logits).double() - single(x, logits).double()).norm() / single(x, logits).double().norm()
    assert diff.item() < 1e-2
    with pytest.raises(unimoe.Error) as e:
        ep(x.cpu(), logits.cpu())
    assert e.value.field == "x"


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_group_of_one_in_a_cuda_graph():
    g = torch.Generator().manual_seed(1)
    w13 = bf16_values(E, 2 * I, H, scale=0.05, generator=g).bfloat16().cuda()
    w2 = bf16_values(E, H, I, scale=0.05, generator=g).bfloat16().cuda()
    ep = unimoe.EPLayer(CONFIG, T, unimoe.nccl_unique_id(), 1, 0)
    ep.set_weights(w13, w2)
    single = unimoe.MoELayer(CONFIG, T, device="cuda")
    single.set_weights(w13, w2)
    x = bf16_values(T, H, generator=g).bfloat16().cuda()
    logits = torch.randn(T, E, generator=g).cuda()
    ep(x, logits)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ep(x, logits)
    for seed in (2, 3):
        logits.copy_(torch.randn(T, E, generator=torch.Generator().manual_seed(seed)).cuda())
        graph.replay()
        torch.cuda.synchronize()
        want = single(x, logits)
        diff = (out.double() - want.double()).norm() / want.double().norm()
        assert diff.item() < 1e-2


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_groups_of_one_sharing_a_scratch():
    """Two EP layers of different shapes on one scratch, run one after the
    other (A, B, A again), each bit for bit its single layer; a scratch
    too small is refused naming it."""
    other = f"policy=Default E=8 K=2 H={H} I={2 * I}"
    g = torch.Generator().manual_seed(4)
    nbytes = max(unimoe.ep_scratch_bytes(CONFIG, T, 1), unimoe.ep_scratch_bytes(other, T, 1))
    scratch = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    layers = []
    for config in (CONFIG, other):
        e, i = (E, I) if config == CONFIG else (8, 2 * I)
        w13 = bf16_values(e, 2 * i, H, scale=0.05, generator=g).bfloat16().cuda()
        w2 = bf16_values(e, H, i, scale=0.05, generator=g).bfloat16().cuda()
        ep = unimoe.EPLayer(config, T, unimoe.nccl_unique_id(), 1, 0, scratch=scratch)
        ep.set_weights(w13, w2)
        single = unimoe.MoELayer(config, T, device="cuda")
        single.set_weights(w13, w2)
        k = K if config == CONFIG else 2
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(T)]).int().cuda()
        weights = torch.rand(T, k, generator=g).cuda()
        layers.append((ep, single, ids, weights))
    x = bf16_values(T, H, generator=g).bfloat16().cuda()
    for ep, single, ids, weights in layers + layers[:1]:
        got = ep(x, topk_ids=ids, topk_weights=weights)
        want = single(x, topk_ids=ids, topk_weights=weights)
        torch.cuda.synchronize()
        assert torch.equal(got, want)
    with pytest.raises(unimoe.Error) as e:
        unimoe.EPLayer(CONFIG, T, unimoe.nccl_unique_id(), 1, 0, scratch=scratch[:256])
    assert e.value.field == "scratch"
