"""ALiBi as Bloom means it, on a Bloom-shaped step: CUSTOM and vLLM's TRITON_ATTN against a float64 reference.

The reference is independent of tritonfa's contract (-slope * |query position - key position|): the bias comes
from transformers' `build_alibi_tensor`, what Bloom adds to the scores (slope_h * key position, then the causal
mask), with the slopes vLLM's Bloom model hands its attention layers. The step holds what would expose a misaligned
bias: a chunked prefill with cached context (the query positions do not start at 0), a fresh prefill and decodes.
Both backends read the same cache; both must stay within bf16 rounding of float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from vllm.config import set_current_vllm_config
from vllm_batch import allocate_kv_cache, make_batch, make_builder, make_layer

from tritonfa_vllm.backend import TritonFABackend, TritonFAImpl

NUM_HEADS, HEAD_SIZE, BLOCK_SIZE = 16, 64, 16  # integration/scripts/models/bloom-alibi-h64


def bloom_slopes(num_heads: int) -> list[float]:
    from vllm.model_executor.models.bloom import _get_alibi_slopes

    return _get_alibi_slopes(num_heads).tolist()


def bloom_reference(q, k_seqs, v_seqs, query_lens, scale):
    """float64 attention with transformers' Bloom ALiBi bias; q [tokens, H, D], k/v per sequence [len, H, D].

    Returns (out, magnitude), magnitude = sum_j p_j |v_j|, the scale of a kernel's rounding error (bf16 P and V).
    """
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    out = torch.zeros(q.shape, dtype=torch.float64)
    magnitude = torch.zeros(q.shape, dtype=torch.float64)  # sum_j p_j |v_j|: the scale of the rounding errors
    start = 0
    for k, v, query_len in zip(k_seqs, v_seqs, query_lens):
        seq_len = k.shape[0]
        context_len = seq_len - query_len
        alibi = build_alibi_tensor(torch.ones(1, seq_len), NUM_HEADS, torch.float64)  # [H, 1, seq_len]
        scores = torch.einsum("qhd,khd->hqk", q[start : start + query_len].double(), k.double()) * scale + alibi
        query_pos = context_len + torch.arange(query_len)
        future = torch.arange(seq_len)[None, :] > query_pos[:, None]
        probs = scores.masked_fill(future, -math.inf).softmax(dim=-1)
        out[start : start + query_len] = torch.einsum("hqk,khd->qhd", probs, v.double())
        magnitude[start : start + query_len] = torch.einsum("hqk,khd->qhd", probs, v.double().abs())
        start += query_len
    return out, magnitude


def triton_attn_parts(device):
    """vLLM's own TRITON_ATTN backend (impl and builder), built as the engine builds it for the Bloom config."""
    from pathlib import Path

    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    model = Path(__file__).parents[2] / "integration" / "scripts" / "models" / "bloom-alibi-h64"
    model_config = ModelConfig(model=str(model), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=2048)
    config = VllmConfig(
        model_config=model_config, cache_config=CacheConfig(block_size=BLOCK_SIZE), device_config=DeviceConfig("cpu")
    )
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=NUM_HEADS, head_size=HEAD_SIZE, dtype=torch.bfloat16)
    with set_current_vllm_config(config):
        builder = TritonAttentionBackend.get_builder_cls()(spec, ["layer"], config, torch.device(device))
    impl_cls = TritonAttentionBackend.get_impl_cls()
    return TritonAttentionBackend, impl_cls, builder


def bloom_step(device, backend_name: str, slopes: list[float] | None = None):
    """One Bloom-shaped attention call (chunk with context, fresh prefill, two decodes) through a backend.

    Returns (impl, query, kv_cache, metadata, output, per-sequence K, per-sequence V, query_lens).
    """
    query_lens, context_lens = [40, 17, 1, 1], [60, 0, 90, 33]
    batch = make_batch(query_lens, context_lens, BLOCK_SIZE, device)
    k_seqs = [torch.randn(s, NUM_HEADS, HEAD_SIZE, dtype=torch.bfloat16, device=device) for s in batch.seq_lens]
    v_seqs = [torch.randn(s, NUM_HEADS, HEAD_SIZE, dtype=torch.bfloat16, device=device) for s in batch.seq_lens]
    q = torch.randn(batch.num_query_tokens, NUM_HEADS, HEAD_SIZE, dtype=torch.bfloat16, device=device)
    if backend_name == "CUSTOM":
        backend, impl_cls = TritonFABackend, TritonFAImpl
        builder = make_builder(backend, device, num_kv_heads=NUM_HEADS, head_size=HEAD_SIZE)
    else:
        backend, impl_cls, builder = triton_attn_parts(device)
    slopes = bloom_slopes(NUM_HEADS) if slopes is None else slopes
    impl = impl_cls(NUM_HEADS, HEAD_SIZE, HEAD_SIZE**-0.5, NUM_HEADS, slopes, None, "auto")
    metadata = builder.build(0, batch.common)
    layer = make_layer(device=device)
    kv_cache = allocate_kv_cache(backend, batch.num_blocks, BLOCK_SIZE, NUM_HEADS, HEAD_SIZE, "auto", q.dtype, device)

    def cat(seqs, cached: bool):
        return torch.cat([s[:c] if cached else s[c:] for s, c in zip(seqs, context_lens)])

    impl.do_kv_cache_update(layer, cat(k_seqs, True), cat(v_seqs, True), kv_cache, batch.context_slot_mapping)
    new_k, new_v = cat(k_seqs, False), cat(v_seqs, False)
    impl.do_kv_cache_update(layer, new_k, new_v, kv_cache, metadata.slot_mapping)
    out = torch.full_like(q, float("nan"))
    impl.forward(layer, q, new_k, new_v, kv_cache, metadata, out)
    assert not out.isnan().any()
    return impl, q, kv_cache, metadata, out, k_seqs, v_seqs, query_lens


@pytest.mark.parametrize("backend_name", ["CUSTOM", "TRITON_ATTN"])
def test_bloom_alibi_against_float64(device, backend_name):
    impl, q, _, _, out, k_seqs, v_seqs, query_lens = bloom_step(device, backend_name)
    ref, magnitude = bloom_reference(
        q.cpu(), [k.cpu() for k in k_seqs], [v.cpu() for v in v_seqs], query_lens, impl.scale
    )
    err = (out.double().cpu() - ref).abs()
    # rounding only: P rounded to bf16 for the P @ V dot (at most 2^-8 of sum p|v|, bf16's unit roundoff) and the
    # bf16 output (2^-8 of |out|); a misplaced bias costs far more (the steepest head's slope is 0.7 per position)
    worst = float((err / (2**-8 * (magnitude + ref.abs()))).max())
    print(f"{backend_name}: max |out - float64| {err.max():.2e}, {worst:.2f} of the rounding bound")
    assert worst <= 1.0, f"{backend_name}: {worst:.2f} x the bf16 rounding bound from float64 Bloom attention"


def test_engine_capture_check(device):
    """integration/scripts/_attention_capture.py (the GPU suite `e2e_check.py --suite alibi`) on the CPU: its
    check passes CUSTOM's output, reads the cache and lengths right, and fails an ALiBi that is off."""
    capture = load_capture_module()
    impl, q, kv_cache, metadata, out, *_ = bloom_step(device, "CUSTOM")
    record = capture.check_call(impl, q, kv_cache, metadata, out)
    assert record["kind"] == "mixed" and record["max_context"] == 90 and record["tokens"] == 59
    assert record["slope_error"] < 1e-6, "vLLM's Bloom slopes differ from transformers'"
    assert record["ratio"] <= 1.0, record

    # the same layer with its heads' slopes in reverse order: the check must see it
    wrong = bloom_step(device, "CUSTOM", slopes=bloom_slopes(NUM_HEADS)[::-1])
    record = capture.check_call(*wrong[:5])
    assert record["slope_error"] > 0.1 and record["ratio"] > 10, record


def test_engine_capture_wrapper(device):
    """install() wraps each attention layer's impl.forward, still returns its result, and records up to per_kind
    calls of each step kind per layer."""
    capture = load_capture_module()
    impl, q, kv_cache, metadata, out, *_ = bloom_step(device, "CUSTOM")
    attention = torch.nn.Module()
    attention.impl, attention.attn_backend = impl, TritonFABackend
    model = torch.nn.Sequential(torch.nn.Sequential(attention))
    recorder = capture.Recorder(per_kind=2)
    assert capture.install(model, recorder) == 1
    assert capture.install(model, recorder) == 0  # idempotent
    layer = make_layer(device=device)
    for _ in range(3):
        again = torch.empty_like(out)
        assert impl.forward(layer, q, None, None, kv_cache, metadata, again) is again
        torch.testing.assert_close(again, out, atol=0, rtol=0)
    assert impl.forward(layer, q, None, None, kv_cache, None, torch.empty_like(out)) is not None  # profiling run
    summary = recorder.summary()
    assert summary["calls"] == 2 and summary["kinds"]["mixed"]["calls"] == 2, summary
    assert summary["kinds"]["mixed"]["ratio"] <= 1.0 and summary["slope_error"] < 1e-6


def load_capture_module():
    import importlib
    import sys
    from pathlib import Path

    scripts = str(Path(__file__).parents[2] / "integration" / "scripts")
    if scripts not in sys.path:
        sys.path.append(scripts)
    return importlib.import_module("_attention_capture")
