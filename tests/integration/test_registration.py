"""Registration through the installed entry point, and what the backend class declares to vLLM's selector."""

import importlib.metadata

import pytest
import torch
import vllm.plugins
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.registry import AttentionBackendEnum

import tritonfa_vllm
from tritonfa_vllm import compat
from tritonfa_vllm.backend import TritonFABackend, TritonFAImpl


@pytest.fixture
def clean_registry(monkeypatch):
    """No CUSTOM override and plugins not yet loaded in this process; restored afterwards."""
    saved = AttentionBackendEnum.CUSTOM.get_path() if AttentionBackendEnum.CUSTOM.is_overridden() else None
    AttentionBackendEnum.CUSTOM.clear_override()
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    yield
    AttentionBackendEnum.CUSTOM.clear_override()
    if saved is not None:
        from vllm.v1.attention.backends.registry import register_backend

        register_backend(AttentionBackendEnum.CUSTOM, saved)


def test_entry_point_is_installed():
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    ours = [p for p in points if p.value == "tritonfa_vllm:register"]
    assert ours, "tritonfa-vllm is not installed (pip install -e integration/): no vllm.general_plugins entry point"
    assert ours[0].name == "tritonfa"
    dist = importlib.metadata.distribution("tritonfa-vllm")
    assert dist.version == tritonfa_vllm.__version__
    # the metadata states the same supported range as compat (pip normalizes the order of specifiers)
    vllm_req = [r.replace(" ", "")[4:] for r in dist.requires or [] if r.startswith("vllm")]
    assert [set(r.split(",")) for r in vllm_req] == [set(compat.SUPPORTED_RANGE.split(","))], dist.requires


def test_vllm_loads_plugin_and_selects_backend(clean_registry):
    vllm.plugins.load_general_plugins()
    assert AttentionBackendEnum.CUSTOM.get_path() == tritonfa_vllm.BACKEND_PATH
    backend = AttentionBackendEnum.CUSTOM.get_class()
    assert backend is TritonFABackend
    # the attention layer maps the backend back to its enum member by name
    assert AttentionBackendEnum[backend.get_name()] is AttentionBackendEnum.CUSTOM


def test_register_is_idempotent(clean_registry):
    for _ in range(3):
        tritonfa_vllm.register()
    vllm.plugins.load_general_plugins()
    assert AttentionBackendEnum.CUSTOM.get_class() is TritonFABackend


def test_installed_vllm_is_in_supported_range():
    low, high = compat.SUPPORTED_VLLM
    assert low <= compat.vllm_version() < high


def test_declared_support():
    b = TritonFABackend
    assert b.get_name() == "CUSTOM"
    assert b.get_impl_cls() is TritonFAImpl
    for head_size in (64, 80, 96, 112, 128, 256):
        assert b.supports_head_size(head_size)
    assert not b.supports_head_size(48)
    assert b.supports_dtype(torch.bfloat16) and b.supports_dtype(torch.float16)
    assert not b.supports_dtype(torch.float32)
    for kv_cache_dtype in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"):
        assert b.supports_kv_cache_dtype(kv_cache_dtype)
    assert not b.supports_kv_cache_dtype("int8_per_token_head")
    assert b.supports_attn_type(AttentionType.DECODER)
    for other in (AttentionType.ENCODER, AttentionType.ENCODER_ONLY, AttentionType.ENCODER_DECODER):
        assert not b.supports_attn_type(other)
    assert b.supports_sink()
    assert not b.is_mla()
    assert not b.supports_non_causal()
    for block_size in (1, 16, 32, 48):
        assert b.supports_block_size(block_size)


@pytest.mark.parametrize(
    "attn_type", [AttentionType.ENCODER, AttentionType.ENCODER_ONLY, AttentionType.ENCODER_DECODER]
)
def test_non_decoder_attention_raises(attn_type):
    with pytest.raises(NotImplementedError, match="decoder self-attention"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, "auto", attn_type=attn_type)


def test_unsupported_options_raise():
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, "int8_per_token_head")
    with pytest.raises(NotImplementedError, match="use_alibi_sqrt"):
        TritonFAImpl(8, 64, 0.125, 2, [0.5] * 8, None, "auto", use_alibi_sqrt=True)
    # extra arguments at their defaults are fine
    TritonFAImpl(8, 64, 0.125, 2, None, None, "auto", use_alibi_sqrt=False, chunk_lookback=-1)


def test_selector_accepts_supported_configurations():
    """What vLLM's CUDA platform runs for `attention_backend="CUSTOM"`: validate_configuration on the selector config."""
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    def reasons(**kw):
        config = AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16)
        config = config._replace(**{k: v for k, v in kw.items() if k in config._fields})
        return TritonFABackend.validate_configuration(device_capability=DeviceCapability(9, 0), **config._asdict())

    for kw in (
        {},
        dict(kv_cache_dtype="fp8"),
        dict(kv_cache_dtype="fp8_e5m2", dtype=torch.float16),
        dict(head_size=80, has_sink=True),
        dict(head_size=256, has_sliding_window=True),  # field of vLLM >= 0.3x
        dict(block_size=32),
    ):
        assert reasons(**kw) == [], kw
    assert reasons(head_size=48)
    assert reasons(dtype=torch.float32)
    assert reasons(use_mla=True)
    assert reasons(attn_type=AttentionType.ENCODER_ONLY)
    assert reasons(use_non_causal=True)
    assert reasons(kv_cache_dtype="int8_per_token_head")
