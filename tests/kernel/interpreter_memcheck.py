"""A memcheck for Triton's CPU interpreter: every load and store must stay inside the launch's tensor arguments.

On a GPU, compute-sanitizer reports an out-of-bounds access; in the interpreter the same access reads or writes
raw process memory (garbage, a segfault, or a heap corruption found much later). Within `interpreter_memcheck()`,
each interpreted load/store checks, before it touches memory, that every address its mask enables lies inside one
of the tensors the launch was given (the span from the tensor's lowest to its highest element, which for a strided
view also covers the gaps between its elements), and raises `OutOfBoundsAccess` instead of accessing memory
otherwise. Test-only: it patches triton's interpreter internals (triton 3.9) for the duration of the block.
"""

import contextlib

import numpy as np
import torch


class OutOfBoundsAccess(AssertionError):
    """A kernel load or store addressed memory outside every tensor argument of its launch."""


def _spans(args) -> list[tuple[int, int]]:
    """[lo, hi) byte spans of the tensors among a launch's (host) arguments."""
    from triton.runtime.jit import TensorWrapper
    from triton.tools.tensor_descriptor import TensorDescriptor

    spans = []
    for arg in args:
        if isinstance(arg, (tuple, list)):
            spans += _spans(arg)
        elif isinstance(arg, TensorDescriptor):
            spans += _spans([arg.base])
        elif isinstance(arg, (torch.Tensor, TensorWrapper)):
            tensor = arg.base if isinstance(arg, TensorWrapper) else arg
            if tensor.numel() == 0:
                continue
            size = tensor.element_size()
            low = sum(min(0, (n - 1) * s) for n, s in zip(tensor.shape, tensor.stride()))
            high = sum(max(0, (n - 1) * s) for n, s in zip(tensor.shape, tensor.stride()))
            spans.append((tensor.data_ptr() + low * size, tensor.data_ptr() + (high + 1) * size))
    return spans


@contextlib.contextmanager
def interpreter_memcheck():
    """Within the block, interpreted kernels raise OutOfBoundsAccess instead of accessing memory out of bounds."""
    from triton.runtime import interpreter
    from triton.runtime.interpreter import GridExecutor, InterpreterBuilder

    launch = {"kernel": None, "spans": []}
    original_init = GridExecutor._init_args_hst
    original_load = InterpreterBuilder.create_masked_load
    original_store = InterpreterBuilder.create_masked_store

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = original_init(self, args_dev, kwargs)
        launch["kernel"] = getattr(self.fn, "__name__", str(self.fn))
        launch["spans"] = _spans([*args_hst, *kwargs_hst.values()])
        return args_hst, kwargs_hst

    def check(kind: str, ptrs, mask) -> None:
        item = np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize
        addresses = np.broadcast_to(ptrs.data, np.broadcast_shapes(ptrs.data.shape, mask.data.shape))
        active = np.broadcast_to(mask.data, addresses.shape).astype(bool)
        used = addresses[active].astype(np.uint64)
        inside = np.zeros(used.shape, dtype=bool)
        for low, high in launch["spans"]:
            inside |= (used >= low) & (used + item <= high)
        if not inside.all():
            outside = used[~inside]
            raise OutOfBoundsAccess(
                f"{launch['kernel']}: {kind} of {outside.size} element(s) outside every tensor argument, first at "
                f"address {int(outside[0]):#x} (tensor spans: {[(hex(lo), hex(hi)) for lo, hi in launch['spans']]})"
            )

    def create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        check("load", ptrs, mask)
        return original_load(self, ptrs, mask, other, cache_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        check("store", ptrs, mask)
        return original_store(self, ptrs, value, mask, cache_policy)

    GridExecutor._init_args_hst = init_args_hst
    InterpreterBuilder.create_masked_load = create_masked_load
    InterpreterBuilder.create_masked_store = create_masked_store
    try:
        yield
    finally:
        GridExecutor._init_args_hst = original_init
        InterpreterBuilder.create_masked_load = original_load
        InterpreterBuilder.create_masked_store = original_store
