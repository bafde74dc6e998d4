"""Hopper fast path: warp-specialized prefill in Gluon (TMA producer warp, async wgmma consumers).

Scope: contiguous (varlen) K/V, 16-bit q/k/v of one dtype, head size 64/128/256 (equal for K and V), causal or
no mask, GQA, optional lse. Everything else (paged KV, fp8, windows, softcap, ALiBi, bias, sinks, decode tiles)
stays on the portable kernel in `attention.py`, which is also this kernel's CPU/ROCm twin: Gluon does not run in
Triton's interpreter, so the GPU suite tests this file against the same reference.

Schedule per program (one query tile of BLOCK_M = 128 rows of one q head), three partitions:
- a 1-warp producer loads Q once and K_j, V_j into a ring of STAGES shared-memory slots with TMA; `kv_empty[s]`
  hands a slot back once both consumers' P@V of that block has finished reading it;
- two consumer warpgroups of 64 rows each (their own partitions, so neither waits on the other's barriers) run, for
  block j: S_j = Q K_j^T (async) issued *before* O += P_{j-1} V_{j-1} (async); the softmax of S_j runs while that
  P@V is on the tensor cores; then O is rescaled. P stays in registers as the A operand of the P@V wgmma.
- ping-pong (`PINGPONG`, FA3's schedule): the consumers take turns issuing their wgmmas, so one's softmax overlaps
  the other's matmuls instead of both competing for the tensor cores at once.
Grid and tile order follow the portable kernel: `cu_seqlens_q[b] // BLOCK_M + b` tiles before sequence b, found
by binary search; a sequence's last tiles (most keys under a causal mask) run first.
"""

from __future__ import annotations

import torch
import triton

try:  # Gluon ships with triton >= 3.5; without it the launcher never picks this path
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonTensorDescriptor

    # triton 3.6 (the GPU image) names the TMA load async_copy_global_to_shared; later releases async_load
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _cp_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    _thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # renamed after 3.6 too
    HAS_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed triton
    HAS_GLUON = False

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
BLOCK_M = 128
NUM_WARPS = 4  # warps of one consumer warpgroup (64 query rows); the kernel runs two of them and a producer warp
# registers per thread (setmaxnreg) of the second consumer warpgroup and of the producer; the three warpgroups
# share 512 per thread slot. A TMA producer needs few; a paged producer computes gathered addresses.
CONSUMER_REGS = gl.constexpr(240) if HAS_GLUON else 240
PRODUCER_REGS = gl.constexpr(24) if HAS_GLUON else 24
CONSUMER_REGS_PAGED = gl.constexpr(224) if HAS_GLUON else 224
PAGED_PRODUCER_REGS = gl.constexpr(64) if HAS_GLUON else 64
PAGED_PRODUCER_WARPS = gl.constexpr(4) if HAS_GLUON else 4


def tiles_for(head_dim: int) -> tuple[int, int]:
    """(BLOCK_N, STAGES) per head size: Q + STAGES x (K + V) tiles + the output staging fit 227 KiB."""
    if head_dim <= 128:
        return 128, 2
    return 64, 2


def supports(q, k, v, out, paged: bool, features: dict) -> bool:
    """Whether this path computes the call exactly as the portable kernel would (else the launcher falls back)."""
    if not HAS_GLUON or any(features.values()):
        return False
    if not (q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16)):
        return False
    head_dim = q.shape[-1]
    if head_dim not in (64, 128, 256) or k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        return False
    if out.dtype != q.dtype or out.stride(2) != 1:
        return False
    # q (and contiguous k/v): 2-D descriptors over [tokens, heads * D] need heads and dims contiguous, rows 16-byte
    # aligned. Paged k/v ([blocks, page, Hk, D], any strides): 16-byte gathers need every stride a multiple of 8
    # elements, and a page of 16+ keys that divides or is divided by a key block.
    if any(t.data_ptr() % 16 for t in (q, k, v)):  # descriptors and 16-byte copies start 16-byte aligned
        return False
    if q.stride(2) != 1 or q.stride(1) != head_dim or (q.stride(0) * q.element_size()) % 16:
        return False
    for t in (k, v):
        if paged:
            page = t.shape[1]
            if t.stride(3) != 1 or any(t.stride(i) % 8 for i in range(3)) or page < 16 or page & (page - 1):
                return False
        elif t.stride(2) != 1 or t.stride(1) != head_dim or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


if HAS_GLUON:

    @gluon.jit
    def _find_sequence(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_M: gl.constexpr):
        # Largest b with cu_seqlens_q[b] // BLOCK_M + b <= tile_id.
        lo = num_seqs * 0
        hi = num_seqs
        while hi - lo > 1:
            mid = (lo + hi) // 2
            mid_start = gl.load(cu_seqlens_q_ptr + mid) // BLOCK_M + mid
            if mid_start <= tile_id:
                lo = mid
            else:
                hi = mid
        return lo

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, q_row, q_col,
                  seq_k_start, k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks,
                  seq_k_len, kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot,
                  stride_v_head, num_blocks, PAGED: gl.constexpr, PAGE_SIZE: gl.constexpr):  # fmt: skip
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        if PAGED:
            _produce_paged(q_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, q_row, q_col, k_ptr,
                           v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks, seq_k_len,
                           kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot,
                           stride_v_head, num_blocks, PAGE_SIZE)  # fmt: skip
        else:
            _produce_tma(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, q_row,
                         q_col, seq_k_start, kv_head * HEAD_DIM, num_blocks)  # fmt: skip

    @gluon.jit
    def _produce_tma(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty,
                     q_row, q_col, k_row, kv_col, num_blocks):  # fmt: skip
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        mbarrier.expect(q_ready, q_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row, q_col], q_ready, q_smem)
        for j in range(num_blocks):
            s = j % STAGES
            # a fresh barrier's phase "1" counts as complete, so the first round does not wait
            mbarrier.wait(kv_empty.index(s), ((j // STAGES) & 1) ^ 1)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            _tma_load(k_desc, [k_row + j * BLOCK_N, kv_col], k_ready.index(s), k_bufs.index(s))
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            _tma_load(v_desc, [k_row + j * BLOCK_N, kv_col], v_ready.index(s), v_bufs.index(s))

    @gluon.jit
    def _produce_paged(q_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, q_row, q_col,
                       k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks, seq_k_len,
                       kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot,
                       stride_v_head, num_blocks, PAGE_SIZE: gl.constexpr):  # fmt: skip
        # Paged K/V: each page's rows gathered with 16-byte cp.async into the swizzled slot; every producer thread
        # arrives on the ready barrier once its copies land. Keys past the sequence are zero-filled.
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        HEAD_DIM: gl.constexpr = k_bufs.type.shape[2]
        CHUNK: gl.constexpr = PAGE_SIZE if PAGE_SIZE < BLOCK_N else BLOCK_N  # rows that share one block id
        WARPS: gl.constexpr = gl.num_warps()
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [WARPS, 1], [1, 0])
        mbarrier.expect(q_ready, q_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row, q_col], q_ready, q_smem)
        o_row = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
        o_d = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout)), 0)
        table_row = block_table_ptr + seq.to(gl.int64) * stride_bt_seq
        k_head = k_ptr + kv_head * stride_k_head
        v_head = v_ptr + kv_head * stride_v_head
        k_rows = gl.expand_dims(o_row, 1) * stride_k_slot + o_d  # [CHUNK, D] offsets within one page's chunk
        v_rows = gl.expand_dims(o_row, 1) * stride_v_slot + o_d
        for j in range(num_blocks):
            s = j % STAGES
            mbarrier.wait(kv_empty.index(s), ((j // STAGES) & 1) ^ 1)
            for c in gl.static_range(BLOCK_N // CHUNK):
                key0 = j * BLOCK_N + c * CHUNK
                block_id = gl.load(table_row + gl.minimum(key0 // PAGE_SIZE, max_blocks - 1))
                block_id = gl.minimum(gl.maximum(block_id, 0), num_cache_blocks - 1).to(gl.int64)
                valid = gl.expand_dims(key0 + o_row < seq_k_len, 1)
                p_k = k_head + (block_id * stride_k_blk + (key0 % PAGE_SIZE) * stride_k_slot) + k_rows
                _cp_async_load(k_bufs.index(s).slice(c * CHUNK, CHUNK), p_k, mask=valid)
            async_copy.mbarrier_arrive(k_ready.index(s), increment_count=False)
            for c in gl.static_range(BLOCK_N // CHUNK):
                key0 = j * BLOCK_N + c * CHUNK
                block_id = gl.load(table_row + gl.minimum(key0 // PAGE_SIZE, max_blocks - 1))
                block_id = gl.minimum(gl.maximum(block_id, 0), num_cache_blocks - 1).to(gl.int64)
                valid = gl.expand_dims(key0 + o_row < seq_k_len, 1)
                p_v = v_head + (block_id * stride_v_blk + (key0 % PAGE_SIZE) * stride_v_slot) + v_rows
                _cp_async_load(v_bufs.index(s).slice(c * CHUNK, CHUNK), p_v, mask=valid)
            async_copy.mbarrier_arrive(v_ready.index(s), increment_count=False)

    @gluon.jit
    def _wait_turn(turns, round, WG: gl.constexpr, PINGPONG: gl.constexpr):
        # Ping-pong (FA3's schedule): the two consumer warpgroups take turns issuing their wgmmas, so one's softmax
        # runs while the other's matmuls occupy the tensor cores. Round r of warpgroup 0 waits for warpgroup 1's
        # r-th hand-over (a fresh barrier's parity 1 counts as complete, so round 0 of warpgroup 0 goes at once).
        if PINGPONG:
            mbarrier.wait(turns.index(WG), (round & 1) ^ (1 - WG))

    @gluon.jit
    def _pass_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
        if PINGPONG:
            mbarrier.arrive(turns.index(1 - WG), count=1)

    @gluon.jit
    def _softmax_step(b_s, m_i, l_i, j, q_pos, seq_k_len, diagonal, qk_scale, MASKED: gl.constexpr,
                      CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):  # fmt: skip
        # b_s: [BM, BN] raw scores of key block j; returns P (fp32), the new running max and sum, and O's factor.
        if MASKED:
            k_pos = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))  # [BN]
            valid = gl.expand_dims(k_pos < seq_k_len, 0)
            if CAUSAL:
                valid = valid & (gl.expand_dims(k_pos, 0) <= gl.expand_dims(q_pos + diagonal, 1))
            b_s = gl.where(valid, b_s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(b_s, 1) * qk_scale)  # [BM], log2 domain
        if MASKED:
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        else:
            m_use = m_new
        alpha = gl.exp2(m_i - m_use)
        b_p = gl.exp2(b_s * qk_scale - gl.expand_dims(m_use, 1))
        l_i = l_i * alpha + gl.sum(b_p, 1)
        return b_p, m_new, l_i, alpha

    @gluon.jit
    def _kv_step(j, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turns, s_zero, b_o, m_i, l_i, p_prev,
                 q_pos, seq_k_len, diagonal, qk_scale,
                 MASKED: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
                 p_layout: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr):  # fmt: skip
        # S_j = Q K_j^T is issued before O += P_{j-1} V_{j-1}; the softmax of S_j overlaps that P@V.
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        s = j % STAGES
        sp = (j - 1) % STAGES
        mbarrier.wait(k_ready.index(s), (j // STAGES) & 1)
        _wait_turn(turns, j, WG, PINGPONG)
        s_tok = warpgroup_mma(q_smem, k_bufs.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(sp), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p_prev, v_bufs.index(sp), b_o, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        b_s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        b_p, m_i, l_i, alpha = _softmax_step(b_s, m_i, l_i, j, q_pos, seq_k_len, diagonal, qk_scale, MASKED, CAUSAL,
                                             BLOCK_N, s_layout)  # fmt: skip
        p_next = gl.convert_layout(b_p.to(p_prev.dtype), p_layout)
        b_o, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_prev))
        mbarrier.arrive(kv_empty.index(sp), count=1)
        b_o = b_o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        return b_o, m_i, l_i, p_next

    @gluon.jit
    def _zero_rows_from(tile, first_row, num_warps: gl.constexpr):
        ROWS: gl.constexpr = tile.type.shape[0]
        COLS: gl.constexpr = tile.type.shape[1]
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (COLS // 8), COLS // 8], [num_warps, 1], [1, 0])
        rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        values = tile.load(layout)
        tile.store(gl.where(gl.expand_dims(rows < first_row, 1), values, gl.zeros_like(values)))
        fence_async_shared()  # the generic-proxy stores before the wgmma's async-proxy reads
        _thread_barrier()  # every warp's rows before the warpgroup's P@V

    @gluon.jit
    def _consumer(q_tile_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, out_ptr, lse_ptr,
                  seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len, num_blocks, qk_scale,
                  stride_o_tok, stride_o_head, stride_lse_head, ROW0: gl.constexpr, ROWS: gl.constexpr,
                  CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, RETURN_LSE: gl.constexpr, ZERO_TAIL: gl.constexpr,
                  num_warps: gl.constexpr):  # fmt: skip
        # This warpgroup's ROWS query rows start at row ROW0 of the tile; both warpgroups walk the tile's blocks.
        q_smem = q_tile_smem.slice(ROW0, ROWS, dim=0)
        WG: gl.constexpr = ROW0 // ROWS  # 0 or 1
        q_tile_start = q_tile_start + ROW0
        BLOCK_M: gl.constexpr = ROWS
        HEAD_DIM: gl.constexpr = q_smem.type.shape[1]
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, 16]
        )
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

        q_pos = q_tile_start + gl.arange(0, BLOCK_M, layout=row_layout)  # [BM] query position in the sequence
        diagonal = seq_k_len - seq_q_len  # bottom-right alignment: query i lines up with key i + diagonal
        # blocks every key of which every row of this warpgroup may see (no mask needed)
        if CAUSAL:
            num_full = gl.maximum(gl.minimum(q_tile_start + diagonal + 1, seq_k_len), 0) // BLOCK_N
        else:
            num_full = seq_k_len // BLOCK_N
        num_full = gl.minimum(num_full, num_blocks)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_layout)
        b_o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)

        # block 0: S_0 alone (nothing to overlap with yet)
        mbarrier.wait(q_ready, 0)
        mbarrier.wait(k_ready.index(0), 0)
        _wait_turn(turns, 0, WG, PINGPONG)
        s_tok = warpgroup_mma(q_smem, k_bufs.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        if num_full > 0:
            b_p, m_i, l_i, alpha = _softmax_step(b_s, m_i, l_i, 0, q_pos, seq_k_len, diagonal, qk_scale, False,
                                                 CAUSAL, BLOCK_N, s_layout)  # fmt: skip
        else:
            b_p, m_i, l_i, alpha = _softmax_step(b_s, m_i, l_i, 0, q_pos, seq_k_len, diagonal, qk_scale, True,
                                                 CAUSAL, BLOCK_N, s_layout)  # fmt: skip
        p_prev = gl.convert_layout(b_p.to(q_smem.dtype), p_layout)
        # interior blocks: every key visible to every row, no mask
        for j in range(1, num_full):
            b_o, m_i, l_i, p_prev = _kv_step(j, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turns, s_zero, b_o,
                                             m_i, l_i, p_prev, q_pos, seq_k_len, diagonal, qk_scale, False, CAUSAL,
                                             s_layout, o_layout, p_layout, WG, PINGPONG)  # fmt: skip
        # blocks on the causal diagonal or past the sequence's last key
        for j in range(gl.maximum(num_full, 1), num_blocks):
            b_o, m_i, l_i, p_prev = _kv_step(j, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turns, s_zero, b_o,
                                             m_i, l_i, p_prev, q_pos, seq_k_len, diagonal, qk_scale, True, CAUSAL,
                                             s_layout, o_layout, p_layout, WG, PINGPONG)  # fmt: skip
        last = num_blocks - 1
        mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
        if ZERO_TAIL and (last + 1) * BLOCK_N > seq_k_len:
            # The last block runs past the sequence: its V rows there belong to the next sequence or to whatever
            # follows the last one, and P = 0 does not cancel a non-finite value. Zero them before P@V.
            _zero_rows_from(v_bufs.index(last % STAGES), seq_k_len - last * BLOCK_N, num_warps)
        _wait_turn(turns, num_blocks, WG, PINGPONG)
        o_tok = warpgroup_mma(p_prev, v_bufs.index(last % STAGES), b_o, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        b_o = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
        mbarrier.arrive(kv_empty.index(last % STAGES), count=1)

        # Rows that saw no key have l = 0 and O = 0: divide by 1 so they come out as 0, not NaN.
        l_safe = gl.where(l_i == 0.0, 1.0, l_i)
        b_o = b_o * gl.expand_dims(gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout)), 1)
        # 16-byte stores: each thread writes 8 consecutive elements of a row
        store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1],
                                                      [1, 0])  # fmt: skip
        b_out = gl.convert_layout(b_o.to(out_ptr.dtype.element_ty), store_layout)
        o_row = q_tile_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, store_layout))
        o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
        i_tok = (seq_q_start + o_row).to(gl.int64)
        p_o = out_ptr + gl.expand_dims(i_tok * stride_o_tok, 1) + q_head * stride_o_head + gl.expand_dims(o_d, 0)
        gl.store(p_o, b_out, mask=gl.expand_dims(o_row < seq_q_len, 1))
        if RETURN_LSE:
            lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * 0.6931471805599453)
            i_tok_r = (seq_q_start + q_pos).to(gl.int64)
            gl.store(lse_ptr + q_head.to(gl.int64) * stride_lse_head + i_tok_r, lse, mask=q_pos < seq_q_len)

    @gluon.jit
    def _consumer_default(q_tile_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, out_ptr, lse_ptr,
                          seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len, num_blocks, qk_scale,
                          stride_o_tok, stride_o_head, stride_lse_head, ROW0: gl.constexpr, ROWS: gl.constexpr,
                          CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, RETURN_LSE: gl.constexpr,
                          ZERO_TAIL: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        # the default partition of gl.warp_specialize must return a tuple
        _consumer(q_tile_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, out_ptr, lse_ptr,
                  seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len, num_blocks, qk_scale, stride_o_tok,
                  stride_o_head, stride_lse_head, ROW0, ROWS, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL,
                  num_warps)  # fmt: skip
        return ()

    # Lengths, counts and the widths they set (block table, lse rows) change per batch: not specialized, so a new
    # batch never compiles a new variant (vLLM warms up once; CUDA graphs replay)
    @gluon.jit(
        do_not_specialize=[
            "num_seqs", "total_q", "total_k", "num_cache_blocks", "max_blocks", "softmax_scale", "stride_lse_head",
            "stride_bt_seq",
        ]
    )  # fmt: skip
    def attention_fwd_hopper_kernel(
        q_desc,  # q as [total_q, Hq * D], blocks [BLOCK_M, D]
        k_desc,  # k as [total_k, Hk * D], blocks [BLOCK_N, D] (PAGED: only its block shape and layout are used)
        v_desc,  # v as [total_k, Hk * D], blocks [BLOCK_N, D] (PAGED: as k_desc)
        k_ptr,  # PAGED: [num_cache_blocks, PAGE_SIZE, Hk, D] (any strides, D contiguous); else unused
        v_ptr,  # PAGED: as k_ptr
        out_ptr,  # [total_q, Hq, D]
        lse_ptr,  # [Hq, total_q] fp32 (RETURN_LSE)
        cu_seqlens_q_ptr,  # [batch + 1] int32
        cu_seqlens_k_ptr,  # [batch + 1] int32 (contiguous K/V)
        seqused_k_ptr,  # [batch] int32 (HAS_SEQUSED)
        block_table_ptr,  # [batch, max_blocks] int32 (PAGED)
        num_seqs,
        total_q,  # rows of q / out: no store goes past them, whatever cu_seqlens_q holds
        total_k,  # rows of contiguous k / v
        num_cache_blocks,  # PAGED: blocks in the cache (block ids are clamped to them)
        max_blocks,  # PAGED: block-table columns
        softmax_scale,
        stride_o_tok,
        stride_o_head,
        stride_lse_head,
        stride_bt_seq,
        stride_k_blk,
        stride_k_slot,
        stride_k_head,
        stride_v_blk,
        stride_v_slot,
        stride_v_head,
        GROUP: gl.constexpr,  # q heads per kv head
        CAUSAL: gl.constexpr,
        PINGPONG: gl.constexpr,  # the consumer warpgroups alternate their wgmma issue (see _wait_turn)
        RETURN_LSE: gl.constexpr,
        PAGED: gl.constexpr,
        PAGE_SIZE: gl.constexpr,
        HAS_SEQUSED: gl.constexpr,
        SEQ_FILTER: gl.constexpr,  # 0 all sequences, 1 only those with more than DECODE_MAX_Q queries
        DECODE_MAX_Q: gl.constexpr,
        STAGES: gl.constexpr,
        num_warps: gl.constexpr,
    ):
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        q_head = gl.program_id(0)
        tile_id = gl.num_programs(1) - 1 - gl.program_id(1)  # the last sequences' tiles first
        kv_head = q_head // GROUP

        seq = _find_sequence(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_M)
        seq_q_start = gl.load(cu_seqlens_q_ptr + seq)
        seq_q_len = gl.minimum(gl.load(cu_seqlens_q_ptr + seq + 1), total_q) - seq_q_start
        tile_in_seq = tile_id - (seq_q_start // BLOCK_M + seq)
        tiles_in_seq = gl.cdiv(seq_q_len, BLOCK_M)
        skip = tile_in_seq >= tiles_in_seq
        if SEQ_FILTER == 1:
            skip = skip | (seq_q_len <= DECODE_MAX_Q)
        if not skip:
            q_tile_start = (tiles_in_seq - 1 - tile_in_seq) * BLOCK_M  # last tiles first
            if HAS_SEQUSED:
                seq_k_len = gl.load(seqused_k_ptr + seq)
            else:
                seq_k_len = gl.load(cu_seqlens_k_ptr + seq + 1) - gl.load(cu_seqlens_k_ptr + seq)
            if PAGED:
                seq_k_start = 0
                seq_k_cap = max_blocks * PAGE_SIZE  # keys the block table can address
            else:
                seq_k_start = gl.minimum(gl.maximum(gl.load(cu_seqlens_k_ptr + seq), 0), total_k)
                seq_k_cap = total_k - seq_k_start
            seq_k_len = gl.minimum(gl.maximum(seq_k_len, 0), seq_k_cap)
            diagonal = seq_k_len - seq_q_len
            q_last = gl.minimum(q_tile_start + BLOCK_M, seq_q_len) - 1
            if CAUSAL:
                kv_end = gl.maximum(gl.minimum(q_last + diagonal + 1, seq_k_len), 0)
            else:
                kv_end = seq_k_len
            num_blocks = gl.cdiv(kv_end, BLOCK_N)
            if num_blocks == 0:
                _store_empty(out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, stride_o_tok,
                             stride_o_head, stride_lse_head, BLOCK_M, HEAD_DIM, RETURN_LSE, num_warps)  # fmt: skip
            else:
                q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
                k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
                v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
                q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
                k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
                v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
                kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
                turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
                mbarrier.init(turns.index(0), count=1)
                mbarrier.init(turns.index(1), count=1)
                mbarrier.init(q_ready, count=1)
                # TMA: one expect-tx arrival per slot; paged: every producer thread's cp.async arrival
                READY_COUNT: gl.constexpr = 32 * PAGED_PRODUCER_WARPS if PAGED else 1
                for i in gl.static_range(STAGES):
                    mbarrier.init(k_ready.index(i), count=READY_COUNT)
                    mbarrier.init(v_ready.index(i), count=READY_COUNT)
                    mbarrier.init(kv_empty.index(i), count=2)  # both consumer warpgroups hand a slot back
                qk_scale = softmax_scale * 1.4426950408889634  # log2 domain: exp2 with the scale folded in
                HALF: gl.constexpr = BLOCK_M // 2
                FIRST: gl.constexpr = 0
                ZERO_TAIL: gl.constexpr = not PAGED  # paged copies zero-fill keys past the sequence themselves
                # a TMA producer is one warp issuing copies; a paged one computes gathered addresses (4 warps)
                PRODUCER_WARPS: gl.constexpr = PAGED_PRODUCER_WARPS if PAGED else 1
                WORKER_REGS: gl.constexpr = CONSUMER_REGS_PAGED if PAGED else CONSUMER_REGS
                PRODUCER_REGS_: gl.constexpr = PAGED_PRODUCER_REGS if PAGED else PRODUCER_REGS
                gl.warp_specialize(
                    [
                        (_consumer_default, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns,
                                             out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head,
                                             seq_k_len, num_blocks, qk_scale, stride_o_tok, stride_o_head,
                                             stride_lse_head, FIRST, HALF, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL,
                                             num_warps)),
                        (_consumer, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, out_ptr,
                                     lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len, num_blocks,
                                     qk_scale, stride_o_tok, stride_o_head, stride_lse_head, HALF, HALF, CAUSAL,
                                     PINGPONG, RETURN_LSE, ZERO_TAIL, num_warps)),
                        (_producer, (q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready,
                                     kv_empty, seq_q_start + q_tile_start, q_head * HEAD_DIM, seq_k_start, k_ptr,
                                     v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks,
                                     seq_k_len, kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk,
                                     stride_v_slot, stride_v_head, num_blocks, PAGED, PAGE_SIZE)),
                    ],
                    [num_warps, PRODUCER_WARPS],
                    [WORKER_REGS, PRODUCER_REGS_],
                )  # fmt: skip

    @gluon.jit
    def _store_empty(out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, stride_o_tok, stride_o_head,
                     stride_lse_head, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, RETURN_LSE: gl.constexpr,
                     num_warps: gl.constexpr):  # fmt: skip
        # A tile whose rows see no key at all: output 0, lse -inf (as the portable kernel).
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1], [1, 0])
        o_row = q_tile_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
        i_tok = (seq_q_start + o_row).to(gl.int64)
        p_o = out_ptr + gl.expand_dims(i_tok * stride_o_tok, 1) + q_head * stride_o_head + gl.expand_dims(o_d, 0)
        zeros = gl.zeros([BLOCK_M, HEAD_DIM], out_ptr.dtype.element_ty, layout)
        gl.store(p_o, zeros, mask=gl.expand_dims(o_row < seq_q_len, 1))
        if RETURN_LSE:
            row_layout: gl.constexpr = gl.SliceLayout(1, layout)
            lse = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
            gl.store(lse_ptr + q_head.to(gl.int64) * stride_lse_head + i_tok, lse, mask=o_row < seq_q_len)


def plan_hopper_prefill(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                        softmax_scale: float, causal: bool, seq_filter: int, decode_max_q: int,
                        pingpong: bool = True):  # fmt: skip
    """(kernel, grid, args, constexprs, options) of one warp-specialized prefill launch; `supports` must hold."""
    total_q, num_q_heads, head_dim = q.shape
    paged = block_table is not None
    num_kv_heads = k.shape[-2]
    num_seqs = cu_seqlens_q.shape[0] - 1
    block_n, stages = tiles_for(head_dim)
    dtype = gl.float16 if q.dtype == torch.float16 else gl.bfloat16

    def descriptor(t: torch.Tensor, rows: int) -> GluonTensorDescriptor:
        flat_shape = [t.shape[0], t.shape[1] * head_dim]
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], dtype)
        return GluonTensorDescriptor(t, flat_shape, [t.stride(0), 1], [rows, head_dim], layout)

    if paged:
        k_desc = v_desc = descriptor(q, block_n)  # for the slots' shape and swizzle only: K/V are gathered
        kv_strides = (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))
        page_size, num_cache_blocks, max_blocks = k.shape[1], k.shape[0], block_table.shape[1]
        total_k = 0
    else:
        k_desc, v_desc = descriptor(k, block_n), descriptor(v, block_n)
        kv_strides = (0,) * 6
        page_size, num_cache_blocks, max_blocks = 1, 1, 1
        total_k = k.shape[0]
    grid = (num_q_heads, total_q // BLOCK_M + num_seqs)
    args = (
        descriptor(q, BLOCK_M), k_desc, v_desc,
        k if paged else out, v if paged else out, out, lse if lse is not None else out,
        cu_seqlens_q, cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q,
        seqused_k if seqused_k is not None else cu_seqlens_q,
        block_table if paged else cu_seqlens_q,
        num_seqs, total_q, total_k, num_cache_blocks, max_blocks, float(softmax_scale),
        out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
        block_table.stride(0) if paged else 0, *kv_strides,
    )  # fmt: skip
    constexprs = dict(
        GROUP=num_q_heads // num_kv_heads,
        CAUSAL=causal,
        PINGPONG=pingpong,
        RETURN_LSE=lse is not None,
        PAGED=paged,
        PAGE_SIZE=page_size,
        HAS_SEQUSED=seqused_k is not None,
        SEQ_FILTER=seq_filter,
        DECODE_MAX_Q=decode_max_q,
        STAGES=stages,
    )
    return attention_fwd_hopper_kernel, grid, args, constexprs, {"num_warps": NUM_WARPS}


__all__ = ["HAS_GLUON", "plan_hopper_prefill", "supports", "tiles_for", "triton"]
