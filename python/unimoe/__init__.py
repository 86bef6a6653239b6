"""unimoe: the Mixture-of-Experts layer of LLM inference on NVIDIA Hopper,
from PyTorch. docs/python.md has the API, the weight layouts and how the
layer behaves under torch.compile and CUDA graphs."""

try:
    import torch  # noqa: F401  (the package's tensors are torch tensors)
except ImportError as e:
    raise ImportError("unimoe needs PyTorch: install torch (pip install torch), then "
                      "import unimoe again") from e

from ._lib import Error, has_cuda, version
from .config import BackendOptions, ExpertsConfig, MoEConfig, RoutingConfig
from .ep import EPLayer, ep_scratch_bytes, nccl_support, nccl_unique_id
from .functional import clear_fused_experts_cache, fused_experts
from .hf import (from_hf_config, load_fp8_block_experts, load_fp8_tensor_experts,
                 load_gpt_oss_mxfp4, load_hf_experts, load_nvfp4_experts)
from .layer import MoELayer, moe_forward, scratch_bytes

__version__ = version()

__all__ = [
    "BackendOptions", "EPLayer", "Error", "ExpertsConfig", "MoEConfig", "MoELayer",
    "ep_scratch_bytes",
    "RoutingConfig", "clear_fused_experts_cache", "from_hf_config", "fused_experts", "has_cuda",
    "load_fp8_block_experts", "load_fp8_tensor_experts", "load_gpt_oss_mxfp4", "load_hf_experts",
    "load_nvfp4_experts", "moe_forward", "nccl_support", "nccl_unique_id", "scratch_bytes",
    "__version__",
]
