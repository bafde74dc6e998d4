"""The Gluon fp8-KV paged decode on Hopper (kernels/attention_hopper_decode.py, config `decode_gluon`).

Which calls the launcher sends there is checked anywhere (planning on meta tensors, as CI's cross-compile plans).
The kernel itself runs only on a Hopper GPU: Gluon does not run in Triton's interpreter (CI cross-compiles it for
sm_90 instead).
"""

import json
import random

import pytest
import torch
from attn_testing import ON_GPU, check_low_precision, fp8_descale, make_inputs, run_kernel, scaled

from tritonfa.kernels import attention_hopper_decode
from tritonfa.kernels.attention import decode_q_fp8_terms, plan_attention

ON_HOPPER = ON_GPU and torch.cuda.get_device_capability()[0] == 9 and not torch.version.hip
GLUON_DECODE = "attention_decode_hopper_kernel"
FP8 = torch.float8_e4m3fn


def _gluon_on(monkeypatch, **extra):
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"decode_gluon": True, **extra}}))


def _planned(inputs, **kwargs) -> list[str]:
    args = dict(
        q=inputs.q, k=inputs.k, v=inputs.v, lse=None, out=torch.empty(inputs.q.shape, dtype=torch.bfloat16),
        cu_seqlens_q=inputs.cu_seqlens_q, cu_seqlens_k=inputs.cu_seqlens_k, seqused_k=inputs.seqused_k,
        block_table=inputs.block_table, alibi_slopes=None, bias=None, s_aux=None, q_descale=None, k_descale=None,
        v_descale=None, output_scale=None, max_seqlen_q=inputs.max_seqlen_q, max_seqlen_k=inputs.max_seqlen_k,
        softmax_scale=0.125, window_left=-1, window_right=0, softcap=0.0, num_splits=1, arch="hopper",
    )  # fmt: skip
    args.update(kwargs)
    meta = {name: value.to("meta") if isinstance(value, torch.Tensor) else value for name, value in args.items()}
    return [launch.fn.__name__ for launch in plan_attention(**meta)]


@pytest.mark.skipif(not attention_hopper_decode.HAS_GLUON, reason="this triton has no Gluon")
def test_the_launcher_sends_only_covered_decode_calls_to_gluon(monkeypatch):
    """decode_gluon (Hopper's default): a bf16 or e4m3 q with e4m3 paged K/V at D 128 and q-len x group <= 16 goes
    to the Gluon decode; every other call keeps the portable kernel (and with the setting off, every call does)."""
    inputs = make_inputs([1, 1, 1], [40, 17, 0], num_heads=(8, 2), head_size=128, kv_dtype=FP8, kv_layout="paged")
    assert _planned(inputs) == [GLUON_DECODE]
    monkeypatch.setenv("TRITONFA_CONFIG", json.dumps({"hopper": {"decode_gluon": False}}))
    assert _planned(inputs) != [GLUON_DECODE]
    _gluon_on(monkeypatch)
    assert _planned(inputs) == [GLUON_DECODE]
    scale = torch.ones((), dtype=torch.float32)
    assert _planned(inputs, k_descale=scale, v_descale=scale) == [GLUON_DECODE]
    # vLLM's fp8-cache decode: q quantized to e4m3 with its descale, a bf16 out (decode_gluon_fp8_q: Hopper's default)
    fp8_q = make_inputs([1, 2], [40, 17], num_heads=(8, 2), head_size=128, dtype=FP8, kv_dtype=FP8, kv_layout="paged")
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _planned(fp8_q, q_descale=scale, k_descale=scale, v_descale=scale) == [GLUON_DECODE]
    _gluon_on(monkeypatch, decode_gluon_fp8_q=False)
    assert _planned(fp8_q, q_descale=scale, k_descale=scale, v_descale=scale) != [GLUON_DECODE]
    _gluon_on(monkeypatch, decode_gluon_fp8_q=True)
    assert _planned(fp8_q, q_descale=scale, k_descale=scale, v_descale=scale) == [GLUON_DECODE]
    assert decode_q_fp8_terms(fp8_q.q, fp8_q.k, fp8_q.v, arch="hopper") == 0  # one native fp8 term
    # features it does not cover, an fp8 output
    for kwargs in ({"softcap": 30.0}, {"window_left": 8}, {"alibi_slopes": torch.ones(8)}, {"s_aux": torch.zeros(8)},
                   {"out": torch.empty(inputs.q.shape, dtype=FP8)}):  # fmt: skip
        assert GLUON_DECODE not in _planned(inputs, **kwargs), kwargs
    # rows past 16 (q-len 8 x group 4), 16-bit K/V, D 64, contiguous K/V, pages of one key, an fp16 q
    others = [
        make_inputs([8, 1], [40, 17], num_heads=(8, 2), head_size=128, kv_dtype=FP8, kv_layout="paged"),
        make_inputs([1, 1], [40, 17], num_heads=(8, 2), head_size=128, kv_layout="paged"),
        make_inputs([1, 1], [40, 17], num_heads=(8, 2), head_size=64, kv_dtype=FP8, kv_layout="paged"),
        make_inputs([1, 1], [40, 17], num_heads=(8, 2), head_size=128, kv_dtype=FP8, kv_layout="contiguous"),
        make_inputs([1, 1], [40, 17], num_heads=(8, 2), head_size=128, kv_dtype=FP8, kv_layout="paged", block_size=1),
        make_inputs(
            [1, 1], [40, 17], num_heads=(8, 2), head_size=128, dtype=torch.float16, kv_dtype=FP8, kv_layout="paged"
        ),
    ]
    for other in others:
        assert GLUON_DECODE not in _planned(other, max_seqlen_q=other.max_seqlen_q)
    # decode_gluon_split (Hopper's default): a split call too, its partial results merged by the combine launch;
    # with it off, split calls keep the portable kernel
    monkeypatch.delenv("TRITONFA_CONFIG")
    assert _planned(inputs, num_splits=2) == [GLUON_DECODE, "combine_splits_kernel"]
    _gluon_on(monkeypatch, decode_gluon_split=False)
    assert GLUON_DECODE not in _planned(inputs, num_splits=2)
    assert _planned(inputs) == [GLUON_DECODE]
    assert _planned(inputs, num_splits=1) == [GLUON_DECODE]
    # the oracle bounds two fp8 QK terms on Hopper, as the kernel computes them
    assert decode_q_fp8_terms(inputs.q, inputs.k, inputs.v, arch="hopper") == 2


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon decode runs on Hopper only (CI cross-compiles it)")
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("block_size", [16, 64, 256])
def test_gluon_decode_matches_the_reference(monkeypatch, stages, block_size):
    """Random q / K / V, NaN-poisoned cache slots and output; contexts shorter than a block, empty, one key, a block
    edge and long ones; q-len up to 4 with 4 q heads per KV head; with lse, descales and seqused_k."""
    _gluon_on(monkeypatch, decode_gluon_stages=stages)
    seqlens_q = [1, 4, 1, 1, 2, 1, 3]
    seqlens_k = [scaled(300, 2000), 17, 0, 1, 64, scaled(129, 1025), 4097]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, kv_dtype=FP8, kv_layout="paged",
                         block_size=block_size)  # fmt: skip
    assert _planned(inputs, max_seqlen_q=inputs.max_seqlen_q) == [GLUON_DECODE]
    check_low_precision(inputs, causal=True, num_splits=1)
    k_descale, v_descale = fp8_descale("per_head", len(seqlens_q), 2), fp8_descale("scalar", len(seqlens_q), 2)
    check_low_precision(inputs, causal=True, num_splits=1, k_descale=k_descale, v_descale=v_descale)
    check_low_precision(inputs, causal=False, num_splits=1)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon decode runs on Hopper only (CI cross-compiles it)")
@pytest.mark.parametrize("descale", ["scalar", "per_head"])
def test_gluon_decode_with_an_fp8_q(monkeypatch, descale):
    """What vLLM sends for an fp8 cache (decode_gluon_fp8_q, on): q quantized to e4m3 with its descale (one fp8 QK term,
    no split), K/V descales, a bf16 out; NaN-poisoned cache slots, empty and short contexts, q-len up to 4."""
    _gluon_on(monkeypatch)  # decode_gluon_fp8_q: Hopper's default
    seqlens_q, seqlens_k = [1, 2, 1, 4, 1], [scaled(300, 2000), 64, 0, 17, scaled(129, 1025)]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, dtype=FP8, kv_dtype=FP8,
                         kv_layout="paged")  # fmt: skip
    scales = {name: fp8_descale(descale, len(seqlens_q), 2) for name in ("q_descale", "k_descale", "v_descale")}
    assert _planned(inputs, max_seqlen_q=inputs.max_seqlen_q, **scales) == [GLUON_DECODE]
    check_low_precision(inputs, causal=True, num_splits=1, **scales)
    check_low_precision(inputs, causal=False, num_splits=1, q_descale=scales["q_descale"])


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon decode runs on Hopper only (CI cross-compiles it)")
@pytest.mark.parametrize("v16_smem, stages", [(False, 2), (True, 2), (True, 3)])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, FP8])
def test_gluon_decode_at_block_edges(monkeypatch, q_dtype, v16_smem, stages):
    """Hopper's default Gluon decode (bf16 or e4m3 q), and with V widened into its slot for P @ V (the opt-in
    decode_gluon_v16_smem): NaN-poisoned pages of 16 and 64 keys, empty / one-key / block-edge / long contexts (keys
    past the sequence must be zeroed before P @ V), q-len up to 4."""
    if v16_smem:
        _gluon_on(monkeypatch, decode_gluon_v16_smem=True, decode_gluon_stages=stages)
    else:
        monkeypatch.delenv("TRITONFA_CONFIG", raising=False)
    seqlens_q, seqlens_k = [1, 4, 1, 1, 2, 3], [scaled(300, 2000), 17, 0, 1, 64, scaled(129, 4097)]
    for block_size in (16, 64):
        inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, dtype=q_dtype, kv_dtype=FP8,
                             kv_layout="paged", block_size=block_size)  # fmt: skip
        scales = {name: fp8_descale("per_head", len(seqlens_q), 2) for name in ("k_descale", "v_descale")}
        if q_dtype == FP8:
            scales["q_descale"] = fp8_descale("scalar", len(seqlens_q), 2)
        assert _planned(inputs, max_seqlen_q=inputs.max_seqlen_q, **scales) == [GLUON_DECODE]
        check_low_precision(inputs, causal=True, num_splits=1, **scales)
        check_low_precision(inputs, causal=False, num_splits=1, **scales)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon decode runs on Hopper only (CI cross-compiles it)")
@pytest.mark.parametrize("v16_smem", [False, True])
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, FP8])
def test_gluon_decode_split_kv(monkeypatch, q_dtype, v16_smem):
    """decode_gluon_split: splits of a context's 64-key blocks (explicit counts, more splits than a short context
    can use, and the automatic count), partial results merged by combine_splits_kernel; with lse, descales, empty
    and one-key contexts, q-len up to 4; V in registers or widened into its slot (decode_gluon_v16_smem)."""
    seqlens_q, seqlens_k = [1, 4, 1, 1, 2], [scaled(700, 5000), 17, 0, 1, scaled(300, 2000)]
    inputs = make_inputs(seqlens_q, seqlens_k, num_heads=(8, 2), head_size=128, dtype=q_dtype, kv_dtype=FP8,
                         kv_layout="paged")  # fmt: skip
    scales = {name: fp8_descale("per_head", len(seqlens_q), 2) for name in ("k_descale", "v_descale")}
    if q_dtype == FP8:
        scales["q_descale"] = fp8_descale("scalar", len(seqlens_q), 2)
    _gluon_on(monkeypatch, decode_gluon_split=True, decode_gluon_v16_smem=v16_smem)
    for num_splits in (3, 8):
        planned = _planned(inputs, max_seqlen_q=inputs.max_seqlen_q, num_splits=num_splits, **scales)
        assert planned == [GLUON_DECODE, "combine_splits_kernel"]
        check_low_precision(inputs, causal=True, num_splits=num_splits, **scales)
    check_low_precision(inputs, causal=False, num_splits=0, **scales)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon decode runs on Hopper only (CI cross-compiles it)")
def test_gluon_decode_with_eight_q_heads_per_kv_head(monkeypatch):
    """Group 8 (two q tokens fill the 16 rows), vLLM's default fp8 decode shape at b64 in miniature."""
    _gluon_on(monkeypatch)
    inputs = make_inputs([1] * 12 + [2], [2048] * 6 + [1, 5, 700, 63, 65, 128, 3000], num_heads=(32, 4),
                         head_size=128, kv_dtype=FP8, kv_layout="paged")  # fmt: skip
    assert _planned(inputs, max_seqlen_q=inputs.max_seqlen_q) == [GLUON_DECODE]
    check_low_precision(inputs, causal=True, num_splits=1)


@pytest.mark.skipif(not ON_HOPPER, reason="the Gluon decode runs on Hopper only (CI cross-compiles it)")
def test_new_batch_sizes_and_lengths_do_not_recompile_the_gluon_decode():
    """Token counts (some 16-divisible), cache sizes, block-table widths and lse rows change per batch: after one
    call, none of them may compile a new variant (vLLM warms up once; a compile while serving is a latency spike)."""
    kernel = attention_hopper_decode.attention_decode_hopper_kernel

    def call(batch):
        seqlens_k = [random.randint(1, scaled(300, 3000)) for _ in range(batch)]
        inputs = make_inputs([1] * batch, seqlens_k, num_heads=(32, 8), head_size=128, kv_dtype=FP8,
                             kv_layout="paged")  # fmt: skip
        assert _planned(inputs, max_seqlen_q=1) == [GLUON_DECODE]
        out, lse = run_kernel(inputs, causal=True, num_splits=1, return_softmax_lse=True)
        assert not out.isnan().any() and not lse.isnan().any()

    call(3)
    before = sum(len(entry[0]) for entry in kernel.device_caches.values())
    for batch in (16, 1, 32, 7, 48, 64):
        call(batch)
    assert sum(len(entry[0]) for entry in kernel.device_caches.values()) == before, "a new batch compiled a variant"
