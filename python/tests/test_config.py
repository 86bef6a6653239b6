"""MoEConfig: the fields, the text form through the C++ parser, and errors
that name the field."""

import pytest

import unimoe
from unimoe import ExpertsConfig, MoEConfig, RoutingConfig


def test_defaults_are_the_cpp_defaults():
    text = str(MoEConfig())
    assert text.startswith("policy=Renormalize E=0 K=0 n_group=1 topk_group=1 scale=1 ")
    assert "act=SwiGLU alpha=1.702 limit=7 expert_bias=0 local_offset=0 local_experts=-1" in text
    assert text.endswith("quant=BF16 backend=auto deterministic=1")


def test_keywords_text_and_parts_agree():
    by_keywords = MoEConfig(policy="DeepSeekV3", num_experts=256, top_k=8, n_group=8,
                            topk_group=4, routed_scaling_factor=2.5, routing_bias=True,
                            hidden=7168, intermediate=256, quant="FP8Block128")
    text = ("policy=DeepSeekV3 E=256 K=8 n_group=8 topk_group=4 scale=2.5 routing_bias=1 "
            "logits=F32 H=7168 I=256 act=SwiGLU alpha=1.702 limit=7 expert_bias=0 "
            "local_offset=0 local_experts=-1 quant=FP8Block128 backend=auto deterministic=1")
    assert str(by_keywords) == text
    parsed = MoEConfig.parse(text)
    assert parsed == by_keywords
    assert parsed.routing.policy == "DeepSeekV3" and parsed.routing.has_bias is True
    assert parsed.routing.routed_scaling_factor == 2.5
    assert parsed.experts.hidden == 7168 and parsed.experts.quant == "FP8Block128"
    by_parts = MoEConfig(
        routing=RoutingConfig(policy="DeepSeekV3", num_experts=256, top_k=8, n_group=8,
                              topk_group=4, routed_scaling_factor=2.5, has_bias=True),
        experts=ExpertsConfig(hidden=7168, intermediate=256, quant="FP8Block128"))
    assert str(by_parts) == text


def test_round_trip_keeps_every_field():
    c = MoEConfig(policy="TopKSigmoid", num_experts=16, top_k=3, logits_type="BF16", hidden=64,
                  intermediate=96, activation="SwiGLUOai", swiglu_alpha=1.5, swiglu_limit=6.25,
                  expert_bias=True, local_expert_offset=4, num_local_experts=8,
                  backend="stream", routing_variant="cluster")
    again = MoEConfig.parse(str(c))
    assert str(again) == str(c)
    assert again.routing.logits_type == "BF16"
    assert again.experts.swiglu_alpha == 1.5 and again.experts.swiglu_limit == 6.25
    assert again.experts.has_bias is True and again.routing.has_bias is False
    assert (again.experts.local_expert_offset, again.experts.num_local_experts) == (4, 8)
    assert again.options.backend == "stream" and again.options.routing_variant == "cluster"
    assert again.local_experts() == 8 and again.gemm1_cols() == 192


def test_parse_accepts_any_order_and_spacing():
    c = MoEConfig.parse("  I=32   H=64 K=2 E=8 policy=Default ")
    assert (c.routing.policy, c.routing.num_experts, c.routing.top_k) == ("Default", 8, 2)
    assert (c.experts.hidden, c.experts.intermediate) == (64, 32)


@pytest.mark.parametrize("make, field", [
    (lambda: MoEConfig(policy="Softmax"), "routing.policy"),
    (lambda: MoEConfig(activation="Tanh"), "experts.activation"),
    (lambda: MoEConfig(quant="INT4"), "experts.quant"),
    (lambda: MoEConfig(logits_type="F16"), "routing.logits_type"),
    (lambda: MoEConfig(backend="two words"), "options.backend"),
    (lambda: MoEConfig.parse("policy=Default E=eight"), "E"),
    (lambda: MoEConfig.parse("policy=Default colour=blue"), "config"),
    (lambda: MoEConfig.parse("policy"), "config"),
    (lambda: MoEConfig.parse("deterministic=maybe"), "deterministic"),
])
def test_a_bad_value_names_its_field(make, field):
    with pytest.raises(unimoe.Error) as e:
        make()
    assert e.value.field == field
    assert field in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_experts=8, top_k=9, hidden=64, intermediate=32), "routing.top_k"),
    (dict(num_experts=8, top_k=2, hidden=60, intermediate=32), "experts.hidden"),
    (dict(num_experts=8, top_k=2, hidden=64, intermediate=32, quant="FP8Block128"),
     "experts.hidden"),
    (dict(policy="Llama4", num_experts=8, top_k=2, hidden=64, intermediate=32), "routing.top_k"),
    (dict(num_experts=8, top_k=2, hidden=64, intermediate=32, routing_bias=True),
     "routing.has_bias"),
    (dict(num_experts=8, top_k=2, hidden=64, intermediate=32, routing_variant="fastest"),
     "options.routing_variant"),
])
def test_validate_names_the_impossible_field(kwargs, field):
    c = MoEConfig(**kwargs)  # each value parses; together they cannot run
    with pytest.raises(unimoe.Error) as e:
        c.validate()
    assert e.value.field == field


def test_wrong_python_types():
    with pytest.raises(TypeError, match="routing.num_experts"):
        MoEConfig(num_experts="8")
    with pytest.raises(TypeError, match="experts.has_bias"):
        MoEConfig(expert_bias=1)
    with pytest.raises(TypeError, match="unknown field 'has_bias'"):
        MoEConfig(has_bias=True)  # ambiguous: routing_bias or expert_bias
    with pytest.raises(TypeError):
        MoEConfig.parse(42)
