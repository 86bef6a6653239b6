"""The GPU layer from Python: against the CPU reference of the same layer,
the argument checks on the device, torch.compile(fullgraph=True) with
inductor, CUDA-graph capture and replay, FP8 weights through set_weights,
streams, and the tuning calls. Skipped, with the reason, where there is no
Hopper GPU or the build has no GPU layer.

Bound 1e-2 relative norm error: the project's bound for the BF16 and FP8
layers against the reference (docs/design.md, docs/quantization.md): the
GPU accumulates in fp32 in its own order where the reference uses fp64.
"""

import pytest
import torch

import unimoe
from conftest import bf16_values, quant_blocks, rel_err, requires_gpu

pytestmark = requires_gpu

BOUND = 1e-2
E, H, I = 16, 256, 128


def make_layer(config, max_tokens=64, seed=0, scratch=None, **extra):
    g = torch.Generator().manual_seed(seed)
    layer = unimoe.MoELayer(config, max_tokens, device="cuda", scratch=scratch)
    c = layer.config
    w13 = bf16_values(c.local_experts(), c.gemm1_cols(), c.experts.hidden, scale=0.05,
                      generator=g)
    w2 = bf16_values(c.local_experts(), c.experts.hidden, c.experts.intermediate, scale=0.05,
                     generator=g)
    layer.set_weights(w13.bfloat16().cuda(), w2.bfloat16().cuda(), **extra)
    return layer


def call_inputs(t, e=E, h=H, seed=1):
    g = torch.Generator().manual_seed(seed)
    return bf16_values(t, h, generator=g).bfloat16(), torch.randn(t, e, generator=g)


@pytest.mark.parametrize("policy, k", [("Renormalize", 4), ("Default", 4), ("Sigmoid", 2),
                                       ("Llama4", 1), ("TopKSigmoid", 8)])
@pytest.mark.parametrize("t", [1, 7, 64])
def test_gpu_equals_the_reference(policy, k, t):
    layer = make_layer(f"policy={policy} E={E} K={k} H={H} I={I}")
    x, logits = call_inputs(t)
    got = layer(x.cuda(), logits.cuda())
    assert got.device.type == "cuda" and got.dtype == torch.bfloat16 and got.shape == (t, H)
    want = layer(x, logits)  # CPU tensors: the reference, on host copies of the weights
    assert rel_err(got, want) < BOUND


def test_deepseek_routing_bias_and_precomputed_routing():
    layer = make_layer(f"policy=DeepSeekV3 E={E} K=4 n_group=4 topk_group=2 routing_bias=1 "
                       f"H={H} I={I}")
    x, logits = call_inputs(9)
    bias = torch.randn(E) * 0.1
    got = layer(x.cuda(), logits.cuda(), bias.cuda())
    assert rel_err(got, layer(x, logits, bias)) < BOUND
    ids = torch.randint(-1, E + 1, (9, 4), dtype=torch.int32)
    w = torch.rand(9, 4)
    got = layer(x.cuda(), topk_ids=ids.cuda(), topk_weights=w.cuda())
    assert rel_err(got, layer(x, topk_ids=ids, topk_weights=w)) < BOUND


def test_gpu_argument_checks():
    layer = make_layer(f"policy=Renormalize E={E} K=2 H={H} I={I}", max_tokens=8)
    x, logits = call_inputs(4)
    with pytest.raises(unimoe.Error) as e:
        layer(x.cuda(), logits)
    assert e.value.field == "router_logits"
    with pytest.raises(unimoe.Error) as e:
        layer(*(t.cuda() for t in call_inputs(9)))
    assert e.value.field == "x" and "max_tokens" in str(e.value)
    with pytest.raises(TypeError, match="x"):
        layer(x.float().cuda(), logits.cuda())
    with pytest.raises(unimoe.Error) as e:
        layer.set_weights(torch.zeros(E, 2 * I, H, dtype=torch.bfloat16),
                          torch.zeros(E, H, I, dtype=torch.bfloat16).cuda())
    assert e.value.field == "w13"


def test_fp8_block128_weights():
    g = torch.Generator().manual_seed(3)
    c13, s13 = quant_blocks(torch.randn(E, 2 * I, H, generator=g) * 0.05, 128, 128)
    c2, s2 = quant_blocks(torch.randn(E, H, I, generator=g) * 0.05, 128, 128)
    layer = unimoe.MoELayer(f"policy=Renormalize E={E} K=4 H={H} I={I} quant=FP8Block128", 64,
                            device="cuda")
    layer.set_weights(c13.cuda(), c2.cuda(), w13_scale=s13.cuda(), w2_scale=s2.cuda())
    for t in (1, 33):
        x, logits = call_inputs(t, seed=t)
        assert rel_err(layer(x.cuda(), logits.cuda()), layer(x, logits)) < BOUND


def test_fp8_per_tensor_weights():
    g = torch.Generator().manual_seed(4)
    c13, s13 = quant_blocks(torch.randn(E, 2 * I, H, generator=g) * 0.05, 2 * I, H)
    c2, s2 = quant_blocks(torch.randn(E, H, I, generator=g) * 0.05, H, I)
    layer = unimoe.MoELayer(f"policy=Renormalize E={E} K=4 H={H} I={I} quant=FP8PerTensor", 64,
                            device="cuda")
    layer.set_weights(c13.cuda(), c2.cuda(), w13_scale=s13.reshape(E).cuda(),
                      w2_scale=s2.reshape(E).cuda())
    x, logits = call_inputs(16)
    assert rel_err(layer(x.cuda(), logits.cuda()), layer(x, logits)) < BOUND


def test_cuda_graph_replay_with_fresh_inputs():
    layer = make_layer(f"policy=Renormalize E={E} K=4 H={H} I={I}")
    t = 12
    static_x, static_logits = (v.cuda() for v in call_inputs(t, seed=10))
    layer(static_x, static_logits)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = layer(static_x, static_logits)
    for seed in (11, 12, 13):
        x, logits = (v.cuda() for v in call_inputs(t, seed=seed))
        static_x.copy_(x)
        static_logits.copy_(logits)
        graph.replay()
        want = layer(x, logits)  # eager; the forward is deterministic: the same bits
        assert torch.equal(static_out, want)


def test_layers_sharing_a_scratch():
    # Two layers of different shapes on one scratch, run one after another,
    # give the bits of layers with buffers of their own (the forward is
    # deterministic), within the bound of the reference; a scratch one byte
    # short, or at an offset that is not 256-byte aligned, is refused.
    configs = [f"policy=Renormalize E={E} K=4 H={H} I={I}",
               f"policy=Renormalize E=8 K=2 H={H} I=256 quant=FP8Block128 backend=cutlass"]
    need = [unimoe.scratch_bytes(c, 64) for c in configs]
    assert all(n > 64 * 2 * H * 2 for n in need)
    scratch = torch.empty(max(need) + 256, dtype=torch.uint8, device="cuda")
    with pytest.raises(unimoe.Error) as e:
        unimoe.MoELayer(configs[0], 64, scratch=scratch[:need[0] - 1])
    assert e.value.field == "scratch"
    with pytest.raises(unimoe.Error) as e:
        unimoe.MoELayer(configs[0], 64, scratch=scratch[16:])
    assert e.value.field == "scratch"
    g = torch.Generator().manual_seed(5)
    c13, s13 = quant_blocks(torch.randn(8, 512, H, generator=g) * 0.05, 128, 128)
    c2, s2 = quant_blocks(torch.randn(8, H, 256, generator=g) * 0.05, 128, 128)

    def fp8_layer(s):
        layer = unimoe.MoELayer(configs[1], 64, scratch=s)
        layer.set_weights(c13.cuda(), c2.cuda(), w13_scale=s13.cuda(), w2_scale=s2.cuda())
        return layer

    # [shared, own] for each config, on the same weights.
    pairs = [[make_layer(configs[0], seed=6, scratch=scratch), make_layer(configs[0], seed=6)],
             [fp8_layer(scratch), fp8_layer(None)]]
    assert pairs[0][0].workspace_bytes < pairs[0][1].workspace_bytes
    for t in (3, 64):
        inputs = [call_inputs(t, e=E, seed=t), call_inputs(t, e=8, seed=t + 1)]
        shared = [p[0](x.cuda(), l.cuda()) for p, (x, l) in zip(pairs, inputs)]
        for p, (x, l), got in zip(pairs, inputs, shared):
            assert torch.equal(got, p[1](x.cuda(), l.cuda()))
            assert rel_err(got, p[0](x, l)) < BOUND


class Block(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, logits):
        return self.layer(x.bfloat16(), logits).float() * 2 + x


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compile_fullgraph_on_the_gpu(mode):
    torch._dynamo.reset()
    block = Block(make_layer(f"policy=Renormalize E={E} K=4 H={H} I={I}"))
    compiled = torch.compile(block, fullgraph=True, mode=mode)
    for t in (5, 5, 5, 9):
        x, logits = call_inputs(t, seed=t)
        x, logits = x.float().cuda(), logits.cuda()
        got = compiled(x, logits)
        assert torch.equal(got, block(x, logits))


def test_runs_on_the_current_stream():
    layer = make_layer(f"policy=Renormalize E={E} K=4 H={H} I={I}")
    x, logits = (v.cuda() for v in call_inputs(20))
    want = layer(x, logits)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = layer(x, logits)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)


def test_describe_workspace_and_tuning(tmp_path):
    layer = make_layer(f"policy=Renormalize E={E} K=4 H={H} I={I}")
    assert layer.describe(4).startswith("path=")
    assert layer.workspace_bytes > 0
    cache = tmp_path / "tuning.json"
    report = layer.autotune(tokens=[1, 8], iters=3, cache_path=cache)
    assert [line.split(":")[0] for line in report.splitlines()] == ["bucket 1 (T=1)",
                                                                    "bucket 8 (T=8)"]
    assert cache.exists()
    again = make_layer(f"policy=Renormalize E={E} K=4 H={H} I={I}")
    assert "winners for 2 of" in again.use_tuning_cache(cache)
    x, logits = call_inputs(8)
    assert rel_err(again(x.cuda(), logits.cuda()), again(x, logits)) < BOUND
    with pytest.raises(unimoe.Error) as e:
        layer.autotune(tokens=[0])
    assert e.value.field == "autotune.tokens"
