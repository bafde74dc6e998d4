"""Flash-attention forward: one Triton kernel for varlen and paged KV, GQA, fp8, masks and biases.

Grid: (query tiles over the whole batch, KV heads x head chunks). Query tiles are laid out per sequence as
`cu_seqlens_q[b] // TOKENS_PER_TILE + b` (an upper bound on the tiles before sequence b), so the grid size
`total_q // TOKENS_PER_TILE + batch` is known on the host without reading any lengths; each program finds its
sequence by binary search over `cu_seqlens_q` and exits if its tile lies past the sequence's end.

A tile's BLOCK_M rows are (query token, query head) pairs: row r is token r // H_PACK and head r % H_PACK of the
program's head chunk. With H_PACK = 1 a tile is one head's BLOCK_M tokens (prefill); with H_PACK = GROUP the query
heads sharing a KV head share every K/V tile load (decode).

The KV loop runs in three ranges: masked blocks at the start of the window, unmasked interior blocks, masked
blocks at the end (causal diagonal, window edge, sequence end), so the interior pays for no masking.

Scores are kept in the log2 domain (exp2 with log2(e) folded into the scale). When the PV dot runs in fp8 (V fp8,
V_IS_FP8), each key block's P is taken relative to the block's own row max and scaled so that this max is fp8's
largest value (P_TILE_MAX; the fp8 error study's strategy (b), accuracy/README.md), cast to V's fp8 type for the
PV dot; the accumulator and row sum are kept at that block max's scale (one factor per row moves them from one
block's to the next's), so a block's product joins them without a multiply.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait
from triton.tools.tensor_descriptor import TensorDescriptor

from tritonfa.configs import (
    DECODE_MAX_SEQLEN_Q,
    AttentionConfig,
    detect_arch,
    native_fp8_dot,
    select_config,
    select_keys_as_rows_config,
)
from tritonfa.fp8 import FP8_DTYPES, OCP_FP8_DTYPES, descale_strides, fp8_max, is_fp8
from tritonfa.kernels import attention_hopper, attention_hopper_decode, plan_cache, widen_kv
from tritonfa.kernels import launch as launch_module
from tritonfa.kernels.key_major import plan_key_major_storage
from tritonfa.kernels.launch import launch

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
MAX_SPLITS = 64


@triton.jit
def _find_sequence(cu_seqlens_q_ptr, tile_id, num_seqs, TOKENS_PER_TILE: tl.constexpr):
    # Largest b with cu_seqlens_q[b] // TOKENS_PER_TILE + b <= tile_id.
    lo = num_seqs * 0
    hi = num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        mid_start = tl.load(cu_seqlens_q_ptr + mid) // TOKENS_PER_TILE + mid
        lo = tl.where(mid_start <= tile_id, mid, lo)
        hi = tl.where(mid_start <= tile_id, hi, mid)
    return lo


@triton.jit
def _tanh(x):
    # tanh without libdevice (portable to the interpreter and HIP); saturates correctly at +-inf.
    return 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)


@triton.jit
def _widen_e4m3_words(words, ASM: tl.constexpr):
    """[R, C] 32-bit words of four e4m3 values (little-endian) -> [R, 4 C] fp16.

    Triton's own fp8 -> fp16 conversion of a loaded fp8 tensor splits the loaded words into bytes and packs pairs
    again (sm_90: ~3 instructions per value); two cvt.f16x2.e4m3x2 per word need none of that. ASM off (the
    interpreter has no PTX): the same values through Triton's conversions.
    """
    if ASM:
        e0, e1, e2, e3 = tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; .reg .b32 a, b; mov.b32 {lo, hi}, $4; cvt.rn.f16x2.e4m3x2 a, lo; "
            "cvt.rn.f16x2.e4m3x2 b, hi; mov.b32 {$0, $1}, a; mov.b32 {$2, $3}, b; }",
            "=h,=h,=h,=h,r", [words], dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=1,
        )  # fmt: skip
    else:
        e0 = (words & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        e1 = ((words >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        e2 = ((words >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        e3 = ((words >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    x = tl.join(tl.join(e0, e2), tl.join(e1, e3))  # [R, C, 2, 2], e_(2 a + b) at [r, c, a, b]: join adds a last axis
    return tl.reshape(x, [words.shape[0], words.shape[1] * 4])


@triton.jit
def _attend_kv_range(
    acc,
    l_i,
    m_i,
    m_ref,  # V_IS_FP8: the row max acc and l are kept at (see below; -inf before a row's first key)
    q,
    q_lo,  # Q_SPLIT: q's second fp8 term (the rest after q's rounding)
    score_scale,  # [BM] fp32: softmax scale x descales (x q's row scale when q is quantized), natural log units
    kv_start,
    kv_end,
    k_ptr,
    v_ptr,
    k_desc,
    v_desc,
    block_table_ptr,
    bias_ptr,
    kv_head,
    seq_k_start,
    seq_k_len,
    num_blocks,
    q_idx,
    row_valid,
    head_of_row,
    alibi_slope_log2,
    softcap,
    diagonal,
    window_left,
    window_right,
    bias_len_q,
    bias_len_k,
    stride_k_block,
    stride_k_tok,
    stride_k_head,
    stride_k_dim,
    stride_v_block,
    stride_v_tok,
    stride_v_head,
    stride_v_dim,
    stride_bias_head,
    stride_bias_q,
    stride_bias_k,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    CACHE_OFFSETS_32: tl.constexpr,
    USE_TMA: tl.constexpr,
    V_KEY_MAJOR: tl.constexpr,
    V_TMA: tl.constexpr,
    K_ROWS: tl.constexpr,
    PREFETCH_BLOCK_IDS: tl.constexpr,
    KEYS_AS_ROWS: tl.constexpr,
    Q_SPLIT: tl.constexpr,
    WIDEN_ASM: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    QK_DTYPE: tl.constexpr,
    PV_DTYPE: tl.constexpr,
    V_IS_FP8: tl.constexpr,
    P_TILE_MAX: tl.constexpr,
    P_TILE_MAX_LOG2: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    m_d = o_d < HEAD_DIM
    m_dv = o_dv < HEAD_DIM_V
    # Without softcap/ALiBi/bias the scale is applied inside exp2's argument (one FFMA per score) instead of to the
    # scores first; max(s) * c == max(s * c) because every scale is positive.
    TRANSFORMED: tl.constexpr = HAS_SOFTCAP or HAS_ALIBI or HAS_BIAS
    if TRANSFORMED:
        fold = tl.full(score_scale.shape, 1.0, tl.float32)  # [BM]
    else:
        fold = score_scale * LOG2E
    if KEYS_AS_ROWS:
        q_t = tl.trans(q)  # [BD, BM]
        q_lo_t = tl.trans(q_lo)
        # O^T = V^T P^T: the key-wide side of P@V is a wgmma too (V widened into shared memory once per block; an
        # mma.sync reads fp8 V from shared memory a byte at a time)
        acc_t = tl.trans(acc)  # [BDV, BM]
    if PREFETCH_BLOCK_IDS:
        i_k_first = kv_start + tl.arange(0, BLOCK_N)
        i_block_next = tl.load(block_table_ptr + i_k_first // PAGE_SIZE, mask=i_k_first < seq_k_len, other=0)
    for start in range(kv_start, kv_end, BLOCK_N):
        i_k = start + tl.arange(0, BLOCK_N)  # [BN] key positions within the sequence
        m_k = i_k < seq_k_len
        if V_TMA and V_KEY_MAJOR:
            m_k = m_k & (i_k >= 0)  # the key grid starts up to 15 keys before the sequence (see the kernel)
        if PREFETCH_BLOCK_IDS:
            i_block = i_block_next
            i_k_ahead = i_k + BLOCK_N
            i_block_next = tl.load(block_table_ptr + i_k_ahead // PAGE_SIZE, mask=i_k_ahead < seq_k_len, other=0)
        elif PAGED and not USE_TMA:
            i_block = tl.load(block_table_ptr + i_k // PAGE_SIZE, mask=m_k, other=0)
        if USE_TMA:
            if PAGED:
                # A page holds whole key blocks (PAGE_SIZE % BLOCK_N == 0): one block id per step. The descriptors
                # view the cache as rows of Hk * D; a page starts every stride_block / stride_tok rows (more than
                # PAGE_SIZE when K and V of a block sit side by side).
                i_page = tl.load(block_table_ptr + start // PAGE_SIZE)
                i_page = tl.minimum(tl.maximum(i_page, 0), num_blocks - 1)
                i_k_tma_row = i_page * (stride_k_block // stride_k_tok) + start % PAGE_SIZE
                i_v_tma_row = i_page * (stride_v_block // stride_v_tok) + start % PAGE_SIZE
            else:
                i_k_tma_row = seq_k_start + start
                i_v_tma_row = i_k_tma_row
        if PAGED and not USE_TMA:
            # An out-of-range block id (a scheduler bug) must not make the kernel read outside the cache. One unsigned
            # min clamps both ends (a negative id is a huge unsigned one): half the cost of min(max()) per key.
            last_block = (num_blocks - 1).to(tl.uint32)
            i_block = tl.minimum(i_block.to(tl.uint32, bitcast=True), last_block).to(tl.int32, bitcast=True)
            i_in_block = i_k % PAGE_SIZE
            if not CACHE_OFFSETS_32:
                i_block = i_block.to(tl.int64)
                i_in_block = i_in_block.to(tl.int64)
            o_k_row = i_block * stride_k_block + i_in_block * stride_k_tok
            o_v_row = i_block * stride_v_block + i_in_block * stride_v_tok
        elif not PAGED:
            # (also with descriptors: key-major V is read through pointers)
            i_row = (seq_k_start + i_k).to(tl.int64)
            o_k_row = i_row * stride_k_tok
            o_v_row = i_row * stride_v_tok
        if USE_TMA:
            # Tensor descriptors (TMA on Hopper): rows past the tensor read as 0; rows of the next sequence or past
            # the sequence's end in its last page are masked.
            b_k = k_desc.load([i_k_tma_row, kv_head * HEAD_DIM])  # [BN, BD]
            if not KEYS_AS_ROWS:
                b_k = b_k.T  # [BD, BN]
        elif K_ROWS or KEYS_AS_ROWS:
            # K read like V, [BN, BD] (key offsets in the same layout as V's, computed once); for q K^T transposed in
            # shared memory for the dot
            p_k = k_ptr + kv_head * stride_k_head + o_k_row[:, None] + o_d[None, :] * stride_k_dim  # [BN, BD]
            if MASKED:
                b_k = tl.load(p_k, mask=m_k[:, None] & m_d[None, :], other=0.0)
            elif BLOCK_D == HEAD_DIM:
                b_k = tl.load(p_k)
            else:
                b_k = tl.load(p_k, mask=m_d[None, :], other=0.0)
            if not KEYS_AS_ROWS:
                b_k = b_k.T  # [BD, BN]
        else:
            p_k = k_ptr + kv_head * stride_k_head + o_k_row[None, :] + o_d[:, None] * stride_k_dim  # [BD, BN]
            if MASKED:
                b_k = tl.load(p_k, mask=m_d[:, None] & m_k[None, :], other=0.0)
            elif BLOCK_D == HEAD_DIM:
                b_k = tl.load(p_k)  # interior blocks: every key exists
            else:
                b_k = tl.load(p_k, mask=m_d[:, None], other=0.0)  # head dims padded to a power of two
        if V_TMA:
            if V_KEY_MAJOR:
                # key-major storage [Hk * Dv, keys]: the transposed view is the K-major operand fp8 wgmma reads
                b_v = v_desc.load([kv_head * HEAD_DIM_V, i_v_tma_row]).T  # [BN, BDV]
            else:
                b_v = v_desc.load([i_v_tma_row, kv_head * HEAD_DIM_V])  # [BN, BDV]
            if MASKED:
                b_v = tl.where(m_k[:, None], b_v, 0.0)  # 0 * (a NaN of the next sequence) would be NaN
        elif KEYS_AS_ROWS:
            # V's rows as 32-bit words of four e4m3 values (the launcher checked: stride_v_dim 1, the other strides,
            # V's address and HEAD_DIM_V multiples of 4), widened to fp16 two values per instruction
            o_w = tl.arange(0, BLOCK_DV // 4)
            p_v_row = (v_ptr + kv_head * stride_v_head + o_v_row[:, None]).to(tl.pointer_type(tl.int32), bitcast=True)
            p_vw = p_v_row + o_w[None, :]  # [BN, BDV / 4]
            if MASKED:
                b_vw = tl.load(p_vw, mask=m_k[:, None] & (o_w * 4 < HEAD_DIM_V)[None, :], other=0)
            elif BLOCK_DV == HEAD_DIM_V:
                b_vw = tl.load(p_vw)
            else:
                b_vw = tl.load(p_vw, mask=(o_w * 4 < HEAD_DIM_V)[None, :], other=0)
            b_v = _widen_e4m3_words(b_vw, WIDEN_ASM)  # [BN, BDV] fp16
        else:
            p_v = v_ptr + kv_head * stride_v_head + o_v_row[:, None] + o_dv[None, :] * stride_v_dim  # [BN, BDV]
            if MASKED:
                b_v = tl.load(p_v, mask=m_k[:, None] & m_dv[None, :], other=0.0)
            elif BLOCK_DV == HEAD_DIM_V:
                b_v = tl.load(p_v)
            else:
                b_v = tl.load(p_v, mask=m_dv[None, :], other=0.0)

        if KEYS_AS_ROWS:
            # K q^T: the keys are the MMA's rows, so K goes from shared memory into an fp8 wgmma as it is
            b_st = tl.dot(b_k.to(QK_DTYPE), q_t, input_precision=DOT_PRECISION)  # [BN, BM]
            if Q_SPLIT:
                b_st = tl.dot(b_k.to(QK_DTYPE), q_lo_t, b_st, input_precision=DOT_PRECISION)
            b_s = b_st.T  # [BM, BN]
        else:
            b_s = tl.dot(q, b_k.to(QK_DTYPE), input_precision=DOT_PRECISION)  # [BM, BN]
        if TRANSFORMED:
            # log2-domain scores with the scale applied
            if HAS_SOFTCAP:
                b_s = (softcap * LOG2E) * _tanh(b_s * (score_scale / softcap)[:, None])
            else:
                b_s = b_s * (score_scale * LOG2E)[:, None]
            if HAS_ALIBI:
                distance = tl.abs(q_idx[:, None] + diagonal - i_k[None, :]).to(tl.float32)
                b_s -= alibi_slope_log2[:, None] * distance
            if HAS_BIAS:
                p_bias = (
                    bias_ptr
                    + head_of_row[:, None].to(tl.int64) * stride_bias_head
                    + q_idx[:, None].to(tl.int64) * stride_bias_q
                    + i_k[None, :].to(tl.int64) * stride_bias_k
                )
                m_bias = (row_valid & (q_idx < bias_len_q))[:, None] & (m_k & (i_k < bias_len_k))[None, :]
                b_bias = tl.load(p_bias, mask=m_bias, other=0.0)
                b_s += b_bias.to(tl.float32) * LOG2E
        if MASKED:
            visible = m_k[None, :]
            if USE_WINDOW:
                relative = i_k[None, :] - (q_idx[:, None] + diagonal)  # [BM, BN] key minus aligned query
                visible = visible & (relative <= window_right) & (relative >= -window_left)
            b_s = tl.where(visible, b_s, float("-inf"))

        m_tile = tl.max(b_s, 1) * fold  # [BM]
        m_new = tl.maximum(m_i, m_tile)
        # A row that has seen no key yet has m = -inf; subtracting 0 instead keeps exp2 free of inf - inf.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        if V_IS_FP8:
            # P relative to this block's row max, scaled so that it is fp8's max: small probabilities keep the
            # format's exponent range whatever the running max (a sink or an earlier peak) is. acc and l are kept at
            # that same reference (m_ref, this block's row max, at most 2^64 below the running max so that they
            # stay finite): moving them from one block's reference to the next is the one factor per row the running
            # max gives otherwise, and the block's P@V joins acc without a multiply. A row with no key in this block
            # keeps its reference (0 while it has none: acc and l are 0 there).
            m_ref_new = tl.maximum(m_tile, m_new - 64.0)
            m_keep = tl.where(m_new == float("-inf"), 0.0, m_ref)
            m_ref_new = tl.where(m_tile == float("-inf"), m_keep, m_ref_new)
            rebase = tl.exp2(m_ref - m_ref_new)  # [BM], 0 before a row's first key
            b_p = tl.exp2(b_s * fold[:, None] - (m_ref_new - P_TILE_MAX_LOG2)[:, None])  # [BM, BN], <= P_TILE_MAX
            l_i = l_i * rebase + tl.sum(b_p, 1)
            b_pv = tl.dot(b_p.to(b_v.dtype).to(PV_DTYPE), b_v.to(PV_DTYPE), input_precision=DOT_PRECISION)
            # added to acc in fp32, not passed into the dot: Hopper's fp8 MMA keeps 13 mantissa bits of its
            # accumulator, so chaining acc through every block of a long context shrinks the output (2.5% at 32k keys
            # in the interpreter's model of it)
            acc = acc * rebase[:, None] + b_pv
            m_ref = tl.where(m_new == float("-inf"), float("-inf"), m_ref_new)
        else:
            b_p = tl.exp2(b_s * fold[:, None] - m_safe[:, None])  # [BM, BN]
            l_i = l_i * alpha + tl.sum(b_p, 1)
            if KEYS_AS_ROWS:
                acc_t = acc_t * alpha[None, :]
                acc_t = tl.dot(b_v.T, b_p.to(PV_DTYPE).T, acc_t, input_precision=DOT_PRECISION)  # b_v: fp16
            else:
                acc = acc * alpha[:, None]
                acc += tl.dot(b_p.to(PV_DTYPE), b_v.to(PV_DTYPE), input_precision=DOT_PRECISION)
        m_i = m_new
    if KEYS_AS_ROWS:
        acc = tl.trans(acc_t)
    return acc, l_i, m_i, m_ref


@triton.jit(
    do_not_specialize=[
        "num_seqs",
        "total_q",
        "total_k",
        "num_blocks",
        "max_blocks",
        "softmax_scale",
        "softcap",
        "window_left",
        "window_right",
        "bias_len_q",
        "bias_len_k",
        "stride_bt_seq",
        "stride_bias_batch",
        "stride_bias_head",
        "stride_bias_q",
        "stride_bias_k",
        "stride_lse_head",
        "stride_split_out",
        "stride_split_lse",
        "stride_split_lse_head",
    ]
)
def attention_fwd_kernel(
    q_ptr,  # [total_q, Hq, D]
    k_ptr,  # [total_k, Hk, D] or paged [num_blocks, block_size, Hk, D]
    v_ptr,  # [total_k, Hk, Dv] or paged [num_blocks, block_size, Hk, Dv]
    k_desc,  # USE_TMA: descriptor of k as [total_k, Hk * D], blocks [BN, BD]; else unused
    v_desc,  # V_TMA: v as [total_k, Hk * Dv], blocks [BN, BDV]; key-major: [Hk * Dv, keys], blocks [BDV, BN]
    out_ptr,  # [total_q, Hq, Dv]
    lse_ptr,  # [Hq, total_q] fp32
    cu_seqlens_q_ptr,  # [batch + 1] int32
    cu_seqlens_k_ptr,  # [batch + 1] int32 (contiguous KV)
    seqused_k_ptr,  # [batch] int32
    block_table_ptr,  # [batch, max_blocks] int32
    alibi_ptr,  # [batch | broadcast, Hq] fp32
    bias_ptr,  # [batch | 1, Hq | 1, bias_len_q, bias_len_k]
    sink_ptr,  # [Hq] fp32
    q_descale_ptr,  # [batch | broadcast, Hk | broadcast] fp32, likewise k and v
    k_descale_ptr,
    v_descale_ptr,
    out_scale_ptr,  # [] fp32
    split_out_ptr,  # [num_splits, total_q, Hq, Dv] fp32 partial outputs (split-KV only)
    split_lse_ptr,  # [num_splits, Hq, total_q] fp32 partial lse (split-KV only)
    num_seqs,
    total_q,  # rows of q / out: no load or store goes past them, whatever cu_seqlens_q holds
    total_k,  # rows of contiguous k / v
    num_blocks,  # blocks in the paged cache
    max_blocks,  # block-table columns
    softmax_scale,
    softcap,
    window_left,
    window_right,
    bias_len_q,
    bias_len_k,
    stride_q_tok,
    stride_q_head,
    stride_q_dim,
    stride_k_block,
    stride_k_tok,
    stride_k_head,
    stride_k_dim,
    stride_v_block,
    stride_v_tok,
    stride_v_head,
    stride_v_dim,
    stride_o_tok,
    stride_o_head,
    stride_o_dim,
    stride_lse_head,
    stride_bt_seq,
    stride_alibi_seq,
    stride_bias_batch,
    stride_bias_head,
    stride_bias_q,
    stride_bias_k,
    stride_qdesc_seq,
    stride_qdesc_head,
    stride_kdesc_seq,
    stride_kdesc_head,
    stride_vdesc_seq,
    stride_vdesc_head,
    stride_split_out,
    stride_split_tok,
    stride_split_head,
    stride_split_lse,
    stride_split_lse_head,
    GROUP: tl.constexpr,  # query heads per KV head
    H_PACK: tl.constexpr,  # query heads per tile (1 or GROUP-like)
    HEAD_CHUNKS: tl.constexpr,  # cdiv(GROUP, H_PACK)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,  # keys per cache block (PAGED); a constant, so key -> (block, slot) is a shift, not a
    # division (a runtime block size put 74-175 integer divisions into each loop; one compile per cache layout)
    CACHE_OFFSETS_32: tl.constexpr,  # PAGED: every element offset of the cache views fits in int32 (cheaper math)
    USE_TMA: tl.constexpr,
    V_KEY_MAJOR: tl.constexpr,
    V_TMA: tl.constexpr,  # V through v_desc too (with V_KEY_MAJOR: a descriptor of the key-major copy)
    K_ROWS: tl.constexpr,  # pointer loads of K as [BN, BD] rows (like V) instead of [BD, BN]
    # paged pointer loads: block ids fetched a step ahead, so a step's K/V addresses wait on no load of that step
    # (H200: paged prefill 1.26 -> 1.11 ms); 16-bit decode tiles lost 70% with it (session 3; likely the shared
    # memory of the deeper pipeline it gives: one program per SM) and load in the step
    PREFETCH_BLOCK_IDS: tl.constexpr,
    # Hopper decode tiles with fp8 K: QK as K q^T (an fp8 wgmma over the keys) and P@V as V^T P^T, V's rows loaded as
    # 32-bit words and widened four values at a time
    KEYS_AS_ROWS: tl.constexpr,
    Q_SPLIT: tl.constexpr,  # SCALE_Q into fp8: q as two fp8 terms, hi + the rest (KEYS_AS_ROWS only)
    WIDEN_ASM: tl.constexpr,  # KEYS_AS_ROWS: widen with PTX (off in the interpreter)
    HAS_SEQUSED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_SINK: tl.constexpr,
    HAS_Q_DESCALE: tl.constexpr,
    HAS_K_DESCALE: tl.constexpr,
    HAS_V_DESCALE: tl.constexpr,
    HAS_OUT_SCALE: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    SCALE_Q: tl.constexpr,  # q is cast to QK_DTYPE after a per-row power-of-two scale maps its max |q| to <= Q_MAX
    QK_DTYPE: tl.constexpr,
    PV_DTYPE: tl.constexpr,
    V_IS_FP8: tl.constexpr,
    P_TILE_MAX: tl.constexpr,  # V_IS_FP8: the largest value of V's fp8 type, what each key block's row max of P maps to
    P_TILE_MAX_LOG2: tl.constexpr,  # log2(P_TILE_MAX)
    Q_MAX: tl.constexpr,
    OUT_MAX: tl.constexpr,  # fp8 output clamp; 0 = no clamp
    DOT_PRECISION: tl.constexpr,
    SPLIT_KV: tl.constexpr,  # program_id(2) picks a slice of the KV range; combine_splits_kernel merges
    MIN_BLOCKS_PER_SPLIT: tl.constexpr,  # SPLIT_KV: splits past cdiv(KV blocks, this) only mark themselves empty
    SEQ_FILTER: tl.constexpr,  # 0: every sequence; 1: only seqlen_q > DECODE_MAX_Q; 2: only seqlen_q <= DECODE_MAX_Q
    TILES_PER_SEQ: tl.constexpr,  # 0: tiles packed over cu_seqlens_q; > 0: program_id(0) // TILES_PER_SEQ = sequence
    DECODE_MAX_Q: tl.constexpr,
    # launched as a programmatic dependent of the Gluon prefill of the same mixed batch (config `mixed_pdl`): it
    # reads nothing that launch writes, and program 0 waits for that grid, so this grid - and what the stream runs
    # after it - completes after the prefill
    PDL_WAIT: tl.constexpr,
):
    if PDL_WAIT:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
            gdc_wait()
    TOKENS_PER_TILE: tl.constexpr = BLOCK_M // H_PACK
    tile_id = tl.program_id(0)
    i_hc = tl.program_id(1)
    kv_head = i_hc // HEAD_CHUNKS
    head_chunk = i_hc % HEAD_CHUNKS

    if TILES_PER_SEQ > 0:
        seq = tile_id // TILES_PER_SEQ
        tile_in_seq = tile_id % TILES_PER_SEQ
    else:
        seq = _find_sequence(cu_seqlens_q_ptr, tile_id, num_seqs, TOKENS_PER_TILE)
    seq_q_start = tl.load(cu_seqlens_q_ptr + seq)
    # A sequence that runs past q (cu_seqlens_q[-1] > total_q) is cut at total_q, so its tiles (last rows first)
    # cover the rows q has; uncut, they would fall past the grid and leave those rows unwritten.
    seq_q_len = tl.minimum(tl.load(cu_seqlens_q_ptr + seq + 1), total_q) - seq_q_start
    if TILES_PER_SEQ == 0:
        tile_in_seq = tile_id - (seq_q_start // TOKENS_PER_TILE + seq)
    if SEQ_FILTER == 1:
        if seq_q_len <= DECODE_MAX_Q:
            return
    if SEQ_FILTER == 2:
        if seq_q_len > DECODE_MAX_Q:
            return
    tiles_in_seq = tl.cdiv(seq_q_len, TOKENS_PER_TILE)
    if tile_in_seq >= tiles_in_seq:
        return
    # Last tiles first: under a causal mask they see the most keys, so the long programs start early.
    q_tile_start = (tiles_in_seq - 1 - tile_in_seq) * TOKENS_PER_TILE
    if HAS_SEQUSED:
        seq_k_len = tl.load(seqused_k_ptr + seq)
    else:
        seq_k_len = tl.load(cu_seqlens_k_ptr + seq + 1) - tl.load(cu_seqlens_k_ptr + seq)
    if PAGED:
        seq_k_start = 0
        seq_k_cap = max_blocks * PAGE_SIZE  # keys the block table can address
    else:
        seq_k_start = tl.minimum(tl.maximum(tl.load(cu_seqlens_k_ptr + seq), 0), total_k)
        seq_k_cap = total_k - seq_k_start
    seq_k_len = tl.minimum(tl.maximum(seq_k_len, 0), seq_k_cap)

    o_row = tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, BLOCK_D)
    o_dv = tl.arange(0, BLOCK_DV)
    head_in_group = head_chunk * H_PACK + o_row % H_PACK  # [BM]
    q_idx = q_tile_start + o_row // H_PACK  # [BM] query position within the sequence
    i_q_tok = (seq_q_start + q_idx).to(tl.int64)
    # Rows outside [0, total_q) (inconsistent cu_seqlens_q) are neither read nor written.
    row_valid = (q_idx < seq_q_len) & (head_in_group < GROUP) & (i_q_tok >= 0) & (i_q_tok < total_q)
    if TOKENS_PER_TILE * H_PACK != BLOCK_M:
        row_valid = row_valid & (o_row < TOKENS_PER_TILE * H_PACK)
    head_of_row = kv_head * GROUP + head_in_group  # [BM] query head

    p_q = q_ptr + i_q_tok[:, None] * stride_q_tok + head_of_row[:, None] * stride_q_head + o_d[None, :] * stride_q_dim
    b_q = tl.load(p_q, mask=row_valid[:, None] & (o_d < HEAD_DIM)[None, :], other=0.0)  # [BM, BD]

    qk_scale = softmax_scale
    if HAS_Q_DESCALE:
        qk_scale *= tl.load(q_descale_ptr + seq * stride_qdesc_seq + kv_head * stride_qdesc_head)
    if HAS_K_DESCALE:
        qk_scale *= tl.load(k_descale_ptr + seq * stride_kdesc_seq + kv_head * stride_kdesc_head)
    if SCALE_Q:
        # A bf16 q meeting an fp8 K runs the QK dot in fp16 (fp8 -> fp16 is one conversion per two values, and exact)
        # or, opted in, in fp8. Each row's own power-of-two scale keeps its largest |q| within QK_DTYPE's range; the
        # scale moves into the scores exactly.
        b_q_f32 = b_q.to(tl.float32)
        q_amax = tl.max(tl.abs(b_q_f32), 1)  # [BM]
        q_row_scale = tl.where(q_amax > 0.0, tl.exp2(tl.ceil(tl.log2(tl.maximum(q_amax, 1e-30) / Q_MAX))), 1.0)
        b_q_scaled = b_q_f32 * (1.0 / q_row_scale)[:, None]  # exact: a power of two
        b_q = b_q_scaled.to(QK_DTYPE)
        if Q_SPLIT:
            b_q_lo = (b_q_scaled - b_q.to(tl.float32)).to(QK_DTYPE)  # [BM, BD]
        else:
            b_q_lo = b_q
        score_scale = qk_scale * q_row_scale  # [BM]
    else:
        b_q = b_q.to(QK_DTYPE)
        b_q_lo = b_q
        score_scale = tl.full([BLOCK_M], 1.0, tl.float32) * qk_scale  # [BM]

    if HAS_ALIBI:
        alibi_slope_log2 = tl.load(alibi_ptr + seq * stride_alibi_seq + head_of_row, mask=row_valid, other=0.0) * LOG2E
    else:
        alibi_slope_log2 = tl.zeros([BLOCK_M], dtype=tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    m_ref = m_i  # V_IS_FP8: the reference acc and l are kept at (_attend_kv_range)

    diagonal = seq_k_len - seq_q_len  # bottom-right alignment: query i lines up with key i + diagonal
    q_first = q_tile_start
    q_last = tl.minimum(q_tile_start + TOKENS_PER_TILE, seq_q_len) - 1
    # Key blocks start at key_origin + j * BLOCK_N. A descriptor of key-major V needs each tile's first key
    # 16-byte aligned in memory, so there the grid starts up to 15 keys early (masked); elsewhere at key 0.
    if V_TMA and V_KEY_MAJOR:
        key_origin = -(seq_k_start % 16)
    else:
        key_origin = 0
    if USE_WINDOW:
        kv_lo = tl.maximum(q_first + diagonal - window_left, 0)
        kv_hi = tl.minimum(q_last + diagonal + window_right + 1, seq_k_len)
        # Blocks in [full_lo, full_hi) are visible to every row of the tile.
        full_lo = tl.maximum(q_last + diagonal - window_left, 0)
        full_hi = tl.minimum(q_first + diagonal + window_right + 1, seq_k_len)
    else:
        kv_lo = 0
        kv_hi = seq_k_len
        full_lo = 0
        full_hi = seq_k_len
    kv_lo = key_origin + ((kv_lo - key_origin) // BLOCK_N) * BLOCK_N  # down to a block start
    full_lo = key_origin + tl.cdiv(full_lo - key_origin, BLOCK_N) * BLOCK_N  # up
    full_hi = key_origin + ((full_hi - key_origin) // BLOCK_N) * BLOCK_N  # down
    kv_hi = tl.maximum(kv_hi, kv_lo)
    if SPLIT_KV:
        # The split count is sized on the device from this sequence's real KV range: under CUDA graphs the grid
        # is fixed at capture, so splits a short context does not need mark themselves empty and stop.
        split = tl.program_id(2)
        kv_blocks = tl.cdiv(kv_hi - kv_lo, BLOCK_N)
        splits_used = tl.maximum(tl.minimum(tl.num_programs(2), tl.cdiv(kv_blocks, MIN_BLOCKS_PER_SPLIT)), 1)
        if split >= splits_used:
            p_slse = (
                split_lse_ptr
                + split.to(tl.int64) * stride_split_lse
                + head_of_row.to(tl.int64) * stride_split_lse_head
                + i_q_tok
            )
            tl.store(p_slse, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=row_valid)
            return
        blocks_per_split = tl.cdiv(kv_blocks, splits_used)
        kv_lo = tl.minimum(kv_lo + split * blocks_per_split * BLOCK_N, kv_hi)
        kv_hi = tl.minimum(kv_lo + blocks_per_split * BLOCK_N, kv_hi)
    mid_lo = tl.minimum(tl.maximum(full_lo, kv_lo), kv_hi)
    mid_hi = tl.minimum(tl.maximum(full_hi, mid_lo), kv_hi)

    block_table_row = block_table_ptr + seq.to(tl.int64) * stride_bt_seq
    bias_base = bias_ptr + seq.to(tl.int64) * stride_bias_batch
    for part in tl.static_range(3):
        range_lo = kv_lo if part == 0 else (mid_lo if part == 1 else mid_hi)
        range_hi = mid_lo if part == 0 else (mid_hi if part == 1 else kv_hi)
        acc, l_i, m_i, m_ref = _attend_kv_range(
            acc, l_i, m_i, m_ref, b_q, b_q_lo, score_scale, range_lo, range_hi, k_ptr, v_ptr, k_desc, v_desc,
            block_table_row, bias_base, kv_head, seq_k_start, seq_k_len, num_blocks, q_idx, row_valid, head_of_row,
            alibi_slope_log2, softcap, diagonal, window_left, window_right, bias_len_q, bias_len_k,
            stride_k_block, stride_k_tok, stride_k_head, stride_k_dim,
            stride_v_block, stride_v_tok, stride_v_head, stride_v_dim,
            stride_bias_head, stride_bias_q, stride_bias_k,
            HEAD_DIM, HEAD_DIM_V, BLOCK_D, BLOCK_DV, BLOCK_N, part != 1, PAGED, PAGE_SIZE, CACHE_OFFSETS_32, USE_TMA,
            V_KEY_MAJOR, V_TMA, K_ROWS, PREFETCH_BLOCK_IDS, KEYS_AS_ROWS, Q_SPLIT, WIDEN_ASM, USE_WINDOW, HAS_SOFTCAP,
            HAS_ALIBI, HAS_BIAS, QK_DTYPE,
            PV_DTYPE, V_IS_FP8, P_TILE_MAX, P_TILE_MAX_LOG2, DOT_PRECISION,
        )  # fmt: skip

    if V_IS_FP8:
        m_i = m_ref - P_TILE_MAX_LOG2  # acc and l as at a running max: P_TILE_MAX is the reference's P
    if HAS_SINK and not SPLIT_KV:
        # The sink joins the denominator only now: had it started the running max, P would be quantized relative
        # to the sink instead of the row's top key (fp8 V loses precision when the sink dominates).
        sink_log2 = tl.load(sink_ptr + head_of_row, mask=row_valid, other=0.0).to(tl.float32) * LOG2E
        m_final = tl.maximum(m_i, sink_log2)
        key_weight = tl.exp2(m_i - m_final)
        acc = acc * key_weight[:, None]
        l_i = l_i * key_weight + tl.exp2(sink_log2 - m_final)
        m_i = m_final
    # Rows that saw no key (and no sink) have l = 0 and acc = 0: divide by 1 so they come out as 0, not NaN.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out_factor = 1.0 / l_safe
    if HAS_V_DESCALE:
        out_factor = out_factor * tl.load(v_descale_ptr + seq * stride_vdesc_seq + kv_head * stride_vdesc_head)
    b_o = acc * out_factor[:, None]  # [BM, BDV]
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)  # [BM]
    m_o = row_valid[:, None] & (o_dv < HEAD_DIM_V)[None, :]
    if SPLIT_KV:
        i_split = tl.program_id(2).to(tl.int64)
        p_so = (
            split_out_ptr
            + i_split * stride_split_out
            + i_q_tok[:, None] * stride_split_tok
            + head_of_row[:, None] * stride_split_head
            + o_dv[None, :]
        )
        tl.store(p_so, b_o, mask=m_o)
        p_slse = split_lse_ptr + i_split * stride_split_lse + head_of_row.to(tl.int64) * stride_split_lse_head + i_q_tok
        tl.store(p_slse, lse, mask=row_valid)
    else:
        if HAS_OUT_SCALE:
            b_o = b_o / tl.load(out_scale_ptr)
        if OUT_MAX > 0:
            b_o = tl.minimum(tl.maximum(b_o, -OUT_MAX), OUT_MAX)
        p_o = (
            out_ptr
            + i_q_tok[:, None] * stride_o_tok
            + head_of_row[:, None] * stride_o_head
            + o_dv[None, :] * stride_o_dim
        )
        tl.store(p_o, b_o.to(out_ptr.dtype.element_ty), mask=m_o)
        if RETURN_LSE:
            tl.store(lse_ptr + head_of_row.to(tl.int64) * stride_lse_head + i_q_tok, lse, mask=row_valid)


@triton.jit(
    do_not_specialize=[
        "num_seqs", "num_splits", "stride_split_out", "stride_split_lse", "stride_split_lse_head", "stride_lse_head"
    ]
)  # fmt: skip
def combine_splits_kernel(
    split_out_ptr,  # [num_splits, total_q, Hq, Dv] fp32, laid out like out
    split_lse_ptr,  # [num_splits, Hq, total_q] fp32
    out_ptr,  # [total_q, Hq, Dv]
    lse_ptr,  # [Hq, total_q] fp32
    sink_ptr,  # [Hq]
    out_scale_ptr,  # [] fp32
    cu_seqlens_q_ptr,  # [batch + 1] int32
    num_seqs,
    num_splits,
    stride_split_out,
    stride_split_tok,
    stride_split_head,
    stride_split_lse,
    stride_split_lse_head,
    stride_o_tok,
    stride_o_head,
    stride_o_dim,
    stride_lse_head,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    BLOCK_SPLITS: tl.constexpr,
    HAS_SINK: tl.constexpr,
    HAS_OUT_SCALE: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    OUT_MAX: tl.constexpr,
    SPLITS_PER_STEP: tl.constexpr,
):
    i_tok = tl.program_id(0).to(tl.int64)
    i_head = tl.program_id(1)
    # Rows of no sequence (padding past cu_seqlens_q[-1]) have no partial results: leave them as they are.
    if (i_tok < tl.load(cu_seqlens_q_ptr)) | (i_tok >= tl.load(cu_seqlens_q_ptr + num_seqs)):
        return
    o_split = tl.arange(0, BLOCK_SPLITS)
    o_dv = tl.arange(0, BLOCK_DV)
    m_split = o_split < num_splits
    m_dv = o_dv < HEAD_DIM_V
    b_lse = tl.load(
        split_lse_ptr + o_split.to(tl.int64) * stride_split_lse + i_head * stride_split_lse_head + i_tok,
        mask=m_split,
        other=float("-inf"),
    )  # [BS]
    m = tl.max(b_lse, 0)
    if HAS_SINK:
        m = tl.maximum(m, tl.load(sink_ptr + i_head).to(tl.float32))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    weight = tl.exp(b_lse - m_safe)  # [BS]
    denominator = tl.sum(weight, 0)
    if HAS_SINK:
        denominator += tl.exp(tl.load(sink_ptr + i_head).to(tl.float32) - m_safe)
    # Partial outputs in chunks of SPLITS_PER_STEP splits: all 64 x Dv at once would spill registers (MI300, Dv 256).
    b_acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for first in range(0, num_splits, SPLITS_PER_STEP):
        o_chunk = first + tl.arange(0, SPLITS_PER_STEP)
        b_lse_chunk = tl.load(
            split_lse_ptr + o_chunk.to(tl.int64) * stride_split_lse + i_head * stride_split_lse_head + i_tok,
            mask=o_chunk < num_splits,
            other=float("-inf"),
        )  # [SC]
        p_so = (
            split_out_ptr
            + o_chunk.to(tl.int64)[:, None] * stride_split_out
            + i_tok * stride_split_tok
            + i_head * stride_split_head
            + o_dv[None, :]
        )
        # Splits a short context left empty (lse -inf) wrote no partial output: skip reading them.
        m_used = b_lse_chunk > float("-inf")
        b_so = tl.load(p_so, mask=m_used[:, None] & m_dv[None, :], other=0.0)  # [SC, BDV]
        b_acc += tl.sum(b_so * tl.exp(b_lse_chunk - m_safe)[:, None], 0)
    safe_denominator = tl.where(denominator == 0.0, 1.0, denominator)
    b_o = b_acc / safe_denominator  # [BDV]
    if HAS_OUT_SCALE:
        b_o = b_o / tl.load(out_scale_ptr)
    if OUT_MAX > 0:
        b_o = tl.minimum(tl.maximum(b_o, -OUT_MAX), OUT_MAX)
    p_o = out_ptr + i_tok * stride_o_tok + i_head * stride_o_head + o_dv * stride_o_dim
    tl.store(p_o, b_o.to(out_ptr.dtype.element_ty), mask=m_dv)
    if RETURN_LSE:
        lse = tl.where(denominator == 0.0, float("-inf"), m_safe + tl.log(safe_denominator))
        tl.store(lse_ptr + i_head * stride_lse_head + i_tok, lse)


# Plain-Python twins of triton.cdiv / triton.next_power_of_2 for the launcher (host time per call: those are
# constexpr-function wrappers since triton 3.7, ~3 us a call)
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 0  # triton's: 0 for 0


def _next_pow2_at_least(value: int, floor: int) -> int:
    return max(_next_power_of_2(value), floor)


_TORCH_TO_TL = {
    torch.float16: tl.float16,
    torch.bfloat16: tl.bfloat16,
    torch.float32: tl.float32,
    torch.float8_e4m3fn: tl.float8e4nv,
    torch.float8_e5m2: tl.float8e5,
    torch.float8_e4m3fnuz: tl.float8e4b8,
    torch.float8_e5m2fnuz: tl.float8e5b16,
}


def _dot_dtypes(
    arch: str, q: torch.dtype, k: torch.dtype, v: torch.dtype, block_m: int
) -> tuple[torch.dtype, torch.dtype]:
    """dtypes the QK and PV dots of a tile of block_m rows run in."""

    def common(a: torch.dtype, b: torch.dtype) -> torch.dtype:
        if a == b and (not is_fp8(a) or native_fp8_dot(arch, a)):
            return a
        if torch.float32 in (a, b):
            return torch.float32
        sixteen = {a, b} - set(FP8_DTYPES)
        if len(sixteen) == 1:
            return sixteen.pop()  # fp8 with one 16-bit type: upcast the fp8 side
        if len(sixteen) == 2:
            return torch.float32  # fp16 with bf16
        return torch.float16  # two fp8 types (or one without native dots): fp16 holds both exactly

    qk = common(q, k)
    # An fp8 P@V rounds P to V's type first. Not where the dot would be fp16 anyway: Triton's dots of fewer than 64
    # rows are mma.sync on sm_90, fp16 with fp8 operands unpacked (SASS); V widens to fp16 exactly there.
    fp16_mma_only = arch == "hopper" and block_m < 64
    pv = (torch.float16 if fp16_mma_only else common(v, v)) if is_fp8(v) else v
    return qk, pv


# A bf16 q is scaled per row to at most this (a power of two) before it is cast to fp16 for a dot with fp8 K.
FP16_SAFE_MAX = 32768.0


def quantizes_q(arch: str, config: AttentionConfig, q: torch.dtype, k: torch.dtype) -> bool:
    """Whether a 16-bit q is rounded to K's fp8 type in the kernel (per-row scale) so that QK is a native fp8 dot.

    Opt-in (`AttentionConfig.fp8_q_for_fp8_kv`, e.g. TRITONFA_CONFIG='{"fp8_q_for_fp8_kv": true}'): it costs q's
    rounding error (3 mantissa bits for e4m3). The default runs such a QK dot in fp16, exactly.
    """
    return config.fp8_q_for_fp8_kv and q in (torch.float16, torch.bfloat16) and is_fp8(k) and native_fp8_dot(arch, k)


def keys_as_rows(arch: str, config: AttentionConfig, q: torch.dtype, k: torch.dtype) -> bool:
    """Whether a Hopper decode tile runs QK as K q^T, an fp8 wgmma over the keys (`decode_keys_as_rows`; its
    "tile" form, Hopper's default at head sizes that pad to 128: _decode_config).

    For q of K's fp8 type, or a 16-bit q with e4m3 K (q rounded per row into two e4m3 terms, or one with
    fp8_q_for_fp8_kv).
    """
    if not (
        config.decode_keys_as_rows and arch == "hopper" and config.block_m < 64 and config.block_n >= 64 and is_fp8(k)
    ):
        return False
    return native_fp8_dot(arch, k) and (q == k or (q in (torch.float16, torch.bfloat16) and k == torch.float8_e4m3fn))


def _decode_config(arch: str, q, k, v, block_d: int, element_bytes: int) -> AttentionConfig:
    """The decode tile. A config with decode_keys_as_rows="tile" hands an fp8-K call with a bf16 or fp8 q to the
    architecture's keys-as-rows tile for the head size where there is one and it covers the call, and keeps its own
    tile (the setting off) for the others: an fp16 q's two e4m3 terms would keep ~8 of its 11 significant bits, where
    the 16-row tile's fp16 dot is exact (a bf16 q's 8 bits fit the two terms)."""
    config = select_config(arch, block_d, 1, element_bytes)
    if config.decode_keys_as_rows != "tile":
        return config
    tile = select_keys_as_rows_config(arch, block_d)
    if (
        tile is not None
        and q.dtype != torch.float16
        and keys_as_rows(arch, tile, q.dtype, k.dtype)
        and _v_as_words(v, v.shape[-1])
    ):
        return tile
    return dataclasses.replace(config, decode_keys_as_rows=False)


def _q_fp8_terms(arch: str, config: AttentionConfig, q, k, v) -> int:
    """How many e4m3 terms a keys-as-rows tile splits a 16-bit q into, each a native fp8 QK dot: 2 (hi + the rest),
    1 with fp8_q_for_fp8_kv; 0 where the tile is not keys-as-rows or q is K's type already."""
    if q.dtype == k.dtype or not (keys_as_rows(arch, config, q.dtype, k.dtype) and _v_as_words(v, v.shape[-1])):
        return 0
    return 1 if config.fp8_q_for_fp8_kv else 2


def decode_q_fp8_terms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: str | None = None) -> int:
    """`_q_fp8_terms` of the decode tile plan_attention picks for these tensors (tests bound the lse error of the
    fp8 QK dots with it)."""
    arch = arch or detect_arch(q.device)
    block_d, block_dv, element_bytes = _tile_dims(q, k, v)
    config = _decode_config(arch, q, k, v, max(block_d, block_dv), element_bytes)
    if arch == "hopper" and config.decode_gluon and attention_hopper_decode.covers_tensors(q, k, v):
        # the Gluon decode (where it covers the call) splits a bf16 q into two e4m3 terms too; an e4m3 q is K's type
        return 2 if q.dtype != k.dtype else 0
    return _q_fp8_terms(arch, config, q, k, v)


def _tile_dims(q, k, v) -> tuple[int, int, int]:
    """(q's and v's head sizes padded to a power of two at least one dot's depth, the widest element size)."""
    dot_floor = 32 if any(is_fp8(t.dtype) for t in (q, k, v)) else 16
    return (
        _next_pow2_at_least(q.shape[-1], dot_floor),
        _next_pow2_at_least(v.shape[-1], dot_floor),
        max(t.element_size() for t in (q, k, v)),
    )


def _v_as_words(v: torch.Tensor, head_dim_v: int) -> bool:
    """Whether every row of e4m3 V can be read as 32-bit words (keys-as-rows decode tiles need it; other V keeps
    the default decode tile)."""
    if v.dtype != torch.float8_e4m3fn or v.stride(-1) != 1 or head_dim_v % 4:
        return False
    return v.data_ptr() % 4 == 0 and all(stride % 4 == 0 for stride in v.stride()[:-1])


def dot_precision(arch: str, qk_dtype: torch.dtype, pv_dtype: torch.dtype) -> str:
    """`input_precision` of the two dots: full fp32 ("ieee") for fp32 inputs, which the contract computes exactly.

    For 16-bit and fp8 operands the value changes nothing, but Triton still checks it against the target's list:
    AMD targets other than gfx942 (MI200, MI350, RDNA) accept no "tf32", so "ieee" there; elsewhere "tf32", the value
    measured on Hopper.
    """
    if torch.float32 in (qk_dtype, pv_dtype) or arch in ("cdna2", "cdna4", "rdna"):
        return "ieee"
    return "tf32"


@dataclasses.dataclass
class KernelLaunch:
    """One kernel launch, fully bound: what the launcher runs and what CI cross-compiles (one source for both)."""

    fn: Any
    grid: tuple[int, ...]
    args: tuple  # positional runtime arguments, in the kernel's order
    constexprs: dict[str, Any]
    options: dict[str, Any]  # num_warps, num_stages, waves_per_eu

    def __call__(self) -> None:
        launch(self.fn, self.grid, self.args, self.constexprs, self.options)


def attention_forward(*args, **kwargs) -> None:
    """Launch the forward kernel on validated arguments; writes `out` (and `lse` if given). See `plan_attention`;
    positional calls reuse the plan of an earlier call with the same geometry, and its compiled kernels
    (`plan_cache.run`)."""
    if kwargs:
        for planned in plan_attention(*args, **kwargs):
            planned()
        return
    plan_cache.run(plan_attention, args)


def compile_calls(calls: list[tuple]) -> None:
    """Compile, side by side, the kernel variants that these `attention_forward` calls (positional arguments) plan
    and that have not run yet; nothing runs. A warm-up of several calls (the vLLM backend's, one call per variant
    bucket) calls this first: its variants then compile at once instead of call after call (launch.compile_ahead)."""
    launch_module.compile_ahead([planned for args in calls for planned in plan_attention(*args)])


def plan_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    block_table: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    bias: torch.Tensor | None,
    s_aux: torch.Tensor | None,
    q_descale: torch.Tensor | None,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
    output_scale: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    num_splits: int = 0,
    arch: str | None = None,
) -> list[KernelLaunch]:
    """The launches that compute attention for validated arguments (buffers for split-KV are allocated here).

    window_left / window_right are -1 for unbounded (causal has been folded into window_right = 0).
    num_splits: KV splits per query tile of a decode-shaped batch (0 = chosen from the launch size, 1 = no split).
    arch: the architecture family to plan for (default: q's device's).

    A decode-shaped batch (max_seqlen_q <= DECODE_MAX_SEQLEN_Q) is one launch with the decode tiles. Any other batch
    of several sequences is two launches over the same arguments: prefill tiles for the sequences with more than
    DECODE_MAX_SEQLEN_Q queries, decode tiles for the others (a chunked-prefill step's decodes would otherwise
    each fill a whole prefill tile). Each launch skips the other's sequences on the device: no lengths are read on
    the host.
    """
    arch = arch or detect_arch(q.device)
    num_seqs = cu_seqlens_q.shape[0] - 1
    block_d, block_dv, element_bytes = _tile_dims(q, k, v)
    plan = functools.partial(
        _plan_launch, arch, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
        bias, s_aux, q_descale, k_descale, v_descale, output_scale, max_seqlen_k, softmax_scale, window_left,
        window_right, softcap, block_d, block_dv,
    )  # fmt: skip
    decode_config = _decode_config(arch, q, k, v, max(block_d, block_dv), element_bytes)
    if max_seqlen_q <= DECODE_MAX_SEQLEN_Q:
        fast_decode = _plan_hopper_decode(
            arch, decode_config, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
            bias, s_aux, q_descale, k_descale, v_descale, output_scale, max_seqlen_q, max_seqlen_k, softmax_scale,
            window_left, window_right, softcap, num_splits,
        )  # fmt: skip
        if fast_decode is not None:
            return fast_decode
        return plan(decode_config, seq_filter=0, num_splits=num_splits)
    prefill_config = select_config(arch, max(block_d, block_dv), max_seqlen_q, element_bytes)
    # Gluon does not run in Triton's interpreter (CPU tensors); meta tensors: CI's cross-compile plans it
    if arch == "hopper" and prefill_config.warp_specialized and q.device.type in ("cuda", "meta"):
        features = dict(
            alibi=alibi_slopes is not None, bias=bias is not None,
            sinks=s_aux is not None, descale=any(d is not None for d in (q_descale, k_descale, v_descale)),
            output_scale=output_scale is not None, softcap=softcap > 0.0, window=window_left >= 0 or window_right > 0,
        )  # fmt: skip
        quantize_q = quantizes_q(arch, prefill_config, q.dtype, k.dtype)
        widen_fp8 = (prefill_config.ws_fp8 and prefill_config.ws_fp8_widen_copy and not quantize_q
                     and k.dtype in OCP_FP8_DTYPES)  # fmt: skip
        gather_pages = prefill_config.ws_paged_gather_copy and block_table is not None and k.dtype == q.dtype
        if widen_fp8 or gather_pages:
            widened = _plan_widened_hopper_prefill(
                q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_k, softmax_scale,
                window_right == 0, prefill_config, q_descale, k_descale, v_descale, features,
            )  # fmt: skip
            if widened is not None:
                if num_seqs == 1:
                    return widened
                return _overlapped(widened, plan(decode_config, seq_filter=2, num_splits=1), prefill_config)
        if attention_hopper.supports(q, k, v, out, block_table is not None, features, prefill_config.ws_fp8,
                                     quantize_q, prefill_config.ws_fp8_paged, prefill_config.ws_pad_head_dim,
                                     prefill_config.ws_fp8_k16):  # fmt: skip
            fast = functools.partial(
                _plan_hopper_prefill, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                softmax_scale, window_right == 0, prefill_config, q_descale, k_descale, v_descale, quantize_q,
            )  # fmt: skip
            if num_seqs == 1:
                return fast(seq_filter=0)
            return _overlapped(fast(seq_filter=1), plan(decode_config, seq_filter=2, num_splits=1), prefill_config)
    if num_seqs == 1:
        return plan(prefill_config, seq_filter=0, num_splits=1)
    return plan(prefill_config, seq_filter=1, num_splits=1) + plan(decode_config, seq_filter=2, num_splits=1)


def _overlapped(prefill: list[KernelLaunch], decode: list[KernelLaunch], config: AttentionConfig) -> list[KernelLaunch]:
    """A mixed batch's Gluon prefill launch and its decode launch, the decode as a programmatic dependent of the
    prefill where `config.mixed_pdl` asks for it: the two touch disjoint rows, so the decode programs may take each
    SM the prefill's persistent programs leave, instead of waiting for the last of them (see PDL_WAIT)."""
    if not (config.mixed_pdl and len(decode) == 1 and decode[0].fn is attention_fwd_kernel):
        return prefill + decode
    *before, primary = prefill
    (secondary,) = decode
    primary = dataclasses.replace(primary, constexprs={**primary.constexprs, "LAUNCH_DEPENDENTS": True})
    secondary = dataclasses.replace(secondary, constexprs={**secondary.constexprs, "PDL_WAIT": True},
                                    options={**secondary.options, "launch_pdl": True})  # fmt: skip
    return [*before, primary, secondary]


# The most a widened copy of fp8 K/V may take (both tensors); larger calls widen inside the kernel (ws_fp8_k16).
WIDEN_COPY_MAX_BYTES = 1 << 30


def _plan_widened_hopper_prefill(
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_k, softmax_scale, causal,
    config: AttentionConfig, q_descale, k_descale, v_descale, features: dict,
) -> list[KernelLaunch] | None:  # fmt: skip
    """A 16-bit q with fp8 K/V (config `ws_fp8_widen_copy`), or with a paged cache of q's type (config
    `ws_paged_gather_copy`): K and V widened to q's type / gathered by one launch (`widen_kv`), then the 16-bit
    Gluon prefill over the contiguous copies with the descales applied to the scores and O. None where that does
    not apply (not such a call, the copy would be too large, or the Gluon prefill does not cover the call)."""
    paged = block_table is not None
    widenable = (
        q.dtype in (torch.float16, torch.bfloat16) and k.dtype == v.dtype
        and (k.dtype in OCP_FP8_DTYPES or (paged and k.dtype == q.dtype))
        and k.shape[-1] == v.shape[-1] and k.stride(-1) == 1 and v.stride(-1) == 1
        and not any(on for name, on in features.items() if name != "descale")
    )  # fmt: skip
    if not widenable:
        return None
    num_seqs = cu_seqlens_q.shape[0] - 1
    rows = widen_kv.rows_needed(k, num_seqs, max_seqlen_k, paged)
    if rows == 0 or 2 * rows * k.shape[-2] * k.shape[-1] * q.element_size() > WIDEN_COPY_MAX_BYTES:
        return None
    widen, k16, v16, cu_seqlens_k16, seqused_k16 = widen_kv.plan_widen_kv(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, max_seqlen_k,
        DECODE_MAX_SEQLEN_Q if num_seqs > 1 else 0,
    )  # fmt: skip
    if not attention_hopper.supports(q, k16, v16, out, False, features, pad_head_dim=config.ws_pad_head_dim):
        return None
    fast = _plan_hopper_prefill(
        q, k16, v16, out, lse, cu_seqlens_q, cu_seqlens_k16, seqused_k16, None, softmax_scale, causal, config,
        q_descale, k_descale, v_descale, False, seq_filter=0 if num_seqs == 1 else 1,
    )  # fmt: skip
    return [KernelLaunch(*widen), *fast]


def _plan_hopper_decode(
    arch, config: AttentionConfig, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
    alibi_slopes, bias, s_aux, q_descale, k_descale, v_descale, output_scale, max_seqlen_q, max_seqlen_k,
    softmax_scale, window_left, window_right, softcap, num_splits,
) -> list[KernelLaunch] | None:  # fmt: skip
    """The Gluon fp8-KV decode launch (config `decode_gluon`) where it covers the call, else None. A call the
    portable kernel would split (few sequences x KV heads, long contexts) stays there, unless decode_gluon_split:
    then the Gluon launch writes per-split partial results and combine_splits_kernel merges them."""
    if not (arch == "hopper" and config.decode_gluon and q.device.type in ("cuda", "meta")):
        return None
    features = dict(
        alibi=alibi_slopes is not None, bias=bias is not None, sinks=s_aux is not None,
        q_descale=q_descale is not None, k_descale=k_descale is not None, v_descale=v_descale is not None,
        output_scale=output_scale is not None, softcap=softcap > 0.0, window=window_left >= 0 or window_right > 0,
    )  # fmt: skip
    page_size = k.shape[1] if block_table is not None else 0
    if not attention_hopper_decode.supports(q, k, v, out, block_table, max_seqlen_q, features, page_size):
        return None
    if is_fp8(q.dtype) and not config.decode_gluon_fp8_q:
        return None
    num_seqs, num_kv_heads = cu_seqlens_q.shape[0] - 1, k.shape[-2]
    block_n = attention_hopper_decode.BLOCK_N
    splits = num_splits or _auto_num_splits(q.device, num_seqs * num_kv_heads, max_seqlen_k, block_n)
    if splits != 1 and not config.decode_gluon_split:
        return None
    split_out, split_lse = _split_buffers(splits, q, v) if splits > 1 else (None, None)
    launches = [
        KernelLaunch(
            *attention_hopper_decode.plan_hopper_decode(
                q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, softmax_scale,
                window_right == 0, q_descale, k_descale, v_descale, config.decode_gluon_stages,
                split_out, split_lse, MIN_BLOCKS_PER_SPLIT, config.decode_gluon_v16_smem,
            )
        )
    ]  # fmt: skip
    if split_out is not None:
        launches.append(_combine_launch(split_out, split_lse, out, lse, s_aux, output_scale, cu_seqlens_q, q))
    return launches


def _plan_hopper_prefill(
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, softmax_scale, causal,
    config: AttentionConfig, q_descale, k_descale, v_descale, quantize_q, seq_filter,
) -> list[KernelLaunch]:  # fmt: skip
    """The Gluon prefill launch, after fp8 V's key-major copy where it reads one."""
    v16_contiguous = config.ws_fp8_v16_contiguous is True or (config.ws_fp8_v16_contiguous == "causal" and causal)
    # one program per SM, two at D 64 (their shared memory fits twice), where the persistent consumers fit
    programs = (
        _multiprocessor_count(q.device) * (2 if q.shape[-1] <= 64 else 1)
        if config.ws_persistent
        and _persistent_fits(q.shape[-1], is_fp8(k.dtype), block_table is not None, causal, config,
                             widened_k=attention_hopper.widens_k(q.dtype, k.dtype, quantize_q),
                             v16_contiguous=v16_contiguous)
        else 0
    )  # fmt: skip
    # fp8 q/k/v non-causal, contiguous, key-major V, flat grid: three consumers, P in shared memory, serial steps
    # with the two-level P@V (config `ws_fp8_three_consumers`)
    fp8_three = (config.ws_fp8_three_consumers and is_fp8(q.dtype) and is_fp8(k.dtype) and not causal
                 and block_table is None and not v16_contiguous and programs == 0 and q.shape[-1] <= 128)  # fmt: skip
    copies = []  # fp8 V's key-major copy, where the launch reads one
    fn, grid, args, constexprs, options = attention_hopper.plan_hopper_prefill(
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, softmax_scale, causal, seq_filter,
        DECODE_MAX_SEQLEN_Q, config.ws_pingpong, q_descale, k_descale, v_descale, quantize_q,
        config.ws_fp8_two_level, config.ws_stages, config.ws_paged_tma, programs,
        config.ws_block_n,
        config.ws_fp8_paged_v16,
        v16_contiguous,
        config.ws_fp8_p_per_tile,
        config.ws_early_k_release,
        config.ws_lean_softmax,
        config.ws_fp8_p_one_rounding,
        _dynamic_grid(config, causal, block_table is not None),
        config.ws_dynamic_tail,
        config.ws_uniform_ticket is True or (config.ws_uniform_ticket == "paged" and block_table is not None),
        config.ws_producer_regs,
        config.ws_fp8_row_sum_mma,
        3 if fp8_three else config.ws_consumers,
        config.ws_p_smem or fp8_three,
        config.ws_softmax_fence,
        config.ws_serial_pv or fp8_three,
        config.ws_mask_ptx,
        config.ws_two_level_fma,
        config.v_copy_kernel,
        copies,
    )  # fmt: skip
    return [*(KernelLaunch(*c) for c in copies), KernelLaunch(fn, grid, args, constexprs, options)]


def _dynamic_grid(config: AttentionConfig, causal: bool, paged: bool) -> bool:
    """Whether a persistent Gluon prefill takes tiles from the counter (configs `ws_dynamic`, `ws_dynamic_paged`)."""
    wanted = config.ws_dynamic is True or (config.ws_dynamic == "causal" and causal)
    return wanted and (config.ws_dynamic_paged or not paged)


def _persistent_fits(head_dim: int, fp8: bool, paged: bool, causal: bool, config: AttentionConfig,
                     widened_k: bool = False, v16_contiguous: bool = False) -> bool:  # fmt: skip
    """Whether the persistent grid's consumers keep their loops out of local memory (sm_90 SASS): not at D 256; fp8
    K/V at D 128 only with 64-key blocks or with gathered V widened to fp16 (the two-level fp8 P@V with 128-key
    blocks spills ~220 instructions there, 0 with either; widened_k: K and V widened for a 16-bit q). The 128-key
    spills come from the TMA producer's 56 registers; with 24 (`ws_producer_regs`) they are gone, and the persistent
    fp8 non-causal kernel still ran 7.7% slower than the flat one (H100, session 32): it stays flat."""
    if head_dim > 128:
        return False
    if widened_k:  # paged ran slower there (H200, session 10, b8x2048 causal: 1.174 persistent, 1.104 ms flat)
        return not paged
    if not fp8 or head_dim <= 64:
        return True
    if config.ws_fp8_paged_v16 if paged else v16_contiguous:  # V widened: 0 spills
        return True
    block_n = config.ws_block_n or attention_hopper.tiles_for(128, contiguous_fp8_causal=causal and not paged)[0]
    return block_n == 64


def _plan_launch(
    arch, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, bias, s_aux,
    q_descale, k_descale, v_descale, output_scale, max_seqlen_k, softmax_scale, window_left, window_right, softcap,
    block_d, block_dv, config: AttentionConfig, seq_filter: int, num_splits: int,
) -> list[KernelLaunch]:  # fmt: skip
    """One launch of attention_fwd_kernel (+ combine_splits_kernel when the KV range is split).

    seq_filter 2 (decode sequences of a mixed batch) maps DECODE_MAX_SEQLEN_Q // tokens-per-tile tiles to every
    sequence, so the grid does not grow with the prefill tokens of the batch.
    """
    num_seqs = cu_seqlens_q.shape[0] - 1
    total_q, num_q_heads, head_dim = q.shape
    paged = block_table is not None
    num_kv_heads = k.shape[-2]
    head_dim_v = v.shape[-1]
    group = num_q_heads // num_kv_heads

    h_pack = min(group, config.block_m) if config.pack_gqa else 1
    head_chunks = _cdiv(group, h_pack)
    tokens_per_tile = config.block_m // h_pack
    if seq_filter == 2:
        tiles_per_seq = _cdiv(DECODE_MAX_SEQLEN_Q, tokens_per_tile)
        grid: tuple[int, ...] = (num_seqs * tiles_per_seq, num_kv_heads * head_chunks)
    else:
        tiles_per_seq = 0
        grid = (total_q // tokens_per_tile + num_seqs, num_kv_heads * head_chunks)
    if num_splits == 0:
        num_splits = _auto_num_splits(q.device, num_seqs * grid[1], max_seqlen_k, config.block_n)
    split_kv = num_splits > 1
    if split_kv:
        grid = (*grid, num_splits)
        split_out, split_lse = _split_buffers(num_splits, q, v)
    else:
        split_out = split_lse = q  # never dereferenced (SPLIT_KV is off)

    keys_rows = keys_as_rows(arch, config, q.dtype, k.dtype) and _v_as_words(v, head_dim_v)
    q_split = _q_fp8_terms(arch, config, q, k, v) == 2
    quantize_q = quantizes_q(arch, config, q.dtype, k.dtype) or (keys_rows and q.dtype != k.dtype)
    scale_q = quantize_q or (q.dtype == torch.bfloat16 and is_fp8(k.dtype))
    q_compute = k.dtype if quantize_q else (torch.float16 if scale_q else q.dtype)
    qk_dtype, pv_dtype = _dot_dtypes(arch, q_compute, k.dtype, v.dtype, config.block_m)
    out_max = fp8_max(out.dtype) if is_fp8(out.dtype) else 0.0
    unbounded = 1 << 30  # farther than any position, so -1 windows need no special case in the kernel

    # Decode tiles read each V row once: a transposed copy of V would cost more than it saves.
    v_key_major = _wants_key_major_v(arch, v, paged) and config.block_m >= 64 and seq_filter != 2
    copies = []
    v_storage = plan_key_major_storage(v, False, config.v_copy_kernel, copies) if v_key_major else None
    v_arg = v  # the V pointer the kernel gets (its strides come from v)
    if v_storage is not None:
        v = v_storage[:, :, : v.shape[0]].permute(2, 0, 1)  # the same [total_k, Hk, Dv] tensor, keys contiguous
        # the storage itself, at the view's address: under inference_mode a view has no _base, and the plan cache
        # could not tell it is the scratch storage's (the plan would be made again at every call)
        v_arg = v_storage
    k_desc, v_desc = _tensor_descriptors(config, arch, k, v, v_storage, paged, config.block_n, block_d, block_dv)
    use_tma = k_desc is not None
    v_tma = v_desc is not None
    if not use_tma:
        k_desc = k  # never dereferenced (USE_TMA is off)
    if not v_tma:
        v_desc = v_arg  # never dereferenced (V_TMA is off)
    if paged:
        k_strides = (k.stride(0), k.stride(1), k.stride(2), k.stride(3))
        v_strides = (v.stride(0), v.stride(1), v.stride(2), v.stride(3))
        block_size = k.shape[1]
        num_blocks = k.shape[0]
        max_blocks = block_table.shape[1]
        total_k = 0
    else:
        k_strides = (0, k.stride(0), k.stride(1), k.stride(2))
        v_strides = (0, v.stride(0), v.stride(1), v.stride(2))
        block_size = num_blocks = max_blocks = 1
        total_k = k.shape[0]
    if bias is not None:
        bias_strides = tuple(bias.stride(i) if bias.shape[i] > 1 else 0 for i in range(4))
        bias_len_q, bias_len_k = bias.shape[2], bias.shape[3]
    else:
        bias_strides = (0, 0, 0, 0)
        bias_len_q = bias_len_k = 0

    args = (
        q, k, v_arg, k_desc, v_desc, out,
        lse if lse is not None else q,
        cu_seqlens_q,
        cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q,
        seqused_k if seqused_k is not None else cu_seqlens_q,
        block_table if block_table is not None else cu_seqlens_q,
        alibi_slopes if alibi_slopes is not None else q,
        bias if bias is not None else q,
        s_aux if s_aux is not None else q,
        q_descale if q_descale is not None else q,
        k_descale if k_descale is not None else q,
        v_descale if v_descale is not None else q,
        output_scale if output_scale is not None else q,
        split_out,
        split_lse,
        num_seqs,
        total_q,
        total_k,
        num_blocks,
        max_blocks,
        float(softmax_scale),
        float(softcap),
        window_left if window_left >= 0 else unbounded,
        window_right if window_right >= 0 else unbounded,
        bias_len_q,
        bias_len_k,
        q.stride(0), q.stride(1), q.stride(2),
        *k_strides,
        *v_strides,
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0) if lse is not None else 0,
        block_table.stride(0) if block_table is not None else 0,
        alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0,
        *bias_strides,
        *descale_strides(q_descale),
        *descale_strides(k_descale),
        *descale_strides(v_descale),
        *(split_out.stride()[:3] if split_kv else (0, 0, 0)),
        *(split_lse.stride()[:2] if split_kv else (0, 0)),
    )  # fmt: skip
    constexprs = dict(
        GROUP=group,
        H_PACK=h_pack,
        HEAD_CHUNKS=head_chunks,
        HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        PAGED=paged,
        PAGE_SIZE=block_size,
        CACHE_OFFSETS_32=paged and max(_max_offset(k), _max_offset(v)) < CACHE_OFFSETS_32_LIMIT,
        USE_TMA=use_tma,
        V_KEY_MAJOR=v_key_major,
        V_TMA=v_tma,
        K_ROWS=config.k_rows and not use_tma,
        PREFETCH_BLOCK_IDS=paged
        and not use_tma
        and (
            # prefill tiles, where a page holds 4 keys or more: with pages of 2 keys ptxas 12.8 (triton 3.6's) built
            # a launch that faults on sm_90 (D 80 / Dv 112, ALiBi, 8 warps; session 29: the same PTX through CUDA
            # 13.0's ptxas, or without the look-ahead, runs clean)
            (config.block_m >= 64 and block_size >= 4)
            or config.decode_prefetch_ids is True
            or (config.decode_prefetch_ids == "fp8" and k.element_size() == 1)
        ),
        KEYS_AS_ROWS=keys_rows,
        Q_SPLIT=q_split,
        WIDEN_ASM=not triton.knobs.runtime.interpret,  # the interpreter runs no PTX
        HAS_SEQUSED=seqused_k is not None,
        USE_WINDOW=window_left >= 0 or window_right >= 0,
        HAS_SOFTCAP=softcap > 0.0,
        HAS_ALIBI=alibi_slopes is not None,
        HAS_BIAS=bias is not None,
        HAS_SINK=s_aux is not None,
        HAS_Q_DESCALE=q_descale is not None,
        HAS_K_DESCALE=k_descale is not None,
        HAS_V_DESCALE=v_descale is not None,
        HAS_OUT_SCALE=output_scale is not None,
        RETURN_LSE=lse is not None,
        SCALE_Q=scale_q,
        QK_DTYPE=_TORCH_TO_TL[qk_dtype],
        PV_DTYPE=_TORCH_TO_TL[pv_dtype],
        V_IS_FP8=is_fp8(pv_dtype),  # P@V in fp8: P rounded through V's type, each block's row max at P_TILE_MAX
        P_TILE_MAX=fp8_max(v.dtype) if is_fp8(pv_dtype) else 1.0,
        P_TILE_MAX_LOG2=math.log2(fp8_max(v.dtype)) if is_fp8(pv_dtype) else 0.0,
        Q_MAX=(fp8_max(k.dtype) if quantize_q else FP16_SAFE_MAX) if scale_q else 0.0,
        OUT_MAX=out_max,
        DOT_PRECISION=dot_precision(arch, qk_dtype, pv_dtype),
        SPLIT_KV=split_kv,
        MIN_BLOCKS_PER_SPLIT=MIN_BLOCKS_PER_SPLIT,
        SEQ_FILTER=seq_filter,
        TILES_PER_SEQ=tiles_per_seq,
        DECODE_MAX_Q=DECODE_MAX_SEQLEN_Q,
        PDL_WAIT=False,  # set by _overlapped
    )  # fmt: skip
    launches = [*(KernelLaunch(*c) for c in copies),
                KernelLaunch(attention_fwd_kernel, grid, args, constexprs, config.launch_options(arch))]  # fmt: skip
    if split_kv:
        launches.append(_combine_launch(split_out, split_lse, out, lse, s_aux, output_scale, cu_seqlens_q, q))
    return launches


def _split_buffers(num_splits: int, q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial outputs [num_splits, total_q, Hq, Dv] and lse [num_splits, Hq, total_q] (fp32) of a split-KV launch."""
    total_q, num_q_heads, head_dim_v = q.shape[0], q.shape[1], v.shape[-1]
    # scratch: a call served from the plan cache gets buffers of its own (see plan_cache.scratch)
    split_out = plan_cache.scratch((num_splits, total_q, num_q_heads, head_dim_v), torch.float32, q.device)
    # -inf: a row no split writes (inconsistent cu_seqlens_q) combines to 0 instead of uninitialized memory
    split_lse = plan_cache.scratch((num_splits, num_q_heads, total_q), torch.float32, q.device, fill=float("-inf"))
    return split_out, split_lse


def _combine_launch(split_out, split_lse, out, lse, s_aux, output_scale, cu_seqlens_q, q) -> KernelLaunch:
    """combine_splits_kernel over a split-KV launch's partial results, into out (and lse)."""
    num_splits, total_q, num_q_heads, head_dim_v = split_out.shape
    args = (
        split_out, split_lse, out,
        lse if lse is not None else q,
        s_aux if s_aux is not None else q,
        output_scale if output_scale is not None else q,
        cu_seqlens_q,
        cu_seqlens_q.shape[0] - 1,
        num_splits,
        split_out.stride(0), split_out.stride(1), split_out.stride(2),
        split_lse.stride(0), split_lse.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0) if lse is not None else 0,
    )  # fmt: skip
    constexprs = dict(
        HEAD_DIM_V=head_dim_v,
        BLOCK_DV=_next_power_of_2(head_dim_v),
        BLOCK_SPLITS=MAX_SPLITS,
        HAS_SINK=s_aux is not None,
        HAS_OUT_SCALE=output_scale is not None,
        RETURN_LSE=lse is not None,
        OUT_MAX=fp8_max(out.dtype) if is_fp8(out.dtype) else 0.0,
        SPLITS_PER_STEP=8,
    )
    options = {"num_warps": 4, "num_stages": 1}
    return KernelLaunch(combine_splits_kernel, (total_q, num_q_heads), args, constexprs, options)


def _tensor_descriptors(config, arch, k, v, v_storage, paged, block_n, block_d, block_dv):
    """(k, v) tensor descriptors (TMA on Hopper), None for each read through pointers.

    K and V are described as 2-D [total_k, Hk * D] so one descriptor serves every head; that needs the head size
    to be a power of two (a padded tile would read the next head's columns) and 16-byte aligned rows. A paged cache
    qualifies when its pages hold whole key blocks (block size a multiple of BLOCK_N) and are dense.
    """
    if not config.tma or arch not in ("hopper", "blackwell", "interpreter") or k.shape[0] == 0:
        return None, None
    num_kv_heads, head_dim = k.shape[-2:]
    head_dim_v = v.shape[-1]
    if head_dim != block_d or head_dim_v != block_dv:
        return None, None
    row_dim = 1 if paged else 0  # the dimension that steps one key

    def rows(t: torch.Tensor) -> int:
        """Rows of Hk * D from t's first key to its last: a paged cache [num_blocks, page, Hk, D] whose block stride
        is a whole number of rows (K and V of a block may sit side by side) is such a run of rows."""
        if not paged:
            return t.shape[0]
        rows_per_block = t.stride(0) // t.stride(1)
        return (t.shape[0] - 1) * rows_per_block + t.shape[1]

    def rows_ok(t: torch.Tensor) -> bool:
        return (
            t.stride(-1) == 1
            and t.stride(-2) == t.shape[-1]
            and (t.stride(row_dim) * t.element_size()) % 16 == 0
            and t.data_ptr() % 16 == 0
            and (not paged or (t.stride(0) % t.stride(1) == 0 and t.stride(0) >= t.shape[1] * t.stride(1)))
            and rows(t) < 2**31
        )

    # A key block must never straddle two pages: the page holds whole key blocks.
    if (paged and k.shape[1] % block_n) or not rows_ok(k) or (v_storage is None and not rows_ok(v)):
        return None, None
    k_desc = TensorDescriptor(k, [rows(k), num_kv_heads * head_dim], [k.stride(row_dim), 1], [block_n, block_d])
    if v_storage is None:
        v_desc = TensorDescriptor(v, [rows(v), num_kv_heads * head_dim_v], [v.stride(row_dim), 1], [block_n, block_dv])
    elif config.tma_key_major_v:
        # storage [Hk, Dv, keys padded to 16] as [Hk * Dv, keys]: a tile's first key is any key (sequences start
        # anywhere), which a descriptor allows and a 16-byte cp.async does not (pointer loads of it are not pipelined)
        heads_dims, padded = num_kv_heads * head_dim_v, v_storage.shape[-1]
        v_desc = TensorDescriptor(v_storage, [heads_dims, padded], [padded, 1], [block_dv, block_n])
    else:
        v_desc = None  # key-major V through pointers
    return k_desc, v_desc


# Paged caches whose element offsets all stay below this take 32-bit address math (sm_90 paged prefill loop: 536 ->
# 441 instructions; the contiguous loop has 384). A cache past it (> 2^31 elements per view) compiles a 64-bit variant.
CACHE_OFFSETS_32_LIMIT = 2**31


def _max_offset(t: torch.Tensor) -> int:
    """The largest element offset from t's first element to any of its elements."""
    return sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)


def _wants_key_major_v(arch: str, v: torch.Tensor, paged: bool) -> bool:
    """fp8 wgmma on Hopper reads both operands K-major; for the PV dot that means V with keys contiguous.

    Row-major V makes Triton transpose every V tile through shared memory inside the loop; one copy of V per call
    is cheaper for prefill. `TRITONFA_FP8_V_TRANSPOSE=0` turns it off (for measurements).
    """
    if os.environ.get("TRITONFA_FP8_V_TRANSPOSE", "1") == "0":
        return False
    return is_fp8(v.dtype) and not paged and arch in ("hopper", "blackwell") and v.stride(0) != 1


# Each split of a split-KV launch covers at least this many key blocks (else the combine costs more than it saves).
MIN_BLOCKS_PER_SPLIT = 4


def _auto_num_splits(device: torch.device, programs: int, max_seqlen_k: int, block_n: int) -> int:
    """KV splits for a decode-shaped launch of `programs` (sequence, head-chunk) pairs: enough to fill the GPU twice,
    but none that max_seqlen_k says no sequence can use (each split covers at least MIN_BLOCKS_PER_SPLIT blocks).

    Within that cap the kernel sizes the splits a sequence really uses from its KV length on the device, so a CUDA
    graph captured with a large max_seqlen_k replays well at any shorter length. A power of two.
    """
    target_programs = 2 * _multiprocessor_count(device)
    usable = _cdiv(max(max_seqlen_k, 0), MIN_BLOCKS_PER_SPLIT * block_n)
    splits = min(_cdiv(target_programs, max(programs, 1)), MAX_SPLITS, usable)
    return _next_power_of_2(splits) if splits > 1 else 1


@functools.cache
def _multiprocessor_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: small, so CPU tests exercise the split path
    return torch.cuda.get_device_properties(device).multi_processor_count
