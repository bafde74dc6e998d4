"""fp8 formats per platform and the fixed scales the kernel uses with them.

NVIDIA (and the CPU interpreter) use the OCP formats float8_e4m3fn / float8_e5m2; MI300 (CDNA3, gfx942) uses
float8_e4m3fnuz, whose range is half of e4m3fn's (max 240 instead of 448). Every fp8 tensor is read as
`real = stored * descale` with an fp32 descale of shape [], [1] or [batch, num_kv_heads].
"""

from __future__ import annotations

import torch

FP8_DTYPES: tuple[torch.dtype, ...] = tuple(
    dt
    for dt in (
        getattr(torch, "float8_e4m3fn", None),
        getattr(torch, "float8_e5m2", None),
        getattr(torch, "float8_e4m3fnuz", None),
        getattr(torch, "float8_e5m2fnuz", None),
    )
    if dt is not None
)


# the OCP formats (NVIDIA's, the CPU interpreter's): every value of either is also a bf16 and an fp16 value
OCP_FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype."""
    return float(torch.finfo(dtype).max)


def p_scale(dtype: torch.dtype) -> float:
    """Power of two that P (softmax probabilities, in [0, 1]) is multiplied by before it is cast to `dtype`.

    The largest power of two not above the format's max keeps P = 1 representable while using the format's full
    exponent range for small probabilities; a power of two makes the rescaling of the accumulator exact.
    """
    largest = fp8_max(dtype)
    scale = 1.0
    while scale * 2.0 <= largest:
        scale *= 2.0
    return scale


def descale_strides(descale: torch.Tensor | None) -> tuple[int, int]:
    """(sequence, KV head) strides of a descale of shape [batch, Hk]; (0, 0) for [], [1] (one value for all)."""
    if descale is None or descale.dim() < 2:
        return 0, 0
    return descale.stride(0), descale.stride(1)


def default_fp8_dtype(arch: str) -> torch.dtype:
    """The platform's e4m3 format: e4m3fnuz on CDNA3 (MI300), e4m3fn elsewhere (NVIDIA, MI350+, CPU)."""
    if arch == "cdna3":
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn
