"""The interpreter fixes (tritonfa.interpreter_fixes, applied by tests/conftest.py) still apply and still matter (triton is pinned for them).

`test_*_is_fixed` fail if a triton upgrade changes the internals the patches wrap (the fix silently stops
applying); `test_*_bug_still_present` fail once upstream fixes a bug, so the workaround can be dropped.
"""

import pytest
import torch
import triton
import triton.language as tl
from attn_testing import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="interpreter-only workarounds")

FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz]


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a = tl.load(a_ptr + i[:, None] * N + i[None, :])  # [N, N]
    b = tl.load(b_ptr + i[:, None] * N + i[None, :])  # [N, N]
    tl.store(c_ptr + i[:, None] * N + i[None, :], tl.dot(a, b))


@triton.jit
def _cast_kernel(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, tl.load(x_ptr + i).to(y_ptr.dtype.element_ty))


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.zeros(a.shape[0], b.shape[1])
    _dot_kernel[(1,)](a, b, c, a.shape[0])
    return c


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    y = torch.zeros(x.numel(), dtype=dtype)
    _cast_kernel[(1,)](x, y, x.numel())
    return y


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.dtype.itemsize]
    return torch.equal(x.view(bits), y.view(bits))


@pytest.fixture
def unpatched(monkeypatch):
    from triton.runtime.interpreter import InterpreterBuilder

    for name in ("create_dot", "create_fp_to_fp", "cast_impl"):
        monkeypatch.setattr(InterpreterBuilder, name, getattr(InterpreterBuilder, name).__wrapped__)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, *FP8_DTYPES])
def test_dot_is_fixed(dtype):
    a, b = torch.randn(16, 16).to(dtype), torch.randn(16, 16).to(dtype)
    torch.testing.assert_close(_dot(a, b), a.float() @ b.float(), atol=1e-5, rtol=1e-5)


def test_dot_fp8_special_values_are_fixed():
    a = torch.zeros(16, 16, dtype=torch.float8_e4m3fn)
    a[0, 0] = float("nan")
    b = torch.ones(16, 16, dtype=torch.float8_e4m3fn)
    c = _dot(a, b)
    assert c[0].isnan().all() and not c[1:].isnan().any()


@pytest.mark.parametrize("src", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("dst", [*FP8_DTYPES, torch.bfloat16])
def test_downcast_rounds_like_torch(src, dst):
    if src == dst:
        pytest.skip("no cast")
    # in range for every fp8 dtype, including subnormals
    x = (torch.randn(4096) * 4 * torch.rand(4096) ** 4).to(src)
    assert _same_bits(_cast(x, dst), x.to(dst))


@pytest.mark.parametrize("src", FP8_DTYPES)
def test_fp8_upcast_is_exact(src):
    x = torch.arange(256, dtype=torch.uint8).view(src)
    for dst in (torch.float32, torch.float16, torch.bfloat16):
        torch.testing.assert_close(_cast(x, dst), x.to(dst), atol=0, rtol=0, equal_nan=True)


def test_bf16_dot_bug_still_present(unpatched):
    a, b = torch.randn(16, 16).to(torch.bfloat16), torch.randn(16, 16).to(torch.bfloat16)
    error = (_dot(a, b) - a.float() @ b.float()).abs().max()
    assert error > 1.0, "triton#11584 looks fixed: drop the create_dot patch in tritonfa/interpreter_fixes.py"


def test_fp8_downcast_bug_still_present(unpatched):
    x = torch.tensor([0.496] * 16)
    assert not _same_bits(_cast(x, torch.float8_e4m3fn), x.to(torch.float8_e4m3fn)), (
        "triton#8322 looks fixed: drop the create_fp_to_fp patch in tritonfa/interpreter_fixes.py"
    )


def test_bf16_downcast_truncation_still_present(unpatched):
    x = torch.randn(4096)
    assert not _same_bits(_cast(x, torch.bfloat16), x.to(torch.bfloat16)), (
        "fp32 -> bf16 casts round to nearest now: drop the cast_impl patch in tritonfa/interpreter_fixes.py"
    )
