"""Everything that differs between the vLLM versions tritonfa_vllm supports (0.24 <= vLLM < 0.35).

Tested: 0.24.0 (the GPU machine's build; CPU tests), 0.33.0 and 0.34.0 (newest on PyPI; CPU tests); 0.34 behaves
like 0.33 below. Two differences matter to the backend:

1. The per-layer KV cache tensor vLLM hands to the backend.
   - 0.24 (and earlier): the shape the backend declares in `get_kv_cache_shape`,
     `(num_blocks, 2, block_size, num_kv_heads, head_size)`, with the physical order from
     `get_kv_cache_stride_order` (NHD by default, HND when VLLM_KV_CACHE_LAYOUT=HND).
   - 0.33: vLLM owns the layout. The tensor is the logical `(num_blocks, num_kv_heads, block_size, 2 * head_size)`
     ([K | V] along the last dim) with whatever physical strides vLLM picked (LBNHC by default); the two
     methods above are no longer called (and are gone from the base class).
   Both are split here into paged K and V views `[num_blocks, block_size, num_kv_heads, head_size]` with arbitrary
   strides, which is what `tritonfa.flash_attn_varlen_func` and vLLM's reshape-and-cache op take.
2. `AttentionBackend.get_kv_cache_shape` is abstract in 0.24 and absent in 0.33: the backend always defines it
   (`kv_cache_shape` below); newer versions ignore it.
3. ROCm: vLLM 0.34 bounds the pointer range of the K/V views it hands to Triton kernels
   (`set_triton_ptr_range`, so Triton's AMD backend can keep 32-bit buffer addressing on views into one large
   cache allocation); 0.24 has no such helper and does nothing (`bound_pointer_range` below).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

# [min, max) of vLLM (major, minor); same range as the `vllm` requirement in integration/pyproject.toml.
SUPPORTED_VLLM = ((0, 24), (0, 35))
SUPPORTED_RANGE = ">=0.24,<0.35"


def vllm_version() -> tuple[int, int] | None:
    """(major, minor) of the installed vLLM, or None for a dev build without a version."""
    import vllm

    try:
        major, minor = (int(part) for part in vllm.__version__.split(".")[:2])
    except ValueError:
        return None
    return major, minor


def check_vllm_version() -> None:
    """Warn (once per process) when the installed vLLM lies outside the tested range; never refuse."""
    version = vllm_version()
    low, high = SUPPORTED_VLLM
    if version is not None and not low <= version < high:
        import vllm

        logger.warning(
            "tritonfa_vllm is tested with vllm%s; found vllm %s: the CUSTOM backend may not work",
            SUPPORTED_RANGE,
            vllm.__version__,
        )


def split_kv_cache(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's KV cache -> (key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, D] (views)."""
    if kv_cache.dim() == 5:  # 0.24: (num_blocks, 2, block_size, Hk, D)
        key_cache, value_cache = kv_cache.unbind(1)
        return key_cache, value_cache
    if kv_cache.dim() == 4:  # 0.33: (num_blocks, Hk, block_size, 2 * D)
        kv = kv_cache.transpose(1, 2)
        return kv[..., :head_size], kv[..., head_size:]
    raise ValueError(f"unexpected KV cache shape {tuple(kv_cache.shape)} (vLLM {SUPPORTED_RANGE} expected)")


def bound_pointer_range(region: torch.Tensor, *views: torch.Tensor) -> None:
    """Tell Triton (ROCm) that `views` lie inside `region`, where the installed vLLM can (>= 0.3x); else nothing."""
    from vllm.v1.attention.backends import utils

    helper = getattr(utils, "set_triton_ptr_range", None)
    if helper is not None:
        helper(region, *views)


def kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_size: int, cache_dtype_str: str = "auto"
) -> tuple[int, ...]:
    """`AttentionBackend.get_kv_cache_shape` of vLLM <= 0.2x: K and V of a block side by side."""
    return (num_blocks, 2, block_size, num_kv_heads, head_size)


def kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
    """`AttentionBackend.get_kv_cache_stride_order` of vLLM <= 0.2x for the shape above (NHD or HND).

    The kernel reads K/V through strides, so both layouts work; NHD (vLLM's default) keeps a token's heads
    contiguous, which is what the reshape-and-cache op writes fastest.
    """
    from vllm.v1.attention.backends.utils import get_kv_cache_layout

    layout = get_kv_cache_layout()
    if layout == "NHD":
        # (num_blocks, [num_layers,] 2, block_size, Hk, D)
        return (1, 0, 2, 3, 4, 5) if include_num_layers_dimension else (0, 1, 2, 3, 4)
    if layout == "HND":
        # (num_blocks, Hk, [num_layers,] 2, block_size, D)
        return (1, 4, 0, 2, 3, 5) if include_num_layers_dimension else (0, 1, 3, 2, 4)
    raise ValueError(f"unknown KV cache layout {layout!r}")
