"""fp8 K/V widened to a 16-bit type in one pass before attention (exact: every e4m3 / e5m2 value is a bf16 and
an fp16 value), so that a 16-bit q meeting an fp8 cache runs the 16-bit attention kernel unchanged.

Widening inside the attention kernel repeats the work for every query tile and q head that reads a key block
(b8x2048 causal, 4 q heads per kv head: ~30 times per block) and costs shared-memory passes the tensor cores wait
for; here each key is read once (1 byte) and written once (2 bytes).

The same launch gathers a paged 16-bit cache of q's type into contiguous copies (config `ws_paged_gather_copy`:
the contiguous prefill then reads whole blocks instead of one TMA box per page); the values move unchanged.

Contiguous K/V keep their rows (row r of the copy is row r of the input; the attention call keeps cu_seqlens_k and
seqused_k). Paged K/V are gathered into rows `b * max_seqlen_k + j` (key j of sequence b), and the kernel writes
the matching `cu_seqlens_k` (b * max_seqlen_k) and `seqused_k` (the length, capped at max_seqlen_k and at the
block table's width) on the device: nothing is read on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tritonfa.kernels.plan_cache import scratch

# keys per program: 64 keys x 128 dims of K and V are 16 KB read, 32 KB written
BLOCK_KEYS = 64


@triton.jit(do_not_specialize=["num_seqs", "total_k", "max_seqlen_k", "num_cache_blocks", "max_blocks"])
def widen_kv_kernel(
    k_ptr,  # [total_k, Hk, D] or paged [num_cache_blocks, page, Hk, D] (any strides, D contiguous), fp8 or 16-bit
    v_ptr,  # likewise
    k_out_ptr,  # [rows, Hk, D] contiguous, 16-bit: rows = total_k (contiguous) or num_seqs * max_seqlen_k (paged)
    v_out_ptr,
    cu_seqlens_q_ptr,  # [num_seqs + 1] int32
    cu_seqlens_k_ptr,  # [num_seqs + 1] int32 (contiguous, or paged without seqused_k)
    seqused_k_ptr,  # [num_seqs] int32 (HAS_SEQUSED)
    block_table_ptr,  # [num_seqs, max_blocks] int32 (PAGED)
    cu_seqlens_k_out_ptr,  # [num_seqs + 1] int32 (PAGED): b * max_seqlen_k
    seqused_k_out_ptr,  # [num_seqs] int32 (PAGED): the keys copied
    num_seqs,
    total_k,
    max_seqlen_k,
    num_cache_blocks,
    max_blocks,
    stride_k_block,  # paged only: a cache block's stride (contiguous: 0)
    stride_k_tok,
    stride_k_head,
    stride_v_block,
    stride_v_tok,
    stride_v_head,
    stride_bt_seq,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_SEQUSED: tl.constexpr,
    SKIP_DECODE_MAX_Q: tl.constexpr,  # > 0: sequences with at most this many queries are not copied (decode tiles)
    BLOCK_KEYS: tl.constexpr,
):
    i_blk, i_seq, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if HAS_SEQUSED:
        seq_len = tl.load(seqused_k_ptr + i_seq)
    else:
        seq_len = tl.load(cu_seqlens_k_ptr + i_seq + 1) - tl.load(cu_seqlens_k_ptr + i_seq)
    seq_len = tl.maximum(seq_len, 0)
    if PAGED:
        # the copy holds max_seqlen_k rows per sequence and the table max_blocks pages
        seq_len = tl.minimum(tl.minimum(seq_len, max_seqlen_k), max_blocks * PAGE_SIZE)
        if i_blk == 0 and i_h == 0:
            tl.store(seqused_k_out_ptr + i_seq, seq_len)
            tl.store(cu_seqlens_k_out_ptr + i_seq, i_seq * max_seqlen_k)
            if i_seq == num_seqs - 1:
                tl.store(cu_seqlens_k_out_ptr + num_seqs, num_seqs * max_seqlen_k)
    if SKIP_DECODE_MAX_Q > 0:
        seq_q_len = tl.load(cu_seqlens_q_ptr + i_seq + 1) - tl.load(cu_seqlens_q_ptr + i_seq)
        if seq_q_len <= SKIP_DECODE_MAX_Q:
            return
    if i_blk * BLOCK_KEYS >= seq_len:
        return

    o_key = i_blk * BLOCK_KEYS + tl.arange(0, BLOCK_KEYS)  # [BK] key of the sequence
    o_d = tl.arange(0, BLOCK_D)
    m_key = o_key < seq_len
    if PAGED:
        i_page = tl.minimum(o_key // PAGE_SIZE, max_blocks - 1)
        block_id = tl.load(block_table_ptr + i_seq.to(tl.int64) * stride_bt_seq + i_page, mask=m_key, other=0)
        block_id = tl.minimum(tl.maximum(block_id, 0), num_cache_blocks - 1).to(tl.int64)  # never outside the cache
        i_slot = (o_key % PAGE_SIZE).to(tl.int64)
        k_row = block_id * stride_k_block + i_slot * stride_k_tok
        v_row = block_id * stride_v_block + i_slot * stride_v_tok
        i_out = i_seq.to(tl.int64) * max_seqlen_k + o_key
    else:
        i_tok = tl.load(cu_seqlens_k_ptr + i_seq).to(tl.int64) + o_key
        m_key = m_key & (i_tok >= 0) & (i_tok < total_k)  # inconsistent lengths never reach past the tensor
        k_row = i_tok * stride_k_tok
        v_row = i_tok * stride_v_tok
        i_out = i_tok
    m = m_key[:, None] & (o_d < HEAD_DIM)[None, :]
    num_kv_heads = tl.num_programs(2)
    o_out = (i_out * num_kv_heads + i_h)[:, None] * HEAD_DIM + o_d[None, :]
    b_k = tl.load(k_ptr + (k_row + i_h * stride_k_head)[:, None] + o_d[None, :], mask=m)
    tl.store(k_out_ptr + o_out, b_k.to(k_out_ptr.dtype.element_ty), mask=m)
    b_v = tl.load(v_ptr + (v_row + i_h * stride_v_head)[:, None] + o_d[None, :], mask=m)
    tl.store(v_out_ptr + o_out, b_v.to(v_out_ptr.dtype.element_ty), mask=m)


def rows_needed(k: torch.Tensor, num_seqs: int, max_seqlen_k: int, paged: bool) -> int:
    """Rows of the widened copy: the input's (contiguous) or max_seqlen_k per sequence (paged)."""
    return num_seqs * max_seqlen_k if paged else k.shape[0]


def plan_widen_kv(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_k: int,
                  skip_decode_max_q: int):  # fmt: skip
    """((kernel, grid, args, constexprs, options), k16, v16, cu_seqlens_k, seqused_k) of the attention call over
    K and V widened to q's 16-bit type (or, 16-bit already, gathered). The copies are allocated here; the launch
    fills them.

    skip_decode_max_q > 0: sequences with at most that many queries are left out (a mixed batch's decodes, which
    another launch reads from the fp8 cache).
    """
    paged = block_table is not None
    num_seqs = cu_seqlens_q.shape[0] - 1
    num_kv_heads, head_dim = k.shape[-2], k.shape[-1]
    rows = rows_needed(k, num_seqs, max_seqlen_k, paged)
    # scratch: a call served from the plan cache gets copies of its own (see plan_cache.scratch)
    k16 = scratch((rows, num_kv_heads, head_dim), q.dtype, q.device)
    v16 = scratch((rows, num_kv_heads, head_dim), q.dtype, q.device)
    if paged:
        cu_out = scratch((num_seqs + 1,), torch.int32, q.device)
        seqused_out = scratch((num_seqs,), torch.int32, q.device)
        strides = (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))
        page_size, num_cache_blocks, max_blocks = k.shape[1], k.shape[0], block_table.shape[1]
    else:
        cu_out, seqused_out = cu_seqlens_k, seqused_k
        strides = (0, k.stride(0), k.stride(1), 0, v.stride(0), v.stride(1))
        page_size, num_cache_blocks, max_blocks = 1, 1, 1
    some = cu_seqlens_q  # an int32 tensor standing in for arguments the constexprs switch off (never read)
    args = (
        k, v, k16, v16, cu_seqlens_q,
        cu_seqlens_k if cu_seqlens_k is not None else some,
        seqused_k if seqused_k is not None else some,
        block_table if paged else some,
        cu_out if paged else some,
        seqused_out if paged else some,
        num_seqs, k.shape[0] if not paged else 0, max_seqlen_k, num_cache_blocks, max_blocks,
        *strides, block_table.stride(0) if paged else 0,
    )  # fmt: skip
    constexprs = dict(
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        PAGED=paged,
        PAGE_SIZE=page_size,
        HAS_SEQUSED=seqused_k is not None,
        SKIP_DECODE_MAX_Q=skip_decode_max_q,
        BLOCK_KEYS=BLOCK_KEYS,
    )
    grid = (triton.cdiv(max(max_seqlen_k, 1), BLOCK_KEYS), num_seqs, num_kv_heads)
    launch = (widen_kv_kernel, grid, args, constexprs, {"num_warps": 4, "num_stages": 1})
    return launch, k16, v16, cu_out, seqused_out
