"""EPLayer: one rank of an expert-parallel group over NCCL (docs/expert-parallel.md).

Every rank, one process a GPU, makes an EPLayer with the same NCCL id, which
one rank draws with nccl_unique_id() and shares (torch.distributed's
broadcast_object_list, a file); the layer makes and owns its communicator.
Its weights are the rank's E / W experts; its calls take the rank's own
tokens and give their outputs, as MoELayer's do, and every rank must make
each call (the exchanges are collective).

    import torch.distributed as dist
    ids = [unimoe.nccl_unique_id() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(ids, src=0)
    layer = unimoe.EPLayer(config, max_tokens=256, nccl_id=ids[0],
                           world_size=dist.get_world_size(), rank=dist.get_rank())
    layer.set_weights(w13[first:last], w2[first:last])  # this rank's experts
    out = layer(x, router_logits)

NCCL is loaded at run time: PyTorch's copy where torch has loaded it.
"""

import ctypes

import torch

from . import _lib
from ._lib import Error
from .config import as_config
from .layer import MoELayer, _scratch_query

_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES


def nccl_support():
    """'' when NCCL can be loaded in this process, else why not."""
    return _lib.call_str(_lib.lib.unimoe_nccl_support)


def nccl_unique_id():
    """A new NCCL unique id (bytes) for one group's EPLayer on every rank."""
    buf = ctypes.create_string_buffer(_ID_BYTES)
    _lib.check(_lib.lib.unimoe_nccl_unique_id(buf, _ID_BYTES))
    return buf.raw


def ep_scratch_bytes(config, max_tokens, world_size, device=None):
    """Bytes of the scratch an EPLayer of `config` (the whole model's layer)
    takes on each rank of a group of world_size serving up to max_tokens
    tokens a rank (EPLayer::scratch_bytes), on `device` (None: the current
    CUDA device); size one buffer a rank for the largest of a model's EP
    layers."""
    config = as_config(config)
    for name, v in (("max_tokens", max_tokens), ("world_size", world_size)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: {v!r} is not an int")
    return _scratch_query(device, lambda out: _lib.lib.unimoe_ep_scratch_bytes(
        config.to_string().encode(), max_tokens, world_size, out))


class EPLayer(MoELayer):
    """One rank of an expert-parallel layer: config is the whole model's
    layer (all E experts; the expert range left at its default); rank r
    serves experts [r * E / W, (r + 1) * E / W), whose weights set_weights
    takes in MoELayer's layouts with E / W experts. max_tokens: the most
    tokens a rank passes to one call, the same on every rank. describe,
    workspace_bytes, autotune and use_tuning_cache act on the rank's local
    layer. GPU only.

    scratch: None (the layer allocates its buffers) or a CUDA tensor on the
    layer's device, contiguous, of at least
    unimoe.ep_scratch_bytes(config, max_tokens, world_size) bytes, which the
    EP layers of one model on this rank may share (as MoELayer's scratch)."""

    def __init__(self, config, max_tokens, nccl_id, world_size, rank, device=None, scratch=None):
        if not isinstance(nccl_id, (bytes, bytearray)) or len(nccl_id) != _ID_BYTES:
            raise Error(f"nccl_id: expected {_ID_BYTES} bytes from nccl_unique_id()", "nccl_id")
        for name, v in (("world_size", world_size), ("rank", rank)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name}: {v!r} is not an int")
        if device is not None and torch.device(device).type != "cuda":
            raise Error(f"device: {device}; an EPLayer runs on a GPU", "device")
        if not torch.cuda.is_available():
            raise RuntimeError("unimoe: an EPLayer needs a CUDA device (there is none)")
        self._ep_args = (bytes(nccl_id), world_size, rank)
        self.world_size, self.rank = world_size, rank
        super().__init__(config, max_tokens, device, scratch=scratch)

    def _make_c(self):
        nccl_id, world, rank = self._ep_args
        ep = ctypes.c_void_p()
        if self._scratch is None:
            _lib.check(_lib.lib.unimoe_ep_create(self._text, self.max_tokens, nccl_id,
                                                 len(nccl_id), world, rank, ctypes.byref(ep)))
        else:
            nbytes = self._scratch.numel() * self._scratch.element_size()
            _lib.check(_lib.lib.unimoe_ep_create_with_scratch(
                self._text, self.max_tokens, nccl_id, len(nccl_id), world, rank,
                ctypes.c_void_p(self._scratch.data_ptr()), nbytes, ctypes.byref(ep)))
        local = ctypes.c_void_p()
        try:
            _lib.check(_lib.lib.unimoe_ep_local_layer(ep, ctypes.byref(local)))
        except Exception:
            _lib.lib.unimoe_ep_destroy(ep)
            raise
        self._owner = self._c_target = ep
        self._c = local
        self._destroy = _lib.lib.unimoe_ep_destroy
        self._c_set_weights = _lib.lib.unimoe_ep_set_weights
        self._c_forward = _lib.lib.unimoe_ep_forward
        self._local_experts = self.config.routing.num_experts // world

    def _forward(self, x, router_logits, routing_bias, topk_ids, topk_weights):
        if isinstance(x, torch.Tensor) and x.get_device() < 0:
            raise Error(f"x: on {x.device}; an EPLayer runs on {self.device} (the CPU "
                        "reference of one rank's experts would not be the layer's output)", "x")
        return super()._forward(x, router_logits, routing_bias, topk_ids, topk_weights)

    @property
    def bytes_sent_per_call(self):
        """Bytes this rank sends the other ranks a call (fixed at creation)."""
        n = ctypes.c_size_t()
        _lib.check(_lib.lib.unimoe_ep_bytes(self._owner, ctypes.byref(n), None))
        return n.value
