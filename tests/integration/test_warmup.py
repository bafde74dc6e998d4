"""The backend's warm-up compiles every kernel variant a layer can launch: no Triton compilation while serving.

Coverage is checked without launching anything: `plan_attention` gives the launches of a call and
`tritonfa_vllm.variants.variant_keys` the keys Triton's JIT cache looks them up by. The warm-up's synthetic calls
must produce every key that realistic batches (built the way the backend builds its call) produce, for Hopper's
configs and for the machine's own.
"""

from __future__ import annotations

import random

import pytest
import torch
from vllm.platforms import current_platform
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm_batch import allocate_kv_cache, cache_dtype, make_builder, make_layer

from tritonfa.kernels.attention import plan_attention
from tritonfa_vllm import backend
from tritonfa_vllm.backend import TritonFABackend, TritonFAImpl
from tritonfa_vllm.variants import variant_keys

FP8 = current_platform.fp8_dtype()

# name -> (TritonFAImpl kwargs, model dtype, block size, fp8 query, fp8 output)
LAYERS = {
    "bf16-gqa4-d128": (dict(num_heads=8, head_size=128, num_kv_heads=2), torch.bfloat16, 16, False, False),
    "fp16-mqa-d64-bs32-features": (
        dict(num_heads=4, head_size=64, num_kv_heads=1, sliding_window=64, logits_soft_cap=30.0, alibi=True),
        torch.float16, 32, False, False,
    ),
    "fp8cache-fp8q-fp8out-sinks": (
        dict(num_heads=8, head_size=64, num_kv_heads=8, kv_cache_dtype="fp8", sinks=True),
        torch.bfloat16, 16, True, True,
    ),
}  # fmt: skip


def make_layer_call(device, name):
    kwargs, dtype, block_size, fp8_query, fp8_out = LAYERS[name]
    kwargs = dict(kwargs)
    num_heads, head_size, num_kv_heads = kwargs.pop("num_heads"), kwargs.pop("head_size"), kwargs.pop("num_kv_heads")
    kv_cache_dtype = kwargs.pop("kv_cache_dtype", "auto")
    alibi = kwargs.pop("alibi", False)
    sinks = torch.randn(num_heads, device=device) if kwargs.pop("sinks", False) else None
    impl = TritonFAImpl(
        num_heads, head_size, head_size**-0.5, num_kv_heads, [0.5] * num_heads if alibi else None,
        kwargs.pop("sliding_window", None), kv_cache_dtype, sinks=sinks, **kwargs,
    )  # fmt: skip
    kv_cache = allocate_kv_cache(
        TritonFABackend, 40, block_size, num_kv_heads, head_size, kv_cache_dtype, dtype, device
    )
    # as vLLM hands them: the query a view of the fused qkv projection, the output its own buffer
    qkv = torch.zeros(512, (num_heads + 2 * num_kv_heads) * head_size, dtype=FP8 if fp8_query else dtype, device=device)
    query = qkv[:, : num_heads * head_size].view(-1, num_heads, head_size)
    output = torch.empty(512, num_heads, head_size, dtype=FP8 if fp8_out else dtype, device=device)
    output_scale = torch.tensor(0.5, device=device) if fp8_out else None
    builder = make_builder(
        TritonFABackend, device, block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size,
        cache_dtype=kv_cache_dtype, dtype=cache_dtype(kv_cache_dtype, dtype),
    )  # fmt: skip
    return impl, make_layer(0.05, 0.02, 0.03, device), kv_cache, query, output, output_scale, builder


def realistic_metadata(rng, device, block_size, kind):
    """Metadata of a random batch as the runner builds it (contents of the block table do not matter to a plan)."""
    num_seqs = 1 if kind == "single-prefill" else rng.randint(1, 300)
    if kind == "decode":
        query_lens = [rng.choice([1, 1, 1, 2, 4, 16]) for _ in range(num_seqs)]
    elif kind == "single-prefill":
        query_lens = [rng.randint(17, 8192)]
    else:  # mixed: chunked prefills and decodes
        query_lens = [rng.choice([1, 1, rng.randint(1, 16), rng.randint(17, 2048)]) for _ in range(num_seqs)]
        query_lens[rng.randrange(num_seqs)] = rng.randint(17, 2048)
    seq_lens = [q + rng.randint(0, 100_000 - q) for q in query_lens]
    pad_reqs = rng.choice([0, 0, 3])  # CUDA-graph padding: requests with no tokens
    max_blocks = -(-max(seq_lens) // block_size)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()] + [sum(query_lens)] * pad_reqs)
    return CommonAttentionMetadata(
        query_start_loc=cu.to(torch.int32).to(device),
        query_start_loc_cpu=cu.to(torch.int32),
        seq_lens=torch.tensor(seq_lens + [0] * pad_reqs, dtype=torch.int32, device=device),
        num_reqs=num_seqs + pad_reqs,
        num_actual_tokens=sum(query_lens) + rng.choice([0, 5]),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens) if rng.random() < 0.5 else 131072,
        block_table_tensor=torch.zeros(num_seqs + pad_reqs, max_blocks, dtype=torch.int32, device=device),
        slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64, device=device),
        causal=True,
    )


def plan_keys(calls, arch):
    keys = set()
    for args in calls:
        (q, k, v, out, cu_q, cu_k, seqused, bt, alibi, bias, s_aux, qd, kd, vd, os_, max_q, max_k, scale, wl, wr, cap,
         splits, _return_lse) = args  # fmt: skip
        keys |= variant_keys(plan_attention(
            q, k, v, out, None, cu_q, cu_k, seqused, bt, alibi, bias, s_aux, qd, kd, vd, os_, max_q, max_k, scale, wl,
            wr, cap, splits, arch=arch,
        ))  # fmt: skip
    return keys


def missing_variants(device, name, num_batches=24, seed=0):
    """Keys that realistic batches plan but the warm-up's synthetic calls do not, per arch (empty: covered)."""
    impl, layer, kv_cache, query, output, output_scale, builder = make_layer_call(device, name)
    key_cache, value_cache = impl._paged_kv(kv_cache)
    warm = impl._warm_up_calls(layer, query, output, key_cache, value_cache, output_scale)
    rng = random.Random(seed)
    real = []
    for i in range(num_batches):
        kind = ("decode", "mixed", "single-prefill")[i % 3]
        md = builder.build(0, realistic_metadata(rng, device, key_cache.shape[1], kind))
        q = query[: md.num_actual_tokens]
        out = output[: md.num_actual_tokens]
        real.append(
            impl._op_args(
                layer, q, key_cache, value_cache, out, md.query_start_loc, md.seq_lens, md.block_table,
                md.max_query_len, md.max_seq_len, output_scale,
            )
        )  # fmt: skip
    missing = {}
    for arch in ("hopper", None):
        warm_keys, real_keys = plan_keys(warm, arch), plan_keys(real, arch)
        assert len(real_keys) >= 2
        missing[arch] = real_keys - warm_keys
    return missing


@pytest.mark.parametrize("name", list(LAYERS))
def test_warm_up_covers_realistic_batches(device, name):
    missing = missing_variants(device, name)
    assert missing == {"hopper": set(), None: set()}


def test_coverage_check_catches_a_missing_bucket(device, monkeypatch):
    """Without the multi-sequence prefill bucket, mixed batches plan variants the warm-up never compiled."""
    original = TritonFAImpl._warm_up_calls

    def without_mixed_prefill(self, *args):
        return [call for call in original(self, *args) if not (call[15] > 16 and call[4].shape[0] > 2)]

    monkeypatch.setattr(TritonFAImpl, "_warm_up_calls", without_mixed_prefill)
    missing = missing_variants(device, "bf16-gqa4-d128")
    assert missing["hopper"] and missing[None]
    assert {key[0] for key in missing["hopper"]} == {"attention_fwd_kernel"}


def test_warm_up_runs_once_per_configuration(device, monkeypatch):
    """Profiling (empty cache): nothing; the first dummy run with the real cache: the warm-up; later calls and other
    layers of the same configuration: nothing; a layer of another configuration: its own warm-up."""
    monkeypatch.setattr(backend, "_WARMED_UP", set())
    launched, compiled = [], []
    monkeypatch.setattr(backend, "varlen_fwd", lambda *args: launched.append(args))
    monkeypatch.setattr(backend, "compile_varlen_fwd", lambda calls: compiled.append((len(launched), list(calls))))
    name = "bf16-gqa4-d128"
    impl, layer, kv_cache, query, output, output_scale, _ = make_layer_call(device, name)
    impl.forward(layer, query, None, None, torch.tensor([], device=device), None, output)  # profiling run
    assert launched == [] and compiled == []
    impl.forward(layer, query, None, None, kv_cache, None, output)  # warm-up dummy run
    assert len(launched) == 4
    # the four calls' kernels compile side by side before the first of them runs
    assert len(compiled) == 1 and compiled[0][0] == 0
    assert [tuple(map(id, args)) for args in compiled[0][1]] == [tuple(map(id, args)) for args in launched]
    assert len(impl._warm_up_calls(layer, query, output, *impl._paged_kv(kv_cache), output_scale)) == 4
    impl.forward(layer, query, None, None, kv_cache, None, output)
    other_layer = make_layer_call(device, name)  # same configuration, its own cache tensor
    other_layer[0].forward(other_layer[1], query, None, None, other_layer[2], None, output)
    assert len(launched) == 4
    fp8 = make_layer_call(device, "fp8cache-fp8q-fp8out-sinks")
    fp8[0].forward(fp8[1], fp8[3], None, None, fp8[2], None, fp8[4], output_scale=fp8[5])
    assert len(launched) == 8 and len(compiled) == 2


def encoder_only_layer_call(device, sliding_window=None, softcap=None, alibi=False, dtype=torch.bfloat16):
    """An encoder-only layer (vLLM's EncoderOnlyAttention) and its inputs as vLLM hands them: query, key and value
    views of the fused qkv projection, the output its own buffer; no KV cache."""
    from vllm.v1.attention.backend import AttentionType

    num_heads, num_kv_heads, head_size = 8, 2, 128
    impl = TritonFAImpl(
        num_heads, head_size, head_size**-0.5, num_kv_heads, [0.5] * num_heads if alibi else None, sliding_window,
        "auto", logits_soft_cap=softcap, attn_type=AttentionType.ENCODER_ONLY,
    )  # fmt: skip
    q_cols, kv_cols = num_heads * head_size, num_kv_heads * head_size
    qkv = torch.zeros(512, q_cols + 2 * kv_cols, dtype=dtype, device=device)
    query = qkv[:, :q_cols].view(-1, num_heads, head_size)
    key = qkv[:, q_cols : q_cols + kv_cols].view(-1, num_kv_heads, head_size)
    value = qkv[:, q_cols + kv_cols :].view(-1, num_kv_heads, head_size)
    output = torch.empty(512, num_heads, head_size, dtype=dtype, device=device)
    return impl, make_layer(device=device), query, key, value, output


@pytest.mark.parametrize(
    "features", [{}, dict(sliding_window=64, softcap=30.0, alibi=True, dtype=torch.float16)], ids=["plain", "features"]
)
def test_encoder_only_warm_up_covers_realistic_batches(device, features):
    """Encoder-only batches (every sequence whole, up to 512 tokens in all): the warm-up's synthetic calls produce
    every kernel variant key that decode-shaped, single-sequence and several-sequence batches plan."""
    impl, layer, query, key, value, output = encoder_only_layer_call(device, **features)
    warm = impl._warm_up_encoder_only_calls(layer, query, key, value, output, None)
    rng = random.Random(0)
    real = []
    for i in range(24):
        kind = ("short", "single", "several")[i % 3]
        if kind == "short":
            lens = [rng.randint(1, 16) for _ in range(rng.randint(1, 20))]
        elif kind == "single":
            lens = [rng.randint(17, 500)]
        else:
            lens = [rng.randint(1, 60) for _ in range(rng.randint(2, 6))] + [rng.randint(17, 100)]
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        rows = sum(lens) + rng.choice([0, 5])  # CUDA-graph padding tokens
        real.append(
            impl._encoder_op_args(layer, query[:rows], key[:rows], value[:rows], output[:rows], cu, max(lens), None)
        )
    for arch in ("hopper", None):
        warm_keys, real_keys = plan_keys(warm, arch), plan_keys(real, arch)
        assert len(real_keys) >= 2
        assert real_keys <= warm_keys, arch


def test_encoder_only_warm_up_runs_once_per_configuration(device, monkeypatch):
    """A dummy run (no metadata) compiles the layer's three buckets and zeroes the output; a second layer of the
    same configuration compiles nothing."""
    monkeypatch.setattr(backend, "_WARMED_UP", set())
    launched = []
    monkeypatch.setattr(backend, "varlen_fwd", lambda *args: launched.append(args))
    impl, layer, query, key, value, output = encoder_only_layer_call(device)
    output.fill_(float("nan"))
    assert impl.forward(layer, query, key, value, torch.tensor([], device=device), None, output) is output
    assert len(launched) == 3 and (output == 0).all()
    other = encoder_only_layer_call(device)
    other[0].forward(other[1], *other[2:5], torch.tensor([], device=device), None, other[5])
    assert len(launched) == 3


def test_warm_up_compile_tool_times_the_backends_calls(device):
    """kernel/scripts/warm_up_compile.py times the warm-up's calls for a Llama layer: the same query lengths, KV
    bounds and block-table widths as the backend's `_warm_up_calls` (page 16)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "kernel" / "scripts" / "warm_up_compile.py"
    spec = importlib.util.spec_from_file_location("warm_up_compile", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    impl, layer, kv_cache, query, output, output_scale, _ = make_layer_call(device, "bf16-gqa4-d128")
    backend_calls = impl._warm_up_calls(layer, query, output, *impl._paged_kv(kv_cache), output_scale)
    tool_calls = tool.warm_up_calls(device, backend._multiprocessor_count(query.device))

    def shape(args):
        return args[6].tolist(), args[15], args[16], tuple(args[7].shape), args[5] is None

    assert [shape(c) for c in tool_calls] == [shape(c) for c in backend_calls]
