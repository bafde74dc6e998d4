"""Shared test setup: device choice, Triton's interpreter on CPU (with test-only fixes), seeds, NaN-poisoned memory.

- `--device cpu|cuda|auto` (default auto: cuda when available). On cpu, TRITON_INTERPRET=1 is set before anything
  imports triton, and three interpreter bugs are patched (see `_patch_interpreter`); the patches are checked by
  tests/kernel/test_interpreter_patches.py.
- Seeds: one run-level seed (random unless `--seed N`, printed in the header and on failures) combined with each
  test's id, so every run draws fresh inputs and any failure reproduces with `--seed N`.
- Tests under tests/kernel/ see `torch.empty`-style allocations filled with NaN, so unwritten outputs show up.
"""

import functools
import os
import random
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

KERNEL_TESTS = Path(__file__).parent / "kernel"
SEED_ENV = "TRITONFA_TEST_SEED"
DEVICE_ENV = "TRITONFA_TEST_DEVICE"

MARKERS = {
    "gpu": "needs a GPU (large sizes); skipped on the interpreter",
    "slow": "slower cases; still part of the default run",
}


def pytest_addoption(parser):
    group = parser.getgroup("tritonfa")
    group.addoption("--device", choices=["cpu", "cuda", "auto"], default="auto", help="where kernels run")
    group.addoption("--seed", type=int, default=None, help="run-level random seed (default: a fresh one)")


def _resolve_device(option: str) -> str:
    if option == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if option == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda given but torch sees no CUDA device")
    return option


def pytest_configure(config):
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")

    # xdist workers inherit the controller's environment, so seed and device are chosen once per run
    if SEED_ENV not in os.environ or config.getoption("seed") is not None:
        seed = config.getoption("seed")
        os.environ[SEED_ENV] = str(seed if seed is not None else random.SystemRandom().randrange(2**31))
    if DEVICE_ENV not in os.environ or config.getoption("device") != "auto":
        os.environ[DEVICE_ENV] = _resolve_device(config.getoption("device"))

    if "PYTEST_XDIST_WORKER" in os.environ:
        # workers share the cores already; torch's own threads would only oversubscribe them
        torch.set_num_threads(1)
    if os.environ[DEVICE_ENV] == "cpu":
        # must happen before any module decorates a kernel with @triton.jit
        os.environ["TRITON_INTERPRET"] = "1"
        _patch_interpreter()


def pytest_collection_modifyitems(config, items):
    if current_device() == "cuda":
        return
    skip_gpu = pytest.mark.skip(reason="gpu test: too big for the interpreter (run with a GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_report_header(config):
    seed = os.environ[SEED_ENV]
    return f"tritonfa: device={os.environ[DEVICE_ENV]} seed={seed} (reproduce with --seed {seed})"


def run_seed() -> int:
    return int(os.environ[SEED_ENV])


def current_device() -> str:
    return os.environ[DEVICE_ENV]


@pytest.fixture(scope="session")
def device() -> str:
    """'cpu' (kernels run in Triton's interpreter) or 'cuda'."""
    return current_device()


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Seed torch/random/numpy from the run seed and the test id: fresh per run, reproducible with --seed."""
    seed = (run_seed() ^ zlib.crc32(request.node.nodeid.encode())) % 2**31
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        report.sections.append(("tritonfa", f"reproduce with: --seed {run_seed()} --device {current_device()}"))
    return report


# ---------------------------------------------------------------------------------------------------------------
# NaN-poisoned allocations (fla style)


def _poison(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype.is_floating_point and tensor.numel():
        tensor.fill_(float("nan"))
    return tensor


@pytest.fixture(autouse=True)
def _nan_poisoned_empty(request, monkeypatch):
    """Under tests/kernel/, torch.empty & co. return NaN-filled float memory so unwritten outputs show up."""
    if not request.node.path.is_relative_to(KERNEL_TESTS):
        yield
        return
    for name in ("empty", "empty_like", "empty_strided"):
        original = getattr(torch, name)
        monkeypatch.setattr(torch, name, functools.wraps(original)(_poisoning(original)))
    monkeypatch.setattr(torch.Tensor, "new_empty", _poisoning(torch.Tensor.new_empty))
    yield


def _poisoning(allocate):
    def allocate_poisoned(*args, **kwargs):
        tensor = allocate(*args, **kwargs)
        # `out=` variants return the caller's tensor, which must not be clobbered
        return tensor if "out" in kwargs else _poison(tensor)

    return allocate_poisoned


# ---------------------------------------------------------------------------------------------------------------
# Triton interpreter fixes (test-only; pinned to triton 3.9, checked by tests/kernel/test_interpreter_patches.py)
#
# 1. triton#11584: tl.dot on bf16 multiplies the raw uint16 bit patterns. Fix: give create_dot float32 operands.
#    fp8 operands get the same exact upcast (the interpreter's own turns e4m3fn NaN into 480 and flushes e5m2
#    subnormals).
# 2. triton#8322: casts to fp8 round wrongly (0.496 -> 0.25). Fix: create_fp_to_fp converts through torch when
#    either side is fp8 or bf16.
# 3. casts fp32/fp16 -> bf16 (create_fp_trunc / stores) truncate instead of rounding to nearest even, unlike the
#    GPU. Fix: cast_impl converts through torch when the destination is bf16.


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


def _patch_interpreter():
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import InterpreterBuilder

    if getattr(InterpreterBuilder, "_tritonfa_patched", False):
        return
    for name in ("create_dot", "create_fp_to_fp", "cast_impl"):
        if not callable(getattr(InterpreterBuilder, name, None)):
            raise RuntimeError(f"triton's InterpreterBuilder.{name} is gone: update the patches in tests/conftest.py")

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
