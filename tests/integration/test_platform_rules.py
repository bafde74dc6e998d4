"""What the backend decides from the GPU it runs on, with vLLM's platform made to report NVIDIA or AMD GPUs.

The rules follow vLLM 0.34's own Triton backend: no fp8 KV cache before SM89 and no bf16 cache before SM80 (a
clear error from the selector and from the impl), no fp8 query on ROCm gfx90a / gfx11, pointer ranges of the cache
views bounded on ROCm where vLLM has the helper; plus the kernel's own limit (fp32 tiles of head sizes > 128 do not
fit 64 KiB of LDS).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from test_registration import selector_reasons
from vllm.platforms import current_platform
from vllm.platforms.interface import DeviceCapability
from vllm_batch import allocate_kv_cache, make_layer

from tritonfa_vllm.backend import TritonFABackend, TritonFAImpl


@pytest.fixture
def nvidia(monkeypatch):
    """vLLM's platform reports an NVIDIA GPU; returns a setter for its compute capability."""
    platform = type(current_platform)
    monkeypatch.setattr(platform, "is_cuda", lambda self: True)
    monkeypatch.setattr(platform, "is_rocm", lambda self: False)

    def set_capability(major: int, minor: int) -> None:
        monkeypatch.setattr(
            platform, "get_device_capability", classmethod(lambda cls, device_id=0: DeviceCapability(major, minor))
        )

    return set_capability


@pytest.fixture
def rocm(monkeypatch):
    """vLLM's platform reports an AMD GPU; returns a setter for its gfx arch (vllm.platforms.rocm replaced: the real
    module reads the GPU when imported)."""
    platform = type(current_platform)
    monkeypatch.setattr(platform, "is_cuda", lambda self: False)
    monkeypatch.setattr(platform, "is_rocm", lambda self: True)

    def set_arch(gcn_arch: str) -> None:
        fake = types.ModuleType("vllm.platforms.rocm")
        fake.on_gfx90a = lambda: gcn_arch == "gfx90a"
        fake.on_gfx11 = lambda: gcn_arch.startswith("gfx11")
        monkeypatch.setitem(sys.modules, "vllm.platforms.rocm", fake)

    set_arch("gfx942")
    return set_arch


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_fp8_kv_cache_before_sm89_is_a_clear_error(nvidia, kv_cache_dtype):
    nvidia(8, 6)  # Ampere (A10, RTX 30xx): no fp8
    reasons = selector_reasons(capability=(8, 6), kv_cache_dtype=kv_cache_dtype)
    assert any("SM89" in r and "bfloat16" in r for r in reasons), reasons
    with pytest.raises(ValueError, match=r"fp8 KV cache needs native fp8.*SM89.*SM86.*bfloat16"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, kv_cache_dtype)
    nvidia(7, 5)  # Turing: the suggestion is float16
    with pytest.raises(ValueError, match="--kv-cache-dtype float16"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, kv_cache_dtype)
    # Ada and Hopper have fp8
    for capability in ((8, 9), (9, 0), (10, 0)):
        nvidia(*capability)
        assert selector_reasons(capability=capability, kv_cache_dtype=kv_cache_dtype) == []
        assert TritonFAImpl(8, 64, 0.125, 2, None, None, kv_cache_dtype).fp8_kv_cache


def test_bf16_kv_cache_before_sm80_is_a_clear_error(nvidia):
    nvidia(7, 5)
    assert any("SM80" in r for r in selector_reasons(capability=(7, 5), kv_cache_dtype="bfloat16"))
    with pytest.raises(ValueError, match="bfloat16 KV cache needs SM80"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, "bfloat16")
    assert selector_reasons(capability=(7, 5), kv_cache_dtype="float16", dtype=torch.float16) == []
    nvidia(8, 0)
    assert selector_reasons(capability=(8, 0), kv_cache_dtype="bfloat16") == []
    TritonFAImpl(8, 64, 0.125, 2, None, None, "bfloat16")


@pytest.mark.parametrize(
    "gcn_arch, takes_fp8_query",
    [("gfx942", True), ("gfx950", True), ("gfx90a", False), ("gfx1100", False), ("gfx1201", True)],
)
def test_rocm_fp8_query(rocm, gcn_arch, takes_fp8_query):
    """vLLM 0.34: no fp8 query on gfx90a (CDNA2 has no fp8 dots) nor gfx11 (RDNA3)."""
    rocm(gcn_arch)
    assert TritonFAImpl(8, 64, 0.125, 2, None, None, "fp8").supports_quant_query_input is takes_fp8_query
    # never with a 16-bit cache or an e5m2 one (vLLM quantizes q to e4m3)
    assert not TritonFAImpl(8, 64, 0.125, 2, None, None, "auto").supports_quant_query_input
    assert not TritonFAImpl(8, 64, 0.125, 2, None, None, "fp8_e5m2").supports_quant_query_input


def test_fp8_query_elsewhere(nvidia):
    nvidia(9, 0)
    assert TritonFAImpl(8, 64, 0.125, 2, None, None, "fp8_e4m3").supports_quant_query_input


@pytest.mark.parametrize("capability, fits", [((9, 4), False), ((9, 0), False), ((11, 0), False), ((9, 5), True)])
def test_rocm_fp32_head_size_limit(rocm, capability, fits):
    """fp32 tiles of head sizes > 128 do not fit 64 KiB of LDS (MI300, MI200, RDNA); MI350 has 160 KiB."""
    assert selector_reasons(capability=capability, dtype=torch.float32, head_size=128) == []
    assert selector_reasons(capability=capability, dtype=torch.bfloat16, head_size=256) == []
    reasons = selector_reasons(capability=capability, dtype=torch.float32, head_size=256)
    assert (reasons == []) is fits, reasons


def test_fp32_any_head_size_on_nvidia(nvidia):
    nvidia(9, 0)
    assert selector_reasons(dtype=torch.float32, head_size=256) == []


def test_rocm_bounds_pointer_range_of_cache_views(rocm, device):
    """vLLM 0.34 calls set_triton_ptr_range on the K/V views it hands to Triton on ROCm; 0.24 has no such helper."""
    from vllm.v1.attention.backends import utils

    impl = TritonFAImpl(4, 64, 0.125, 2, None, None, "auto")
    kv_cache = allocate_kv_cache(TritonFABackend, 6, 16, 2, 64, "auto", torch.bfloat16, device)
    key_cache, value_cache = impl._paged_kv(kv_cache)
    if not hasattr(utils, "set_triton_ptr_range"):
        assert not hasattr(key_cache, "ptr_range")
        return
    end = kv_cache.data_ptr() + kv_cache.untyped_storage().nbytes()  # the layer's cache is its own allocation here
    for view in (key_cache, value_cache):
        assert view.ptr_range() == end - view.data_ptr()


def test_no_pointer_range_off_rocm(nvidia, device):
    impl = TritonFAImpl(4, 64, 0.125, 2, None, None, "auto")
    kv_cache = allocate_kv_cache(TritonFABackend, 6, 16, 2, 64, "auto", torch.bfloat16, device)
    assert not any(hasattr(view, "ptr_range") for view in impl._paged_kv(kv_cache))


def test_profiling_run_zeroes_output(device):
    """vLLM's profiling run passes no metadata; like vLLM's own backends, the output comes back zeroed (the rest of
    the profiled forward then sees finite values, not whatever the allocation held)."""
    impl = TritonFAImpl(4, 64, 0.125, 2, None, None, "auto")
    output = torch.full((5, 4, 64), float("nan"), device=device)
    query = torch.randn(5, 4, 64, device=device)
    returned = impl.forward(make_layer(device=device), query, None, None, torch.empty(0), None, output)
    assert returned is output and bool((output == 0).all())
