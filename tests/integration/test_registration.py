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
    # any head size the kernel takes (1-256), not a fixed list
    for head_size in (8, 32, 40, 64, 72, 80, 96, 112, 128, 160, 192, 200, 256):
        assert b.supports_head_size(head_size), head_size
    for head_size in (0, 257, 512):
        assert not b.supports_head_size(head_size), head_size
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert b.supports_dtype(dtype), dtype
    assert not b.supports_dtype(torch.float64)
    for kv_cache_dtype in ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"):
        assert b.supports_kv_cache_dtype(kv_cache_dtype), kv_cache_dtype
    for kv_cache_dtype in ("int8_per_token_head", "fp8_per_token_head", "nvfp4"):
        assert not b.supports_kv_cache_dtype(kv_cache_dtype), kv_cache_dtype
    assert b.supports_attn_type(AttentionType.DECODER) and b.supports_attn_type(AttentionType.ENCODER_ONLY)
    for other in (AttentionType.ENCODER, AttentionType.ENCODER_DECODER):
        assert not b.supports_attn_type(other)
    assert b.supports_sink()
    assert not b.is_mla()
    assert not b.supports_non_causal()
    for block_size in (1, 16, 32, 48):
        assert b.supports_block_size(block_size)


@pytest.mark.parametrize("attn_type", [AttentionType.ENCODER, AttentionType.ENCODER_DECODER])
def test_cross_attention_models_raise(attn_type):
    with pytest.raises(NotImplementedError, match="encoder-decoder"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, "auto", attn_type=attn_type)


def test_encoder_only_layer():
    """Bidirectional: a sliding window reaches sliding_window - 1 tokens on each side; no KV cache, so no fp8 one."""
    impl = TritonFAImpl(8, 64, 0.125, 2, None, 5, "auto", attn_type=AttentionType.ENCODER_ONLY)
    assert impl.encoder_only and impl.window_size == (4, 4)
    assert TritonFAImpl(8, 64, 0.125, 2, None, 5, "auto").window_size == (4, 0)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype='auto'"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, "fp8", attn_type=AttentionType.ENCODER_ONLY)


def test_unsupported_options_raise():
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, "int8_per_token_head")
    with pytest.raises(NotImplementedError, match="use_alibi_sqrt"):
        TritonFAImpl(8, 64, 0.125, 2, [0.5] * 8, None, "auto", use_alibi_sqrt=True)
    # extra arguments at their defaults are fine
    TritonFAImpl(8, 64, 0.125, 2, None, None, "auto", use_alibi_sqrt=False, chunk_lookback=-1)
    with pytest.raises(ValueError, match="head sizes"):
        TritonFAImpl(8, 320, 0.125, 2, None, None, "auto")
    with pytest.raises(ValueError, match="alibi_slopes"):
        TritonFAImpl(8, 64, 0.125, 2, [0.5] * 4, None, "auto")
    with pytest.raises(ValueError, match="sinks"):
        TritonFAImpl(8, 64, 0.125, 2, None, None, "auto", sinks=torch.zeros(4))


def selector_reasons(capability=(9, 0), **kw) -> list[str]:
    """What vLLM's platform code runs for `attention_backend="CUSTOM"`: validate_configuration on the selector
    config (a non-empty list of reasons becomes vLLM's "Selected backend CUSTOM is not valid" error)."""
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    config = AttentionSelectorConfig(head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16)
    config = config._replace(**{k: v for k, v in kw.items() if k in config._fields})
    return TritonFABackend.validate_configuration(device_capability=DeviceCapability(*capability), **config._asdict())


def test_selector_accepts_supported_configurations():
    for kw in (
        {},
        dict(kv_cache_dtype="fp8"),
        dict(kv_cache_dtype="fp8_e5m2", dtype=torch.float16),
        dict(kv_cache_dtype="bfloat16", dtype=torch.float32),
        dict(kv_cache_dtype="float16"),
        dict(dtype=torch.float32, head_size=256),
        dict(head_size=80, has_sink=True),
        dict(head_size=72),
        dict(head_size=256, has_sliding_window=True),  # field of vLLM >= 0.3x
        dict(block_size=32),
    ):
        assert selector_reasons(**kw) == [], kw
    assert selector_reasons(head_size=288)
    assert selector_reasons(dtype=torch.float64)
    assert selector_reasons(use_mla=True)
    assert selector_reasons(attn_type=AttentionType.ENCODER_ONLY) == []
    assert selector_reasons(attn_type=AttentionType.ENCODER_DECODER)
    assert selector_reasons(use_non_causal=True)
    assert selector_reasons(kv_cache_dtype="int8_per_token_head")
