"""Fixes for three numeric bugs of Triton's CPU interpreter (TRITON_INTERPRET=1), pinned to triton 3.9.

Never applied by the kernel path: the test suite (tests/conftest.py) and CPU-scale studies (tritonfa.accuracy)
call `patch_triton_interpreter()` before running kernels in the interpreter; tests/kernel/test_interpreter_patches.py
checks that each fix still applies and that each bug is still there (so a triton upgrade says when to drop one).

1. triton#11584: tl.dot on bf16 multiplies the raw uint16 bit patterns. Fix: give create_dot float32 operands.
   fp8 operands get the same exact upcast (the interpreter's own turns e4m3fn NaN into 480 and flushes e5m2
   subnormals).
2. triton#8322: casts to fp8 round wrongly (0.496 -> 0.25). Fix: create_fp_to_fp converts through torch when
   either side is fp8 or bf16.
3. casts fp32/fp16 -> bf16 (create_fp_trunc / stores) truncate instead of rounding to nearest even, unlike the
   GPU. Fix: cast_impl converts through torch when the destination is bf16.
"""

import functools

import numpy as np
import torch

__all__ = ["patch_triton_interpreter"]


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

    @functools.wraps(original_dot)
    def create_dot(self, a, b, d, *args, **kwargs):
        return original_dot(self, upcast_operand(a), upcast_operand(b), d, *args, **kwargs)

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
