"""Architecture-dependent code paths, exercised on any machine by faking the detected architecture
(TRITONFA_ARCH), so ROCm-only branches (MI300's fp8 format, waves_per_eu) cannot rot unnoticed on NVIDIA/CPU CI."""

import dataclasses
import json

import pytest
import torch
from attn_testing import ON_GPU, check_low_precision, make_inputs, run_kernel

from tritonfa.configs import (
    ARCHS,
    all_configs,
    detect_arch,
    native_fp8_dot,
    select_config,
    select_keys_as_rows_config,
)
from tritonfa.fp8 import default_fp8_dtype, p_scale
from tritonfa.interface import default_output_dtype


def test_forced_architecture_is_detected(monkeypatch):
    for arch in ARCHS:
        monkeypatch.setenv("TRITONFA_ARCH", arch)
        assert detect_arch(torch.device("cpu")) == arch
    monkeypatch.setenv("TRITONFA_ARCH", "gfx-imaginary")
    with pytest.raises(ValueError, match="TRITONFA_ARCH"):
        detect_arch(torch.device("cpu"))


def test_mi300_uses_its_own_fp8_format_and_range():
    assert default_fp8_dtype("cdna3") == torch.float8_e4m3fnuz
    assert default_fp8_dtype("hopper") == default_fp8_dtype("cdna4") == torch.float8_e4m3fn
    assert default_output_dtype(torch.bfloat16, torch.tensor(1.0), "cdna3") == torch.float8_e4m3fnuz
    assert default_output_dtype(torch.bfloat16, torch.tensor(1.0), "hopper") == torch.float8_e4m3fn
    assert p_scale(torch.float8_e4m3fnuz) == 128 and p_scale(torch.float8_e4m3fn) == 256  # max 240 vs 448
    assert native_fp8_dot("cdna3", torch.float8_e4m3fnuz) and not native_fp8_dot("cdna3", torch.float8_e4m3fn)
    assert native_fp8_dot("hopper", torch.float8_e4m3fn) and not native_fp8_dot("hopper", torch.float8_e4m3fnuz)
    assert not native_fp8_dot("ampere", torch.float8_e4m3fn)


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "interpreter"])
def test_every_architecture_has_decode_and_prefill_configs(arch):
    for block_d in (16, 64, 128, 256):
        for max_seqlen_q in (1, 4096):
            config = select_config(arch, block_d, max_seqlen_q)
            assert config.block_m in (16, 32, 64, 128) and config.block_n in (16, 32, 64, 128, 256)
            assert config.pack_gqa or max_seqlen_q > 1, "decode tiles share K/V loads across the query heads"
    options = {tuple(sorted(c.launch_options(arch))) for _, c in all_configs(arch)}
    amd = arch in ("cdna2", "cdna3", "cdna4")
    assert any("waves_per_eu" in o for o in options) == amd, "waves_per_eu is an AMD-only launch option"


def test_keys_as_rows_decode_tile_is_hoppers_d128_only(monkeypatch):
    monkeypatch.delenv("TRITONFA_CONFIG", raising=False)
    tile = select_keys_as_rows_config("hopper", 128)
    assert tile.decode_keys_as_rows and (tile.block_m, tile.block_n, tile.num_stages) == (16, 64, 2)
    assert tile.launch_options("hopper")["maxnreg"] == 128 and tile.pack_gqa
    assert select_keys_as_rows_config("hopper", 64) is None and select_keys_as_rows_config("hopper", 256) is None
    assert all(select_keys_as_rows_config(arch, 128) is None for arch in ARCHS if arch != "hopper")
    assert (128, tile) in all_configs("hopper")  # cross-compiled with the others


def test_fp32_inputs_shrink_tiles_to_fit_shared_memory():
    bf16 = select_config("hopper", 256, 4096, element_bytes=2)
    fp32 = select_config("hopper", 256, 4096, element_bytes=4)
    need = (fp32.block_m + 2 * fp32.num_stages * fp32.block_n) * 256 * 4
    assert need <= 227 * 1024 and (fp32.block_m, fp32.block_n) < (bf16.block_m, bf16.block_n)


def test_env_override_applies_per_architecture(monkeypatch):
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"cdna3": {"block_n": 32, "waves_per_eu": 3}}))
    assert select_config("cdna3", 128, 4096).block_n == 32
    assert select_config("hopper", 128, 4096) == dataclasses.replace(select_config("hopper", 128, 4096))
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"block_mm": 1}))
    with pytest.raises(ValueError, match="block_mm"):
        select_config("hopper", 128, 4096)


@pytest.mark.skipif(ON_GPU, reason="fakes the architecture of the interpreter; a GPU runs its own")
@pytest.mark.parametrize("arch", ["cdna3", "rdna"])
def test_rocm_paths_compute_the_same_function(arch, monkeypatch):
    """The kernel under MI300/RDNA configs (fnuz fp8 dots on CDNA3, other tiles) agrees with the reference."""
    monkeypatch.setenv("TRITONFA_ARCH", arch)
    fp8 = default_fp8_dtype(arch)
    inputs = make_inputs([37, 1, 0], [37, 90, 5], num_heads=(4, 2), head_size=64, dtype=fp8, kv_layout="paged",
                         block_size=16)  # fmt: skip
    check_low_precision(inputs, causal=True)
    out = run_kernel(inputs, causal=True, output_scale=torch.tensor(0.05))
    assert out.dtype == (torch.float8_e4m3fnuz if arch == "cdna3" else torch.float8_e4m3fn)


def test_mi200_is_not_mi300():
    """gfx90a/gfx908 have no fp8 dots and use vLLM's e4m3fn there: fp8 inputs are upcast, never dotted natively."""
    assert not any(native_fp8_dot("cdna2", dtype) for dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz))
    assert default_fp8_dtype("cdna2") == torch.float8_e4m3fn
    assert select_config("cdna2", 128, 4096).waves_per_eu > 0
