"""Every argument check of MoELayer: the exception's kind (TypeError for a
dtype, unimoe.Error, a ValueError, for a value) and the argument it names.
On the CPU layer; the GPU layer runs the same checks (test_gpu.py)."""

import pytest
import torch

import unimoe

E, K, H, I, T = 8, 2, 64, 32, 5
CONFIG = f"policy=Renormalize E={E} K={K} H={H} I={I}"


def make_layer(config=CONFIG, max_tokens=8):
    layer = unimoe.MoELayer(config, max_tokens, device="cpu")
    layer.set_weights(torch.randn(E, 2 * I, H).bfloat16(), torch.randn(E, H, I).bfloat16())
    return layer


def inputs(t=T):
    return torch.randn(t, H).bfloat16(), torch.randn(t, E)


def test_a_good_call_gives_bf16_t_by_h():
    out = make_layer()(*inputs())
    assert out.dtype == torch.bfloat16 and out.shape == (T, H) and out.device.type == "cpu"
    assert torch.isfinite(out.float()).all() and out.abs().sum() > 0


def test_zero_tokens():
    out = make_layer()(*inputs(0))
    assert out.shape == (0, H)


def test_bad_layer_arguments():
    with pytest.raises(unimoe.Error) as e:
        unimoe.MoELayer(CONFIG, 0, device="cpu")
    assert e.value.field == "max_tokens"
    with pytest.raises(TypeError, match="max_tokens"):
        unimoe.MoELayer(CONFIG, 8.0, device="cpu")
    with pytest.raises(unimoe.Error) as e:
        unimoe.MoELayer(CONFIG.replace("K=2", "K=9"), 8, device="cpu")
    assert e.value.field == "routing.top_k"
    with pytest.raises(TypeError, match="config"):
        unimoe.MoELayer(42, 8, device="cpu")


def test_scratch_checks_on_the_cpu_layer():
    # The CPU reference takes no scratch; a scratch must be a tensor.
    with pytest.raises(TypeError, match="scratch"):
        unimoe.MoELayer(CONFIG, 8, device="cpu", scratch=1024)
    with pytest.raises(unimoe.Error) as e:
        unimoe.MoELayer(CONFIG, 8, device="cpu", scratch=torch.empty(1024, dtype=torch.uint8))
    assert e.value.field == "scratch"
    with pytest.raises(TypeError, match="max_tokens"):
        unimoe.scratch_bytes(CONFIG, 8.0)
    if not (unimoe.has_cuda() and torch.cuda.is_available()):
        with pytest.raises(RuntimeError, match="scratch serves only the GPU layer"):
            unimoe.scratch_bytes(CONFIG, 8)


def expect(exc, field, fn, *args, **kwargs):
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    assert field in str(e.value)
    if exc is unimoe.Error:
        assert e.value.field == field
    return e.value


def test_set_weights_checks():
    layer = unimoe.MoELayer(CONFIG, 8, device="cpu")
    w13, w2 = torch.randn(E, 2 * I, H).bfloat16(), torch.randn(E, H, I).bfloat16()
    expect(TypeError, "w13", layer.set_weights, w13.float(), w2)
    expect(TypeError, "w2", layer.set_weights, w13, w2.half())
    expect(TypeError, "w13", layer.set_weights, [1, 2], w2)
    expect(unimoe.Error, "w13", layer.set_weights, w13[:, :I], w2)
    expect(unimoe.Error, "w2", layer.set_weights, w13, w2.transpose(1, 2).contiguous())
    expect(unimoe.Error, "w2", layer.set_weights, w13,
           torch.randn(E, I, H).bfloat16().transpose(1, 2))
    misaligned = torch.empty(E * 2 * I * H + 1, dtype=torch.bfloat16)[1:].view(E, 2 * I, H)
    expect(unimoe.Error, "w13", layer.set_weights, misaligned, w2)
    expect(unimoe.Error, "b13", layer.set_weights, w13, w2, b13=torch.zeros(E, 2 * I))
    expect(unimoe.Error, "w13_scale", layer.set_weights, w13, w2,
           w13_scale=torch.ones(E, 1, 1))
    expect(unimoe.Error, "x_scale", layer.set_weights, w13, w2, x_scale=torch.ones(1))
    if torch.cuda.is_available():
        expect(unimoe.Error, "w13", layer.set_weights, w13.cuda(), w2)


def test_set_weights_checks_biases_and_fp8_scales():
    biased = unimoe.MoELayer(CONFIG + " expert_bias=1", 8, device="cpu")
    w13, w2 = torch.randn(E, 2 * I, H).bfloat16(), torch.randn(E, H, I).bfloat16()
    expect(unimoe.Error, "b13", biased.set_weights, w13, w2)
    expect(TypeError, "b2", biased.set_weights, w13, w2, b13=torch.zeros(E, 2 * I),
           b2=torch.zeros(E, H).bfloat16())
    expect(unimoe.Error, "b2", biased.set_weights, w13, w2, b13=torch.zeros(E, 2 * I),
           b2=torch.zeros(E, H + 1))
    fp8 = unimoe.MoELayer(f"policy=Renormalize E={E} K={K} H=128 I=128 quant=FP8Block128", 8,
                          device="cpu")
    c13 = torch.zeros(E, 256, 128).to(torch.float8_e4m3fn)
    c2 = torch.zeros(E, 128, 128).to(torch.float8_e4m3fn)
    expect(TypeError, "w13", fp8.set_weights, c13.bfloat16(), c2)
    expect(unimoe.Error, "w13_scale", fp8.set_weights, c13, c2)
    expect(unimoe.Error, "w2_scale", fp8.set_weights, c13, c2, w13_scale=torch.ones(E, 2, 1),
           w2_scale=torch.ones(E, 2, 1))
    expect(TypeError, "w13_scale", fp8.set_weights, c13, c2,
           w13_scale=torch.ones(E, 2, 1, dtype=torch.float64), w2_scale=torch.ones(E, 1, 1))
    fp8.set_weights(c13, c2, w13_scale=torch.ones(E, 2, 1), w2_scale=torch.ones(E, 1, 1))
    per_tensor = unimoe.MoELayer(f"policy=Renormalize E={E} K={K} H=128 I=128 "
                                 "quant=FP8PerTensor", 8, device="cpu")
    expect(unimoe.Error, "x_scale", per_tensor.set_weights, c13, c2, w13_scale=torch.ones(E),
           w2_scale=torch.ones(E), x_scale=torch.ones(2))
    per_tensor.set_weights(c13, c2, w13_scale=torch.ones(E), w2_scale=torch.ones(E),
                           x_scale=torch.ones(1), act_scale=torch.ones(()))
    # A rank's slice of a model's per-expert scales starts 4 bytes in: the
    # fp32 scales need 4-byte alignment only.
    per_tensor.set_weights(c13, c2, w13_scale=torch.ones(E + 1)[1:], w2_scale=torch.ones(E + 3)[3:])
    fp4 = unimoe.MoELayer(f"policy=Renormalize E={E} K={K} H=128 I=128 quant=MXFP4", 8,
                          device="cpu")
    expect(TypeError, "w13", fp4.set_weights, c13, c2)  # MXFP4 takes packed uint8 codes


def test_call_checks():
    layer = make_layer()
    x, logits = inputs()
    expect(TypeError, "x", layer, x.float(), logits)
    expect(TypeError, "x", layer, "x", logits)
    expect(TypeError, "router_logits", layer, x, logits.bfloat16())
    expect(unimoe.Error, "x", layer, x[:, :H // 2], logits)
    expect(unimoe.Error, "x", layer, x.unsqueeze(0), logits)
    expect(unimoe.Error, "x", layer, torch.randn(H, T).bfloat16().T, logits)
    expect(unimoe.Error, "router_logits", layer, x, logits[:, :E - 1])
    expect(unimoe.Error, "router_logits", layer, x, logits[:T - 1])
    expect(unimoe.Error, "router_logits", layer, x, torch.randn(E, T).T)
    big = torch.randn(9, H).bfloat16()
    err = expect(unimoe.Error, "x", layer, big, torch.randn(9, E))
    assert "max_tokens is 8" in str(err)
    misaligned = torch.empty(T * H + 1, dtype=torch.bfloat16)[1:].view(T, H)
    expect(unimoe.Error, "x", layer, misaligned, logits)
    expect(unimoe.Error, "router_logits", layer, x)
    expect(unimoe.Error, "routing_bias", layer, x, logits, routing_bias=torch.zeros(E))
    if torch.cuda.is_available():
        expect(unimoe.Error, "x", layer, x.cuda(), logits.cuda())
        expect(unimoe.Error, "router_logits", layer, x, logits.cuda())


def test_precomputed_routing_checks():
    layer = make_layer()
    x, _ = inputs()
    ids = torch.randint(0, E, (T, K), dtype=torch.int32)
    w = torch.rand(T, K)
    expect(unimoe.Error, "topk_weights", layer, x, topk_ids=ids)
    expect(unimoe.Error, "topk_ids", layer, x, topk_weights=w)
    expect(TypeError, "topk_ids", layer, x, topk_ids=ids.long(), topk_weights=w)
    expect(TypeError, "topk_weights", layer, x, topk_ids=ids, topk_weights=w.double())
    expect(unimoe.Error, "topk_ids", layer, x, topk_ids=ids[:, :1], topk_weights=w)
    assert layer(x, topk_ids=ids, topk_weights=w).shape == (T, H)


def test_routing_bias_checks():
    layer = make_layer(f"policy=DeepSeekV3 E={E} K={K} n_group=2 topk_group=1 routing_bias=1 "
                       f"H={H} I={I}")
    x, logits = inputs()
    expect(unimoe.Error, "routing_bias", layer, x, logits)
    expect(TypeError, "routing_bias", layer, x, logits, torch.zeros(E, dtype=torch.float64))
    expect(unimoe.Error, "routing_bias", layer, x, logits, torch.zeros(E + 1))
    assert layer(x, logits, torch.zeros(E)).shape == (T, H)


def test_call_before_set_weights():
    layer = unimoe.MoELayer(CONFIG, 8, device="cpu")
    expect(unimoe.Error, "weights", layer, *inputs())


def test_cpu_layer_has_no_gpu_only_methods():
    layer = make_layer()
    assert layer.workspace_bytes == 0
    assert "cpu_reference" in layer.describe(4)
    with pytest.raises(RuntimeError, match="autotune"):
        layer.autotune(tokens=[1])
    with pytest.raises(RuntimeError, match="use_tuning_cache"):
        layer.use_tuning_cache("/nonexistent.json")


def test_weights_are_kept_alive():
    layer = unimoe.MoELayer(CONFIG, 8, device="cpu")
    w13, w2 = torch.randn(E, 2 * I, H).bfloat16(), torch.randn(E, H, I).bfloat16()
    layer.set_weights(w13.clone(), w2.clone())  # the layer holds the only references
    x, logits = inputs()
    want = make_layer_with(w13, w2)(x, logits)
    torch.randn(E * 2 * I * H)  # allocations that would reuse freed memory
    assert torch.equal(layer(x, logits), want)


def make_layer_with(w13, w2):
    layer = unimoe.MoELayer(CONFIG, 8, device="cpu")
    layer.set_weights(w13, w2)
    return layer
