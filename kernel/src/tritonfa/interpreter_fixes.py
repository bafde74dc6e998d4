"""Fixes for three numeric bugs of Triton's CPU interpreter (TRITON_INTERPRET=1), pinned to triton 3.9.

Never applied by the kernel path: the test suite (tests/conftest.py) and the tools' CPU modes (`python -m
tritonfa.bench`, accuracy/fp8_error_study.py) call `patch_triton_interpreter()` before running kernels in the
interpreter; tests/kernel/test_interpreter_patches.py checks that each fix still applies and that each bug is still
there (so a triton upgrade says when to drop one).

1. triton#11584: tl.dot on bf16 multiplies the raw uint16 bit patterns. Fix: give create_dot float32 operands.
   fp8 operands get the same exact upcast (the interpreter's own turns e4m3fn NaN into 480 and flushes e5m2
   subnormals).
2. triton#8322: casts to fp8 round wrongly (0.496 -> 0.25). Fix: create_fp_to_fp converts through torch when
   either side is fp8 or bf16.
3. casts fp32/fp16 -> bf16 (create_fp_trunc / stores) truncate instead of rounding to nearest even, unlike the
   GPU. Fix: cast_impl converts through torch when the destination is bf16.

Besides the fixes, an opt-in model of a GPU behaviour the interpreter lacks: `sm90_fp8_accumulation()` makes fp8 x fp8
dots accumulate like Hopper's fp8 tensor cores (see `_sm90_fp8_dot`), so CPU tests can catch kernels that lose
precision only on H100/H200.
"""

import contextlib
import functools

import numpy as np
import torch

__all__ = ["patch_triton_interpreter", "sm90_fp8_accumulation"]

_SM90_FP8 = {"on": False}
SM90_FP8_K_STEP = 32  # K of one fp8 wgmma instruction
SM90_FP8_KEPT_BITS = 13  # mantissa bits kept below the largest addend's leading bit


@contextlib.contextmanager
def sm90_fp8_accumulation(enabled: bool = True):
    """Within the block, interpreted fp8 x fp8 `tl.dot`s accumulate like Hopper's fp8 wgmma (needs the patches)."""
    previous = _SM90_FP8["on"]
    _SM90_FP8["on"] = enabled
    try:
        yield
    finally:
        _SM90_FP8["on"] = previous


def _truncate_below(x: torch.Tensor, ulp: torch.Tensor) -> torch.Tensor:
    return torch.trunc(x / ulp) * ulp  # ulp a power of two: exact


def _ulp_of_largest(x: torch.Tensor) -> torch.Tensor:
    exponent = torch.floor(torch.log2(x.abs().clamp_min(torch.finfo(torch.float32).tiny)))
    return torch.exp2(exponent - SM90_FP8_KEPT_BITS)


def _aligned_step(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc + a @ b as one 32-deep fp8 MMA step: the accumulator and every product are aligned to the largest of
    them and cut to 13 bits below its leading bit, the aligned terms summed (exactly: they are multiples of one
    power of two, 33 of them within fp32's 24 bits) and the sum cut to 13 bits."""
    products = a.unsqueeze(-1) * b.unsqueeze(-3)  # [..., M, STEP, N], exact: fp8 x fp8 has 8 significant bits
    ulp = _ulp_of_largest(torch.maximum(products.abs().amax(-2), acc.abs()))
    total = _truncate_below(acc, ulp) + _truncate_below(products, ulp.unsqueeze(-2)).sum(-2)
    return _truncate_below(total, _ulp_of_largest(total))


def _sm90_fp8_dot(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, max_num_imprecise_acc: int) -> torch.Tensor:
    """a @ b + c as Hopper runs an fp8 dot: each 32-deep MMA step adds its products into the accumulator with every
    addend cut to 13 bits below the largest one's leading bit (`_aligned_step`), so a sum chained through `c` loses
    each product's low bits once the accumulator outgrows them. The H100 (session 39, kernel/PERF_NOTES.md) shrank a
    one-level P@V's output to 0.928 / 0.855 / 0.602 of the reference over 4k / 8k / 32k keys; this model replays
    that arithmetic to 0.936 / 0.860 / 0.517 (the earlier model, 13 bits kept of the step's sum: 0.997 / 0.994 /
    0.978). Triton's default on sm_90 (max_num_imprecise_acc = 2**30) never promotes; a positive value N below K
    adds a fresh partial sum into an exact fp32 accumulator every N elements (the interpreter's own default is 0:
    read as never, like sm_90)."""
    k = a.shape[-1]
    promote_every = max_num_imprecise_acc if 0 < max_num_imprecise_acc < k else None
    acc = c.clone()
    partial = torch.zeros_like(c) if promote_every else acc
    for start in range(0, k, SM90_FP8_K_STEP):
        step = slice(start, start + SM90_FP8_K_STEP)
        partial = _aligned_step(partial, a[..., step], b[..., step, :])
        if promote_every and ((start + SM90_FP8_K_STEP) % promote_every == 0 or start + SM90_FP8_K_STEP >= k):
            acc = acc + partial
            partial = torch.zeros_like(c)
    return acc if promote_every else partial


def _torch_dtype_of(tl_dtype):
    import triton.language as tl

    return {
        tl.float16: torch.float16,
        tl.bfloat16: torch.bfloat16,
        tl.float32: torch.float32,
        tl.float64: torch.float64,
        tl.float8e4nv: torch.float8_e4m3fn,
        tl.float8e5: torch.float8_e5m2,
        tl.float8e4b8: torch.float8_e4m3fnuz,
        tl.float8e5b16: torch.float8_e5m2fnuz,
    }.get(tl_dtype)


_BITS_VIEW = {1: torch.uint8, 2: torch.int16}


def _handle_to_torch(handle) -> torch.Tensor:
    """TensorHandle (numpy data; bf16/fp8 stored as raw uints) -> torch tensor of the real dtype, same shape."""
    dtype = _torch_dtype_of(handle.dtype.scalar)
    data = torch.from_numpy(np.ascontiguousarray(handle.data))
    if dtype.itemsize <= 2 and not dtype == torch.float16:
        data = data.view(_BITS_VIEW[dtype.itemsize])
    return data.view(dtype)


def _torch_to_handle(tensor: torch.Tensor, tl_dtype):
    from triton.runtime.interpreter import TensorHandle, _get_np_dtype

    if tensor.dtype.itemsize <= 2 and tensor.dtype != torch.float16:
        tensor = tensor.view(_BITS_VIEW[tensor.dtype.itemsize])
    return TensorHandle(tensor.numpy().view(_get_np_dtype(tl_dtype)), tl_dtype.scalar)


def _is_fp8_or_bf16(tl_dtype) -> bool:
    return _torch_dtype_of(tl_dtype) is not None and (tl_dtype.is_bf16() or tl_dtype.primitive_bitwidth == 8)


def patch_triton_interpreter() -> None:
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import InterpreterBuilder

    if getattr(InterpreterBuilder, "_tritonfa_patched", False):
        return
    for name in ("create_dot", "create_fp_to_fp", "cast_impl"):
        if not callable(getattr(InterpreterBuilder, name, None)):
            raise RuntimeError(f"triton's InterpreterBuilder.{name} is gone: update tritonfa/interpreter_fixes.py")

    original_dot = InterpreterBuilder.create_dot
    original_fp_to_fp = InterpreterBuilder.create_fp_to_fp
    original_cast = InterpreterBuilder.cast_impl

    def upcast_operand(handle):
        if not _is_fp8_or_bf16(handle.dtype.scalar):
            return handle
        return _torch_to_handle(_handle_to_torch(handle).to(torch.float32), tl.float32)

    def is_fp8(handle) -> bool:
        scalar = handle.dtype.scalar
        return scalar.is_floating() and scalar.primitive_bitwidth == 8

    @functools.wraps(original_dot)
    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if _SM90_FP8["on"] and is_fp8(a) and is_fp8(b) and d.dtype.scalar == tl.float32:
            a32, b32 = _handle_to_torch(a).float(), _handle_to_torch(b).float()
            c32 = torch.from_numpy(np.ascontiguousarray(d.data))
            return _torch_to_handle(_sm90_fp8_dot(a32, b32, c32, max_num_imprecise_acc or 0), tl.float32)
        return original_dot(self, upcast_operand(a), upcast_operand(b), d, input_precision, max_num_imprecise_acc)

    @functools.wraps(original_fp_to_fp)
    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        src_dtype, dst_dtype = src.dtype.scalar, dst_type.scalar
        convertible = _torch_dtype_of(src_dtype) is not None and _torch_dtype_of(dst_dtype) is not None
        if (
            convertible
            and rounding_mode != ir.ROUNDING_MODE.RTZ
            and (_is_fp8_or_bf16(src_dtype) or _is_fp8_or_bf16(dst_dtype))
        ):
            converted = _handle_to_torch(src).to(_torch_dtype_of(dst_dtype))
            return _torch_to_handle(converted, dst_dtype)
        return original_fp_to_fp(self, src, dst_type, rounding_mode)

    @functools.wraps(original_cast)
    def cast_impl(self, src, dst_type):
        src_dtype, dst_dtype = src.dtype.scalar, dst_type.scalar
        if dst_dtype.is_bf16() and src_dtype.is_floating() and _torch_dtype_of(src_dtype) is not None:
            return _torch_to_handle(_handle_to_torch(src).to(torch.bfloat16), dst_dtype)
        return original_cast(self, src, dst_type)

    InterpreterBuilder.create_dot = create_dot
    InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    InterpreterBuilder.cast_impl = cast_impl
    InterpreterBuilder._tritonfa_patched = True
