"""fp8 K/V widened to a 16-bit type (or a paged 16-bit cache gathered) before a 16-bit attention
(kernels/widen_kv.py): the copy holds exactly the keys each sequence reads, and nothing else is written."""

import pytest
import torch
from attn_testing import DEVICE, make_inputs

from tritonfa.kernels.attention import KernelLaunch
from tritonfa.kernels.widen_kv import plan_widen_kv

FP8_TYPES = [torch.float8_e4m3fn, torch.float8_e5m2]


def _widen(inputs, q_dtype, skip_decode_max_q=0, seqused_k=None, max_seqlen_k=None):
    seqused_k = inputs.seqused_k if seqused_k is None else seqused_k
    max_seqlen_k = inputs.max_seqlen_k if max_seqlen_k is None else max_seqlen_k
    q = inputs.q.to(q_dtype)
    launch, k16, v16, cu_k, used_k = plan_widen_kv(
        q, inputs.k, inputs.v, inputs.cu_seqlens_q, inputs.cu_seqlens_k, seqused_k, inputs.block_table,
        max_seqlen_k, skip_decode_max_q,
    )  # fmt: skip
    k16.fill_(float("nan"))  # poisoned: rows the kernel must not write stay NaN
    v16.fill_(float("nan"))
    if inputs.block_table is not None:
        cu_k.fill_(-7)
        used_k.fill_(-7)
    KernelLaunch(*launch)()
    return k16, v16, cu_k, used_k


def _key_rows(inputs, b: int, length: int):
    """(k, v) rows [length, Hk, D] of sequence b's first `length` keys, read from the inputs as stored."""
    if inputs.block_table is None:
        start = int(inputs.cu_seqlens_k[b])
        return inputs.k[start : start + length], inputs.v[start : start + length]
    keys = torch.arange(length, device=inputs.k.device)
    block = inputs.block_table[b].long()[keys // inputs.k.shape[1]]
    slot = keys % inputs.k.shape[1]
    return inputs.k[block, slot], inputs.v[block, slot]


@pytest.mark.parametrize("kv_dtype", [*FP8_TYPES, None])  # None: q's own type (a paged 16-bit cache gathered)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kv_layout", ["contiguous", "contiguous_seqused", "paged", "paged_kv_interleaved",
                                       "paged_heads_major"])  # fmt: skip
def test_widened_copy_holds_each_sequences_keys_exactly(kv_dtype, q_dtype, kv_layout):
    """Odd lengths, an empty sequence, 70 keys (two programs' blocks, the second partial); fp8 values come back
    exactly (every e4m3 / e5m2 value is a bf16 and an fp16 value), 16-bit ones unchanged; rows no sequence reads
    stay NaN."""
    kv_dtype = kv_dtype or q_dtype
    seqlens_k = [70, 0, 129, 5]
    use_seqused = kv_layout == "contiguous_seqused"
    inputs = make_inputs([3, 2, 40, 1], seqlens_k, num_heads=(4, 2), head_size=72, dtype=q_dtype, kv_dtype=kv_dtype,
                         kv_layout=kv_layout.replace("_seqused", ""), use_seqused_k=use_seqused)  # fmt: skip
    k16, v16, cu_k, used_k = _widen(inputs, q_dtype)
    assert k16.dtype == v16.dtype == q_dtype
    written = torch.zeros(k16.shape[0], dtype=torch.bool, device=k16.device)
    for b, length in enumerate(seqlens_k):
        k_rows, v_rows = _key_rows(inputs, b, length)
        start = int(cu_k[b])
        if inputs.block_table is not None:
            assert start == b * inputs.max_seqlen_k and int(used_k[b]) == length
        torch.testing.assert_close(k16[start : start + length], k_rows.to(q_dtype), rtol=0, atol=0)
        torch.testing.assert_close(v16[start : start + length], v_rows.to(q_dtype), rtol=0, atol=0)
        written[start : start + length] = True
    assert k16[~written].isnan().all() and v16[~written].isnan().all(), "rows no sequence reads were written"
    if inputs.block_table is not None:
        assert int(cu_k[-1]) == len(seqlens_k) * inputs.max_seqlen_k


def test_widened_copy_skips_decode_sequences_and_caps_lengths():
    """A mixed batch's decodes (<= skip_decode_max_q queries) are read from the fp8 cache by another launch: not
    copied, but their lengths are still written. A seqused_k beyond max_seqlen_k or the block table's width is
    capped to what the copy and the table hold (the attention then never reads past either)."""
    inputs = make_inputs([40, 1, 20], [50, 30, 33], num_heads=(4, 2), head_size=64, kv_dtype=torch.float8_e4m3fn,
                         kv_layout="paged", block_size=16)  # fmt: skip
    k16, _, cu_k, used_k = _widen(inputs, torch.bfloat16, skip_decode_max_q=16)
    assert used_k.tolist() == [50, 30, 33] and cu_k.tolist() == [0, 50, 100, 150]
    assert k16[50:100].isnan().all(), "the decode sequence was copied"
    assert not k16[:50].isnan().any() and not k16[100:133].isnan().any()

    too_long = torch.tensor([50, 30, 1000], dtype=torch.int32, device=DEVICE)
    k16, _, cu_k, used_k = _widen(inputs, torch.bfloat16, seqused_k=too_long)
    width = inputs.block_table.shape[1] * 16
    assert used_k.tolist() == [50, 30, min(50, width)], "capped at max_seqlen_k (50) and the table"
    assert cu_k.tolist() == [0, 50, 100, 150]


def test_widened_copy_of_an_out_of_range_block_id_reads_inside_the_cache():
    """A block table entry past the cache (or negative) is clamped to a block of the cache, never read outside."""
    inputs = make_inputs([20], [40], num_heads=(4, 2), head_size=64, kv_dtype=torch.float8_e4m3fn, kv_layout="paged")
    inputs.block_table[0, 0] = inputs.k.shape[0] + 5
    inputs.block_table[0, 1] = -3
    k16, _, _, _ = _widen(inputs, torch.bfloat16)
    last, first = inputs.k[-1].to(torch.bfloat16), inputs.k[0].to(torch.bfloat16)
    torch.testing.assert_close(k16[:16], last, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(k16[16:32], first, rtol=0, atol=0, equal_nan=True)
