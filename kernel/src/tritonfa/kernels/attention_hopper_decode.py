"""Hopper fast path for fp8-KV paged decode in Gluon: a producer warp keeps a ring of K/V blocks in flight.

Why: the portable keys-as-rows tile (attention.py) issues a block's copies at the end of the previous iteration and
waits for them at the top of the next, so inside a program nothing overlaps a block's loads (ncu, H100: the K/V wait
is 46% of its stall cycles, DRAM 73%); holding the next block in registers instead cost occupancy (session 22). Here
the copies live in shared memory: a 1-warp producer issues TMA boxes (one per page run) for up to STAGES blocks
ahead, whatever the consumer is doing.

Scope (`supports`): a bf16 q, or an e4m3 q with its descale (vLLM quantizes q for an fp8 cache), e4m3 K/V in
vLLM's paged layout that `paged_tma_view` describes, D 128 for q, K and V, pages of >= 16 keys, decode rows (q-len x
group <= 16 per sequence), causal (bottom-right) or not, optional K/V descales, optional lse; no window, softcap,
ALiBi, bias, sinks or output scale; split-KV partial results for the combine kernel (`decode_gluon_split`, on for
Hopper D 128). Everything else stays on the portable kernel, which is also this kernel's CPU/ROCm twin (Gluon does
not run in Triton's interpreter).

Per program (one sequence x one KV head; the group's q heads x q-len are the 16 rows):
- producer warp: page ids one block ahead, then per 64-key block the K and V boxes of its pages into ring slot
  j % STAGES, each slot's ready barrier armed with its byte count; waits for a slot the consumer handed back;
- consumer warpgroup: a bf16 q split into two e4m3 terms (hi + the rest: a bf16 q exactly), per row scaled by a
  power of two (an e4m3 q is one term as it is); S^T = K q^T as one fp8 wgmma per term (the keys are the MMA's 64
  rows, K read from the slot as stored); the softmax over the keys; P into shared memory as fp16; V widened fp8 ->
  fp16 in registers and transposed into the A operand of O^T += V^T P^T (a 16-bit wgmma); the slot handed back once
  V is read. Or (V16_SMEM, `decode_gluon_v16_smem`: on for Hopper D 128) V widened into the stage's own 16 KB once
  K is consumed, P @ V reading it from shared memory, the slot handed back after P @ V.
"""

from __future__ import annotations

import functools

import torch
import triton

from tritonfa.fp8 import descale_strides
from tritonfa.kernels import attention_hopper

HAS_GLUON = attention_hopper.HAS_GLUON
if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    from tritonfa.kernels.attention_hopper import _page_block_id, _page_boxes, _thread_barrier

FP8_E4M3 = getattr(torch, "float8_e4m3fn", None)
BLOCK_M = 16  # rows: the group's q heads x q-len (the N side of every wgmma)
BLOCK_N = 64  # keys per block (the M side of the QK wgmma)
HEAD_DIM = 128
NUM_WARPS = 4  # the consumer warpgroup; the producer is one more warp
LAUNCH_REGS = 64


def covers_tensors(q, k, v) -> bool:
    """The q / K / V types and head size this kernel computes: a bf16 q (split into two e4m3 terms) or an e4m3 q,
    e4m3 K and V, D 128 (the test oracle bounds the fp8 QK error from this)."""
    return (
        FP8_E4M3 is not None
        and q.dtype in (torch.bfloat16, FP8_E4M3)
        and k.dtype == FP8_E4M3
        and v.dtype == FP8_E4M3
        and q.shape[-1] == k.shape[-1] == v.shape[-1] == HEAD_DIM
    )


def supports(q, k, v, out, block_table, max_seqlen_q: int, features: dict, page_size: int) -> bool:
    """Whether this kernel covers the call (see the module docstring); the launcher falls back otherwise."""
    num_q_heads, num_kv_heads = q.shape[1], k.shape[2]
    return (
        HAS_GLUON
        and block_table is not None
        and block_table.shape[1] > 0
        and covers_tensors(q, k, v)
        and out.shape[-1] == HEAD_DIM
        and out.dtype in (torch.float16, torch.bfloat16)
        and q.stride(-1) == 1
        and out.stride(-1) == 1
        and page_size >= 16
        and (page_size % BLOCK_N == 0 or BLOCK_N % page_size == 0)
        and num_q_heads % num_kv_heads == 0
        and max(max_seqlen_q, 1) * (num_q_heads // num_kv_heads) <= BLOCK_M
        and not any(on for name, on in features.items() if name not in ("q_descale", "k_descale", "v_descale"))
        and attention_hopper.paged_tma_view(k) is not None
        and attention_hopper.paged_tma_view(v) is not None
    )


if HAS_GLUON:
    from triton.language.core import builtin

    @builtin
    def _reinterpret(desc, dtype, shape, layout, _semantic=None):
        # a shared memory view as another type and shape: triton 3.6 spells it `_reinterpret`, later ones `reinterpret`
        method = getattr(desc, "reinterpret", None) or desc._reinterpret
        return method(dtype, shape, layout, _semantic=_semantic)

    LOG2E = gl.constexpr(1.4426950408889634)
    E4M3_MAX = gl.constexpr(448.0)
    PRODUCER_REGS = gl.constexpr(24)  # setmaxnreg of the producer warp: ids and box coordinates

    @gluon.jit
    def _decode_producer(k_desc, v_desc, kv_bufs, ready, empty, block_table_ptr, stride_bt_seq,
                         num_cache_blocks, max_blocks, seqused_k_ptr, cu_seqlens_k_ptr, k_rows_per_block,
                         k_rows_per_head, k_cols_per_head, v_rows_per_block, v_rows_per_head, v_cols_per_head,
                         PAGE_SIZE: gl.constexpr, HAS_SEQUSED: gl.constexpr, SPLIT_KV: gl.constexpr,
                         MIN_BLOCKS_PER_SPLIT: gl.constexpr):  # fmt: skip
        STAGES: gl.constexpr = kv_bufs.type.shape[0] // 2
        BLOCK_N: gl.constexpr = kv_bufs.type.shape[1]
        CHUNK: gl.constexpr = k_desc.block_type.shape[0]  # keys per box: min(PAGE_SIZE, BLOCK_N)
        CHUNKS: gl.constexpr = BLOCK_N // CHUNK
        seq = gl.program_id(0)
        kv_head = gl.program_id(1)
        seq_k_len = _seq_k_len(seq, seqused_k_ptr, cu_seqlens_k_ptr, max_blocks, PAGE_SIZE, HAS_SEQUSED)
        block_lo, block_hi = _split_blocks(gl.cdiv(seq_k_len, BLOCK_N), SPLIT_KV, MIN_BLOCKS_PER_SPLIT)
        table_row = block_table_ptr + seq.to(gl.int64) * stride_bt_seq
        ids_layout: gl.constexpr = gl.BlockedLayout([CHUNKS], [32], [1], [0])
        o_chunk = gl.arange(0, CHUNKS, layout=ids_layout)
        # block j + 1's page ids load while block j's boxes are issued
        next_ids = _page_block_id(table_row, (block_lo * BLOCK_N + o_chunk * CHUNK) // PAGE_SIZE, max_blocks,
                                  num_cache_blocks)  # fmt: skip
        for i in range(block_hi - block_lo):
            j = block_lo + i
            s = i % STAGES
            ids = next_ids.to(gl.int32)
            next_ids = _page_block_id(table_row, ((j + 1) * BLOCK_N + o_chunk * CHUNK) // PAGE_SIZE, max_blocks,
                                      num_cache_blocks)  # fmt: skip
            # a fresh barrier's phase "1" counts as complete: the first round does not wait
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            _page_boxes(k_desc, ready.index(2 * s), kv_bufs.index(2 * s), ids, o_chunk, j * BLOCK_N,
                        k_rows_per_block, kv_head * k_rows_per_head, kv_head * k_cols_per_head, PAGE_SIZE)  # fmt: skip
            _page_boxes(v_desc, ready.index(2 * s + 1), kv_bufs.index(2 * s + 1), ids, o_chunk, j * BLOCK_N,
                        v_rows_per_block, kv_head * v_rows_per_head, kv_head * v_cols_per_head, PAGE_SIZE)  # fmt: skip

    @gluon.jit
    def _split_blocks(num_blocks, SPLIT_KV: gl.constexpr, MIN_BLOCKS_PER_SPLIT: gl.constexpr):
        # [lo, hi) of this program's 64-key blocks: all of them, or with SPLIT_KV the slice of program_id(2), sized
        # from this sequence's length on the device as the portable kernel does (CUDA graphs fix the grid at
        # capture: splits a short context does not need get no block and write an empty partial result)
        if SPLIT_KV:
            splits_used = gl.maximum(gl.minimum(gl.num_programs(2), gl.cdiv(num_blocks, MIN_BLOCKS_PER_SPLIT)), 1)
            per_split = gl.cdiv(num_blocks, splits_used)
            block_lo = gl.minimum(gl.program_id(2) * per_split, num_blocks)
            block_hi = gl.minimum(block_lo + per_split, num_blocks)
        else:
            block_lo = 0
            block_hi = num_blocks
        return block_lo, block_hi

    @gluon.jit
    def _seq_k_len(seq, seqused_k_ptr, cu_seqlens_k_ptr, max_blocks, PAGE_SIZE: gl.constexpr,
                   HAS_SEQUSED: gl.constexpr):  # fmt: skip
        if HAS_SEQUSED:
            seq_k_len = gl.load(seqused_k_ptr + seq)
        else:
            seq_k_len = gl.load(cu_seqlens_k_ptr + seq + 1) - gl.load(cu_seqlens_k_ptr + seq)
        return gl.minimum(gl.maximum(seq_k_len, 0), max_blocks * PAGE_SIZE)  # keys the block table can address

    @gluon.jit
    def _decode_consumer(kv_bufs, q_hi_smem, q_lo_smem, p_smem, ready, empty, q_ptr, out_ptr, lse_ptr,
                         cu_seqlens_q_ptr, seqused_k_ptr, cu_seqlens_k_ptr, q_descale_ptr, k_descale_ptr,
                         v_descale_ptr, softmax_scale, max_blocks, total_q, stride_q_tok, stride_q_head, stride_o_tok,
                         stride_o_head, stride_lse_head, stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq,
                         stride_kdesc_head, stride_vdesc_seq, stride_vdesc_head, split_out_ptr, split_lse_ptr,
                         stride_split_out, stride_split_tok, stride_split_head, stride_split_lse,
                         stride_split_lse_head,
                         GROUP: gl.constexpr, PAGE_SIZE: gl.constexpr, HAS_SEQUSED: gl.constexpr,
                         Q_FP8: gl.constexpr, HAS_Q_DESCALE: gl.constexpr, HAS_K_DESCALE: gl.constexpr,
                         HAS_V_DESCALE: gl.constexpr, RETURN_LSE: gl.constexpr, CAUSAL: gl.constexpr,
                         SPLIT_KV: gl.constexpr, MIN_BLOCKS_PER_SPLIT: gl.constexpr, V16_SMEM: gl.constexpr,
                         num_warps: gl.constexpr):  # fmt: skip
        STAGES: gl.constexpr = kv_bufs.type.shape[0] // 2
        BLOCK_N: gl.constexpr = kv_bufs.type.shape[1]
        HEAD_DIM: gl.constexpr = kv_bufs.type.shape[2]
        BLOCK_M: gl.constexpr = q_hi_smem.type.shape[0]
        seq = gl.program_id(0)
        kv_head = gl.program_id(1)
        seq_k_len = _seq_k_len(seq, seqused_k_ptr, cu_seqlens_k_ptr, max_blocks, PAGE_SIZE, HAS_SEQUSED)
        block_lo, block_hi = _split_blocks(gl.cdiv(seq_k_len, BLOCK_N), SPLIT_KV, MIN_BLOCKS_PER_SPLIT)
        seq_q_start = gl.load(cu_seqlens_q_ptr + seq)
        seq_q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - seq_q_start

        # S^T [keys, rows] (fp8 wgmma, K = 32) and O^T [D, rows] (16-bit wgmma, K = 16)
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 32]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_M, 16]
        )
        v_op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)  # one value per row of q (a column of S^T)
        key_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        # q rows: row r is token r // GROUP of the sequence, q head kv_head * GROUP + r % GROUP
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
        o_row = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, q_layout))
        o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, q_layout))
        q_idx = o_row // GROUP
        i_q_tok = (seq_q_start + q_idx).to(gl.int64)
        row_valid = (q_idx < seq_q_len) & (o_row < GROUP * (BLOCK_M // GROUP)) & (i_q_tok < total_q)
        q_head = kv_head * GROUP + o_row % GROUP
        p_q = q_ptr + gl.expand_dims(i_q_tok * stride_q_tok + q_head * stride_q_head, 1) + gl.expand_dims(o_d, 0)
        qk_scale = softmax_scale
        if HAS_Q_DESCALE:
            qk_scale = qk_scale * gl.load(q_descale_ptr + seq * stride_qdesc_seq + kv_head * stride_qdesc_head)
        if HAS_K_DESCALE:
            qk_scale = qk_scale * gl.load(k_descale_ptr + seq * stride_kdesc_seq + kv_head * stride_kdesc_head)
        if Q_FP8:
            # an e4m3 q (vLLM quantizes q for an fp8 cache) is the one term as it is; its descale is in qk_scale
            q_hi_smem.store(gl.load(p_q, mask=gl.expand_dims(row_valid, 1), other=0.0))
            fold = gl.full([BLOCK_M], qk_scale * LOG2E, gl.float32, col_layout)  # scores in log2 units per column
        else:
            b_q = gl.load(p_q, mask=gl.expand_dims(row_valid, 1), other=0.0).to(gl.float32)  # [BM, D]
            # each row scaled by a power of two into e4m3's range, then hi + the rest as two e4m3 terms; the scale
            # moves into the scores exactly
            q_amax = gl.max(gl.abs(b_q), axis=1)
            q_row_scale = gl.where(q_amax > 0.0, gl.exp2(gl.ceil(gl.log2(gl.maximum(q_amax, 1e-30) / E4M3_MAX))), 1.0)
            b_q = b_q * gl.expand_dims(1.0 / q_row_scale, 1)
            # hi rounded onto e4m3's grid in fp32 (3 mantissa bits, subnormal step 2^-9), so the rest is exact in
            # fp32: reading hi back from fp8 (.to(float32)) gave wrong values in this kernel (H200, triton 3.6; the
            # same conversions are right alone), every row wrong and some NaN
            q_step = gl.exp2(gl.maximum(gl.floor(gl.log2(gl.maximum(gl.abs(b_q), 1e-30))), -6.0) - 3.0)
            q_hi_f32 = gl.extra.libdevice.rint(b_q / q_step) * q_step
            q_hi_smem.store(q_hi_f32.to(gl.float8e4nv))
            q_lo_smem.store((b_q - q_hi_f32).to(gl.float8e4nv))
            # scores in log2 units per column (row of q)
            fold = gl.convert_layout(q_row_scale, col_layout) * (qk_scale * LOG2E)
        fence_async_shared()  # the generic-proxy stores before the wgmma's async-proxy reads
        _thread_barrier()  # every warp's rows before the warpgroup's QK

        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, col_layout)
        l_i = gl.zeros([BLOCK_M], gl.float32, col_layout)
        acc = gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, o_layout)  # O^T
        s_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
        v_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])  # 16-byte smem reads
        o_key = gl.arange(0, BLOCK_N, layout=key_layout)
        # the last key each row sees: the sequence's last, or with CAUSAL (bottom-right aligned) token t of q_len sees
        # keys up to seq_k_len - q_len + t
        last_key = gl.full([1, BLOCK_M], seq_k_len - 1, gl.int32, s_layout)
        if CAUSAL:
            token = gl.expand_dims(gl.arange(0, BLOCK_M, layout=col_layout) // GROUP, 0)
            last_key = gl.minimum(last_key, seq_k_len - seq_q_len + token)
        o_key_v = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, v_layout))
        # V16_SMEM: the slot's 16 KB (K's and V's fp8 bytes) hold the block's V in fp16 for P @ V
        v16_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], gl.float16)
        v16_bufs = _reinterpret(kv_bufs, gl.float16, [STAGES, BLOCK_N, HEAD_DIM], v16_layout)  # slot s: fp8 2s, 2s+1
        # V16_SMEM: P's row sums kept per thread and summed over the keys once after the loop (no cross-warp sum per
        # block: the registers V's operand held are free)
        l_t = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, s_layout)
        for i in range(block_hi - block_lo):
            j = block_lo + i
            s = i % STAGES
            phase = (i // STAGES) & 1
            mbarrier.wait(ready.index(2 * s), phase)
            k_tile = kv_bufs.index(2 * s)
            tok = warpgroup_mma(k_tile, q_hi_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            if not Q_FP8:
                tok = warpgroup_mma(k_tile, q_lo_smem.permute((1, 0)), tok, is_async=True)
            # V widened while the QK wgmmas run: keys past the sequence zeroed (a stale slot may hold NaN)
            mbarrier.wait(ready.index(2 * s + 1), phase)
            b_v = kv_bufs.index(2 * s + 1).load(v_layout).to(gl.float16)  # [BN, D]
            if V16_SMEM:
                if (j + 1) * BLOCK_N > seq_k_len:  # only the last block has keys past the sequence (64 SELs)
                    b_v = gl.where(gl.expand_dims(j * BLOCK_N + o_key_v < seq_k_len, 1), b_v, gl.zeros_like(b_v))
            else:
                b_v = gl.where(gl.expand_dims(j * BLOCK_N + o_key_v < seq_k_len, 1), b_v, gl.zeros_like(b_v))
                # V^T [D, BN] as the A operand in registers: the transposing convert goes through a 2 KB scratch in
                # 8 rounds of store / bar.sync / load / bar.sync (16 of the block's 24 barriers). (Read straight into
                # the operand layout instead, V spilled: H100, session 24, +5%; kernel/PERF_NOTES.md)
                v_op = gl.convert_layout(gl.permute(b_v, (1, 0)), v_op_layout)
            b_st = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
            _thread_barrier()  # every warp's reads of V's slot
            if V16_SMEM:
                # K is consumed and every warp holds its V: the slot takes V in fp16 (one store, made visible to
                # the wgmma by the fence and barrier before P @ V), and goes back to the producer after P @ V
                v16_smem = v16_bufs.index(s)
                v16_smem.store(b_v)
            else:
                mbarrier.arrive(empty.index(s), count=1)  # K and V of this slot are read: the producer may refill it
            i_key = gl.expand_dims(j * BLOCK_N + o_key, 1)  # [BN, 1]
            b_st = gl.where(i_key <= last_key, b_st, float("-inf"))
            m_tile = gl.max(b_st, axis=0) * fold  # [BM]
            m_new = gl.maximum(m_i, m_tile)
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            b_pt = gl.exp2(b_st * gl.expand_dims(fold, 0) - gl.expand_dims(m_safe, 0))  # P^T [BN, BM]
            if V16_SMEM:
                l_t = l_t * gl.expand_dims(alpha, 0) + b_pt
            else:
                l_i = l_i * alpha + gl.sum(b_pt, axis=0)
            m_i = m_new
            p_smem.store(gl.permute(b_pt.to(gl.float16), (1, 0)))  # P [BM, BN]: keys contiguous
            fence_async_shared()
            _thread_barrier()  # every warp's part of P before the P@V wgmma
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(0, o_layout)), 0)
            if V16_SMEM:
                tok = warpgroup_mma(v16_smem.permute((1, 0)), p_smem.permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
                _thread_barrier()  # every warp's part of P @ V read the slot
                mbarrier.arrive(empty.index(s), count=1)
            else:
                tok = warpgroup_mma(v_op, p_smem.permute((1, 0)), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))

        if V16_SMEM:
            l_i = gl.sum(l_t, axis=0)
        # rows that saw no key have l = 0 and O = 0: divide by 1 so they come out as 0, not NaN
        l_safe = gl.where(l_i == 0.0, 1.0, l_i)
        o_factor = 1.0 / l_safe
        if HAS_V_DESCALE:
            o_factor = o_factor * gl.load(v_descale_ptr + seq * stride_vdesc_seq + kv_head * stride_vdesc_head)
        acc = acc * gl.expand_dims(gl.convert_layout(o_factor, gl.SliceLayout(0, o_layout)), 0)
        lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
        lse = gl.convert_layout(lse, gl.SliceLayout(1, q_layout))
        if SPLIT_KV:
            # this split's normalized partial output and lse, in fp32 for combine_splits_kernel (an empty split:
            # O = 0, lse -inf, which the combine skips)
            i_split = gl.program_id(2).to(gl.int64)
            b_so = gl.convert_layout(gl.permute(acc, (1, 0)), q_layout)  # [BM, D] fp32
            p_so = (split_out_ptr + i_split * stride_split_out
                    + gl.expand_dims(i_q_tok * stride_split_tok + q_head * stride_split_head, 1)
                    + gl.expand_dims(o_d, 0))  # fmt: skip
            gl.store(p_so, b_so, mask=gl.expand_dims(row_valid, 1))
            p_slse = split_lse_ptr + i_split * stride_split_lse + q_head.to(gl.int64) * stride_split_lse_head + i_q_tok
            gl.store(p_slse, lse, mask=row_valid)
        else:
            b_o = gl.convert_layout(gl.permute(acc.to(out_ptr.dtype.element_ty), (1, 0)), q_layout)  # [BM, D]
            p_o = out_ptr + gl.expand_dims(i_q_tok * stride_o_tok + q_head * stride_o_head, 1) + gl.expand_dims(o_d, 0)
            gl.store(p_o, b_o, mask=gl.expand_dims(row_valid, 1))
            if RETURN_LSE:
                gl.store(lse_ptr + q_head.to(gl.int64) * stride_lse_head + i_q_tok, lse, mask=row_valid)

    # lengths, counts and the widths they set change per batch: not specialized (see attention_fwd_hopper_kernel)
    @gluon.jit(
        do_not_specialize=[
            "softmax_scale", "total_q", "num_cache_blocks", "max_blocks", "stride_bt_seq", "stride_lse_head",
            "stride_split_out", "stride_split_lse", "stride_split_lse_head",
        ]
    )  # fmt: skip
    def attention_decode_hopper_kernel(
        q_ptr,  # [total_q, Hq, D] bf16, or e4m3 (Q_FP8)
        k_desc,  # K's paged TMA view (attention_hopper.paged_tma_view) in boxes [min(PAGE_SIZE, BLOCK_N), D]
        v_desc,  # V's likewise
        out_ptr,  # [total_q, Hq, D]
        lse_ptr,  # [Hq, total_q] fp32 (RETURN_LSE)
        cu_seqlens_q_ptr,  # [batch + 1] int32
        cu_seqlens_k_ptr,  # [batch + 1] int32 (without HAS_SEQUSED)
        seqused_k_ptr,  # [batch] int32 (HAS_SEQUSED)
        block_table_ptr,  # [batch, max_blocks] int32
        q_descale_ptr,  # fp32, [batch | broadcast, Hk | broadcast] (HAS_Q_DESCALE); likewise k and v
        k_descale_ptr,
        v_descale_ptr,
        softmax_scale,
        total_q,
        num_cache_blocks,
        max_blocks,
        stride_bt_seq,
        stride_q_tok,
        stride_q_head,
        stride_o_tok,
        stride_o_head,
        stride_lse_head,
        stride_qdesc_seq,
        stride_qdesc_head,
        stride_kdesc_seq,
        stride_kdesc_head,
        stride_vdesc_seq,
        stride_vdesc_head,
        split_out_ptr,  # [num_splits, total_q, Hq, D] fp32 (SPLIT_KV)
        split_lse_ptr,  # [num_splits, Hq, total_q] fp32 (SPLIT_KV)
        stride_split_out,
        stride_split_tok,
        stride_split_head,
        stride_split_lse,
        stride_split_lse_head,
        k_rows_per_block,  # the TMA views' placement of (block, kv head) (attention_hopper.paged_tma_view)
        k_rows_per_head,
        k_cols_per_head,
        v_rows_per_block,
        v_rows_per_head,
        v_cols_per_head,
        GROUP: gl.constexpr,
        PAGE_SIZE: gl.constexpr,
        STAGES: gl.constexpr,
        HAS_SEQUSED: gl.constexpr,
        Q_FP8: gl.constexpr,
        HAS_Q_DESCALE: gl.constexpr,
        HAS_K_DESCALE: gl.constexpr,
        HAS_V_DESCALE: gl.constexpr,
        RETURN_LSE: gl.constexpr,
        CAUSAL: gl.constexpr,
        SPLIT_KV: gl.constexpr,  # program_id(2) picks a slice of the KV blocks; combine_splits_kernel merges
        MIN_BLOCKS_PER_SPLIT: gl.constexpr,
        V16_SMEM: gl.constexpr,  # P @ V reads V widened into its slot instead of the A operand in registers
    ):
        BLOCK_N: gl.constexpr = 64
        HEAD_DIM: gl.constexpr = k_desc.block_type.shape[1]
        BLOCK_M: gl.constexpr = 16
        # ring slot s: K's block at 2s, V's at 2s + 1 (adjacent: with V16_SMEM the 16 KB hold V in fp16)
        kv_bufs = gl.allocate_shared_memory(k_desc.dtype, [2 * STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HEAD_DIM], gl.float8e4nv)
        q_hi_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, HEAD_DIM], q_layout)
        q_lo_smem = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, HEAD_DIM], q_layout)
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], gl.float16)
        p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_M, BLOCK_N], p_layout)
        ready = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())  # K, V per slot
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(2 * i), count=1)
            mbarrier.init(ready.index(2 * i + 1), count=1)
            mbarrier.init(empty.index(i), count=1)
        gl.warp_specialize(
            [
                (_decode_consumer, (
                    kv_bufs, q_hi_smem, q_lo_smem, p_smem, ready, empty, q_ptr, out_ptr, lse_ptr,
                    cu_seqlens_q_ptr, seqused_k_ptr, cu_seqlens_k_ptr, q_descale_ptr, k_descale_ptr, v_descale_ptr,
                    softmax_scale, max_blocks, total_q, stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
                    stride_lse_head, stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head,
                    stride_vdesc_seq, stride_vdesc_head, split_out_ptr, split_lse_ptr, stride_split_out,
                    stride_split_tok, stride_split_head, stride_split_lse, stride_split_lse_head, GROUP, PAGE_SIZE,
                    HAS_SEQUSED, Q_FP8, HAS_Q_DESCALE, HAS_K_DESCALE, HAS_V_DESCALE, RETURN_LSE, CAUSAL, SPLIT_KV,
                    MIN_BLOCKS_PER_SPLIT, V16_SMEM, gl.num_warps())),
                (_decode_producer, (
                    k_desc, v_desc, kv_bufs, ready, empty, block_table_ptr, stride_bt_seq, num_cache_blocks,
                    max_blocks, seqused_k_ptr, cu_seqlens_k_ptr, k_rows_per_block, k_rows_per_head, k_cols_per_head,
                    v_rows_per_block, v_rows_per_head, v_cols_per_head, PAGE_SIZE, HAS_SEQUSED, SPLIT_KV,
                    MIN_BLOCKS_PER_SPLIT)),
            ],
            [1],
            [PRODUCER_REGS],
        )  # fmt: skip


@functools.lru_cache(maxsize=16)
def _box_layout(rows: int):
    return gl.NVMMASharedLayout.get_default_for([rows, HEAD_DIM], gl.float8e4nv)


def plan_hopper_decode(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, softmax_scale,
                       causal: bool, q_descale, k_descale, v_descale, stages: int, split_out=None, split_lse=None,
                       min_blocks_per_split: int = 1, v16_smem: bool = False):  # fmt: skip
    """(kernel, grid, args, constexprs, options) of one launch; the caller checked `supports`. With split_out /
    split_lse ([num_splits, total_q, Hq, D] / [num_splits, Hq, total_q] fp32) the launch writes partial results for
    combine_splits_kernel, num_splits programs per (sequence, KV head)."""
    num_seqs = cu_seqlens_q.shape[0] - 1
    num_q_heads, num_kv_heads = q.shape[1], k.shape[2]
    page_size = k.shape[1]
    chunk = min(page_size, BLOCK_N)
    descriptors, placements = [], []
    for cache in (k, v):
        rows, width, row_stride, placement = attention_hopper.paged_tma_view(cache)
        descriptors.append(GluonTensorDescriptor(cache, [rows, width], [row_stride, 1], [chunk, HEAD_DIM],
                                                 _box_layout(chunk)))  # fmt: skip
        placements.extend(placement)

    args = (
        q, descriptors[0], descriptors[1], out, lse if lse is not None else out,
        cu_seqlens_q, cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q,
        seqused_k if seqused_k is not None else cu_seqlens_q, block_table,
        q_descale if q_descale is not None else q, k_descale if k_descale is not None else q,
        v_descale if v_descale is not None else q,
        softmax_scale, q.shape[0], k.shape[0], block_table.shape[1], block_table.stride(0),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
        *descale_strides(q_descale), *descale_strides(k_descale), *descale_strides(v_descale),
        split_out if split_out is not None else out, split_lse if split_lse is not None else out,
        *(split_out.stride()[:3] if split_out is not None else (0, 0, 0)),
        *(split_lse.stride()[:2] if split_lse is not None else (0, 0)), *placements,
    )  # fmt: skip
    constexprs = dict(
        GROUP=num_q_heads // num_kv_heads,
        PAGE_SIZE=page_size,
        STAGES=stages,
        HAS_SEQUSED=seqused_k is not None,
        Q_FP8=q.dtype == FP8_E4M3,
        HAS_Q_DESCALE=q_descale is not None,
        HAS_K_DESCALE=k_descale is not None,
        HAS_V_DESCALE=v_descale is not None,
        RETURN_LSE=lse is not None,
        CAUSAL=causal,
        SPLIT_KV=split_out is not None,
        MIN_BLOCKS_PER_SPLIT=min_blocks_per_split,
        V16_SMEM=v16_smem,
    )
    grid = (num_seqs, num_kv_heads) if split_out is None else (num_seqs, num_kv_heads, split_out.shape[0])
    # launched at 64 registers a thread (8 warps: the consumer warpgroup, the producer's): four programs per SM;
    # setmaxnreg then gives the consumer 104 and the producer 24 (sm_90: 0 spills)
    return attention_decode_hopper_kernel, grid, args, constexprs, {"num_warps": NUM_WARPS, "maxnreg": LAUNCH_REGS}


__all__ = ["HAS_GLUON", "plan_hopper_decode", "supports", "triton"]
