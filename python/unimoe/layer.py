"""MoELayer: the GPU layer (or the CPU reference) on torch tensors, and the
torch.library custom op `unimoe::moe_forward` that torch.compile traces.

Eager calls go straight to the C function: a call through the custom op
pays torch.library's Python dispatch, tens of microseconds a call (30-45 us
on a 2-core development machine), as much as a decode step's whole layer.
Under torch.compile (torch.compiler.is_compiling()) the call is the custom
op instead, so that a graph holds it with no break.
The op cannot take the layer object, so it takes an int handle: live layers
are kept in a registry of weak references, keyed by handle.
"""

import ctypes
import itertools
import weakref
from typing import Optional

import torch

from . import _lib
from ._lib import Error
from .config import as_config

_BF16, _F32, _I32 = torch.bfloat16, torch.float32, torch.int32
_E4M3, _U8 = torch.float8_e4m3fn, torch.uint8
_FP8 = ("FP8Block128", "FP8PerTensor")
_FP4 = ("MXFP4", "NVFP4")
_FP4_BLOCK = {"MXFP4": 32, "NVFP4": 16}  # values per block scale along K
# The 1-byte dtypes that 4-bit codes and block scales may come in, besides
# uint8 (viewed as uint8); each only where the installed torch has it.
_FP4_CODES = tuple(d for d in (getattr(torch, "float4_e2m1fn_x2", None),) if d is not None)
_BLOCK_SCALE_DTYPES = {"MXFP4": tuple(d for d in (getattr(torch, "float8_e8m0fnu", None),)
                                      if d is not None),
                       "NVFP4": (_E4M3,)}

# What every eager GPU call uses, looked up once.
_c_forward = _lib.lib.unimoe_layer_forward
_current_device = getattr(torch._C, "_cuda_getDevice", None)  # absent from CPU-only torch
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

_layers = weakref.WeakValueDictionary()
_handles = itertools.count(1)


def _layer(handle):
    layer = _layers.get(handle)
    if layer is None:
        raise RuntimeError(f"unimoe: no live MoELayer has handle {handle} (it was destroyed)")
    return layer


@torch.library.custom_op("unimoe::moe_forward", mutates_args=())
def moe_forward(handle: int, x: torch.Tensor, router_logits: Optional[torch.Tensor],
                routing_bias: Optional[torch.Tensor], topk_ids: Optional[torch.Tensor],
                topk_weights: Optional[torch.Tensor]) -> torch.Tensor:
    """The forward of the layer with this handle: out [T, H] bf16."""
    return _layer(handle)._forward(x, router_logits, routing_bias, topk_ids, topk_weights)


@moe_forward.register_fake
def _moe_forward_fake(handle, x, router_logits, routing_bias, topk_ids, topk_weights):
    hidden = _layer(handle).config.experts.hidden
    return x.new_empty((x.shape[0], hidden), dtype=_BF16)


def _ptr(t):
    return None if t is None else t.data_ptr()


def _fits(t, dtype, shape, align, device_index):
    return (t.dtype is dtype and t.get_device() == device_index and t.shape == shape
            and t.is_contiguous() and not t.data_ptr() % align)


def _check_scratch(scratch, device):
    """The scratch argument of MoELayer, checked: None, or a contiguous CUDA
    tensor on `device`."""
    if scratch is None:
        return None
    if not isinstance(scratch, torch.Tensor):
        raise TypeError(f"scratch: {type(scratch).__name__} is not a torch.Tensor")
    if device.type != "cuda":
        raise Error("scratch: the CPU reference takes no scratch", "scratch")
    if scratch.device != device:
        raise Error(f"scratch: is on {scratch.device}; the layer is on {device}", "scratch")
    if not scratch.is_contiguous():
        raise Error("scratch: is not contiguous", "scratch")
    return scratch


def scratch_bytes(config, max_tokens, device=None):
    """Bytes of the scratch a GPU layer of `config` serving up to max_tokens
    tokens takes (MoELayer::scratch_bytes) on `device` (None: the current
    CUDA device); size one buffer for the largest of a model's layers."""
    config = as_config(config)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise TypeError(f"max_tokens: {max_tokens!r} is not an int")
    return _scratch_query(device, lambda out: _lib.lib.unimoe_layer_scratch_bytes(
        config.to_string().encode(), max_tokens, out))


def _scratch_query(device, call):
    """The size_t a C scratch query `call(out)` writes, made on `device`
    (None: the current CUDA device)."""
    if not _lib.has_cuda():
        raise RuntimeError("unimoe: this build has no GPU layer (nvcc was not found when it was "
                           "built); a scratch serves only the GPU layer")
    if not torch.cuda.is_available():
        raise RuntimeError("unimoe: no CUDA device; a scratch serves only the GPU layer")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else \
        torch.device(device)
    n = ctypes.c_size_t()
    with torch.cuda.device(device):
        _lib.check(call(ctypes.byref(n)))
    return n.value


class MoELayer:
    """One MoE layer: config, max_tokens, weights set once, then calls.

    device: "cuda" or "cuda:N" for the GPU layer (created on that device;
    None: the current CUDA device), "cpu" for the CPU reference, which
    computes what the GPU layer must (fp64 accumulation, the same bf16 and
    FP8 roundings, 4-bit weights dequantized exactly) and is slow: it is for
    testing and checking. A GPU layer called with CPU tensors also runs the
    reference, on host copies of its weights.

    scratch: None (the layer allocates its per-call buffers) or a CUDA
    tensor on the layer's device, contiguous, of at least
    unimoe.scratch_bytes(config, max_tokens) bytes, which layers that run
    one after another (the MoE layers of one model) may share; the layer
    keeps a reference to it (docs/python.md, "Shared scratch").
    """

    def __init__(self, config, max_tokens, device=None, scratch=None):
        self.config = as_config(config)
        self._text = self.config.to_string().encode()
        c = self.config
        self._hidden, self._num_experts, self._top_k = (c.experts.hidden, c.routing.num_experts,
                                                        c.routing.top_k)
        self._has_bias = c.routing.has_bias
        bf16_logits = c.routing.logits_type == "BF16"
        self._logits_dtype, self._logits_align = (_BF16, 2) if bf16_logits else (_F32, 4)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise TypeError(f"max_tokens: {max_tokens!r} is not an int")
        self.max_tokens = max_tokens
        self._c = None  # the unimoe_layer the introspection calls take
        self._owner = None  # what __del__ destroys, with self._destroy
        self._local_experts = c.local_experts()  # E_local of the weights
        self._weights = {}
        self._interleaved = False
        self._host_weights = None
        if device is None:
            if not torch.cuda.is_available():
                raise RuntimeError("unimoe: no CUDA device; pass device='cpu' for the CPU "
                                   "reference")
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type not in ("cuda", "cpu"):
            raise Error(f"device: {device}; allowed: cuda, cpu", "device")
        self.device = device
        self._device_index = device.index if device.type == "cuda" else -1
        self._scratch = _check_scratch(scratch, device)
        if device.type == "cpu":
            self.config.validate()
            if max_tokens < 1:
                raise Error(f"max_tokens: is {max_tokens}; must be >= 1", "max_tokens")
        else:
            if not _lib.has_cuda():
                raise RuntimeError("unimoe: this build has no GPU layer (nvcc was not found when "
                                   "it was built); pass device='cpu' for the CPU reference")
            with torch.cuda.device(device):
                self._make_c()
        self.handle = next(_handles)
        _layers[self.handle] = self

    def _make_c(self):
        """Creates the C layer on the current device: sets _c, _owner,
        _destroy and the calls set_weights and forward make (_c_set_weights,
        _c_forward, _c_target)."""
        handle = ctypes.c_void_p()
        if self._scratch is None:
            _lib.check(_lib.lib.unimoe_layer_create(self._text, self.max_tokens,
                                                    ctypes.byref(handle)))
        else:
            nbytes = self._scratch.numel() * self._scratch.element_size()
            _lib.check(_lib.lib.unimoe_layer_create_with_scratch(
                self._text, self.max_tokens, ctypes.c_void_p(self._scratch.data_ptr()), nbytes,
                ctypes.byref(handle)))
        self._c = self._owner = self._c_target = handle
        self._destroy = _lib.lib.unimoe_layer_destroy
        self._c_set_weights = _lib.lib.unimoe_layer_set_weights
        self._c_forward = _c_forward

    def __del__(self):
        owner = getattr(self, "_owner", None)
        if owner is not None:
            self._destroy(owner)
            self._owner = self._c = None

    # ---------------------------------------------------------- weights ----

    def set_weights(self, w13, w2, b13=None, b2=None, w13_scale=None, w2_scale=None,
                    x_scale=None, act_scale=None, w13_block_scale=None, w2_block_scale=None,
                    w13_interleaved=False):
        """Sets the experts' weights in unimoe's layout (docs/python.md):
        w13 [E_local, gemm1_cols, H] gate rows then up rows, w2 [E_local, H, I];
        bf16 for BF16, float8_e4m3fn for the FP8 variants; fp32 biases
        b13 [E_local, gemm1_cols] and b2 [E_local, H] (expert_bias); fp32
        scales (FP8Block128: per 128 x 128 block, w13_scale
        [E_local, gemm1_cols/128, H/128], w2_scale [E_local, H/128, I/128];
        FP8PerTensor: [E_local] each, optional static x_scale and act_scale
        of one element, positive and finite).

        MXFP4 and NVFP4 (W4A16): w13 [E_local, gemm1_cols, H/2] and w2
        [E_local, H, I/2] uint8, e2m1 codes packed two a byte along K, the
        even K index in the low nibble (or float4_e2m1fn_x2); block scales
        uint8, one per block of K values: MXFP4 e8m0 per 32 (or
        float8_e8m0fnu) w13_block_scale [E_local, gemm1_cols, H/32] and
        w2_block_scale [E_local, H, I/32]; NVFP4 e4m3 per 16 (or
        float8_e4m3fn) [E_local, gemm1_cols, H/16] and [E_local, H, I/16],
        and fp32 matrix scales w13_scale and w2_scale [E_local].
        w13_interleaved=True: the w13 rows, their block scales and b13
        alternate gate, up, gate, up (gpt-oss checkpoints); 4-bit variants
        and gated activations only.

        Tensors on the layer's device, contiguous; w13, w2, b13 and b2
        16-byte aligned, the fp32 scales 4-byte aligned (the block scales
        need no alignment). The layer keeps references to them."""
        c = self.config
        q = c.experts.quant
        e, h, i, n1 = self._local_experts, c.experts.hidden, c.experts.intermediate, c.gemm1_cols()
        fp4 = q in _FP4
        if fp4:
            w13 = self._check_fp4("w13", w13, (e, n1, h // 2), _FP4_CODES)
            w2 = self._check_fp4("w2", w2, (e, h, i // 2), _FP4_CODES)
        else:
            wdtype = _BF16 if q == "BF16" else _E4M3
            self._check("w13", w13, wdtype, (e, n1, h), 16)
            self._check("w2", w2, wdtype, (e, h, i), 16)
        given = {"w13": w13, "w2": w2}
        for name, t, shape in (("b13", b13, (e, n1)), ("b2", b2, (e, h))):
            if c.experts.has_bias:
                self._require(name, t, "the config has expert biases (expert_bias)")
                self._check(name, t, _F32, shape, 16)
                given[name] = t
            elif t is not None:
                raise Error(f"{name}: given, but the config has no expert biases (expert_bias=0)",
                            name)
        scale_shapes = {
            "FP8Block128": {"w13_scale": (e, -(-n1 // 128), -(-h // 128)),
                            "w2_scale": (e, -(-h // 128), -(-i // 128))},
            "FP8PerTensor": {"w13_scale": (e,), "w2_scale": (e,)},
            "NVFP4": {"w13_scale": (e,), "w2_scale": (e,)},
        }.get(q, {})
        for name, t in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
            if name in scale_shapes:
                self._require(name, t, f"quant {q} needs weight scales")
                self._check(name, t, _F32, scale_shapes[name], 4)
                given[name] = t
            elif t is not None:
                why = " (MXFP4's scales are the e8m0 block scales)" if q == "MXFP4" else ""
                raise Error(f"{name}: given, but quant {q} has no fp32 weight scales{why}", name)
        for name, t, rows, k in (("w13_block_scale", w13_block_scale, n1, h),
                                 ("w2_block_scale", w2_block_scale, h, i)):
            if fp4:
                self._require(name, t, f"quant {q} needs block scales")
                given[name] = self._check_fp4(name, t, (e, rows, k // _FP4_BLOCK[q]),
                                              _BLOCK_SCALE_DTYPES[q], align=1)
            elif t is not None:
                raise Error(f"{name}: given, but quant {q} has no block scales (MXFP4 and NVFP4 "
                            "only)", name)
        if not isinstance(w13_interleaved, bool):
            raise TypeError(f"w13_interleaved: {type(w13_interleaved).__name__} is not a bool")
        if w13_interleaved and not fp4:
            raise Error(f"w13_interleaved: quant {q} reads w13 as given; reorder interleaved "
                        "gate/up rows to gate rows then up rows (MXFP4 and NVFP4 only)",
                        "w13_interleaved")
        if w13_interleaved and n1 != 2 * i:
            raise Error(f"w13_interleaved: needs a gated activation (w13 holds gate and up "
                        f"rows); {c.experts.activation} has one set of rows", "w13_interleaved")
        for name, t in (("x_scale", x_scale), ("act_scale", act_scale)):
            if t is None:
                continue
            if q != "FP8PerTensor":
                raise Error(f"{name}: given, but only FP8PerTensor takes a static activation "
                            "scale", name)
            self._check(name, t, _F32, None, 4)
            if t.numel() != 1 or t.dim() > 1:
                raise Error(f"{name}: shape {tuple(t.shape)}; expected one element", name)
            given[name] = t
        if self._c is not None:
            w = _lib.Weights(w13_interleaved=int(w13_interleaved),
                             **{k: t.data_ptr() for k, t in given.items()})
            with torch.cuda.device(self.device):
                _lib.check(self._c_set_weights(self._c_target, ctypes.byref(w)))
        self._weights = given
        self._interleaved = w13_interleaved
        self._host_weights = None

    def _check_fp4(self, name, t, shape, other_dtypes, align=16):
        """_check for a 4-bit layout's bytes: uint8, or one of other_dtypes
        (1-byte dtypes of the same bytes); returns the tensor as uint8."""
        if isinstance(t, torch.Tensor) and t.dtype in other_dtypes:
            t = t.view(_U8)
        if isinstance(t, torch.Tensor) and t.dtype != _U8:
            allowed = ", ".join(str(d) for d in (_U8,) + tuple(other_dtypes))
            raise TypeError(f"{name}: dtype {t.dtype}; expected one of {allowed}")
        self._check(name, t, _U8, shape, align)
        return t

    def _require(self, name, t, why):
        if t is None:
            raise Error(f"{name}: missing; {why}", name)

    def _check(self, name, t, dtype, shape, align, device_index=None):
        """TypeError for a non-tensor or a wrong dtype; Error naming the
        argument for a wrong device, shape, layout or alignment."""
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: {type(t).__name__} is not a torch.Tensor")
        if t.dtype != dtype:
            raise TypeError(f"{name}: dtype {t.dtype}; expected {dtype}")
        want = self._device_index if device_index is None else device_index
        if t.get_device() != want:
            where = "cpu" if want < 0 else f"cuda:{want}"
            raise Error(f"{name}: on {t.device}; expected {where}", name)
        if shape is not None and t.shape != shape:
            raise Error(f"{name}: shape {tuple(t.shape)}; expected {shape}", name)
        if not t.is_contiguous():
            raise Error(f"{name}: not contiguous; pass .contiguous()", name)
        if t.data_ptr() % align:
            raise Error(f"{name}: data at {t.data_ptr():#x} is not {align}-byte aligned", name)

    # ----------------------------------------------------------- calls ----

    def __call__(self, x, router_logits=None, routing_bias=None, topk_ids=None,
                 topk_weights=None):
        """out [T, H] bf16 for x [T, H] bf16 and router_logits [T, E] (fp32,
        or bf16 with logits_type BF16); routing_bias [E] fp32 where the
        config has one; or precomputed topk_ids [T, K] int32 and topk_weights
        [T, K] fp32 in place of the logits. Runs on the current CUDA stream
        of the layer's device, or on the CPU reference for CPU tensors."""
        if torch.compiler.is_compiling():
            return torch.ops.unimoe.moe_forward(self.handle, x, router_logits, routing_bias,
                                                topk_ids, topk_weights)
        return self._forward(x, router_logits, routing_bias, topk_ids, topk_weights)

    def _forward(self, x, router_logits, routing_bias, topk_ids, topk_weights):
        if not self._call_fits(x, router_logits, routing_bias, topk_ids, topk_weights):
            self._check_call(x, router_logits, routing_bias, topk_ids, topk_weights)
        t, dev = x.shape[0], x.get_device()
        out = x.new_empty((t, self._hidden))  # bf16 on x's device; faster than torch.empty
        if t == 0:
            return out
        precomputed = topk_ids is not None
        logits = None if precomputed else router_logits
        bias = routing_bias if self._has_bias and not precomputed else None
        if dev < 0:
            w = _lib.Weights(w13_interleaved=int(self._interleaved),
                             **{k: v.data_ptr() for k, v in self._weights_on_host().items()})
            _lib.check(_lib.lib.unimoe_ref_forward(
                self._text, t, x.data_ptr(), _ptr(logits), _ptr(bias), _ptr(topk_ids),
                _ptr(topk_weights), ctypes.byref(w), out.data_ptr(), 0))
            return out
        if _current_device() != dev:
            raise RuntimeError(f"unimoe: the layer is on cuda:{dev} but the current device is "
                               f"cuda:{_current_device()}; call it under "
                               f"torch.cuda.device({dev})")
        status = self._c_forward(self._c_target, t, x.data_ptr(), _ptr(logits), _ptr(bias),
                                 _ptr(topk_ids), _ptr(topk_weights), out.data_ptr(),
                                 _current_raw_stream(dev))
        if status:
            _lib.check(status)
        return out

    def _call_fits(self, x, logits, bias, ids, weights):
        """Whether a call's arguments are all as they must be: the few
        attribute reads of the common call, with no message built.
        _check_call finds what is wrong where this says no."""
        try:
            t, dev = x.shape[0], x.get_device()
            if (x.dim() != 2 or t > self.max_tokens or not self._weights
                    or (dev >= 0 and dev != self._device_index)
                    or not _fits(x, _BF16, (t, self._hidden), 16, dev)):
                return False
            if ids is None and weights is None:
                if not _fits(logits, self._logits_dtype, (t, self._num_experts),
                             self._logits_align, dev):
                    return False
                if self._has_bias:
                    return _fits(bias, _F32, (self._num_experts,), 4, dev)
                return bias is None
            return (_fits(ids, _I32, (t, self._top_k), 4, dev)
                    and _fits(weights, _F32, (t, self._top_k), 4, dev))
        except (AttributeError, IndexError, TypeError):
            return False

    def _check_call(self, x, router_logits, routing_bias, topk_ids, topk_weights):
        """Raises the exception that names what is wrong with a call's arguments."""
        c = self.config
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: {type(x).__name__} is not a torch.Tensor")
        dev = x.get_device()
        if dev >= 0 and dev != self._device_index:
            raise Error(f"x: on {x.device}; this layer is on {self.device}", "x")
        if x.dim() != 2:
            raise Error(f"x: shape {tuple(x.shape)}; expected [T, {c.experts.hidden}]", "x")
        t = x.shape[0]
        if t > self.max_tokens:
            raise Error(f"x: {t} tokens; the layer's max_tokens is {self.max_tokens}", "x")
        self._check("x", x, _BF16, (t, self._hidden), 16, dev)
        if topk_ids is not None or topk_weights is not None:
            both = "precomputed routing needs both topk_ids and topk_weights"
            self._require("topk_ids", topk_ids, both)
            self._require("topk_weights", topk_weights, both)
            self._check("topk_ids", topk_ids, _I32, (t, self._top_k), 4, dev)
            self._check("topk_weights", topk_weights, _F32, (t, self._top_k), 4, dev)
        else:
            self._require("router_logits", router_logits, "pass router_logits (or topk_ids "
                          "and topk_weights)")
            self._check("router_logits", router_logits, self._logits_dtype,
                        (t, self._num_experts), self._logits_align, dev)
            if self._has_bias:
                self._require("routing_bias", routing_bias, "the config has a routing bias "
                              "(routing_bias=1)")
                self._check("routing_bias", routing_bias, _F32, (self._num_experts,), 4, dev)
            elif routing_bias is not None:
                raise Error("routing_bias: given, but the config has no routing bias",
                            "routing_bias")
        if not self._weights:
            raise Error("weights: set_weights was not called", "weights")

    def _weights_on_host(self):
        if self.device.type == "cpu":
            return self._weights
        if self._host_weights is None:
            self._host_weights = {k: v.cpu() for k, v in self._weights.items()}
        return self._host_weights

    # ----------------------------------------------------- introspection ----

    def describe(self, num_tokens):
        """What serves a call of num_tokens tokens, one line (MoELayer::describe)."""
        if self._c is None:
            return "path=cpu_reference (ref::moe_forward: fp64 accumulation, the layer's roundings)"
        return _lib.call_str(_lib.lib.unimoe_layer_describe, self._c, int(num_tokens))

    @property
    def workspace_bytes(self):
        """Device memory the layer holds besides the weights."""
        if self._c is None:
            return 0
        n = ctypes.c_size_t()
        _lib.check(_lib.lib.unimoe_layer_workspace_bytes(self._c, ctypes.byref(n)))
        return n.value

    def _gpu_only(self, what):
        if self._c is None:
            raise RuntimeError(f"unimoe: {what} serves the GPU layer; this layer is the CPU "
                               "reference")

    def use_tuning_cache(self, path):
        """Uses the winners a tuning cache holds for this device and config
        (MoELayer::use_tuning_cache); returns what was used. Before capturing."""
        self._gpu_only("use_tuning_cache")
        with torch.cuda.device(self.device):
            return _lib.call_str(_lib.lib.unimoe_layer_use_tuning_cache, self._c,
                                 str(path).encode())

    def autotune(self, tokens=(), routing="uniform", iters=20, check_tokens=2, cache_path=None,
                 verbose=False):
        """Times the candidates of the token buckets of `tokens` (empty:
        every bucket up to max_tokens) and keeps the fastest
        (MoELayer::autotune); returns one line per bucket. Needs
        set_weights first. Allocates and synchronizes: never while capturing."""
        self._gpu_only("autotune")
        tokens = [int(n) for n in tokens]
        array = (ctypes.c_int * len(tokens))(*tokens)
        with torch.cuda.device(self.device):
            return _lib.call_str(
                _lib.lib.unimoe_layer_autotune, self._c, array, len(tokens), routing.encode(),
                int(iters), int(check_tokens), str(cache_path).encode() if cache_path else None,
                0 if verbose else 1)
