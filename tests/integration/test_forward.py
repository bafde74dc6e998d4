"""The backend's cache write and forward on small mixed batches, against tritonfa.reference.

Each case runs what vLLM runs for one layer in one step: the builder turns CommonAttentionMetadata into metadata,
`do_kv_cache_update` (vLLM's reshape-and-cache op) writes the step's K/V after earlier steps wrote the context,
and `forward` attends over the paged cache. The oracle is `tritonfa.reference.attention_reference` on contiguous
K/V built from the same token values independently of the cache (rounded through fp8 the way the cache stores
them), so a wrong slot, layout, scale or length shows up.
"""

from __future__ import annotations

import math

import pytest
import torch
from vllm.platforms import current_platform
from vllm_batch import (
    allocate_kv_cache,
    cache_dtype,
    cached_key_value,
    make_batch,
    make_builder,
    make_layer,
    vllm_declares_kv_layout,
)

from tritonfa.reference import attention_reference
from tritonfa_vllm.backend import TritonFABackend, TritonFAImpl

FP8 = current_platform.fp8_dtype()


def alibi_slopes(num_heads: int) -> list[float]:
    return [2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)]


def run_step(
    device: str,
    *,
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int = 8,
    num_kv_heads: int = 2,
    head_size: int = 64,
    dtype: torch.dtype = torch.bfloat16,
    kv_cache_dtype: str = "auto",
    block_size: int = 16,
    sliding_window: int | None = None,
    softcap: float | None = None,
    alibi: bool = False,
    sinks: bool = False,
    scales: tuple[float, float, float] = (1.0, 1.0, 1.0),  # k, v, q
    fp8_query: bool = False,
    output_scale: float | None = None,
    pad_tokens: int = 0,
    pad_reqs: int = 0,
    max_seq_len: int | None = None,
    layout: str | None = None,
    inputs: dict | None = None,
    head_offsets: tuple[int, int] = (0, 0),
):
    """One layer, one step. Returns (output of the real tokens, reference, inputs) — inputs reusable for TP."""
    batch = make_batch(
        query_lens, context_lens, block_size, device,
        pad_tokens=pad_tokens, pad_reqs=pad_reqs, max_seq_len=max_seq_len,
    )  # fmt: skip
    fp8_kv = kv_cache_dtype.startswith("fp8")
    k_scale, v_scale, q_scale = scales
    num_real = batch.num_query_tokens
    num_tokens = num_real + pad_tokens
    if inputs is None:
        total_hq, total_hk = num_heads, num_kv_heads
        inputs = {
            "k": [torch.randn(s, total_hk, head_size, dtype=dtype, device=device) for s in batch.seq_lens],
            "v": [torch.randn(s, total_hk, head_size, dtype=dtype, device=device) for s in batch.seq_lens],
            "q": torch.randn(num_tokens, total_hq, head_size, dtype=dtype, device=device),
            "sinks": torch.randn(total_hq, dtype=torch.float32, device=device) if sinks else None,
        }
    inputs.pop("ref_fp8_p", None)  # a reused dict: this call's own
    # this rank's heads (all of them unless a TP test slices)
    hq0, hk0 = head_offsets
    k_seqs = [k[:, hk0 : hk0 + num_kv_heads] for k in inputs["k"]]
    v_seqs = [v[:, hk0 : hk0 + num_kv_heads] for v in inputs["v"]]
    q = inputs["q"][:, hq0 : hq0 + num_heads]
    sinks_t = None if inputs["sinks"] is None else inputs["sinks"][hq0 : hq0 + num_heads].contiguous()
    # as vLLM's ALiBi models do under tensor parallelism: the slopes of all heads, sliced to this rank's
    slopes = alibi_slopes(inputs["q"].shape[1])[hq0 : hq0 + num_heads] if alibi else None

    layer = make_layer(k_scale, v_scale, q_scale, device)
    impl = TritonFAImpl(
        num_heads, head_size, 1.0 / math.sqrt(head_size), num_kv_heads, slopes, sliding_window, kv_cache_dtype,
        logits_soft_cap=softcap, sinks=sinks_t,
    )  # fmt: skip
    builder = make_builder(
        TritonFABackend, device, block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size,
        cache_dtype=kv_cache_dtype, dtype=cache_dtype(kv_cache_dtype, dtype),
    )  # fmt: skip
    metadata = builder.build(common_prefix_len=0, common_attn_metadata=batch.common)
    kv_cache = allocate_kv_cache(
        TritonFABackend, batch.num_blocks, block_size, num_kv_heads, head_size, kv_cache_dtype, dtype, device, layout
    )

    def new_part(seqs):
        rows = [s[c:] for s, c in zip(seqs, batch.context_lens)]
        rows.append(torch.randn(pad_tokens, num_kv_heads, head_size, dtype=dtype, device=device))  # padding
        return torch.cat(rows)

    ctx_k = torch.cat([k[:c] for k, c in zip(k_seqs, batch.context_lens)])
    ctx_v = torch.cat([v[:c] for v, c in zip(v_seqs, batch.context_lens)])
    new_k, new_v = new_part(k_seqs), new_part(v_seqs)
    if ctx_k.shape[0]:  # earlier steps
        impl.do_kv_cache_update(layer, ctx_k, ctx_v, kv_cache, batch.context_slot_mapping)
    impl.do_kv_cache_update(layer, new_k, new_v, kv_cache, metadata.slot_mapping)

    query = (q.float() / q_scale).to(FP8) if fp8_query else q
    out_dtype = FP8 if output_scale is not None else dtype
    output = torch.empty(num_tokens, num_heads, head_size, dtype=out_dtype, device=device)
    out_scale_t = None if output_scale is None else torch.tensor(output_scale, dtype=torch.float32, device=device)
    returned = impl.forward(layer, query, new_k, new_v, kv_cache, metadata, output, output_scale=out_scale_t)
    assert returned is output

    # --- what the cache must hold: each token's K/V at its slot, as vLLM stores it (fp8: value / scale; a 16-bit
    # cache of another dtype than the model: rounded to it)
    def stored(x, scale):
        return (x.float() / scale).to(FP8) if fp8_kv else x.to(cache_dtype(kv_cache_dtype, dtype))

    all_slots = torch.cat([batch.context_slot_mapping, metadata.slot_mapping[:num_real]])
    expect_k = torch.cat([stored(ctx_k, k_scale), stored(new_k[:num_real], k_scale)])
    expect_v = torch.cat([stored(ctx_v, v_scale), stored(new_v[:num_real], v_scale)])
    cache_k, cache_v = cached_key_value(kv_cache, head_size)
    if fp8_kv:
        cache_k, cache_v = cache_k.view(FP8), cache_v.view(FP8)
    torch.testing.assert_close(cache_k[all_slots].float(), expect_k.float(), atol=0, rtol=0)
    torch.testing.assert_close(cache_v[all_slots].float(), expect_v.float(), atol=0, rtol=0)

    # --- the oracle on contiguous K/V in sequence order
    k_ref = torch.cat([stored(k, k_scale) for k in k_seqs])
    v_ref = torch.cat([stored(v, v_scale) for v in v_seqs])
    cu_q = torch.tensor([0, *torch.tensor(batch.query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *torch.tensor(batch.seq_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    f32 = dict(dtype=torch.float32, device=device)
    reference = dict(
        q=query[:num_real], k=k_ref, v=v_ref, max_seqlen_q=max(batch.query_lens), cu_seqlens_q=cu_q,
        max_seqlen_k=max(batch.seq_lens), cu_seqlens_k=cu_k,
        softmax_scale=impl.scale, causal=True, window_size=impl.window_size, softcap=impl.logits_soft_cap,
        alibi_slopes=None if slopes is None else torch.tensor(slopes, **f32), s_aux=sinks_t,
        q_descale=torch.tensor(q_scale, **f32) if fp8_query else None,
        k_descale=torch.tensor(k_scale, **f32) if fp8_kv else None,
        v_descale=torch.tensor(v_scale, **f32) if fp8_kv else None,
    )  # fmt: skip
    ref = attention_reference(**reference)
    if fp8_kv:
        # the error of rounding P through V's fp8 type at a fixed power of two: the scale of the kernel's own
        # P rounding (it scales P per key block instead; see check_fp8_p)
        inputs["ref_fp8_p"] = attention_reference(**reference, fp8_p_round_trip=v_ref.dtype).float()
    out = output[:num_real].float()
    if output_scale is not None:
        out = out * output_scale
    return out, ref.float(), inputs


def check(out, ref, atol, rtol=2e-2):
    assert not out.isnan().any(), "NaN in the output"
    torch.testing.assert_close(out, ref, atol=atol, rtol=rtol)


def check_fp8_p(out, ref, ref_fp8_p, floor=1e-2):
    """With fp8 V the kernel rounds P to fp8, scaled per (row, key block): no closed-form reference rounds it the
    same way. FA-style oracle: its error against the reference with exact P is at most twice that of the reference
    that rounds P through fp8 at a fixed power of two, plus a rounding floor."""
    assert not out.isnan().any(), "NaN in the output"
    kernel_error = (out - ref).abs().max().item()
    reference_error = (ref_fp8_p - ref).abs().max().item()
    assert reference_error > 0, "the fp8 P reference rounds nothing: the bound would be the floor alone"
    assert kernel_error <= 2 * reference_error + floor, (kernel_error, reference_error)


MIXED = dict(query_lens=[13, 17, 1, 1], context_lens=[20, 0, 30, 47])  # chunked prefill, prefill, two decodes


@pytest.mark.parametrize(
    "dtype, num_heads, num_kv_heads, head_size, block_size",
    [(torch.bfloat16, 8, 2, 128, 16), (torch.float16, 4, 1, 64, 32)],
    ids=["bf16-gqa4-d128-bs16", "fp16-mqa-d64-bs32"],
)
def test_mixed_batch(device, dtype, num_heads, num_kv_heads, head_size, block_size):
    out, ref, _ = run_step(
        device, **MIXED, dtype=dtype, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
        block_size=block_size,
    )  # fmt: skip
    check(out, ref, atol=1.5e-2)


@pytest.mark.parametrize(
    "kv_cache_dtype, fp8_query",
    [("fp8", False), ("fp8_e4m3", True), ("fp8_e5m2", False)],
    ids=["fp8", "fp8_e4m3-fp8-query", "fp8_e5m2"],
)
def test_fp8_kv_cache(device, kv_cache_dtype, fp8_query):
    impl = TritonFAImpl(8, 64, 0.125, 2, None, None, kv_cache_dtype)
    assert impl.supports_quant_query_input == (kv_cache_dtype != "fp8_e5m2")
    out, ref, inputs = run_step(
        device, **MIXED, kv_cache_dtype=kv_cache_dtype, scales=(0.05, 0.02, 0.03), fp8_query=fp8_query
    )
    check_fp8_p(out, ref, inputs["ref_fp8_p"])


@pytest.mark.parametrize("head_size", [8, 40, 64, 72, 80, 96, 112, 160, 200, 256])
def test_head_sizes(device, head_size):
    """Any head size up to 256 (the backend declares the kernel's range, not a list)."""
    out, ref, _ = run_step(
        device, query_lens=[7, 1], context_lens=[9, 20], num_heads=4, num_kv_heads=2, head_size=head_size
    )
    check(out, ref, atol=1.5e-2)


@pytest.mark.parametrize(
    "feature",
    [dict(sliding_window=8), dict(softcap=2.0), dict(alibi=True), dict(sinks=True)],
    ids=["sliding_window", "softcap", "alibi", "sinks"],
)
def test_features(device, feature):
    out, ref, _ = run_step(device, query_lens=[11, 1, 1], context_lens=[14, 40, 3], **feature)
    check(out, ref, atol=1.5e-2)


@pytest.mark.parametrize(
    "dtype, kv_cache_dtype, atol",
    [
        (torch.float32, "auto", 1e-5),  # fp32 dots in full precision ("ieee"): close to the float64 reference
        # bf16 cache for an fp32 model: the oracle reads the same rounded K/V; the kernel rounds P to V's dtype
        (torch.float32, "bfloat16", 1e-2),
        (torch.bfloat16, "bfloat16", 1.5e-2),  # the model's dtype named explicitly
        (torch.bfloat16, "float16", 1.5e-2),  # fp16 cache, bf16 model: the kernel's mixed 16-bit dots run in fp32
        (torch.float16, "bfloat16", 1.5e-2),
        (torch.float32, "fp8", 3e-2),
    ],
    ids=["fp32", "fp32-bf16cache", "bf16-bf16cache", "bf16-fp16cache", "fp16-bf16cache", "fp32-fp8cache"],
)
def test_model_and_cache_dtypes(device, dtype, kv_cache_dtype, atol):
    scales = (0.05, 0.02, 1.0) if kv_cache_dtype == "fp8" else (1.0, 1.0, 1.0)
    out, ref, inputs = run_step(device, **MIXED, dtype=dtype, kv_cache_dtype=kv_cache_dtype, scales=scales)
    if "ref_fp8_p" in inputs:
        check_fp8_p(out, ref, inputs["ref_fp8_p"])
    else:
        check(out, ref, atol=atol, rtol=1e-5 if atol < 1e-3 else 2e-2)


def test_fp8_output_quantization(device):
    impl = TritonFAImpl(8, 64, 0.125, 2, None, None, "auto")
    from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8StaticTensorSym

    assert impl.fused_output_quant_supported(kFp8StaticTensorSym)
    out, ref, _ = run_step(device, query_lens=[6, 1], context_lens=[10, 17], output_scale=0.01)
    check(out, ref, atol=2e-2, rtol=7e-2)  # fp8 e4m3 output: 3 mantissa bits


def test_cudagraph_padding_and_long_upper_bound(device):
    """As replayed into a captured graph: padded tokens (slot -1) and requests (no tokens, no KV), max_seq_len an
    upper bound far above the real lengths (decode-shaped: the kernel may split the KV range)."""
    out, ref, _ = run_step(
        device, query_lens=[1, 1, 1], context_lens=[40, 77, 5], pad_tokens=2, pad_reqs=2, max_seq_len=4096
    )
    check(out, ref, atol=1.5e-2)


def test_kv_cache_layouts(device):
    """vLLM 0.33 picks the physical layout of the [num_blocks, Hk, block_size, 2D] cache; the kernel reads strides."""
    if vllm_declares_kv_layout():
        pytest.skip("vLLM <= 0.2x: the backend declares the layout (NHD), covered by the other tests")
    for layout in ("LBHNC", "BLNHC"):
        out, ref, _ = run_step(device, query_lens=[5, 1], context_lens=[12, 30], layout=layout)
        check(out, ref, atol=1.5e-2)


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
def test_tensor_parallel_head_split(device, alibi):
    """TP=2 of a 32 q / 8 kv head layer: each rank runs its 16 / 4 heads with its own cache and the same metadata
    (with ALiBi: its slice of the 32 heads' slopes); the concatenated outputs equal the TP=1 output and the
    reference."""
    full, ref, inputs = run_step(
        device, query_lens=[6, 1, 1], context_lens=[10, 21, 5], num_heads=32, num_kv_heads=8, alibi=alibi
    )
    check(full, ref, atol=1.5e-2)
    ranks = []
    for rank in range(2):
        out, ref_rank, _ = run_step(
            device, query_lens=[6, 1, 1], context_lens=[10, 21, 5], num_heads=16, num_kv_heads=4, inputs=inputs,
            head_offsets=(16 * rank, 4 * rank), alibi=alibi,
        )  # fmt: skip
        check(out, ref_rank, atol=1.5e-2)
        ranks.append(out)
    torch.testing.assert_close(torch.cat(ranks, dim=1), full, atol=2e-3, rtol=0)


def test_checked_once_then_straight_to_the_op(device, monkeypatch):
    """A layer's first call goes through tritonfa's public flash_attn_varlen_func (every argument checked); later
    calls with the same cache views and dtypes call the function the `tritonfa::varlen_fwd` op wraps directly (no
    dispatcher), with the same result. A new cache tensor or another output dtype is checked again."""
    from tritonfa_vllm import backend

    monkeypatch.setattr(TritonFAImpl, "_warm_up", lambda self, *args: None)  # its launches would count (test_warmup)
    calls = []
    for name in ("flash_attn_varlen_func", "varlen_fwd", "varlen_fwd_into"):
        original = getattr(backend, name)
        monkeypatch.setattr(backend, name, lambda *a, _name=name, _f=original, **k: calls.append(_name) or _f(*a, **k))
    batch = make_batch([9, 1, 1], [12, 30, 5], 16, device)
    impl = TritonFAImpl(4, 64, 0.125, 2, alibi_slopes(4), 24, "auto", logits_soft_cap=30.0)
    layer = make_layer(device=device)
    metadata = make_builder(TritonFABackend, device).build(0, batch.common)

    def new_cache():
        kv_cache = allocate_kv_cache(TritonFABackend, batch.num_blocks, 16, 2, 64, "auto", torch.bfloat16, device)
        for slots in (batch.context_slot_mapping, metadata.slot_mapping):
            k, v = (torch.randn(slots.shape[0], 2, 64, dtype=torch.bfloat16, device=device) for _ in range(2))
            impl.do_kv_cache_update(layer, k, v, kv_cache, slots)
        return kv_cache

    kv_cache = new_cache()
    query = torch.randn(11, 4, 64, dtype=torch.bfloat16, device=device)
    outputs = []
    for _ in range(3):
        outputs.append(torch.full_like(query, float("nan")))
        impl.forward(layer, query, None, None, kv_cache, metadata, outputs[-1])
    assert calls == ["flash_attn_varlen_func", "varlen_fwd_into", "varlen_fwd_into"]
    assert not outputs[0].isnan().any()
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0], atol=0, rtol=0)
    # no call goes through torch's ADInplaceOrView kernel (most of an op call's host time; it is what bumps the
    # version counter of the mutated `out`): the public function calls tritonfa's implementation directly in eager
    # mode, and the direct calls dispatch below that kernel
    assert all(out._version == 0 for out in outputs)

    calls.clear()
    impl.forward(layer, query, None, None, new_cache(), metadata, torch.empty_like(query))  # new cache: checked
    impl.forward(layer, query, None, None, impl._kv_cache_source, metadata, torch.empty_like(query))
    impl.forward(
        layer, query, None, None, impl._kv_cache_source, metadata, torch.empty_like(query, dtype=torch.float32)
    )
    assert calls == ["flash_attn_varlen_func", "varlen_fwd_into", "flash_attn_varlen_func"]


def test_first_call_checks_what_the_builder_cannot(device):
    """The layer-level checks still happen (through the public function) on the first call: e.g. a query whose
    head size differs from the cache's."""
    batch = make_batch([3], [5], 16, device)
    impl = TritonFAImpl(4, 64, 0.125, 2, None, None, "auto")
    metadata = make_builder(TritonFABackend, device).build(0, batch.common)
    kv_cache = allocate_kv_cache(TritonFABackend, batch.num_blocks, 16, 2, 32, "auto", torch.bfloat16, device)
    impl.head_size = 32  # a cache laid out for head size 32
    query = torch.randn(3, 4, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="head size"):
        impl.forward(make_layer(device=device), query, None, None, kv_cache, metadata, torch.empty_like(query))


@pytest.mark.parametrize(
    "feature",
    [{}, dict(sliding_window=6), dict(softcap=2.0), dict(alibi=True), dict(sinks=True)],
    ids=["plain", "sliding_window", "softcap", "alibi", "sinks"],
)
def test_encoder_only(device, feature):
    """vLLM's EncoderOnlyAttention layers (bidirectional embedding models): each sequence's queries attend to its
    whole sequence, no causal mask and no KV cache (do_kv_cache_update writes nothing, forward reads the step's
    K/V). As vLLM builds it: the metadata from the backend wrapped by create_encoder_only_attention_backend, K/V
    views of the fused qkv projection, CUDA-graph padding (tokens and a request); sequences of 1 to 23 tokens (the
    decode-shaped and the prefill launches); the output NaN-poisoned. A dummy run (no metadata) zeroes the output."""
    from vllm.model_executor.layers.attention.encoder_only_attention import create_encoder_only_attention_backend
    from vllm.v1.attention.backend import AttentionType

    num_heads, num_kv_heads, head_size, dtype = 8, 2, 64, torch.bfloat16
    query_lens, pad_tokens, pad_reqs = [5, 1, 23, 2], 3, 1
    batch = make_batch(query_lens, [0] * len(query_lens), 16, device, pad_tokens=pad_tokens, pad_reqs=pad_reqs)
    # what vLLM's runner hands an EncoderOnlyAttentionSpec group: a one-column block table of zeros
    common = batch.common.replace(
        block_table_tensor=torch.zeros(len(query_lens) + pad_reqs, 1, dtype=torch.int32, device=device)
    )
    wrapped = create_encoder_only_attention_backend(TritonFABackend)
    builder = make_builder(wrapped, device, num_kv_heads=num_kv_heads, head_size=head_size, encoder_only=True)
    metadata = builder.build(common_prefix_len=0, common_attn_metadata=common)

    num_real = sum(query_lens)
    num_tokens = num_real + pad_tokens
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_size, dtype=dtype, device=device)
    q_cols, kv_cols = num_heads * head_size, num_kv_heads * head_size
    query = qkv[:, :q_cols].view(num_tokens, num_heads, head_size)
    key = qkv[:, q_cols : q_cols + kv_cols].view(num_tokens, num_kv_heads, head_size)
    value = qkv[:, q_cols + kv_cols :].view(num_tokens, num_kv_heads, head_size)
    slopes = alibi_slopes(num_heads) if feature.get("alibi") else None
    sinks = torch.randn(num_heads, dtype=torch.float32, device=device) if feature.get("sinks") else None
    impl = TritonFAImpl(
        num_heads, head_size, head_size**-0.5, num_kv_heads, slopes, feature.get("sliding_window"), "auto",
        logits_soft_cap=feature.get("softcap"), attn_type=AttentionType.ENCODER_ONLY, sinks=sinks,
    )  # fmt: skip
    layer = make_layer(device=device)
    no_cache = torch.tensor([], dtype=dtype, device=device)
    impl.do_kv_cache_update(layer, key, value, no_cache, metadata.slot_mapping)  # nothing to write

    output = torch.full((num_tokens, num_heads, head_size), float("nan"), dtype=dtype, device=device)
    assert impl.forward(layer, query, key, value, no_cache, metadata, output) is output
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    reference = dict(
        q=query[:num_real], k=key[:num_real], v=value[:num_real], max_seqlen_q=max(query_lens), cu_seqlens_q=cu,
        max_seqlen_k=max(query_lens), cu_seqlens_k=cu, softmax_scale=impl.scale, window_size=impl.window_size,
        softcap=impl.logits_soft_cap, s_aux=sinks,
        alibi_slopes=None if slopes is None else torch.tensor(slopes, dtype=torch.float32, device=device),
    )  # fmt: skip
    ref = attention_reference(**reference, causal=False).float()
    check(output[:num_real].float(), ref, atol=1.5e-2)
    # bidirectional indeed: the causal result differs beyond the tolerance
    causal = attention_reference(**{**reference, "window_size": (impl.window_size[0], 0)}, causal=True).float()
    assert (causal - ref).abs().max() > 0.1

    dummy = torch.full_like(output, float("nan"))
    assert impl.forward(layer, query, key, value, no_cache, None, dummy) is dummy
    assert (dummy == 0).all()
