"""unimoe against transformers' own MoE blocks, built from tiny random
configs: the layer is configured by from_hf_config, loaded by
load_hf_experts, and given the router logits the block's gate computes;
shared experts, which the layer leaves to the caller, are added as a model
would add them. On the CPU reference, and on the GPU layer where there is one.

Bound: the blocks compute in fp32 from the same bf16-representable weights
and x; the layer rounds the activated intermediate to bf16 and its output
to bf16, each at most 2^-9 relative per element, about 2^-8 of the
output's norm together. 1e-2 is the project's BF16 bound for the GPU layer
(docs/design.md), which also covers the GPU's fp32 accumulation order.
"""

import json

import pytest
import torch
import torch.nn.functional as F

import unimoe
from conftest import DEVICES, bf16_values, rel_err

transformers = pytest.importorskip("transformers")

BOUND = 1e-2
T, H, I = 11, 64, 32


def randomize(module, seed, scale=0.1):
    """Every parameter and float buffer to bf16-representable random values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            if t.is_floating_point():
                t.copy_(bf16_values(*t.shape, scale=scale, generator=g))
    return module


def unimoe_forward(hf_config, block, device, x, logits, routing_bias=None):
    config = unimoe.from_hf_config(hf_config)
    layer = unimoe.MoELayer(config, 32, device=device)
    weights = {k: v.to(device) for k, v in unimoe.load_hf_experts(block).items()}
    layer.set_weights(**weights)
    bias = None if routing_bias is None else routing_bias.float().to(device)
    out = layer(x.bfloat16().to(device), logits.float().to(device), bias)
    assert out.device.type == device
    return out.cpu().double()


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return bf16_values(T, H, generator=g)


@pytest.mark.parametrize("device", DEVICES)
def test_mixtral(device):
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    cfg = transformers.MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=8,
                                     num_experts_per_tok=2)
    block = randomize(MixtralSparseMoeBlock(cfg), 1)
    x = inputs(1)
    want = block(x.view(1, T, H)).view(T, H)
    got = unimoe_forward(cfg, block, device, x, F.linear(x, block.gate.weight))
    assert rel_err(got, want) < BOUND


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_qwen3_moe(device, norm_topk_prob):
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
    cfg = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=16,
                                      num_experts_per_tok=4, norm_topk_prob=norm_topk_prob)
    config = unimoe.from_hf_config(cfg)
    assert config.routing.policy == ("Renormalize" if norm_topk_prob else "Default")
    assert (config.routing.num_experts, config.routing.top_k) == (16, 4)
    block = randomize(Qwen3MoeSparseMoeBlock(cfg), 2)
    x = inputs(2)
    want = block(x.view(1, T, H)).view(T, H)
    got = unimoe_forward(cfg, block, device, x, F.linear(x, block.gate.weight))
    assert rel_err(got, want) < BOUND


@pytest.mark.parametrize("device", DEVICES)
def test_qwen2_moe_routed_plus_gated_shared_expert(device):
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    cfg = transformers.Qwen2MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=8,
                                      num_experts_per_tok=2, shared_expert_intermediate_size=48)
    block = randomize(Qwen2MoeSparseMoeBlock(cfg), 3)
    x = inputs(3)
    want = block(x.view(1, T, H)).view(T, H)
    routed = unimoe_forward(cfg, block, device, x, F.linear(x, block.gate.weight))
    with torch.no_grad():
        shared = torch.sigmoid(block.shared_expert_gate(x)) * block.shared_expert(x)
    assert rel_err(routed + shared, want) < BOUND


@pytest.mark.parametrize("device", DEVICES)
def test_deepseek_v3_routed_part(device):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    cfg = transformers.DeepseekV3Config(hidden_size=H, moe_intermediate_size=I,
                                        n_routed_experts=16, num_experts_per_tok=4, n_group=4,
                                        topk_group=2, n_shared_experts=1,
                                        routed_scaling_factor=2.5)
    block = randomize(DeepseekV3MoE(cfg), 4)
    x = inputs(4)
    with torch.no_grad():
        want = block(x.view(1, T, H)).view(T, H)
        shared = block.shared_experts(x)
    logits = F.linear(x.float(), block.gate.weight.float())
    routed = unimoe_forward(cfg, block, device, x, logits, block.gate.e_score_correction_bias)
    assert rel_err(routed + shared, want) < BOUND


@pytest.mark.parametrize("device", DEVICES)
def test_gpt_oss(device):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
    cfg = transformers.GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=8,
                                    num_experts_per_tok=2)
    # weights large enough that some gate and up values pass the clamp limit
    block = randomize(GptOssMLP(cfg), 5, scale=1.0)
    x = inputs(5)
    with torch.no_grad():
        want, _ = block(x.view(1, T, H))
        gate_up = torch.einsum("th,ehn->ten", x, block.experts.gate_up_proj)
    assert (gate_up.abs() > block.experts.limit).any()
    logits = F.linear(x, block.router.weight, block.router.bias)
    got = unimoe_forward(cfg, block, device, x, logits)
    assert rel_err(got, want.view(T, H)) < BOUND


@pytest.mark.parametrize("device", DEVICES)
def test_llama4_with_the_weight_on_the_input(device):
    """Llama-4 multiplies the expert's input by the router weight, which no
    unimoe config computes (from_hf_config refuses it). With K = 1 the
    caller gets Llama-4's output exactly as documented in docs/python.md:
    x * sigmoid(top logit) in, the argmax expert by precomputed routing
    with weight 1, plus the shared expert."""
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe
    cfg = transformers.Llama4TextConfig(hidden_size=H, intermediate_size=I,
                                        intermediate_size_mlp=48, num_local_experts=8,
                                        num_experts_per_tok=1)
    with pytest.raises(unimoe.Error) as e:
        unimoe.from_hf_config(cfg)
    assert e.value.field == "hf_config.model_type"
    block = randomize(Llama4TextMoe(cfg), 6)
    x = inputs(6)
    with torch.no_grad():
        want, _ = block(x.view(1, T, H))
        shared = block.shared_expert(x)
        logits = F.linear(x, block.router.weight)
    top, ids = logits.max(-1, keepdim=True)
    layer = unimoe.MoELayer(unimoe.MoEConfig(policy="Llama4", num_experts=8, top_k=1, hidden=H,
                                             intermediate=I), 32, device=device)
    layer.set_weights(**{k: v.to(device) for k, v in unimoe.load_hf_experts(block).items()})
    scaled = (x * torch.sigmoid(top)).bfloat16().to(device)
    routed = layer(scaled, topk_ids=ids.int().to(device),
                   topk_weights=torch.ones(T, 1, device=device))
    assert rel_err(routed.cpu().double() + shared, want.view(T, H)) < BOUND


class _OldExpert(torch.nn.Module):
    """An expert MLP as older Mixtral checkpoints hold it: w1 gate, w3 up, w2 down."""

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Linear(H, I, bias=False)
        self.w3 = torch.nn.Linear(H, I, bias=False)
        self.w2 = torch.nn.Linear(I, H, bias=False)


def test_per_expert_linear_layout():
    experts = torch.nn.ModuleList([_OldExpert() for _ in range(4)])
    w = unimoe.load_hf_experts(experts)
    assert w["w13"].shape == (4, 2 * I, H) and w["w2"].shape == (4, H, I)
    assert w["w13"].dtype == torch.bfloat16
    for e, m in enumerate(experts):
        assert torch.equal(w["w13"][e, :I], m.w1.weight.bfloat16())
        assert torch.equal(w["w13"][e, I:], m.w3.weight.bfloat16())
        assert torch.equal(w["w2"][e], m.w2.weight.bfloat16())


def test_fp8_expert_weights_are_refused_not_converted():
    # e4m3 codes cast to bf16 without their scales would be wrong weights:
    # load_hf_experts refuses them and names the FP8 loaders.
    experts = torch.nn.ModuleList([_OldExpert() for _ in range(4)])
    for m in experts:
        m.w1.weight = torch.nn.Parameter(m.w1.weight.data.to(torch.float8_e4m3fn),
                                         requires_grad=False)
    with pytest.raises(unimoe.Error, match="load_fp8_block_experts") as e:
        unimoe.load_hf_experts(experts)
    assert e.value.field == "module"
    fused = torch.nn.Module()  # transformers 5's fused layout, in e4m3
    fused.gate_up_proj = torch.nn.Parameter(torch.zeros(4, 2 * I, H, dtype=torch.float8_e4m3fn),
                                            requires_grad=False)
    fused.down_proj = torch.nn.Parameter(torch.zeros(4, H, I, dtype=torch.float8_e4m3fn),
                                         requires_grad=False)
    with pytest.raises(unimoe.Error, match="load_fp8_tensor_experts"):
        unimoe.load_hf_experts(fused)


def test_from_hf_config_reads_dicts_and_paths(tmp_path):
    d = {"model_type": "mixtral", "hidden_size": H, "intermediate_size": I,
         "num_local_experts": 8, "num_experts_per_tok": 2}
    (tmp_path / "config.json").write_text(json.dumps(d))
    want = "policy=Renormalize E=8 K=2"
    assert str(unimoe.from_hf_config(d)).startswith(want)
    assert str(unimoe.from_hf_config(tmp_path)).startswith(want)
    assert str(unimoe.from_hf_config(str(tmp_path / "config.json"))).startswith(want)
    with pytest.raises(unimoe.Error) as e:
        unimoe.from_hf_config({"model_type": "bert"})
    assert e.value.field == "hf_config.model_type"
    with pytest.raises(TypeError):
        unimoe.from_hf_config(42)
