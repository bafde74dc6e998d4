"""Hopper fast path: warp-specialized prefill in Gluon (TMA producer warp, async wgmma consumers).

Scope: contiguous (varlen) or paged K/V, 16-bit q/k/v of one dtype, head size 64/128/256 (equal for K and V; with
config `ws_pad_head_dim` also other multiples of 8, in tiles of the next of those), causal or no mask, GQA, optional
lse; with config `ws_fp8` (Hopper default), also fp8 (e4m3) K/V, contiguous (paged only with the opt-in
`ws_fp8_paged`: it hung on the H200, fixed since, not re-run), with an fp8 q or a 16-bit q quantized here (config
`fp8_q_for_fp8_kv`), D <= 128, with descales. Everything else (windows, softcap, ALiBi, bias, sinks, decode tiles)
stays on the portable kernel in `attention.py`, which is also this kernel's CPU/ROCm twin: Gluon does not run in
Triton's interpreter, so the GPU suite tests this file against the same reference. Schedules (config): paged K/V
through TMA boxes (`ws_paged_tma`, else cp.async gathers), a persistent grid (`ws_persistent`: `PERSISTENT`, one
program per SM walking the tiles, D <= 128); both on by default on Hopper.

fp8 (`FP8`): the fp8 wgmma reads both operands K-major, so V comes from a key-major copy ([Hk * D, keys], tiles
[D, BLOCK_N]; paged: transposed by the gathering producer); P comes out of exp2 scaled by 2^P_SCALE_LOG2
(`tritonfa.fp8.p_scale`: the scale subtracts from the row max, and cancels in O / l) before its cast to e4m3, and
with `TWO_LEVEL` each block's P@V is added to O in fp32 (Hopper's fp8 MMA keeps 13 mantissa bits of its
accumulator). A 16-bit q
(`QUANTIZE_Q`) is staged in shared memory by the producer's TMA (like any Q, a tile ahead on the persistent grid);
each consumer warpgroup scales its rows by a power of two into e4m3's range and stores them as fp8 for its QK; the
scale moves into the scores exactly.

Schedule per program (one query tile of BLOCK_M = 128 rows of one q head), three partitions:
- a 1-warp producer loads Q once and K_j, V_j into a ring of STAGES shared-memory slots with TMA; `kv_empty[s]`
  hands a slot back once both consumers' P@V of that block has finished reading it;
- two consumer warpgroups of 64 rows each (their own partitions, so neither waits on the other's barriers) run, for
  block j: S_j = Q K_j^T (async) issued *before* O += P_{j-1} V_{j-1} (async); the softmax of S_j runs while that
  P@V is on the tensor cores; then O is rescaled. P stays in registers as the A operand of the P@V wgmma.
- ping-pong (`PINGPONG`, FA3's schedule): the consumers take turns issuing their wgmmas, so one's softmax overlaps
  the other's matmuls instead of both competing for the tensor cores at once. `PINGPONG` 2 (config `ws_serial_pv`):
  each consumer also waits for its P@V before its next QK, leaving the overlap to the other warpgroups.
Grid and tile order follow the portable kernel: `cu_seqlens_q[b] // BLOCK_M + b` tiles before sequence b, found
by a wide search (many probes per dependent load); a sequence's last tiles (most keys under a causal mask) run
first.
"""

from __future__ import annotations

import functools
import math

import torch
import triton

from tritonfa.fp8 import descale_strides, fp8_max, is_fp8, p_scale
from tritonfa.kernels import plan_cache
from tritonfa.kernels.key_major import key_major_copy, plan_key_major_storage

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

FP8_E4M3 = getattr(torch, "float8_e4m3fn", None)
SIXTEEN_BIT = (torch.float16, torch.bfloat16)
if HAS_GLUON:
    _GL_DTYPES = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16}
    if FP8_E4M3 is not None:
        _GL_DTYPES[FP8_E4M3] = gl.float8e4nv

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
BLOCK_M = 128
NUM_WARPS = 4  # warps of one consumer warpgroup (64 query rows); the kernel runs two of them and a producer warp
# registers per thread (setmaxnreg) of the second consumer warpgroup and of the producer; the three warpgroups
# share 512 per thread slot. A TMA producer needs few; a paged producer computes gathered addresses.
# P_PER_TILE: each key block's row max of P maps to e4m3's largest value (fp8 P@V is e4m3 here)
P_TILE_MAX = gl.constexpr(448.0) if HAS_GLUON else 448.0
P_TILE_MAX_LOG2 = gl.constexpr(math.log2(448.0)) if HAS_GLUON else math.log2(448.0)
# ROW_SUM_MMA's P @ ones: N of its wgmma, every column a row's sum. 16, not wgmma's narrowest 8: at 8 the sums came
# out wrong on an H100 (session 33), and the 8-row tile's descriptor had no stride between 8-row groups (0; V's
# tiles and a 16-row one have 1024 B), the one difference from V's in the PTX (a view of 8 rows of 16 keeps the 0).
ROW_SUM_COLS = gl.constexpr(16) if HAS_GLUON else 16
CONSUMER_REGS = gl.constexpr(240) if HAS_GLUON else 240
PRODUCER_REGS = gl.constexpr(24) if HAS_GLUON else 24
# three consumer warpgroups (192-row tiles, config `ws_consumers`) and a TMA producer share 512 per thread slot too:
# the two worker consumers get 160 each (setmaxnreg: multiples of 8), the default one what is left (168)
CONSUMER_REGS_THREE = gl.constexpr(160) if HAS_GLUON else 160
CONSUMER_REGS_PAGED = gl.constexpr(224) if HAS_GLUON else 224
PAGED_PRODUCER_REGS = gl.constexpr(64) if HAS_GLUON else 64
PAGED_PRODUCER_WARPS = gl.constexpr(4) if HAS_GLUON else 4
# fp8 with gathered pages: the consumers (O plus one block's P@V in fp32) spill below 232; the producer transposes
# V with what is left (2 x 128 x 232 + 128 x 48 = 64 K registers)
CONSUMER_REGS_FP8_GATHER = gl.constexpr(240) if HAS_GLUON else 240
PRODUCER_REGS_FP8_GATHER = gl.constexpr(32) if HAS_GLUON else 32


@triton.constexpr_function
def _partition_regs(gather, v_key_major, producer):
    """Registers per thread (setmaxnreg) of the second consumer warpgroup, or with `producer` of the producer, for a
    kernel's loads: TMA, gathers, gathered fp8 V transposed."""
    if not gather:
        regs = PRODUCER_REGS if producer else CONSUMER_REGS
    elif v_key_major:
        regs = PRODUCER_REGS_FP8_GATHER if producer else CONSUMER_REGS_FP8_GATHER
    else:
        regs = PAGED_PRODUCER_REGS if producer else CONSUMER_REGS_PAGED
    return getattr(regs, "value", regs)


# a persistent TMA producer also finds each work item's sequence and bounds
PERSISTENT_PRODUCER_REGS = gl.constexpr(56) if HAS_GLUON else 56
# the dynamic persistent grid (`DYNAMIC`): work items in flight from the producer to the consumers
WORK_SLOTS = gl.constexpr(2) if HAS_GLUON else 2


def tile_head_dim(head_dim: int) -> int:
    """The D of the Gluon prefill's tiles for a head size: 64, 128 or 256 (smaller ones are padded)."""
    return 64 if head_dim <= 64 else 128 if head_dim <= 128 else 256


# K widened by the producer: while its copies waited for a free ring slot, block j's k_ready came after block j + 1's
# gather, which waited for slot j + 1 - STAGES, released after block j's QK: two slots deadlocked (H200, session 10:
# every D 64 test hung). The copies now go to staging tiles without that wait (session 12); 3 slots are kept
WIDENED_K_MIN_STAGES = 3


def tiles_for(
    head_dim: int, paged_16_bit: bool = False, contiguous_fp8_causal: bool = False, widened_k: bool = False
) -> tuple[int, int]:
    """(BLOCK_N, STAGES) per head size: Q + STAGES x (K + V) tiles + the output staging fit 227 KiB.

    A 16-bit paged cache at D 128 gathered by the producer warps runs 64-key blocks in 4 slots: the same keys in
    flight in smaller steps (H200, session 8, paged b8x2048 causal, three runs: 0.644-0.660 -> 0.551-0.600 ms).
    Pages through TMA boxes take 128 x 2 like contiguous K/V since early K release (H100, session 26: 0.563-0.583
    -> 0.545-0.567 ms every round; 64 x 3 slower).
    Causal contiguous fp8 at D 128 runs 64-key blocks in 3 slots, which puts it on the persistent grid (its
    consumers spill there with 128-key blocks): H200, session 9, b8x2048 causal 0.650 -> 0.597 ms; non-causal
    b4x4096 went 1.565 -> 1.816, so it keeps 128 x 2.
    widened_k (fp8 K/V widened to a 16-bit q's type by the producer): 16-bit K and V slots plus four fp8 staging
    tiles, in 64-key blocks so that they fit beside a double-buffered 16-bit Q (D 128: 213 KB), in at least 3 slots
    (`WIDENED_K_MIN_STAGES`).
    """
    if widened_k:
        return 64, WIDENED_K_MIN_STAGES
    if head_dim == 128 and (paged_16_bit or contiguous_fp8_causal):
        return (64, 4) if paged_16_bit else (64, 3)
    if head_dim <= 128:
        return 128, 2
    return 64, 2


def widens_k(q_dtype: torch.dtype, k_dtype: torch.dtype, quantize_q: bool) -> bool:
    """Whether a call that `supports` sends here gathers fp8 K/V and widens them (a 16-bit q not rounded to fp8)."""
    return is_fp8(k_dtype) and q_dtype in SIXTEEN_BIT and not quantize_q


def supports(q, k, v, out, paged: bool, features: dict, fp8: bool = False, quantize_q: bool = False,
             fp8_paged: bool = False, pad_head_dim: bool = False, widen_k: bool = False) -> bool:  # fmt: skip
    """Whether this path computes the call exactly as the portable kernel would (else the launcher falls back).

    fp8: contiguous fp8 K/V may come here (config `ws_fp8`), fp8_paged: paged ones too (`ws_fp8_paged`); quantize_q:
    a 16-bit q meeting them is rounded to fp8 per row (config `fp8_q_for_fp8_kv`), as the portable kernel does.
    pad_head_dim: 16-bit head sizes other than 64/128/256 (multiples of 8) run in tiles of the next of those
    (config `ws_pad_head_dim`). widen_k: a 16-bit q with fp8 K/V keeps its 16 bits: the producer gathers K and V
    and widens them to q's type and fp16 (exact), both dots are 16-bit (config `ws_fp8_k16`).
    """
    if not HAS_GLUON:
        return False
    if k.dtype == v.dtype == FP8_E4M3 and fp8 and (fp8_paged or not paged):
        # D <= 128: O and one block's P@V both live in registers
        fp8_q = q.dtype == FP8_E4M3 or (quantize_q and q.dtype in SIXTEEN_BIT)
        widened = widen_k and widens_k(q.dtype, k.dtype, quantize_q)
        if not (fp8_q or widened) or q.shape[-1] > 128 or out.dtype not in SIXTEEN_BIT:
            return False
        if any(on for name, on in features.items() if name != "descale"):
            return False
    elif any(on for name, on in features.items() if name != "descale") or not (
        q.dtype == k.dtype == v.dtype and q.dtype in SIXTEEN_BIT
    ):  # 16-bit: descales scale the scores and O as for fp8 (a widened fp8 cache's, `widen_kv`)
        return False
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim or v.shape[-1] != head_dim:
        return False
    padded = pad_head_dim and head_dim % 8 == 0 and head_dim < 256 and q.dtype in SIXTEEN_BIT and k.dtype == q.dtype
    if head_dim not in (64, 128, 256) and not padded:
        return False
    if (out.dtype != q.dtype and q.dtype in SIXTEEN_BIT) or out.stride(2) != 1:
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
            page, vec = t.shape[1], 16 // t.element_size()  # elements per 16-byte copy
            if t.stride(3) != 1 or any(t.stride(i) % vec for i in range(3)) or page < 16 or page & (page - 1):
                return False
        elif t.stride(2) != 1 or t.stride(1) != head_dim or (t.stride(0) * t.element_size()) % 16:
            return False
    return True


if HAS_GLUON:

    @gluon.jit
    def _find_sequence(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_M: gl.constexpr, PROBES: gl.constexpr,
                       num_warps: gl.constexpr):  # fmt: skip
        # Largest b with cu_seqlens_q[b] // BLOCK_M + b <= tile_id (b = 0 if none), searched PROBES entries at a
        # time: one dependent load per round (a binary search is one per halving, and with one program per SM it is
        # on every tile's critical path; 64 sequences, 128 probes: 1 round instead of 6). Partitions that must agree
        # on a tile search with the same PROBES: then they agree whatever cu_seqlens_q holds.
        o_probe = gl.arange(0, PROBES, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
        lo = num_seqs * 0
        count = num_seqs  # the answer is in [lo, lo + count)
        while count > 1:
            step = gl.cdiv(count, PROBES)
            b = lo + o_probe * step
            in_range = o_probe * step < count
            start = gl.load(cu_seqlens_q_ptr + b, mask=in_range, other=0) // BLOCK_M + b
            # probes at or before tile_id (a prefix while cu_seqlens_q is monotone; any count stays in range)
            below = gl.sum((in_range & (start <= tile_id)).to(gl.int32), axis=0)
            lo = lo + gl.maximum(below - 1, 0) * step
            count = gl.minimum(step, count - gl.maximum(below - 1, 0) * step)
        return lo

    @gluon.jit
    def _tile_bounds(tile_id, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, num_seqs, total_q, total_k,
                     max_blocks, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                     PAGED: gl.constexpr, PAGE_SIZE: gl.constexpr, HAS_SEQUSED: gl.constexpr,
                     SEQ_FILTER: gl.constexpr, DECODE_MAX_Q: gl.constexpr, KEY_GROUPS: gl.constexpr,
                     PROBES: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        # Tile slot tile_id (cu_seqlens_q[b] // BLOCK_M + b slots before sequence b): whether it holds query rows to
        # compute (process), its sequence, q rows, keys (bounded by total_q / total_k / the block table whatever the
        # index tensors hold) and the key blocks its rows see. A sequence's tile k starts at row k * BLOCK_M: the
        # grids walk the slots from the last, so every sequence's last tiles (most keys under a causal mask) run
        # first. KEY_GROUPS (fp8 V read through its key-major copy, not gathered): the key grid starts key_shift keys
        # early, on a 16-key group of that copy.
        seq = _find_sequence(cu_seqlens_q_ptr, tile_id, num_seqs, BLOCK_M, PROBES, num_warps)
        seq_q_start = gl.load(cu_seqlens_q_ptr + seq)
        seq_q_len = gl.minimum(gl.load(cu_seqlens_q_ptr + seq + 1), total_q) - seq_q_start
        tile_in_seq = tile_id - (seq_q_start // BLOCK_M + seq)
        tiles_in_seq = gl.cdiv(seq_q_len, BLOCK_M)
        skip = tile_in_seq >= tiles_in_seq
        if SEQ_FILTER == 1:
            skip = skip | (seq_q_len <= DECODE_MAX_Q)
        q_tile_start = seq * 0
        seq_k_start = seq * 0
        seq_k_len = seq * 0
        num_blocks = seq * 0
        key_shift = seq * 0
        if not skip:
            q_tile_start = tile_in_seq * BLOCK_M
            if HAS_SEQUSED:
                seq_k_len = gl.load(seqused_k_ptr + seq)
            else:
                seq_k_len = gl.load(cu_seqlens_k_ptr + seq + 1) - gl.load(cu_seqlens_k_ptr + seq)
            if PAGED:
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
            if KEY_GROUPS:
                key_shift = seq_k_start % 16
                num_blocks = gl.where(kv_end > 0, gl.cdiv(kv_end + key_shift, BLOCK_N), 0)
            else:
                num_blocks = gl.cdiv(kv_end, BLOCK_N)
        return not skip, seq, seq_q_start, seq_q_len, q_tile_start, seq_k_start, seq_k_len, num_blocks, key_shift

    @gluon.jit
    def _producer(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, v_stage, q_ready, k_ready, v_ready, kv_empty, q_row,
                  q_col,
                  seq_k_start, k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks,
                  seq_k_len, kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot,
                  stride_v_head, k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block,
                  v_rows_per_head, v_cols_per_head, num_blocks, it0, PAGED: gl.constexpr, PAGE_SIZE: gl.constexpr,
                  PAGED_TMA: gl.constexpr, FP8: gl.constexpr,
                  VALID_D: gl.constexpr):  # fmt: skip
        # it0: K/V blocks this program's producer has loaded before this tile (the ring's slot and phase go on).
        # VALID_D: the head size of q/k/v (<= the tiles' D; see _consumer)
        if PAGED_TMA:
            _produce_paged_tma(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty,
                               q_row, q_col, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks,
                               kv_head, k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block,
                               v_rows_per_head, v_cols_per_head, num_blocks, it0, PAGE_SIZE)  # fmt: skip
        elif FP8 and (PAGED or v_bufs.dtype.primitive_bitwidth == 16):  # paged fp8, or contiguous with V widened
            _produce_gathered_fp8(q_desc, q_smem, k_bufs, v_bufs, v_stage, q_ready, k_ready, v_ready, kv_empty, q_row,
                               q_col, k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks,
                               seq_k_len, kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk,
                               stride_v_slot, stride_v_head, num_blocks, it0, PAGE_SIZE, PAGED,
                               seq_k_start)  # fmt: skip
        elif PAGED:
            _produce_paged(q_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, q_row, q_col, k_ptr,
                           v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks, seq_k_len,
                           kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot,
                           stride_v_head, num_blocks, it0, PAGE_SIZE, VALID_D)  # fmt: skip
        else:
            _produce_tma(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, q_row,
                         q_col, seq_k_start, kv_head * VALID_D, num_blocks, it0, FP8)  # fmt: skip

    @gluon.jit
    def _load_q(q_desc, q_row, q_col, q_ready, q_smem):
        # The tile's Q rows from q_row on: q_smem [BLOCK_M, D] in one box, or [BOXES, rows, D] in BOXES boxes of
        # q_desc's rows (three consumer warpgroups' 192 rows: TMA boxes are powers of two)
        if len(q_smem.type.shape) == 3:
            BOXES: gl.constexpr = q_smem.type.shape[0]
            BOX_M: gl.constexpr = q_desc.block_type.shape[0]
            mbarrier.expect(q_ready, BOXES * q_desc.block_type.nbytes)
            for i in gl.static_range(BOXES):
                _tma_load(q_desc, [q_row + i * BOX_M, q_col], q_ready, q_smem.index(i))
        else:
            mbarrier.expect(q_ready, q_desc.block_type.nbytes)
            _tma_load(q_desc, [q_row, q_col], q_ready, q_smem)

    @gluon.jit
    def _produce_tma(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty,
                     q_row, q_col, k_row, kv_col, num_blocks, it0, V_KEY_MAJOR: gl.constexpr):  # fmt: skip
        # V_KEY_MAJOR: v_desc describes V's key-major copy [Hk * D, keys] in tiles [D, BLOCK_N].
        # QUANTIZE_Q: q_desc / q_smem are the 16-bit q and its staging tile, which the consumers round from.
        BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        _load_q(q_desc, q_row, q_col, q_ready, q_smem)
        for j in range(num_blocks):
            s = (it0 + j) % STAGES
            # a fresh barrier's phase "1" counts as complete, so the first round does not wait
            mbarrier.wait(kv_empty.index(s), (((it0 + j) // STAGES) & 1) ^ 1)
            mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
            _tma_load(k_desc, [k_row + j * BLOCK_N, kv_col], k_ready.index(s), k_bufs.index(s))
            _wait_v_free(kv_empty, s, (((it0 + j) // STAGES) & 1) ^ 1, STAGES)
            mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
            if V_KEY_MAJOR:
                _tma_load(v_desc, [kv_col, k_row + j * BLOCK_N], v_ready.index(s), v_bufs.index(s))
            else:
                _tma_load(v_desc, [k_row + j * BLOCK_N, kv_col], v_ready.index(s), v_bufs.index(s))

    @gluon.jit
    def _produce_paged_tma(q_desc, k_desc, v_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, q_row,
                           q_col, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks, kv_head,
                           k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block, v_rows_per_head,
                           v_cols_per_head, num_blocks, it0, PAGE_SIZE: gl.constexpr):  # fmt: skip
        # Paged K/V through TMA: each page's run of CHUNK keys is one box of a 2-D view of the cache in which the keys
        # of one (block, kv head) are consecutive rows: key p of block b, head h is row b * k_rows_per_block +
        # h * k_rows_per_head + p, column h * k_cols_per_head (heads side by side in a row, or heads as runs of
        # rows; v_* likewise). Keys past the sequence come from the cache (clamped block ids): the consumers mask
        # their scores and zero their V rows.
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        CHUNK: gl.constexpr = k_desc.block_type.shape[0]  # keys per box: min(PAGE_SIZE, BLOCK_N)
        _load_q(q_desc, q_row, q_col, q_ready, q_smem)
        table_row = block_table_ptr + seq.to(gl.int64) * stride_bt_seq
        CHUNKS: gl.constexpr = BLOCK_N // CHUNK
        # a block's CHUNKS block ids in one load, every lane holding all of them (the copies are issued by one lane)
        ids_layout: gl.constexpr = gl.BlockedLayout([CHUNKS], [32], [1], [0])
        o_chunk = gl.arange(0, CHUNKS, layout=ids_layout)
        k_row0 = kv_head * k_rows_per_head
        v_row0 = kv_head * v_rows_per_head
        # block j's ids are loaded while block j - 1's copies are in flight (one load latency per block, not per page)
        next_ids = _page_block_id(table_row, o_chunk * CHUNK // PAGE_SIZE, max_blocks, num_cache_blocks)
        for j in range(num_blocks):
            s = (it0 + j) % STAGES
            ids = next_ids.to(gl.int32)
            next_key0 = (j + 1) * BLOCK_N + o_chunk * CHUNK
            next_ids = _page_block_id(table_row, next_key0 // PAGE_SIZE, max_blocks, num_cache_blocks)
            SPLIT: gl.constexpr = kv_empty.type.shape[0] == 2 * STAGES
            if SPLIT:  # K's boxes as soon as K's slot is free, V's once V's is (see _release_k)
                phase = (((it0 + j) // STAGES) & 1) ^ 1
                mbarrier.wait(kv_empty.index(s), phase)
                _page_boxes(k_desc, k_ready.index(s), k_bufs.index(s), ids, o_chunk, j * BLOCK_N, k_rows_per_block,
                            k_row0, kv_head * k_cols_per_head, PAGE_SIZE)  # fmt: skip
                _wait_v_free(kv_empty, s, phase, STAGES)
                _page_boxes(v_desc, v_ready.index(s), v_bufs.index(s), ids, o_chunk, j * BLOCK_N, v_rows_per_block,
                            v_row0, kv_head * v_cols_per_head, PAGE_SIZE)  # fmt: skip
            else:
                mbarrier.wait(kv_empty.index(s), (((it0 + j) // STAGES) & 1) ^ 1)
                mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes * CHUNKS)
                mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes * CHUNKS)
                for c in gl.static_range(CHUNKS):
                    block_id = gl.sum(gl.where(o_chunk == c, ids, 0), axis=0)  # within each lane: no shuffles
                    slot = (j * BLOCK_N + c * CHUNK) % PAGE_SIZE
                    _tma_load(k_desc, [block_id * k_rows_per_block + k_row0 + slot, kv_head * k_cols_per_head],
                              k_ready.index(s), k_bufs.index(s).slice(c * CHUNK, CHUNK))  # fmt: skip
                    _tma_load(v_desc, [block_id * v_rows_per_block + v_row0 + slot, kv_head * v_cols_per_head],
                              v_ready.index(s), v_bufs.index(s).slice(c * CHUNK, CHUNK))  # fmt: skip

    @gluon.jit
    def _page_boxes(desc, ready, slot_buf, ids, o_chunk, key0, rows_per_block, row0, col, PAGE_SIZE: gl.constexpr):
        # one block's keys of K or V into its ring slot through TMA, a box per page run (see _produce_paged_tma)
        CHUNK: gl.constexpr = desc.block_type.shape[0]
        CHUNKS: gl.constexpr = slot_buf.type.shape[0] // CHUNK
        mbarrier.expect(ready, desc.block_type.nbytes * CHUNKS)
        for c in gl.static_range(CHUNKS):
            block_id = gl.sum(gl.where(o_chunk == c, ids, 0), axis=0)  # within each lane: no shuffles
            slot = (key0 + c * CHUNK) % PAGE_SIZE
            _tma_load(desc, [block_id * rows_per_block + row0 + slot, col], ready, slot_buf.slice(c * CHUNK, CHUNK))

    @gluon.jit
    def _page_block_id(table_row, page, max_blocks, num_cache_blocks):
        # The cache block holding `page` of a sequence: the table column and the id it holds are clamped, so a bad
        # entry reads a wrong block of this cache, never memory outside it (int64: offsets may pass 2^31)
        block_id = gl.load(table_row + gl.minimum(page, max_blocks - 1))
        return gl.minimum(gl.maximum(block_id, 0), num_cache_blocks - 1).to(gl.int64)

    @gluon.jit
    def _produce_paged(q_desc, q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, q_row, q_col,
                       k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks, seq_k_len,
                       kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot,
                       stride_v_head, num_blocks, it0, PAGE_SIZE: gl.constexpr, VALID_D: gl.constexpr):  # fmt: skip
        # Paged K/V: each page's rows gathered with 16-byte cp.async into the swizzled slot; every producer thread
        # arrives on the ready barrier once its copies land. Keys past the sequence are zero-filled, and so are the
        # columns of a padded head (VALID_D < HEAD_DIM).
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        HEAD_DIM: gl.constexpr = k_bufs.type.shape[2]
        CHUNK: gl.constexpr = PAGE_SIZE if PAGE_SIZE < BLOCK_N else BLOCK_N  # rows that share one block id
        WARPS: gl.constexpr = gl.num_warps()
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [WARPS, 1], [1, 0])
        _load_q(q_desc, q_row, q_col, q_ready, q_smem)
        o_row = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
        o_d = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout)), 0)
        table_row = block_table_ptr + seq.to(gl.int64) * stride_bt_seq
        k_head = k_ptr + kv_head * stride_k_head
        v_head = v_ptr + kv_head * stride_v_head
        k_rows = gl.expand_dims(o_row, 1) * stride_k_slot + o_d  # [CHUNK, D] offsets within one page's chunk
        v_rows = gl.expand_dims(o_row, 1) * stride_v_slot + o_d
        for j in range(num_blocks):
            s = (it0 + j) % STAGES
            mbarrier.wait(kv_empty.index(s), (((it0 + j) // STAGES) & 1) ^ 1)
            for c in gl.static_range(BLOCK_N // CHUNK):
                key0 = j * BLOCK_N + c * CHUNK
                block_id = _page_block_id(table_row, key0 // PAGE_SIZE, max_blocks, num_cache_blocks)
                valid = gl.expand_dims(key0 + o_row < seq_k_len, 1)
                if VALID_D < HEAD_DIM:
                    valid = valid & (o_d < VALID_D)
                p_k = k_head + (block_id * stride_k_blk + (key0 % PAGE_SIZE) * stride_k_slot) + k_rows
                _cp_async_load(k_bufs.index(s).slice(c * CHUNK, CHUNK), p_k, mask=valid)
            async_copy.mbarrier_arrive(k_ready.index(s), increment_count=False)
            _wait_v_free(kv_empty, s, (((it0 + j) // STAGES) & 1) ^ 1, STAGES)
            for c in gl.static_range(BLOCK_N // CHUNK):
                key0 = j * BLOCK_N + c * CHUNK
                block_id = _page_block_id(table_row, key0 // PAGE_SIZE, max_blocks, num_cache_blocks)
                valid = gl.expand_dims(key0 + o_row < seq_k_len, 1)
                if VALID_D < HEAD_DIM:
                    valid = valid & (o_d < VALID_D)
                p_v = v_head + (block_id * stride_v_blk + (key0 % PAGE_SIZE) * stride_v_slot) + v_rows
                _cp_async_load(v_bufs.index(s).slice(c * CHUNK, CHUNK), p_v, mask=valid)
            async_copy.mbarrier_arrive(v_ready.index(s), increment_count=False)

    @gluon.jit
    def _gather_block_fp8(j, it0, k_bufs, v_stage, k_ready, kv_empty, k_head, v_head, k_rows, v_rows, o_row, table_row,
                          seq_k_len, max_blocks, num_cache_blocks, stride_k_blk, stride_k_slot, stride_v_blk,
                          stride_v_slot, PAGE_SIZE: gl.constexpr, PAGED: gl.constexpr = True,
                          seq_k_start=0):  # fmt: skip
        # Block j's K rows into its ring slot (k_ready once they land) and its V rows into staging tile j % 2, as
        # one cp.async group; keys past the sequence zero-filled. 16-bit K slots (K widened): K's rows go to
        # staging tile 2 + j % 2 instead, and the widening producer arrives on k_ready; nothing lands in the ring
        # then, so the copies need no free slot (the widening waits for it): they run ahead of the consumers by
        # the staging tiles, not by the ring. Not PAGED: contiguous K/V (rows from seq_k_start on, stride_*_slot
        # between tokens).
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        CHUNK: gl.constexpr = PAGE_SIZE if PAGED and PAGE_SIZE < BLOCK_N else BLOCK_N
        WIDEN_K: gl.constexpr = k_bufs.dtype.primitive_bitwidth == 16
        s = (it0 + j) % STAGES
        if not WIDEN_K:
            mbarrier.wait(kv_empty.index(s), (((it0 + j) // STAGES) & 1) ^ 1)
        for c in gl.static_range(BLOCK_N // CHUNK):
            key0 = j * BLOCK_N + c * CHUNK
            valid = gl.expand_dims(key0 + o_row < seq_k_len, 1)
            if PAGED:
                block_id = _page_block_id(table_row, key0 // PAGE_SIZE, max_blocks, num_cache_blocks)
                k_off = block_id * stride_k_blk + (key0 % PAGE_SIZE) * stride_k_slot
                v_off = block_id * stride_v_blk + (key0 % PAGE_SIZE) * stride_v_slot
            else:
                row = (seq_k_start + key0).to(gl.int64)  # rows past the sequence are masked: no read past total_k
                k_off = row * stride_k_slot
                v_off = row * stride_v_slot
            p_k = k_head + k_off + k_rows
            if WIDEN_K:
                _cp_async_load(v_stage.index(2 + j % 2).slice(c * CHUNK, CHUNK), p_k, mask=valid)
            else:
                _cp_async_load(k_bufs.index(s).slice(c * CHUNK, CHUNK), p_k, mask=valid)
            p_v = v_head + v_off + v_rows
            _cp_async_load(v_stage.index(j % 2).slice(c * CHUNK, CHUNK), p_v, mask=valid)
        if not WIDEN_K:
            async_copy.mbarrier_arrive(k_ready.index(s), increment_count=False)
        async_copy.commit_group()

    @gluon.jit
    def _produce_gathered_fp8(q_desc, q_smem, k_bufs, v_bufs, v_stage, q_ready, k_ready, v_ready, kv_empty, q_row,
                              q_col, k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks,
                              seq_k_len, kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk,
                              stride_v_slot, stride_v_head, num_blocks, it0, PAGE_SIZE: gl.constexpr,
                              PAGED: gl.constexpr = True, seq_k_start=0):  # fmt: skip
        # fp8 K/V, paged (or contiguous with K widened: rows from seq_k_start on): gathered as _produce_paged does,
        # V into two staging tiles [BLOCK_N, D] that the producer warps transpose into the key-major slot
        # [D, BLOCK_N] (keys in FP8_KEY_ORDER per group of 16, as _to_p orders P: the fp8 P@V's K-major operand),
        # or, with 16-bit V slots, widen to fp16 row by row (a 16-bit P@V). With 16-bit K slots (a 16-bit q) K is
        # staged and widened to q's type the same way (a 16-bit QK). Block j + 1's copies are in flight while
        # block j is transposed or widened.
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        HEAD_DIM: gl.constexpr = k_bufs.type.shape[2]
        CHUNK: gl.constexpr = PAGE_SIZE if PAGED and PAGE_SIZE < BLOCK_N else BLOCK_N
        WARPS: gl.constexpr = gl.num_warps()
        VEC: gl.constexpr = 16  # fp8 values per 16-byte copy
        WIDEN_ROWS: gl.constexpr = 32  # 16-bit V slots: rows widened per pass (8 registers of fp8 per thread)
        WIDEN_K: gl.constexpr = k_bufs.dtype.primitive_bitwidth == 16  # a 16-bit q: K widened to its type
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // (HEAD_DIM // VEC), HEAD_DIM // VEC], [WARPS, 1],
                                                [1, 0])  # fmt: skip
        _load_q(q_desc, q_row, q_col, q_ready, q_smem)  # QUANTIZE_Q: the 16-bit q into its staging tile
        o_row = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
        o_d = gl.expand_dims(gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout)), 0)
        table_row = block_table_ptr + seq.to(gl.int64) * stride_bt_seq
        k_head = k_ptr + kv_head * stride_k_head
        v_head = v_ptr + kv_head * stride_v_head
        k_rows = gl.expand_dims(o_row, 1) * stride_k_slot + o_d  # [CHUNK, D] offsets within one page's chunk
        v_rows = gl.expand_dims(o_row, 1) * stride_v_slot + o_d
        _gather_block_fp8(0, it0, k_bufs, v_stage, k_ready, kv_empty, k_head, v_head, k_rows, v_rows, o_row, table_row,
                          seq_k_len, max_blocks, num_cache_blocks, stride_k_blk, stride_k_slot, stride_v_blk,
                          stride_v_slot, PAGE_SIZE, PAGED, seq_k_start)  # fmt: skip
        for j in range(num_blocks):
            s = (it0 + j) % STAGES
            if j + 1 < num_blocks:
                _gather_block_fp8(j + 1, it0, k_bufs, v_stage, k_ready, kv_empty, k_head, v_head, k_rows, v_rows,
                                  o_row, table_row, seq_k_len, max_blocks, num_cache_blocks, stride_k_blk,
                                  stride_k_slot, stride_v_blk, stride_v_slot, PAGE_SIZE, PAGED,
                                  seq_k_start)  # fmt: skip
                async_copy.wait_group(1)  # block j's copies have landed (j + 1's may still fly)
            else:
                async_copy.wait_group(0)
            _thread_barrier()  # every producer warp's rows of block j
            if v_bufs.dtype.primitive_bitwidth == 8:
                _wait_v_free(kv_empty, s, (((it0 + j) // STAGES) & 1) ^ 1, STAGES)
                b_v = v_stage.index(j % 2).load(layout)  # [BN, D], key 16 g + 8 b + 2 a + c as (g, b, a, c)
                b_v = gl.reshape(b_v, [BLOCK_N // 16, 2, 4, 2, HEAD_DIM])
                b_v = gl.reshape(gl.permute(b_v, [0, 2, 1, 3, 4]), [BLOCK_N, HEAD_DIM])  # row 16 g + 4 a + 2 b + c
                v_bufs.index(s).store(gl.permute(b_v, [1, 0]))
            else:
                # 16-bit slots [BN, D] (fp8 -> fp16 / bf16 is exact): rows widened in place, a few rows at a time so
                # the values fit the producer's registers; no transpose, no reorder (a 16-bit P@V reads V row-major)
                if WIDEN_K:  # the ring slot's wait, which _gather_block_fp8 leaves to this point
                    mbarrier.wait(kv_empty.index(s), (((it0 + j) // STAGES) & 1) ^ 1)
                    for r in gl.static_range(BLOCK_N // WIDEN_ROWS):
                        b_k = v_stage.index(2 + j % 2).slice(r * WIDEN_ROWS, WIDEN_ROWS).load(layout)
                        k_bufs.index(s).slice(r * WIDEN_ROWS, WIDEN_ROWS).store(b_k.to(k_bufs.dtype))
                _wait_v_free(kv_empty, s, (((it0 + j) // STAGES) & 1) ^ 1, STAGES)
                for r in gl.static_range(BLOCK_N // WIDEN_ROWS):
                    b_v = v_stage.index(j % 2).slice(r * WIDEN_ROWS, WIDEN_ROWS).load(layout)
                    v_bufs.index(s).slice(r * WIDEN_ROWS, WIDEN_ROWS).store(b_v.to(v_bufs.dtype))
            fence_async_shared()  # the generic-proxy stores before the consumers' wgmma reads
            _thread_barrier()  # every warp is done with staging tile j % 2 before block j + 2's copies fill it
            if WIDEN_K:
                mbarrier.arrive(k_ready.index(s), count=1)
            mbarrier.arrive(v_ready.index(s), count=1)

    @gluon.jit
    def _wait_turn(turns, round, WG: gl.constexpr, PINGPONG: gl.constexpr):
        # Ping-pong (FA3's schedule): the consumer warpgroups (turns: one barrier each) take turns issuing their
        # wgmmas, so one's softmax runs while the others' matmuls occupy the tensor cores. Round r of warpgroup w > 0
        # waits for warpgroup w - 1's round r hand-over; round r of warpgroup 0 for the last one's round r - 1 (a
        # fresh barrier's parity 1 counts as complete, so round 0 of warpgroup 0 goes at once).
        if PINGPONG:
            FIRST_WG: gl.constexpr = 1 if WG == 0 else 0
            mbarrier.wait(turns.index(WG), (round & 1) ^ FIRST_WG)

    @gluon.jit
    def _pass_turn(turns, WG: gl.constexpr, PINGPONG: gl.constexpr):
        if PINGPONG:
            CONSUMERS: gl.constexpr = turns.type.shape[0]
            mbarrier.arrive(turns.index((WG + 1) % CONSUMERS), count=1)

    @gluon.jit
    def _release_k(kv_empty, s, STAGES: gl.constexpr):
        # kv_empty [2 STAGES] (EARLY_K_RELEASE, a split ring): slot s's K and V are handed back apart, K as soon as
        # its QK is done (index s, here) and V after its P@V (index STAGES + s: V_FREE + s at the arrive), so the
        # producer loads the next K a block earlier (FA3's separate K and V pipelines); [STAGES]: both after the P@V,
        # through index s (V_FREE = 0)
        SPLIT: gl.constexpr = kv_empty.type.shape[0] == 2 * STAGES
        if SPLIT:
            mbarrier.arrive(kv_empty.index(s), count=1)

    @gluon.jit
    def _wait_v_free(kv_empty, s, phase, STAGES: gl.constexpr):
        # the producer before it writes V into slot s (a split ring; else its wait for the slot covered V too)
        SPLIT: gl.constexpr = kv_empty.type.shape[0] == 2 * STAGES
        if SPLIT:
            mbarrier.wait(kv_empty.index(STAGES + s), phase)

    @gluon.jit
    def _fold_max(x):
        # [BM, N] -> [BM, N // 2]: columns c and c + N / 2 maxed (one thread holds both in the wgmma layout)
        BM: gl.constexpr = x.type.shape[0]
        N: gl.constexpr = x.type.shape[1]
        a, b = gl.split(gl.permute(gl.reshape(x, [BM, 2, N // 2]), [0, 2, 1]))
        return gl.maximum(a, b)

    @gluon.jit
    def _row_max(x, s_layout: gl.constexpr):
        # [BM, BN] -> [BM] (SliceLayout(1, s_layout)): gl.max folds each thread's values one after another, a
        # dependent chain of BN / 4 - 1 FMNMX per row (31 at 128 keys) before the quad's shuffles, and the softmax's
        # exponentials wait for it; halving the columns in place first makes it a tree (depth log2 of that)
        BN: gl.constexpr = x.type.shape[1]
        if BN >= 16:
            x = _fold_max(x)
        if BN >= 32:
            x = _fold_max(x)
        if BN >= 64:
            x = _fold_max(x)
        if BN >= 128:
            x = _fold_max(x)
        return gl.convert_layout(gl.max(x, 1), gl.SliceLayout(1, s_layout))

    @gluon.jit
    def _mask_scores(b_s, k_pos, q_pos, seq_k_len, diagonal, CAUSAL: gl.constexpr):
        # b_s [BM, BN] with -inf where key k_pos [BN] is not visible to query q_pos [BM]: the visible keys are
        # 0 <= k < end, end per row (the sequence's, causally its diagonal's + 1). One unsigned compare per score
        # takes both bounds (a key before the sequence, negative, compares as a huge number), in inline PTX so that
        # ptxas sees one setp and one selp per score. Written with gl.where the bounds become two selects per score
        # (two compares per column and row), or LLVM hoists the mask above the S wait and packs it into register
        # bits: sm_90, bf16 D 128 causal masked step 746 -> 650 instructions, fp8 key-major 1100 -> 708.
        if CAUSAL:
            end = gl.maximum(gl.minimum(q_pos + diagonal + 1, seq_k_len), 0)  # [BM]
        else:
            end = gl.zeros_like(q_pos) + seq_k_len
        k_2d, end_2d = gl.broadcast(gl.expand_dims(k_pos, 0), gl.expand_dims(end, 1))  # [BM, BN], s layout
        return gl.inline_asm_elementwise(
            asm="{ .reg .pred p; setp.lt.u32 p, $2, $3; selp.f32 $0, $1, 0fFF800000, p; }",
            constraints="=r,r,r,r", args=[b_s, k_2d.to(gl.int32), end_2d.to(gl.int32)], dtype=gl.float32,
            is_pure=True, pack=1,
        )  # fmt: skip

    @gluon.jit
    def _softmax_step(b_s, m_i, l_i, j, key_shift, q_pos, seq_k_len, diagonal, qk_scale, MASKED: gl.constexpr,
                      CAUSAL: gl.constexpr, BLOCK_N: gl.constexpr, s_layout: gl.constexpr,
                      ROW_SCALE: gl.constexpr, P_SCALE_LOG2: gl.constexpr,
                      P_PER_TILE: gl.constexpr = False, LEAN_SOFTMAX: gl.constexpr = False,
                      ROW_SUM: gl.constexpr = True, m_ref=0, MASK_PTX: gl.constexpr = False):  # fmt: skip
        # b_s: [BM, BN] raw scores of key block j; returns P (fp32), the new running max and sum, O's (and l's)
        # factor, and (P_PER_TILE) the reference max O and l are kept at from this block on (else alpha, unused).
        # qk_scale: scores -> log2 units, a scalar or (ROW_SCALE, a quantized q's row scales) [BM] and positive.
        # P_SCALE_LOG2: P (and l) come out 2^P_SCALE_LOG2 times larger, for fp8 P's range. P_PER_TILE instead: P
        # relative to this block's row max, which comes out as fp8's max (P_TILE_MAX), and O and l kept at that
        # scale too (m_ref: the previous block's reference; -inf before a row's first key): moving them from one
        # block's reference to the next is the factor the running max gives otherwise, so per-block P costs no
        # multiply per O value (the fp8 study's (b) at (c)'s instruction count).
        # Block j starts key_shift keys before key j * BLOCK_N of the sequence (fp8: the key grid starts on a group
        # of the key-major copy; 0 otherwise); keys before the sequence's first are masked like those after its last.
        # ROW_SUM False: l is left as it is (the caller sums P on the tensor cores, ROW_SUM_MMA).
        # MASK_PTX (config `ws_mask_ptx`): the mask as _mask_scores writes it, one compare per score.
        if MASKED:
            k_pos = j * BLOCK_N - key_shift + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))  # [BN]
            if MASK_PTX:
                b_s = _mask_scores(b_s, k_pos, q_pos, seq_k_len, diagonal, CAUSAL)
            else:
                if P_SCALE_LOG2 != 0:
                    valid = gl.expand_dims((k_pos < seq_k_len) & (k_pos >= 0), 0)
                else:
                    valid = gl.expand_dims(k_pos < seq_k_len, 0)
                if CAUSAL:
                    valid = valid & (gl.expand_dims(k_pos, 0) <= gl.expand_dims(q_pos + diagonal, 1))
                b_s = gl.where(valid, b_s, float("-inf"))
        if LEAN_SOFTMAX:
            m_tile = _row_max(b_s, s_layout) * qk_scale  # [BM], log2 domain
        else:
            m_tile = gl.max(b_s, 1) * qk_scale
        m_new = gl.maximum(m_i, m_tile)
        if MASKED:
            m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        else:
            m_use = m_new
        alpha = gl.exp2(m_i - m_use)
        beta = alpha
        if P_PER_TILE:
            # this block's reference: its row max, at most 2^64 below the running max (P further down underflows
            # fp8 anyway; the bound keeps O and l, held at the reference, finite)
            m_ref_new = gl.maximum(m_tile, m_new - 64.0)
            if MASKED:  # a row with no key in this block keeps its reference (0 while it has none: O, l are 0)
                m_keep = gl.where(m_new == float("-inf"), 0.0, m_ref)
                m_ref_new = gl.where(m_tile == float("-inf"), m_keep, m_ref_new)
            alpha = gl.exp2(m_ref - m_ref_new)  # 0 before a row's first key (O and l are 0 there)
            m_use = m_ref_new - P_TILE_MAX_LOG2
            if MASKED:
                m_ref_new = gl.where(m_new == float("-inf"), float("-inf"), m_ref_new)
            beta = m_ref_new
        elif P_SCALE_LOG2 != 0:
            m_use = m_use - P_SCALE_LOG2
        if ROW_SCALE:
            b_p = gl.exp2(b_s * gl.expand_dims(qk_scale, 1) - gl.expand_dims(m_use, 1))
        else:
            b_p = gl.exp2(b_s * qk_scale - gl.expand_dims(m_use, 1))
        if ROW_SUM:
            l_i = l_i * alpha + gl.sum(b_p, 1)
        return b_p, m_new, l_i, alpha, beta

    @gluon.jit
    def _after_softmax(l_i):
        # l_i through a loop ptxas cannot remove: a basic-block boundary after the block's exponentials (l sums them
        # all). ptxas schedules a wgmma wait as early as its block allows; without this the P@V's wait that follows
        # the softmax in _kv_step runs right after the row max (sm_90 SASS, every Gluon prefill), so a warpgroup's
        # exponentials never overlap its own P@V (config `ws_softmax_fence`). The loop goes round a second time only
        # for one NaN bit pattern of l, which leaves as another NaN.
        return gl.inline_asm_elementwise(
            asm="{ .reg .pred p; mov.b32 $0, $1; again: setp.eq.b32 p, $0, 0x7fc00001; @p xor.b32 $0, $0, 1; "
            "@p bra again; }",
            constraints="=r,r", args=[l_i], dtype=gl.float32, is_pure=False, pack=1,
        )  # fmt: skip

    @gluon.jit
    def _v_operand(v_bufs, s, V_KEY_MAJOR: gl.constexpr):
        # [BLOCK_N, D] B operand of P@V; a key-major slot [D, BLOCK_N] seen transposed (K-major, as fp8 wgmma needs)
        if V_KEY_MAJOR:
            return v_bufs.index(s).permute((1, 0))
        else:
            return v_bufs.index(s)

    @gluon.jit
    def _fp8_key_order(b_p):
        # [BM, BN] with the keys of each 16-key group reordered 0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15: then the four
        # P values of one fp8 A-operand register are already in one thread (the key-major V copy holds its keys in
        # the same order, key_major.FP8_KEY_ORDER). A reshape of registers: no data moves.
        BM: gl.constexpr = b_p.type.shape[0]
        BN: gl.constexpr = b_p.type.shape[1]
        return gl.reshape(gl.permute(gl.reshape(b_p, [BM, BN // 16, 2, 4, 2]), [0, 1, 3, 2, 4]), [BM, BN])

    @gluon.jit
    def _to_p(b_p, dtype: gl.constexpr, p_layout: gl.constexpr, LEAN_SOFTMAX: gl.constexpr = 0):
        # P (fp32, s layout) as the next P@V's A operand: 16-bit P in its dot-operand layout. fp8 P is carried to the
        # next step as fp16 pairs in the order _fp8_operand wants (a loop-carried fp8 tensor lives as one byte per
        # register and is repacked at every wgmma: ~180 instructions per block on sm_90). LEAN_SOFTMAX 2 (config
        # `ws_fp8_p_one_rounding`): fp8 P rounded once, from fp32, its four bytes carried in the first fp16 pair's
        # register (the second pair's is left unused): 2 conversions per 4 values instead of 4.
        IS_FP8: gl.constexpr = dtype.primitive_bitwidth == 8
        if IS_FP8:
            # in the A operand's register order (free: no value changes thread): each asm instance below and in
            # _fp8_operand then gets the four values of one operand register (the key order's layout groups two of
            # a row with two of the row 8 below it: 16 PRMT more per block, sm_90)
            p = gl.convert_layout(_fp8_key_order(b_p), p_layout, assert_trivial=True)
            if LEAN_SOFTMAX == 2:
                # cvt ...e4m3x2.f32 d, a, b puts a in the high byte: values 0 1 -> lo, 2 3 -> hi, as _fp8_operand
                p = gl.inline_asm_elementwise(
                    asm="{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $3, $2; "
                    "cvt.rn.satfinite.e4m3x2.f32 hi, $5, $4; mov.b32 $0, {lo, hi}; mov.b32 $1, 0; }",
                    constraints="=r,=r,r,r,r,r", args=[p], dtype=gl.float16, is_pure=True, pack=4,
                )  # fmt: skip
            else:
                p = p.to(gl.float16)
        elif LEAN_SOFTMAX:
            # two P values of a row per register, rounded as .to(dtype) would (cvt.rn); the first in the low half, as
            # the A operand wants it (a per-value cvt left ptxas packing them the other way round and swapping every
            # register back before the P@V: 32 PRMT per block)
            if dtype == gl.bfloat16:
                p = gl.inline_asm_elementwise(asm="cvt.rn.bf16x2.f32 $0, $2, $1;", constraints="=r,r,r", args=[b_p],
                                              dtype=gl.bfloat16, is_pure=True, pack=2)  # fmt: skip
            else:
                p = gl.inline_asm_elementwise(asm="cvt.rn.f16x2.f32 $0, $2, $1;", constraints="=r,r,r", args=[b_p],
                                              dtype=gl.float16, is_pure=True, pack=2)  # fmt: skip
            p = gl.convert_layout(p, p_layout)
        else:
            p = gl.convert_layout(b_p.to(dtype), p_layout)
        return p

    @gluon.jit
    def _fp8_operand(p16, p_layout: gl.constexpr, ROUNDED: gl.constexpr = False):
        # fp16 P (from _to_p) -> e4m3, four values packed per register in place: no data moves between threads.
        # pack=4: each asm instance gets two fp16 pairs ($1: values 0 1, $2: values 2 3) and returns four bytes;
        # ROUNDED: _to_p has put the four bytes in $1 already
        if ROUNDED:
            asm: gl.constexpr = "mov.b32 $0, $1;"
        else:
            asm: gl.constexpr = ("{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f16x2 lo, $1; "
                                 "cvt.rn.satfinite.e4m3x2.f16x2 hi, $2; mov.b32 $0, {lo, hi}; }")  # fmt: skip
        p8 = gl.inline_asm_elementwise(asm=asm, constraints="=r,r,r", args=[p16], dtype=gl.float8e4nv, is_pure=True,
                                       pack=4)  # fmt: skip
        return gl.convert_layout(p8, p_layout, assert_trivial=True)

    @gluon.jit
    def _p_narrow(b_p, dtype: gl.constexpr):
        # P (fp32, s layout) in the P@V's type for _p_store (config `ws_p_smem`); fp8 P rounded once, as LEAN_SOFTMAX
        # 2, in the key order of the key-major V copy
        if dtype.primitive_bitwidth == 8:
            b_p = _fp8_key_order(b_p)
        return b_p.to(dtype)

    @gluon.jit
    def _p_store(p, p_smem):
        # P into this warpgroup's tile [BM, BN], the next P@V's A operand (config `ws_p_smem`): P's registers are free
        # while that P@V runs, so O, S and the softmax fit where three consumer warpgroups leave 160 registers. The
        # caller has waited for the P@V that read the tile before (each warp its own 16 rows).
        p_smem.store(p)
        fence_async_shared()  # the generic-proxy stores before the wgmma reads them
        _thread_barrier()  # every warp's rows before the warpgroup's P@V

    @gluon.jit
    def _pv_issue(p_prev, v_op, b_o, o_zero, p_layout: gl.constexpr, TWO_LEVEL: gl.constexpr,
                  LEAN_SOFTMAX: gl.constexpr = 0, ones_smem=0, l_zero=0,
                  ROW_SUM_MMA: gl.constexpr = False, P_SMEM: gl.constexpr = False):  # fmt: skip
        # O += P @ V (async); TWO_LEVEL: P @ V alone, added to O after the wait. Returns its token and, with
        # ROW_SUM_MMA, that of P @ ones [BN, ROW_SUM_COLS] issued after it from the same operand (ones_smem:
        # [ROW_SUM_COLS, BN] e4m3 ones, K-major): P's row sums on the tensor cores instead of 64 FADD per thread and
        # 128-key block on the CUDA cores, and of the fp8 P the P@V uses (else the P@V's token twice)
        FP8_P: gl.constexpr = p_layout.k_width == 4
        if P_SMEM:  # p_prev: this warpgroup's P tile in shared memory (_p_store)
            a = p_prev
        elif FP8_P:
            a = _fp8_operand(p_prev, p_layout, LEAN_SOFTMAX == 2)
        else:
            a = p_prev
        if TWO_LEVEL:
            tok = warpgroup_mma(a, v_op, o_zero, use_acc=False, is_async=True)
        else:
            tok = warpgroup_mma(a, v_op, b_o, is_async=True)
        l_tok = tok
        if ROW_SUM_MMA:
            l_layout: gl.constexpr = l_zero.type.layout
            a_l = gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=l_layout, k_width=p_layout.k_width))
            l_tok = warpgroup_mma(a_l, ones_smem.permute((1, 0)), l_zero, use_acc=False, is_async=True)
        return tok, l_tok

    @gluon.jit
    def _pv_issue_prev(j, it0, sp, v_bufs, v_ready, p_prev, p_smem, b_o, o_zero, p_layout: gl.constexpr,
                       V_KEY_MAJOR: gl.constexpr, TWO_LEVEL: gl.constexpr, LEAN_SOFTMAX: gl.constexpr, ones_smem,
                       l_zero, ROW_SUM_MMA: gl.constexpr, P_SMEM: gl.constexpr):  # fmt: skip
        # _pv_issue of P_{j-1} V_{j-1} once V_{j-1} is in ring slot sp; P from registers (p_prev) or p_smem
        STAGES: gl.constexpr = v_bufs.type.shape[0]
        mbarrier.wait(v_ready.index(sp), ((it0 + j - 1) // STAGES) & 1)
        if P_SMEM:
            p_src = p_smem
        else:
            p_src = p_prev
        return _pv_issue(p_src, _v_operand(v_bufs, sp, V_KEY_MAJOR), b_o, o_zero, p_layout, TWO_LEVEL, LEAN_SOFTMAX,
                         ones_smem, l_zero, ROW_SUM_MMA, P_SMEM)  # fmt: skip

    @gluon.jit
    def _kv_step_serial(j, it0, turn0, s, sp, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turns, s_zero,
                        o_zero, b_o, m_i, l_i, p_prev, m_ref, key_shift, q_pos, seq_k_len, diagonal, qk_scale,
                        MASKED: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
                        p_layout: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr, V_KEY_MAJOR: gl.constexpr,
                        P_SCALE_LOG2: gl.constexpr, TWO_LEVEL: gl.constexpr, P_PER_TILE: gl.constexpr,
                        ROW_SCALE: gl.constexpr, LEAN_SOFTMAX: gl.constexpr, b_l, p_smem, P_SMEM: gl.constexpr,
                        V_FREE: gl.constexpr, MASK_PTX: gl.constexpr = False, TWO_LEVEL_FMA: gl.constexpr = False,
                        o_alpha=0):  # fmt: skip
        # _kv_step, serial (PINGPONG 2): O += P_{j-1} V_{j-1} (issued in this warpgroup's turn, which passes on at
        # once, and waited for), then S_j = Q K_j^T and its softmax; O is then moved to block j's reference (alpha)
        # and P_j kept (registers) or stored (P_SMEM) for the next step. The P@V's product (two-level) or P and S
        # never hold registers at once
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        _wait_turn(turns, turn0 + j, WG, PINGPONG)
        o_tok, l_tok = _pv_issue_prev(j, it0, sp, v_bufs, v_ready, p_prev, p_smem, b_o, o_zero, p_layout,
                                      V_KEY_MAJOR, TWO_LEVEL, LEAN_SOFTMAX, 0, 0, False, P_SMEM)  # fmt: skip
        _pass_turn(turns, WG, PINGPONG)
        if V_KEY_MAJOR or P_SMEM:  # (as _kv_step: an fp8 operand is made in _pv_issue, P_SMEM has none)
            b_pv = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
        else:  # a 16-bit P in registers is kept until its P@V is done
            b_pv, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_prev))
        if TWO_LEVEL and TWO_LEVEL_FMA:  # O to block j-1's reference and P_{j-1} V_{j-1} added: one FFMA (_kv_step)
            b_o = b_o * gl.expand_dims(gl.convert_layout(o_alpha, gl.SliceLayout(1, o_layout)), 1) + b_pv
        elif TWO_LEVEL:
            b_o = b_o + b_pv
        else:
            b_o = b_pv
        mbarrier.arrive(kv_empty.index(V_FREE + sp), count=1)
        mbarrier.wait(k_ready.index(s), ((it0 + j) // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_bufs.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        _release_k(kv_empty, s, STAGES)
        b_p, m_i, l_i, alpha, m_ref = _softmax_step(b_s, m_i, l_i, j, key_shift, q_pos, seq_k_len, diagonal,
                                                    qk_scale, MASKED, CAUSAL, BLOCK_N, s_layout, ROW_SCALE,
                                                    P_SCALE_LOG2, P_PER_TILE, LEAN_SOFTMAX, True, m_ref,
                                                    MASK_PTX)  # fmt: skip
        if TWO_LEVEL and TWO_LEVEL_FMA:
            o_alpha = alpha
        else:
            b_o = b_o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        if P_SMEM:
            _p_store(_p_narrow(b_p, v_bufs.dtype), p_smem)
            p_next = p_prev
        else:
            p_next = _to_p(b_p, v_bufs.dtype, p_layout, LEAN_SOFTMAX)
        return b_o, m_i, l_i, p_next, m_ref, b_l, o_alpha

    @gluon.jit
    def _kv_step(j, it0, turn0, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turns, s_zero,
                 o_zero, b_o, m_i, l_i, p_prev, m_ref, key_shift, q_pos, seq_k_len, diagonal, qk_scale,
                 MASKED: gl.constexpr, CAUSAL: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
                 p_layout: gl.constexpr, WG: gl.constexpr, PINGPONG: gl.constexpr, V_KEY_MAJOR: gl.constexpr,
                 P_SCALE_LOG2: gl.constexpr, TWO_LEVEL: gl.constexpr, P_PER_TILE: gl.constexpr,
                 ROW_SCALE: gl.constexpr, LEAN_SOFTMAX: gl.constexpr, ones_smem=0, b_l=0, l_zero=0,
                 ROW_SUM_MMA: gl.constexpr = False, p_smem=0, P_SMEM: gl.constexpr = False,
                 SOFTMAX_FENCE: gl.constexpr = False, MASK_PTX: gl.constexpr = False,
                 TWO_LEVEL_FMA: gl.constexpr = False, o_alpha=0):  # fmt: skip
        # S_j = Q K_j^T is issued before O += P_{j-1} V_{j-1}; the softmax of S_j overlaps that P@V. it0 / turn0: the
        # K/V blocks and wgmma turns this warpgroup has used before this tile (ring slots and phases go on).
        # ROW_SUM_MMA (two-level fp8 P@V): l as b_l [BM, ROW_SUM_COLS], P_{j-1} @ ones issued after its P@V (_pv_issue)
        # P_SMEM: P goes through p_smem (written once P_{j-1}'s P@V is done); p_prev is an unused placeholder.
        # TWO_LEVEL_FMA (two-level): O is kept at block j-1's reference until P_{j-1} V_{j-1} is added, in one FFMA
        # with the move there from j-2's (o_alpha, the previous step's alpha; this step's is returned as o_alpha),
        # not an FADD and an FMUL (O at block j's reference as soon as the add is done).
        # PINGPONG 2 (serial, _kv_step_serial): P_{j-1} V_{j-1} is issued first and waited for before S_j is issued,
        # so the registers of one never wait beside the other's: three consumer warpgroups' 160 registers hold a
        # two-level fp8 P@V or a 16-bit P, while the other warpgroups' matmuls fill the tensor cores.
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        V_FREE: gl.constexpr = kv_empty.type.shape[0] - STAGES  # where V's hand-backs start (see _release_k)
        s = (it0 + j) % STAGES
        sp = (it0 + j - 1) % STAGES
        if PINGPONG == 2:
            return _kv_step_serial(j, it0, turn0, s, sp, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turns,
                                   s_zero, o_zero, b_o, m_i, l_i, p_prev, m_ref, key_shift, q_pos, seq_k_len, diagonal,
                                   qk_scale, MASKED, CAUSAL, s_layout, o_layout, p_layout, WG, PINGPONG, V_KEY_MAJOR,
                                   P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE, ROW_SCALE, LEAN_SOFTMAX, b_l, p_smem, P_SMEM,
                                   V_FREE, MASK_PTX, TWO_LEVEL_FMA, o_alpha)  # fmt: skip
        mbarrier.wait(k_ready.index(s), ((it0 + j) // STAGES) & 1)
        _wait_turn(turns, turn0 + j, WG, PINGPONG)
        s_tok = warpgroup_mma(q_smem, k_bufs.index(s).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        o_tok, l_tok = _pv_issue_prev(j, it0, sp, v_bufs, v_ready, p_prev, p_smem, b_o, o_zero, p_layout,
                                      V_KEY_MAJOR, TWO_LEVEL, LEAN_SOFTMAX, ones_smem, l_zero, ROW_SUM_MMA,
                                      P_SMEM)  # fmt: skip
        _pass_turn(turns, WG, PINGPONG)
        b_s = warpgroup_mma_wait(num_outstanding=2 if ROW_SUM_MMA else 1, deps=(s_tok,))
        _release_k(kv_empty, s, STAGES)
        b_p, m_i, l_i, alpha, m_ref = _softmax_step(b_s, m_i, l_i, j, key_shift, q_pos, seq_k_len, diagonal,
                                                    qk_scale, MASKED, CAUSAL, BLOCK_N, s_layout, ROW_SCALE,
                                                    P_SCALE_LOG2, P_PER_TILE, LEAN_SOFTMAX, not ROW_SUM_MMA,
                                                    m_ref, MASK_PTX)  # fmt: skip
        if SOFTMAX_FENCE:  # the P@V's wait below after every exponential (_after_softmax)
            l_i = _after_softmax(l_i)
        if P_SMEM:
            p_next = p_prev
            p_narrow = _p_narrow(b_p, v_bufs.dtype)
        else:
            p_next = _to_p(b_p, v_bufs.dtype, p_layout, LEAN_SOFTMAX)
        if V_KEY_MAJOR or P_SMEM:
            # the P operand is made in _pv_issue (fp8: 8-bit registers cannot be a dependency of the wait, triton
            # 3.6-3.9); ptxas keeps its registers until the wgmma is done. P_SMEM: no P registers to keep
            if ROW_SUM_MMA:
                b_pv, b_ls = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, l_tok))
                mbarrier.arrive(kv_empty.index(V_FREE + sp), count=1)
                b_o = (b_o + b_pv) * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
                b_l = (b_l + b_ls) * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, b_l.type.layout)), 1)
            elif TWO_LEVEL and TWO_LEVEL_FMA:
                b_pv = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
                mbarrier.arrive(kv_empty.index(V_FREE + sp), count=1)
                b_o = b_o * gl.expand_dims(gl.convert_layout(o_alpha, gl.SliceLayout(1, o_layout)), 1) + b_pv
                o_alpha = alpha
            elif TWO_LEVEL:
                b_pv = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
                mbarrier.arrive(kv_empty.index(V_FREE + sp), count=1)
                b_o = (b_o + b_pv) * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
            else:
                b_o = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
                mbarrier.arrive(kv_empty.index(V_FREE + sp), count=1)
                b_o = b_o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        elif TWO_LEVEL:
            b_pv, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_prev))
            mbarrier.arrive(kv_empty.index(V_FREE + sp), count=1)
            b_o = (b_o + b_pv) * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        else:
            b_o, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_prev))
            mbarrier.arrive(kv_empty.index(V_FREE + sp), count=1)
            b_o = b_o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
        if P_SMEM:
            _p_store(p_narrow, p_smem)
        return b_o, m_i, l_i, p_next, m_ref, b_l, o_alpha

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
    def _zero_cols_from(tile, first_col, num_warps: gl.constexpr):
        # _zero_rows_from for columns: a padded head's columns past its size
        COLS: gl.constexpr = tile.type.shape[1]
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (COLS // 8), COLS // 8], [num_warps, 1], [1, 0])
        cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        values = tile.load(layout)
        tile.store(gl.where(gl.expand_dims(cols < first_col, 0), values, gl.zeros_like(values)))
        fence_async_shared()  # the generic-proxy stores before the wgmma's async-proxy reads
        _thread_barrier()  # every warp's rows before the warpgroup's QK

    @gluon.jit
    def _zero_keys_outside(tile, key0, seq_k_len, num_warps: gl.constexpr):
        # _zero_rows_from for a key-major fp8 V slot [D, BLOCK_N] whose first column is key key0 of the sequence:
        # column c holds key key0 + 16 (c // 16) + FP8_KEY_ORDER[c % 16]; zero those outside [0, seq_k_len)
        COLS: gl.constexpr = tile.type.shape[1]
        VEC: gl.constexpr = 128 // tile.dtype.primitive_bitwidth  # 16-byte accesses
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // (COLS // VEC), COLS // VEC], [num_warps, 1], [1, 0])
        c = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
        slot = c % 16
        key = key0 + (c - slot) + 8 * ((slot // 2) % 2) + 2 * (slot // 4) + slot % 2
        values = tile.load(layout)
        keep = gl.expand_dims((key >= 0) & (key < seq_k_len), 0)
        tile.store(gl.where(keep, values, gl.zeros_like(values)))
        fence_async_shared()
        _thread_barrier()

    @gluon.jit
    def _quantize_q_rows(q_smem, q_rows, q_ready, q_phase, valid_rows, Q_MAX: gl.constexpr,
                         num_warps: gl.constexpr):  # fmt: skip
        # This warpgroup's rows of a 16-bit q (q_rows: the producer's staging tile, TMA-loaded, ready on q_ready;
        # rows from valid_rows on are not the sequence's and count as zeros), each divided by a power of two that
        # brings its largest |q| within Q_MAX, stored as fp8 into q_smem for the QK wgmma. Returns the row scales
        # [ROWS] (exact: powers of two).
        ROWS: gl.constexpr = q_smem.type.shape[0]
        HEAD_DIM: gl.constexpr = q_smem.type.shape[1]
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1], [1, 0])
        o_row = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        mbarrier.wait(q_ready, q_phase)
        b_q = q_rows.load(layout).to(gl.float32)
        b_q = gl.where(gl.expand_dims(o_row < valid_rows, 1), b_q, 0.0)
        q_amax = gl.max(gl.abs(b_q), 1)  # [ROWS]
        row_scale = gl.where(q_amax > 0.0, gl.exp2(gl.ceil(gl.log2(gl.maximum(q_amax, 1e-30) / Q_MAX))), 1.0)
        b_q = b_q * gl.expand_dims(1.0 / row_scale, 1)
        q_smem.store(b_q.to(q_smem.dtype))
        fence_async_shared()  # the generic-proxy stores before the wgmma's async-proxy reads
        _thread_barrier()  # every warp's rows before the warpgroup's QK
        return row_scale

    @gluon.jit
    def _own_rows(tile, ROW0: gl.constexpr, ROWS: gl.constexpr):
        # A consumer warpgroup's ROWS rows of a Q tile: a slice of [BLOCK_M, D], or its piece of [pieces, ROWS, D]
        # (three consumer warpgroups: Q in 64-row boxes, see _load_q)
        if len(tile.type.shape) == 3:
            return tile.index(ROW0 // ROWS)
        else:
            return tile.slice(ROW0, ROWS, dim=0)

    @gluon.jit
    def _consumer(q_tile_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, q_src, out_ptr, lse_ptr,
                  seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len, num_blocks, key_shift, qk_scale, out_scale,
                  stride_o_tok, stride_o_head, stride_lse_head, ROW0: gl.constexpr,
                  ROWS: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, RETURN_LSE: gl.constexpr,
                  ZERO_TAIL: gl.constexpr, FP8: gl.constexpr, P_SCALE_LOG2: gl.constexpr, TWO_LEVEL: gl.constexpr,
                  P_PER_TILE: gl.constexpr, LEAN_SOFTMAX: gl.constexpr,
                  QUANTIZE_Q: gl.constexpr, Q_MAX: gl.constexpr, num_warps: gl.constexpr, it0=0, turn0=0,
                  q_phase=0, VALID_D: gl.constexpr = 0, q_empty=0,
                  RELEASE_Q: gl.constexpr = False, ones_smem=0, ROW_SUM_MMA: gl.constexpr = False, p_bufs=0,
                  P_SMEM: gl.constexpr = False, SOFTMAX_FENCE: gl.constexpr = False,
                  MASK_PTX: gl.constexpr = False, TWO_LEVEL_FMA: gl.constexpr = False):  # fmt: skip
        # This warpgroup's ROWS query rows start at row ROW0 of the tile; both warpgroups walk the tile's blocks.
        # QUANTIZE_Q: q_src is the tile's 16-bit q staged by the producer [BLOCK_M, D], rounded here into q_tile_smem
        # (see _quantize_q_rows); else unused. RELEASE_Q: arrive on q_empty once rounded (the persistent grid).
        # VALID_D < HEAD_DIM: a head size padded to the tiles' width. The boxes' extra columns hold the next head's
        # values (zeros past the last head): zeroed in Q, so K's cancel in QK; O's are not stored.
        # it0 / turn0 / q_phase: K/V blocks, wgmma turns and Q loads of this program's earlier tiles (persistent).
        # FP8: V slots are key-major, P and l are scaled by 2^P_SCALE_LOG2, O takes out_scale (V's descale); with
        # 16-bit V slots (gathered fp8 V widened by the producer) QK stays fp8 and P@V is a 16-bit one.
        # ROW_SUM_MMA (two-level fp8 P@V only): l from P @ ones on the tensor cores (ones_smem, see _pv_issue).
        # P_SMEM: P reaches its P@V through this warpgroup's tile of p_bufs [CONSUMERS, ROWS, BLOCK_N] (_p_store).
        # SOFTMAX_FENCE: each block's P@V waited for after its softmax's exponentials, not before (_after_softmax).
        V_KEY_MAJOR: gl.constexpr = FP8 and v_bufs.dtype.primitive_bitwidth == 8
        WG: gl.constexpr = ROW0 // ROWS  # 0, 1 (or 2: three consumer warpgroups, the flat grid's 192-row tiles)
        q_smem = _own_rows(q_tile_smem, ROW0, ROWS)
        if P_SMEM:
            p_smem = p_bufs.index(WG)
        else:
            p_smem = q_smem  # unused
        q_tile_start = q_tile_start + ROW0
        BLOCK_M: gl.constexpr = ROWS
        HEAD_DIM: gl.constexpr = q_smem.type.shape[1]
        STAGES: gl.constexpr = k_bufs.type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        V_FREE: gl.constexpr = kv_empty.type.shape[0] - STAGES  # where V's hand-backs start (see _release_k)
        INSTR_K: gl.constexpr = 256 // q_smem.dtype.primitive_bitwidth  # wgmma's K: 16 (16-bit), 32 (fp8)
        INSTR_K_PV: gl.constexpr = 256 // v_bufs.dtype.primitive_bitwidth  # P@V's
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, INSTR_K]
        )
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HEAD_DIM, INSTR_K_PV]
        )
        # registers hold 32 bits of A per k step: 2 16-bit values or 4 fp8 ones
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=INSTR_K_PV // 8)
        row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
        TWO_LEVEL_PV: gl.constexpr = V_KEY_MAJOR and TWO_LEVEL
        # P rounded to fp8 at its block's row max: O and l move from one block's reference to the next by alpha,
        # the same whether the block's P@V is added to O on its own (two-level) or chained in the MMA
        P_PER_TILE_PV: gl.constexpr = V_KEY_MAJOR and P_PER_TILE
        ROW_SUM_PV: gl.constexpr = ROW_SUM_MMA and TWO_LEVEL_PV and not P_PER_TILE_PV
        FENCE: gl.constexpr = SOFTMAX_FENCE and not ROW_SUM_PV  # (the fence reads l, which P @ ones leaves alone)
        # P @ ones' accumulator: ROW_SUM_COLS columns, every one a row's sum
        l_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, ROW_SUM_COLS, INSTR_K_PV]
        )

        q_pos = q_tile_start + gl.arange(0, BLOCK_M, layout=row_layout)  # [BM] query position in the sequence
        diagonal = seq_k_len - seq_q_len  # bottom-right alignment: query i lines up with key i + diagonal
        # blocks every key of which every row of this warpgroup may see (no mask needed)
        if CAUSAL:
            num_full = (gl.maximum(gl.minimum(q_tile_start + diagonal + 1, seq_k_len), 0) + key_shift) // BLOCK_N
        else:
            num_full = (seq_k_len + key_shift) // BLOCK_N
        num_full = gl.minimum(num_full, num_blocks)
        if FP8:
            first_full = (num_full > 0) & (key_shift == 0)  # a shifted block 0 starts before the sequence
        else:
            first_full = num_full > 0
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        o_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
        l_i = gl.zeros([BLOCK_M], gl.float32, row_layout)
        b_o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        l_zero = gl.zeros([BLOCK_M, ROW_SUM_COLS], gl.float32, l_layout)
        b_l = gl.zeros([BLOCK_M, ROW_SUM_COLS], gl.float32, l_layout)

        if QUANTIZE_Q:
            row_scale = _quantize_q_rows(q_smem, _own_rows(q_src, ROW0, ROWS), q_ready, q_phase,
                                         seq_q_len - q_tile_start, Q_MAX, num_warps)  # fmt: skip
            if RELEASE_Q:
                mbarrier.arrive(q_empty, count=1)  # the staging tile is read (and fenced): the next q may load
            qk_scale = gl.convert_layout(row_scale, row_layout) * qk_scale
        else:
            mbarrier.wait(q_ready, q_phase)
            if VALID_D > 0 and VALID_D < HEAD_DIM:
                _zero_cols_from(q_smem, VALID_D, num_warps)
        # block 0: S_0 alone (nothing to overlap with yet)
        s0 = it0 % STAGES
        mbarrier.wait(k_ready.index(s0), (it0 // STAGES) & 1)
        _wait_turn(turns, turn0, WG, PINGPONG)
        s_tok = warpgroup_mma(q_smem, k_bufs.index(s0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        _pass_turn(turns, WG, PINGPONG)
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))
        _release_k(kv_empty, s0, STAGES)
        m_ref = m_i  # P_PER_TILE: -inf, no reference before a row's first key
        if first_full:
            b_p, m_i, l_i, alpha, m_ref = _softmax_step(b_s, m_i, l_i, 0, key_shift, q_pos, seq_k_len, diagonal,
                                                        qk_scale, False, CAUSAL, BLOCK_N, s_layout, QUANTIZE_Q,
                                                        P_SCALE_LOG2, P_PER_TILE_PV, LEAN_SOFTMAX,
                                                        not ROW_SUM_PV, m_ref, MASK_PTX)  # fmt: skip
        else:
            b_p, m_i, l_i, alpha, m_ref = _softmax_step(b_s, m_i, l_i, 0, key_shift, q_pos, seq_k_len, diagonal,
                                                        qk_scale, True, CAUSAL, BLOCK_N, s_layout, QUANTIZE_Q,
                                                        P_SCALE_LOG2, P_PER_TILE_PV, LEAN_SOFTMAX,
                                                        not ROW_SUM_PV, m_ref, MASK_PTX)  # fmt: skip
        o_alpha = alpha  # TWO_LEVEL_FMA: O's move to block 0's reference (O is 0; alpha is 0, finite)
        if P_SMEM:
            _p_store(_p_narrow(b_p, v_bufs.dtype), p_smem)
            p_prev = 0  # a placeholder the steps carry
        else:
            p_prev = _to_p(b_p, v_bufs.dtype, p_layout, LEAN_SOFTMAX)
        if V_KEY_MAJOR:
            if key_shift > 0:
                # block 0's first keys belong to the sequence before: zero them (and any past this one's end)
                mbarrier.wait(v_ready.index(s0), (it0 // STAGES) & 1)
                _zero_keys_outside(v_bufs.index(s0), -key_shift, seq_k_len, num_warps)
        # interior blocks: every key visible to every row, no mask
        for j in range(1, num_full):
            b_o, m_i, l_i, p_prev, m_ref, b_l, o_alpha = _kv_step(
                j, it0, turn0, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turns, s_zero, o_zero, b_o, m_i,
                l_i, p_prev, m_ref, key_shift, q_pos, seq_k_len, diagonal, qk_scale, False, CAUSAL, s_layout,
                o_layout, p_layout, WG, PINGPONG, V_KEY_MAJOR, P_SCALE_LOG2, TWO_LEVEL_PV, P_PER_TILE_PV, QUANTIZE_Q,
                LEAN_SOFTMAX, ones_smem, b_l, l_zero, ROW_SUM_PV, p_smem, P_SMEM, FENCE, MASK_PTX, TWO_LEVEL_FMA,
                o_alpha)  # fmt: skip
        # blocks on the causal diagonal or past the sequence's last key
        for j in range(gl.maximum(num_full, 1), num_blocks):
            b_o, m_i, l_i, p_prev, m_ref, b_l, o_alpha = _kv_step(
                j, it0, turn0, q_smem, k_bufs, v_bufs, k_ready, v_ready, kv_empty, turns, s_zero, o_zero, b_o, m_i,
                l_i, p_prev, m_ref, key_shift, q_pos, seq_k_len, diagonal, qk_scale, True, CAUSAL, s_layout,
                o_layout, p_layout, WG, PINGPONG, V_KEY_MAJOR, P_SCALE_LOG2, TWO_LEVEL_PV, P_PER_TILE_PV, QUANTIZE_Q,
                LEAN_SOFTMAX, ones_smem, b_l, l_zero, ROW_SUM_PV, p_smem, P_SMEM, FENCE, MASK_PTX, TWO_LEVEL_FMA,
                o_alpha)  # fmt: skip
        last = num_blocks - 1
        s_last = (it0 + last) % STAGES
        mbarrier.wait(v_ready.index(s_last), ((it0 + last) // STAGES) & 1)
        if ZERO_TAIL and (last + 1) * BLOCK_N - key_shift > seq_k_len:
            # The last block runs past the sequence: its V rows there belong to the next sequence or to whatever
            # follows the last one, and P = 0 does not cancel a non-finite value. Zero them before P@V.
            if V_KEY_MAJOR:
                _zero_keys_outside(v_bufs.index(s_last), last * BLOCK_N - key_shift, seq_k_len, num_warps)
            else:
                _zero_rows_from(v_bufs.index(s_last), seq_k_len - last * BLOCK_N, num_warps)
        _wait_turn(turns, turn0 + num_blocks, WG, PINGPONG)
        if P_SMEM:
            p_prev = p_smem
        o_tok, l_tok = _pv_issue(p_prev, _v_operand(v_bufs, s_last, V_KEY_MAJOR), b_o, o_zero, p_layout,
                                 TWO_LEVEL_PV, LEAN_SOFTMAX, ones_smem, l_zero, ROW_SUM_PV, P_SMEM)  # fmt: skip
        _pass_turn(turns, WG, PINGPONG)
        if ROW_SUM_PV:
            b_pv, b_ls = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, l_tok))
            b_o = b_o + b_pv
            # every column holds the row's sum: the max of a row's columns reads one of them
            l_i = gl.convert_layout(gl.max(b_l + b_ls, 1), row_layout)
        elif TWO_LEVEL_PV and TWO_LEVEL_FMA:  # O to the last block's reference, its P@V added (_kv_step)
            b_pv = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
            b_o = b_o * gl.expand_dims(gl.convert_layout(o_alpha, gl.SliceLayout(1, o_layout)), 1) + b_pv
        elif TWO_LEVEL_PV:  # (P_PER_TILE_PV either way: the last block's P@V is at the reference O is kept at)
            b_o = b_o + warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
        else:
            b_o = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
        mbarrier.arrive(kv_empty.index(V_FREE + s_last), count=1)

        # Rows that saw no key have l = 0 and O = 0: divide by 1 so they come out as 0, not NaN.
        l_safe = gl.where(l_i == 0.0, 1.0, l_i)
        o_factor = out_scale / l_safe  # out_scale: V's descale (1 without one)
        b_o = b_o * gl.expand_dims(gl.convert_layout(o_factor, gl.SliceLayout(1, o_layout)), 1)
        # 16-byte stores: each thread writes 8 consecutive elements of a row
        store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1],
                                                      [1, 0])  # fmt: skip
        b_out = gl.convert_layout(b_o.to(out_ptr.dtype.element_ty), store_layout)
        o_row = q_tile_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, store_layout))
        o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, store_layout))
        i_tok = (seq_q_start + o_row).to(gl.int64)
        p_o = out_ptr + gl.expand_dims(i_tok * stride_o_tok, 1) + q_head * stride_o_head + gl.expand_dims(o_d, 0)
        if VALID_D > 0 and VALID_D < HEAD_DIM:
            gl.store(p_o, b_out, mask=gl.expand_dims(o_row < seq_q_len, 1) & gl.expand_dims(o_d < VALID_D, 0))
        else:
            gl.store(p_o, b_out, mask=gl.expand_dims(o_row < seq_q_len, 1))
        if RETURN_LSE:
            m_lse = m_i
            if P_PER_TILE_PV:
                m_lse = m_ref - P_TILE_MAX_LOG2  # l is at the last reference, P_TILE_MAX for its row max
            elif P_SCALE_LOG2 != 0:
                m_lse = m_i - P_SCALE_LOG2  # l is 2^P_SCALE_LOG2 too large
            lse = gl.where(l_i == 0.0, float("-inf"), (m_lse + gl.log2(l_safe)) * 0.6931471805599453)
            i_tok_r = (seq_q_start + q_pos).to(gl.int64)
            gl.store(lse_ptr + q_head.to(gl.int64) * stride_lse_head + i_tok_r, lse, mask=q_pos < seq_q_len)

    @gluon.jit
    def _consumer_default(q_tile_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, q_src, out_ptr,
                          lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len, num_blocks, key_shift,
                          qk_scale, out_scale, stride_o_tok, stride_o_head,
                          stride_lse_head,
                          ROW0: gl.constexpr, ROWS: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                          RETURN_LSE: gl.constexpr, ZERO_TAIL: gl.constexpr, FP8: gl.constexpr,
                          P_SCALE_LOG2: gl.constexpr, TWO_LEVEL: gl.constexpr, P_PER_TILE: gl.constexpr,
                          LEAN_SOFTMAX: gl.constexpr,
                          QUANTIZE_Q: gl.constexpr, Q_MAX: gl.constexpr, num_warps: gl.constexpr, it0, turn0, q_phase,
                          VALID_D: gl.constexpr, ones_smem, ROW_SUM_MMA: gl.constexpr, p_bufs=0,
                          P_SMEM: gl.constexpr = False, SOFTMAX_FENCE: gl.constexpr = False,
                          MASK_PTX: gl.constexpr = False, TWO_LEVEL_FMA: gl.constexpr = False):  # fmt: skip
        # the default partition of gl.warp_specialize must return a tuple
        _consumer(q_tile_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, q_src, out_ptr, lse_ptr,
                  seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len, num_blocks, key_shift, qk_scale, out_scale,
                  stride_o_tok, stride_o_head, stride_lse_head, ROW0, ROWS, CAUSAL,
                  PINGPONG, RETURN_LSE, ZERO_TAIL, FP8, P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE, LEAN_SOFTMAX,
                  QUANTIZE_Q, Q_MAX,
                  num_warps, it0, turn0, q_phase, VALID_D, 0, False, ones_smem, ROW_SUM_MMA, p_bufs,
                  P_SMEM, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)  # fmt: skip
        return ()

    @gluon.jit
    def _scales(softmax_scale, seq, kv_head, q_descale_ptr, k_descale_ptr, v_descale_ptr, stride_qdesc_seq,
                stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head, stride_vdesc_seq, stride_vdesc_head,
                HAS_Q_DESCALE: gl.constexpr, HAS_K_DESCALE: gl.constexpr, HAS_V_DESCALE: gl.constexpr):  # fmt: skip
        # (scores -> log2 units, O's factor besides 1 / l) of one (sequence, kv head): descales fold in here
        qk_scale = softmax_scale * 1.4426950408889634  # log2 domain: exp2 with the scale folded in
        out_scale = gl.to_tensor(1.0)
        if HAS_Q_DESCALE:
            qk_scale *= gl.load(q_descale_ptr + seq * stride_qdesc_seq + kv_head * stride_qdesc_head)
        if HAS_K_DESCALE:
            qk_scale *= gl.load(k_descale_ptr + seq * stride_kdesc_seq + kv_head * stride_kdesc_head)
        if HAS_V_DESCALE:
            out_scale *= gl.load(v_descale_ptr + seq * stride_vdesc_seq + kv_head * stride_vdesc_head)
        return qk_scale, out_scale

    @gluon.jit
    def _work_item(work, n_tile_slots, num_q_heads):
        # (q tile slot, q head) of a persistent program's work item: a slot's heads back to back, last slots (the
        # sequences' last, longest tiles) first - the order of the non-persistent grid (see _tile_bounds)
        return n_tile_slots - 1 - work // num_q_heads, work % num_q_heads

    @gluon.jit
    def _give_work(work_ids, work_ready, work_empty, given, work, num_warps: gl.constexpr):
        # The producer hands work item `work` to both consumer warpgroups through slot given % WORK_SLOTS
        SLOTS: gl.constexpr = work_ids.type.shape[0]
        slot = given % SLOTS
        mbarrier.wait(work_empty.index(slot), ((given // SLOTS) & 1) ^ 1)
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        work_ids.index(slot).store(gl.full([1], work, gl.int32, layout))
        mbarrier.arrive(work_ready.index(slot), count=1)  # releases the store to the consumers' wait

    @gluon.jit
    def _draw_ticket(sched_ptr, base, draw, num_warps: gl.constexpr):
        # The next ticket of the dynamic grid's counter (sched_ptr + 1), drawn by the first thread where `draw`:
        # relaxed (a ticket publishes nothing, so no GPU-wide fence before it) and left in that thread's register
        # (no broadcast here), so the producer waits for it only where _ticket reads it, a work item later. The
        # increment depends on `base` (always 1: base >= 0), so this program has read base before any ticket of its
        # own is counted, and so before whoever draws the launch's last ticket moves base on
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        lane = gl.arange(0, 32 * num_warps, layout)
        ones = gl.full([32 * num_warps], 1, gl.int64, layout) + (base < 0).to(gl.int64)
        # one address per thread (all but the first masked off): an address the same in every thread is made a
        # warp-aggregated atomic whose result is broadcast, and so waited for, at once
        return gl.atomic_add(sched_ptr + 1 + lane, ones, mask=(lane == 0) & draw, sem="relaxed", scope="gpu")

    @gluon.jit
    def _ticket(drawn, base, num_warps: gl.constexpr, UNIFORM: gl.constexpr):
        # _draw_ticket's ticket less base, for every thread; UNIFORM: as a value ptxas knows to be the same in every
        # lane (_warp_uniform), since the producer's loop and its TMA issues branch on it
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        lane = gl.arange(0, 32 * num_warps, layout)
        if UNIFORM:
            work = _warp_uniform(gl.max(gl.where(lane == 0, drawn - base, 0), axis=0).to(gl.int32))
        else:
            work = (gl.max(gl.where(lane == 0, drawn, 0), axis=0) - base).to(gl.int32)
        return work

    @gluon.jit
    def _warp_uniform(x):
        # x (int32, the same in every lane) through a warp reduction, whose result sm_80+ keep in a uniform register:
        # a value from shuffles or an atomic is not provably uniform to ptxas, which then guards every branch and
        # `elect` that depends on it for divergence (BSSY/BSYNC, WARPSYNC.COLLECTIVE fallbacks: sm_90 SASS, 3x the
        # producer's TMA issue sites with TMA pages, session 31)
        return gl.inline_asm_elementwise(asm="redux.sync.max.s32 $0, $1, -1;", constraints="=r,r", args=[x],
                                         dtype=gl.int32, is_pure=True, pack=1)  # fmt: skip

    @gluon.jit
    def _take_work(work_ids, work_ready, work_empty, taken, num_warps: gl.constexpr):
        # A consumer warpgroup's next work item from the producer (see _give_work)
        SLOTS: gl.constexpr = work_ids.type.shape[0]
        slot = taken % SLOTS
        mbarrier.wait(work_ready.index(slot), (taken // SLOTS) & 1)
        layout: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        work = gl.max(work_ids.index(slot).load(layout), axis=0)
        _thread_barrier()  # every warp has read the slot before it is handed back
        mbarrier.arrive(work_empty.index(slot), count=1)
        return work

    @gluon.jit
    def _produce_work(work, it, items, q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, v_stage, q_ready, q_empty,
                      k_ready, v_ready, kv_empty, k_ptr, v_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr,
                             block_table_ptr, num_seqs, total_q, total_k, num_cache_blocks, max_blocks, stride_bt_seq,
                             stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot, stride_v_head,
                             k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block, v_rows_per_head,
                             v_cols_per_head, n_tile_slots, num_q_heads, GROUP: gl.constexpr, CAUSAL: gl.constexpr,
                             PAGED: gl.constexpr, PAGE_SIZE: gl.constexpr, PAGED_TMA: gl.constexpr,
                             HAS_SEQUSED: gl.constexpr, SEQ_FILTER: gl.constexpr, DECODE_MAX_Q: gl.constexpr,
                             FP8: gl.constexpr, VALID_D: gl.constexpr):  # fmt: skip
        # One work item of the persistent producer (see _producer_persistent); returns the updated counts
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        Q_BUFS: gl.constexpr = q_bufs.type.shape[0]
        tile_id, q_head = _work_item(work, n_tile_slots, num_q_heads)
        process, seq, seq_q_start, seq_q_len, q_tile_start, seq_k_start, seq_k_len, num_blocks, key_shift = (
            _tile_bounds(tile_id, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, num_seqs, total_q, total_k,
                         max_blocks, BLOCK_M, BLOCK_N, CAUSAL, PAGED, PAGE_SIZE, HAS_SEQUSED, SEQ_FILTER,
                         DECODE_MAX_Q, FP8 and v_desc.dtype.primitive_bitwidth == 8, 32, gl.num_warps())
        )  # fmt: skip
        if process & (num_blocks > 0):
            qb = items % Q_BUFS
            mbarrier.wait(q_empty.index(qb), ((items // Q_BUFS) & 1) ^ 1)
            _producer(q_desc, k_desc, v_desc, q_bufs.index(qb), k_bufs, v_bufs, v_stage, q_ready.index(qb), k_ready,
                      v_ready, kv_empty, seq_q_start + q_tile_start, q_head * VALID_D, seq_k_start - key_shift,
                      k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq, num_cache_blocks, max_blocks, seq_k_len,
                      q_head // GROUP, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot,
                      stride_v_head, k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block,
                      v_rows_per_head, v_cols_per_head, num_blocks, it, PAGED, PAGE_SIZE, PAGED_TMA, FP8,
                      VALID_D)  # fmt: skip
            it += num_blocks
            items += 1
        return it, items

    @gluon.jit
    def _producer_persistent(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, v_stage, q_ready, q_empty, k_ready,
                             v_ready, kv_empty, k_ptr, v_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr,
                             block_table_ptr, num_seqs, total_q, total_k, num_cache_blocks, max_blocks, stride_bt_seq,
                             stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot, stride_v_head,
                             k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block, v_rows_per_head,
                             v_cols_per_head, n_tile_slots, num_q_heads, GROUP: gl.constexpr, CAUSAL: gl.constexpr,
                             PAGED: gl.constexpr, PAGE_SIZE: gl.constexpr, PAGED_TMA: gl.constexpr,
                             HAS_SEQUSED: gl.constexpr, SEQ_FILTER: gl.constexpr, DECODE_MAX_Q: gl.constexpr,
                             FP8: gl.constexpr, VALID_D: gl.constexpr, sched_ptr, work_ids, work_ready, work_empty,
                             DYNAMIC: gl.constexpr, DYNAMIC_TAIL: gl.constexpr,
                             UNIFORM_TICKET: gl.constexpr = False):  # fmt: skip
        # The producer's walk over this program's work items: Q into the next of Q_BUFS buffers once the consumers
        # are done with it (QUANTIZE_Q: q_desc / q_bufs are the 16-bit q and its staging tiles), K/V blocks into the
        # ring, whose slots and phases run on from tile to tile.
        # DYNAMIC: items come from a counter all programs share (sched_ptr: int64 [base, tickets]), so a program that
        # is ahead takes the next item instead of a fixed share; each goes to the consumers through work_ids. Every
        # program draws tickets until one is past the last item, so a launch hands out exactly total + programs
        # tickets, and whoever draws the last one moves base there for the next launch (no reset kernel).
        # DYNAMIC_TAIL > 0: the fixed shares' whole rounds but the last DYNAMIC_TAIL go out in fixed shares (through
        # the same hand-over), the rest from the counter: the balance at the end, the fixed order before it.
        it = gl.program_id(0) * 0  # K/V blocks loaded so far
        items = gl.program_id(0) * 0  # tiles loaded so far
        total = n_tile_slots * num_q_heads
        programs = gl.num_programs(0)
        given = gl.program_id(0) * 0  # DYNAMIC: items handed to the consumers so far
        fixed = gl.program_id(0) * 0  # DYNAMIC: items 0 .. fixed - 1 go out in fixed shares (whole rounds)
        if DYNAMIC:
            base = gl.load(sched_ptr)
            if DYNAMIC_TAIL > 0:
                fixed = gl.maximum(total // programs - DYNAMIC_TAIL, 0) * programs
            if fixed > 0:
                work = gl.program_id(0)
            else:
                first = _draw_ticket(sched_ptr, base, True, gl.num_warps())
                work = _ticket(first, base, gl.num_warps(), UNIFORM_TICKET)
        else:
            work = gl.program_id(0)
        while work < total:
            if DYNAMIC:
                _give_work(work_ids, work_ready, work_empty, given, work, gl.num_warps())
                given += 1
                next_fixed = work + programs < fixed  # the next item still a fixed share, else a ticket
                # the next item's ticket is in flight during this item (read after _produce_work)
                drawn = _draw_ticket(sched_ptr, base, not next_fixed, gl.num_warps())
            it, items = _produce_work(work, it, items, q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, v_stage,
                q_ready, q_empty, k_ready, v_ready, kv_empty, k_ptr, v_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr,
                seqused_k_ptr, block_table_ptr, num_seqs, total_q, total_k, num_cache_blocks, max_blocks,
                stride_bt_seq, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot,
                stride_v_head, k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block,
                v_rows_per_head, v_cols_per_head, n_tile_slots, num_q_heads, GROUP, CAUSAL, PAGED, PAGE_SIZE,
                PAGED_TMA, HAS_SEQUSED, SEQ_FILTER, DECODE_MAX_Q, FP8, VALID_D)  # fmt: skip
            if DYNAMIC:
                if next_fixed:
                    work = work + programs
                else:
                    work = fixed + _ticket(drawn, base, gl.num_warps(), UNIFORM_TICKET)
            else:
                work = work + programs
        if DYNAMIC:
            _give_work(work_ids, work_ready, work_empty, given, total, gl.num_warps())  # past the last: they stop
            if work == total + programs - 1:  # the last ticket: total - fixed items and one past the end per program
                gl.store(sched_ptr, base + total - fixed + programs)

    @gluon.jit
    def _consume_work(work, it, items, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
                             q_src, out_ptr, lse_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, q_descale_ptr,
                             k_descale_ptr, v_descale_ptr, num_seqs, total_q, total_k, max_blocks, softmax_scale,
                             stride_o_tok, stride_o_head, stride_lse_head,
                             stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head,
                             stride_vdesc_seq, stride_vdesc_head, n_tile_slots, num_q_heads, GROUP: gl.constexpr,
                             ROW0: gl.constexpr, ROWS: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                             RETURN_LSE: gl.constexpr, ZERO_TAIL: gl.constexpr, PAGED: gl.constexpr,
                             PAGE_SIZE: gl.constexpr, HAS_SEQUSED: gl.constexpr, SEQ_FILTER: gl.constexpr,
                             DECODE_MAX_Q: gl.constexpr, FP8: gl.constexpr, P_SCALE_LOG2: gl.constexpr,
                             TWO_LEVEL: gl.constexpr, P_PER_TILE: gl.constexpr, LEAN_SOFTMAX: gl.constexpr,
                             QUANTIZE_Q: gl.constexpr,
                             Q_MAX: gl.constexpr,
                             HAS_Q_DESCALE: gl.constexpr, HAS_K_DESCALE: gl.constexpr, HAS_V_DESCALE: gl.constexpr,
                             num_warps: gl.constexpr, VALID_D: gl.constexpr,
                             SOFTMAX_FENCE: gl.constexpr = False, MASK_PTX: gl.constexpr = False,
                             TWO_LEVEL_FMA: gl.constexpr = False):  # fmt: skip
        # One work item of a persistent consumer warpgroup (see _consumer_persistent); returns the updated counts
        BLOCK_M: gl.constexpr = 2 * ROWS  # the tile's rows: two warpgroups'
        HEAD_DIM: gl.constexpr = q_bufs.type.shape[2]
        BLOCK_N: gl.constexpr = k_bufs.type.shape[1]
        Q_BUFS: gl.constexpr = q_bufs.type.shape[0]
        tile_id, q_head = _work_item(work, n_tile_slots, num_q_heads)
        process, seq, seq_q_start, seq_q_len, q_tile_start, seq_k_start, seq_k_len, num_blocks, key_shift = (
            _tile_bounds(tile_id, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, num_seqs, total_q, total_k,
                         max_blocks, BLOCK_M, BLOCK_N, CAUSAL, PAGED, PAGE_SIZE, HAS_SEQUSED, SEQ_FILTER,
                         DECODE_MAX_Q, FP8 and v_bufs.dtype.primitive_bitwidth == 8, 32, num_warps)
        )  # fmt: skip
        if process:
            if num_blocks == 0:
                _store_empty(out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start + ROW0, q_head, stride_o_tok,
                             stride_o_head, stride_lse_head, ROWS, HEAD_DIM, RETURN_LSE, num_warps,
                             VALID_D)  # fmt: skip
            else:
                qk_scale, out_scale = _scales(softmax_scale, seq, q_head // GROUP, q_descale_ptr, k_descale_ptr,
                                              v_descale_ptr, stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq,
                                              stride_kdesc_head, stride_vdesc_seq, stride_vdesc_head,
                                              HAS_Q_DESCALE, HAS_K_DESCALE, HAS_V_DESCALE)  # fmt: skip
                qb = items % Q_BUFS
                if QUANTIZE_Q:
                    q_tile_src = q_src.index(qb)  # the 16-bit q the producer staged for this tile
                else:
                    q_tile_src = q_src
                _consumer(q_bufs.index(qb), k_bufs, v_bufs, q_ready.index(qb), k_ready, v_ready, kv_empty, turns,
                          q_tile_src, out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len,
                          num_blocks, key_shift, qk_scale, out_scale, stride_o_tok,
                          stride_o_head, stride_lse_head, ROW0, ROWS, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL,
                          FP8, P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE, LEAN_SOFTMAX,
                          QUANTIZE_Q, Q_MAX, num_warps, it, it + items,
                          (items // Q_BUFS) & 1, VALID_D, q_empty.index(qb), QUANTIZE_Q,
                          SOFTMAX_FENCE=SOFTMAX_FENCE, MASK_PTX=MASK_PTX, TWO_LEVEL_FMA=TWO_LEVEL_FMA)  # fmt: skip
                if not QUANTIZE_Q:  # (QUANTIZE_Q: handed back once rounded, in _consumer)
                    mbarrier.arrive(q_empty.index(qb), count=1)  # this warpgroup's QK wgmmas are done with it
                it += num_blocks
                items += 1
        return it, items

    @gluon.jit
    def _consumer_persistent(q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns, q_src,
                             out_ptr, lse_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, q_descale_ptr,
                             k_descale_ptr, v_descale_ptr, num_seqs, total_q, total_k, max_blocks, softmax_scale,
                             stride_o_tok, stride_o_head, stride_lse_head,
                             stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head,
                             stride_vdesc_seq, stride_vdesc_head, n_tile_slots, num_q_heads, GROUP: gl.constexpr,
                             ROW0: gl.constexpr, ROWS: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                             RETURN_LSE: gl.constexpr, ZERO_TAIL: gl.constexpr, PAGED: gl.constexpr,
                             PAGE_SIZE: gl.constexpr, HAS_SEQUSED: gl.constexpr, SEQ_FILTER: gl.constexpr,
                             DECODE_MAX_Q: gl.constexpr, FP8: gl.constexpr, P_SCALE_LOG2: gl.constexpr,
                             TWO_LEVEL: gl.constexpr, P_PER_TILE: gl.constexpr, LEAN_SOFTMAX: gl.constexpr,
                             QUANTIZE_Q: gl.constexpr,
                             Q_MAX: gl.constexpr,
                             HAS_Q_DESCALE: gl.constexpr, HAS_K_DESCALE: gl.constexpr, HAS_V_DESCALE: gl.constexpr,
                             num_warps: gl.constexpr, VALID_D: gl.constexpr, work_ids, work_ready, work_empty,
                             DYNAMIC: gl.constexpr, SOFTMAX_FENCE: gl.constexpr = False,
                             MASK_PTX: gl.constexpr = False, TWO_LEVEL_FMA: gl.constexpr = False):  # fmt: skip
        # A consumer warpgroup's walk over the same work items as the producer: each tile as in the non-persistent
        # kernel (_consumer), its ring blocks, wgmma turns and Q buffer counted on from the tiles before. DYNAMIC: the
        # items come from the producer through work_ids (see _producer_persistent) until one is past the last.
        it = gl.program_id(0) * 0  # K/V blocks consumed so far
        items = gl.program_id(0) * 0  # tiles computed so far (each took its blocks + 1 wgmma turns)
        total = n_tile_slots * num_q_heads
        taken = gl.program_id(0) * 0  # DYNAMIC: items taken from the producer so far
        if DYNAMIC:
            work = _take_work(work_ids, work_ready, work_empty, taken, num_warps)
        else:
            work = gl.program_id(0)
        while work < total:
            it, items = _consume_work(work, it, items, q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready,
                v_ready, kv_empty, turns, q_src, out_ptr, lse_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr,
                seqused_k_ptr, q_descale_ptr, k_descale_ptr, v_descale_ptr, num_seqs, total_q, total_k,
                max_blocks, softmax_scale, stride_o_tok, stride_o_head, stride_lse_head, stride_qdesc_seq,
                stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head, stride_vdesc_seq, stride_vdesc_head,
                n_tile_slots, num_q_heads, GROUP, ROW0, ROWS, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL, PAGED,
                PAGE_SIZE, HAS_SEQUSED, SEQ_FILTER, DECODE_MAX_Q, FP8, P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE,
                LEAN_SOFTMAX, QUANTIZE_Q, Q_MAX, HAS_Q_DESCALE, HAS_K_DESCALE, HAS_V_DESCALE, num_warps,
                VALID_D, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)  # fmt: skip
            if DYNAMIC:
                taken += 1
                work = _take_work(work_ids, work_ready, work_empty, taken, num_warps)
            else:
                work += gl.num_programs(0)

    @gluon.jit
    def _consumer_persistent_default(q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns,
                                     q_src, out_ptr, lse_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr,
                                     q_descale_ptr, k_descale_ptr, v_descale_ptr, num_seqs, total_q, total_k,
                                     max_blocks, softmax_scale, stride_o_tok,
                                     stride_o_head, stride_lse_head, stride_qdesc_seq, stride_qdesc_head,
                                     stride_kdesc_seq, stride_kdesc_head, stride_vdesc_seq, stride_vdesc_head,
                                     n_tile_slots, num_q_heads, GROUP: gl.constexpr, ROW0: gl.constexpr,
                                     ROWS: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                                     RETURN_LSE: gl.constexpr, ZERO_TAIL: gl.constexpr, PAGED: gl.constexpr,
                                     PAGE_SIZE: gl.constexpr, HAS_SEQUSED: gl.constexpr, SEQ_FILTER: gl.constexpr,
                                     DECODE_MAX_Q: gl.constexpr, FP8: gl.constexpr, P_SCALE_LOG2: gl.constexpr,
                                     TWO_LEVEL: gl.constexpr, P_PER_TILE: gl.constexpr, LEAN_SOFTMAX: gl.constexpr,
                                     QUANTIZE_Q: gl.constexpr,
                                     Q_MAX: gl.constexpr,
                                     HAS_Q_DESCALE: gl.constexpr, HAS_K_DESCALE: gl.constexpr,
                                     HAS_V_DESCALE: gl.constexpr, num_warps: gl.constexpr,
                                     VALID_D: gl.constexpr, work_ids, work_ready, work_empty,
                                     DYNAMIC: gl.constexpr, SOFTMAX_FENCE: gl.constexpr = False,
                                     MASK_PTX: gl.constexpr = False, TWO_LEVEL_FMA: gl.constexpr = False):  # fmt: skip
        _consumer_persistent(q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns, q_src,
                             out_ptr, lse_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, q_descale_ptr,
                             k_descale_ptr, v_descale_ptr, num_seqs, total_q, total_k, max_blocks, softmax_scale,
                             stride_o_tok, stride_o_head, stride_lse_head,
                             stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head,
                             stride_vdesc_seq, stride_vdesc_head, n_tile_slots, num_q_heads, GROUP, ROW0, ROWS, CAUSAL,
                             PINGPONG, RETURN_LSE, ZERO_TAIL, PAGED, PAGE_SIZE, HAS_SEQUSED, SEQ_FILTER,
                             DECODE_MAX_Q, FP8, P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE, LEAN_SOFTMAX, QUANTIZE_Q, Q_MAX,
                             HAS_Q_DESCALE, HAS_K_DESCALE, HAS_V_DESCALE, num_warps, VALID_D, work_ids, work_ready,
                             work_empty, DYNAMIC, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)  # fmt: skip
        return ()

    # Lengths, counts and the widths they set (block table, lse rows) change per batch: not specialized, so a new
    # batch never compiles a new variant (vLLM warms up once; CUDA graphs replay)
    @gluon.jit(
        do_not_specialize=[
            "num_seqs", "total_q", "total_k", "num_cache_blocks", "max_blocks", "softmax_scale", "stride_lse_head",
            "stride_bt_seq", "n_tile_slots",
        ]
    )  # fmt: skip
    def attention_fwd_hopper_kernel(
        q_desc,  # q as [total_q, Hq * D], blocks [BLOCK_M, D] (QUANTIZE_Q: only its fp8 block type is used)
        k_desc,  # k as [total_k, Hk * D], blocks [BLOCK_N, D] (PAGED: only its block shape and layout are used)
        v_desc,  # v as [total_k, Hk * D], blocks [BLOCK_N, D] (PAGED: as k_desc; FP8: [Hk * D, keys], [D, BLOCK_N];
        # gathered fp8 widened to 16 bits: an fp16 [BLOCK_N, D] block type, never loaded through)
        q16_desc,  # QUANTIZE_Q: the 16-bit q as [total_q, Hq * D] in blocks [BLOCK_M, D], staged for the consumers'
        # rounding; else q_desc again
        k_ptr,  # PAGED: [num_cache_blocks, PAGE_SIZE, Hk, D] (any strides, D contiguous); else unused
        v_ptr,  # PAGED: as k_ptr
        out_ptr,  # [total_q, Hq, D]
        lse_ptr,  # [Hq, total_q] fp32 (RETURN_LSE)
        cu_seqlens_q_ptr,  # [batch + 1] int32
        cu_seqlens_k_ptr,  # [batch + 1] int32 (contiguous K/V)
        seqused_k_ptr,  # [batch] int32 (HAS_SEQUSED)
        block_table_ptr,  # [batch, max_blocks] int32 (PAGED)
        q_descale_ptr,  # fp32, [batch | broadcast, Hk | broadcast] (HAS_Q_DESCALE); likewise k and v
        k_descale_ptr,
        v_descale_ptr,
        sched_ptr,  # DYNAMIC: int64 [base, tickets], shared by the launches on one stream (_producer_persistent)
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
        k_rows_per_block,  # PAGED_TMA: where a page's keys are in k_desc's rows (see _produce_paged_tma)
        k_rows_per_head,
        k_cols_per_head,
        v_rows_per_block,  # PAGED_TMA: likewise for v_desc
        v_rows_per_head,
        v_cols_per_head,
        stride_qdesc_seq,
        stride_qdesc_head,
        stride_kdesc_seq,
        stride_kdesc_head,
        stride_vdesc_seq,
        stride_vdesc_head,
        n_tile_slots,  # PERSISTENT: q tile slots per head (the non-persistent grid's second dimension)
        num_q_heads,  # PERSISTENT
        GROUP: gl.constexpr,  # q heads per kv head
        CAUSAL: gl.constexpr,
        PINGPONG: gl.constexpr,  # the consumer warpgroups alternate their wgmma issue (see _wait_turn)
        RETURN_LSE: gl.constexpr,
        PAGED: gl.constexpr,
        PAGE_SIZE: gl.constexpr,
        PAGED_TMA: gl.constexpr,  # PAGED through TMA boxes of min(PAGE_SIZE, BLOCK_N) keys (else cp.async gathers)
        BLOCK_N: gl.constexpr,
        HAS_SEQUSED: gl.constexpr,
        SEQ_FILTER: gl.constexpr,  # 0 all sequences, 1 only those with more than DECODE_MAX_Q queries
        DECODE_MAX_Q: gl.constexpr,
        STAGES: gl.constexpr,
        FP8: gl.constexpr,  # fp8 K and V (V key-major), fp8 dots
        P_SCALE_LOG2: gl.constexpr,  # FP8: log2 of P's factor before its cast (tritonfa.fp8.p_scale); else 0
        TWO_LEVEL: gl.constexpr,  # FP8: each block's P@V added to O in fp32
        # FP8 with TWO_LEVEL and key-major V: P taken relative to each block's row max at fp8's max (the fp8 error
        # study's (b)); each block's P@V and row sum join O and l scaled by one fp32 factor per row
        P_PER_TILE: gl.constexpr,
        # 1: the row max as a tree, a 16-bit P packed as the P@V reads it (same arithmetic); 2: that, and an fp8 P
        # rounded once from fp32 (see _to_p)
        LEAN_SOFTMAX: gl.constexpr,
        EARLY_K_RELEASE: gl.constexpr,  # K and V slots handed back apart, K once its QK is done (see _release_k)
        QUANTIZE_Q: gl.constexpr,  # FP8 with a 16-bit q: rounded to fp8 here, per row
        Q_MAX: gl.constexpr,  # QUANTIZE_Q: the largest |q| after its row scale
        HAS_Q_DESCALE: gl.constexpr,
        HAS_K_DESCALE: gl.constexpr,
        HAS_V_DESCALE: gl.constexpr,
        PERSISTENT: gl.constexpr,  # one program per SM slot walks (tile slot, q head) items; grid (programs,)
        Q_BUFS: gl.constexpr,  # PERSISTENT: Q buffers (2: the next tile's Q loads during this one)
        VALID_D: gl.constexpr,  # q/k/v's head size: D of the tiles (64/128/256) or less, padded (see _consumer)
        # a mixed batch's decode launch is this launch's programmatic dependent (config `mixed_pdl`): let it start
        LAUNCH_DEPENDENTS: gl.constexpr,
        DYNAMIC: gl.constexpr,  # PERSISTENT: work items taken from a shared counter instead of a fixed share
        DYNAMIC_TAIL: gl.constexpr,  # DYNAMIC: 0, every item from the counter; N, only the last N rounds' items
        UNIFORM_TICKET: gl.constexpr,  # DYNAMIC: a drawn item reaches the producer's loop warp-uniform (_ticket)
        TMA_PRODUCER_REGS: gl.constexpr,  # PERSISTENT, TMA loads: the producer's registers per thread
        ROW_SUM_MMA: gl.constexpr,  # not PERSISTENT, two-level fp8 P@V: P's row sums as P @ ones (_pv_issue)
        # not PERSISTENT, TMA loads: 3, three consumer warpgroups on tiles of three 64-row Q boxes (q_desc's); else 2
        CONSUMERS: gl.constexpr,
        P_SMEM: gl.constexpr,  # not PERSISTENT: P reaches its P@V through shared memory, not registers (_p_store)
        SOFTMAX_FENCE: gl.constexpr,  # each P@V waited for after the softmax's exponentials (_after_softmax)
        MASK_PTX: gl.constexpr,  # masks scores with one compare per score in inline PTX (_mask_scores)
        TWO_LEVEL_FMA: gl.constexpr,  # two-level P@V: O's rescale one block late, fused with the add (_kv_step)
        num_warps: gl.constexpr,
    ):
        if LAUNCH_DEPENDENTS:
            gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                      is_pure=False, pack=1)  # fmt: skip
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[0]
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        # fp8 K/V with a 16-bit q (not rounded to fp8): the gathering producer widens K to q's type too, into slots
        # of q's layout, and arrives once (k_desc stays fp8: the staging tiles' type and layout); contiguous K/V too
        WIDEN_K: gl.constexpr = FP8 and q_desc.dtype.primitive_bitwidth == 16
        # fp8 V widened to 16 bits is gathered, paged or contiguous
        GATHER: gl.constexpr = (PAGED and not PAGED_TMA) or (FP8 and v_desc.dtype.primitive_bitwidth == 16)
        if PAGED and not PAGED_TMA:
            # supports() admits page strides that are multiples of one 16-byte copy (8 elements of 16 bits), but the
            # runtime only tells the compiler about multiples of 16: say so, or a stride of 40 (heads-major pages,
            # D 40) leaves 2-byte copies, which cp.async cannot do (a compile error on the GPU, session 12)
            VEC: gl.constexpr = 128 // k_ptr.dtype.element_ty.primitive_bitwidth
            stride_k_blk = stride_k_blk // VEC * VEC
            stride_k_slot = stride_k_slot // VEC * VEC
            stride_k_head = stride_k_head // VEC * VEC
            stride_v_blk = stride_v_blk // VEC * VEC
            stride_v_slot = stride_v_slot // VEC * VEC
            stride_v_head = stride_v_head // VEC * VEC
        # TMA: one expect-tx arrival per slot; cp.async gathers: every producer thread's arrival. Gathered fp8 V is
        # transposed by the producer warps, which then arrive once (mbarrier.arrive: one thread of the partition)
        READY_COUNT: gl.constexpr = 32 * PAGED_PRODUCER_WARPS if GATHER else 1
        V_READY_COUNT: gl.constexpr = 1 if FP8 else READY_COUNT
        # fp8 V is key-major with an fp8 P@V, unless the gathering producer widens it to 16 bits (v_desc's dtype)
        V_KEY_MAJOR: gl.constexpr = FP8 and v_desc.dtype.primitive_bitwidth == 8
        K_READY_COUNT: gl.constexpr = 1 if WIDEN_K else READY_COUNT
        STAGE_TILES: gl.constexpr = 4 if WIDEN_K else 2  # V's two staging tiles, then K's
        ZERO_TAIL: gl.constexpr = not GATHER  # cp.async gathers zero-fill keys past the sequence themselves
        # a TMA producer is one warp issuing copies; a gathering one computes addresses (4 warps)
        PRODUCER_WARPS: gl.constexpr = PAGED_PRODUCER_WARPS if GATHER else 1
        WORKER_REGS: gl.constexpr = _partition_regs(GATHER, V_KEY_MAJOR, False)
        PRODUCER_REGS_: gl.constexpr = _partition_regs(GATHER, V_KEY_MAJOR, True)
        HALF: gl.constexpr = BLOCK_M // 2
        FIRST: gl.constexpr = 0
        if PERSISTENT:
            q_bufs = gl.allocate_shared_memory(q_desc.dtype, [Q_BUFS, BLOCK_M, HEAD_DIM], q_desc.layout)
            if QUANTIZE_Q:  # the producer's TMA stages the 16-bit q here, a tile ahead; the consumers round it
                q_stage = gl.allocate_shared_memory(q16_desc.dtype, [Q_BUFS, BLOCK_M, HEAD_DIM], q16_desc.layout)
            else:
                q_stage = q_bufs
            if WIDEN_K:
                k_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], q_desc.layout)
            else:
                k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
            if V_KEY_MAJOR:
                v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
            else:
                v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
            if FP8 and GATHER:  # gathered fp8 V rows wait here for the producer's transpose (or widening)
                v_stage = gl.allocate_shared_memory(k_desc.dtype, [STAGE_TILES, BLOCK_N, HEAD_DIM], k_desc.layout)
            else:
                v_stage = q_bufs  # unused
            q_ready = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
            q_empty = gl.allocate_shared_memory(gl.int64, [Q_BUFS, 1], mbarrier.MBarrierLayout())
            k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES * (1 + EARLY_K_RELEASE), 1],
                                                 mbarrier.MBarrierLayout())  # fmt: skip
            turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
            mbarrier.init(turns.index(0), count=1)
            mbarrier.init(turns.index(1), count=1)
            for i in gl.static_range(Q_BUFS):
                mbarrier.init(q_ready.index(i), count=1)
                mbarrier.init(q_empty.index(i), count=2)  # both consumer warpgroups hand a Q buffer back
            for i in gl.static_range(STAGES):
                mbarrier.init(k_ready.index(i), count=K_READY_COUNT)
                mbarrier.init(v_ready.index(i), count=V_READY_COUNT)
                mbarrier.init(kv_empty.index(i), count=2)
                if EARLY_K_RELEASE:
                    mbarrier.init(kv_empty.index(STAGES + i), count=2)
            if DYNAMIC:  # the producer's items for the consumers (see _give_work)
                work_ids = gl.allocate_shared_memory(gl.int32, [WORK_SLOTS, 1],
                                                     gl.SwizzledSharedLayout(1, 1, 1, order=[0]))  # fmt: skip
                work_ready = gl.allocate_shared_memory(gl.int64, [WORK_SLOTS, 1], mbarrier.MBarrierLayout())
                work_empty = gl.allocate_shared_memory(gl.int64, [WORK_SLOTS, 1], mbarrier.MBarrierLayout())
                for i in gl.static_range(WORK_SLOTS):
                    mbarrier.init(work_ready.index(i), count=1)
                    mbarrier.init(work_empty.index(i), count=2)  # both consumer warpgroups
            else:
                work_ids = q_ready  # unused
                work_ready = q_ready
                work_empty = q_ready
            gl.warp_specialize(
                [
                    (_consumer_persistent_default, (
                        q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns, q_stage, out_ptr,
                        lse_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, q_descale_ptr, k_descale_ptr,
                        v_descale_ptr, num_seqs, total_q, total_k, max_blocks, softmax_scale,
                        stride_o_tok, stride_o_head, stride_lse_head, stride_qdesc_seq,
                        stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head, stride_vdesc_seq, stride_vdesc_head,
                        n_tile_slots, num_q_heads, GROUP, FIRST, HALF, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL,
                        PAGED, PAGE_SIZE, HAS_SEQUSED, SEQ_FILTER, DECODE_MAX_Q, FP8, P_SCALE_LOG2, TWO_LEVEL,
                        P_PER_TILE, LEAN_SOFTMAX,
                        QUANTIZE_Q, Q_MAX, HAS_Q_DESCALE, HAS_K_DESCALE, HAS_V_DESCALE, num_warps,
                        VALID_D, work_ids, work_ready, work_empty, DYNAMIC, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)),
                    (_consumer_persistent, (
                        q_bufs, k_bufs, v_bufs, q_ready, q_empty, k_ready, v_ready, kv_empty, turns, q_stage, out_ptr,
                        lse_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, q_descale_ptr, k_descale_ptr,
                        v_descale_ptr, num_seqs, total_q, total_k, max_blocks, softmax_scale,
                        stride_o_tok, stride_o_head, stride_lse_head, stride_qdesc_seq,
                        stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head, stride_vdesc_seq, stride_vdesc_head,
                        n_tile_slots, num_q_heads, GROUP, HALF, HALF, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL,
                        PAGED, PAGE_SIZE, HAS_SEQUSED, SEQ_FILTER, DECODE_MAX_Q, FP8, P_SCALE_LOG2, TWO_LEVEL,
                        P_PER_TILE, LEAN_SOFTMAX,
                        QUANTIZE_Q, Q_MAX, HAS_Q_DESCALE, HAS_K_DESCALE, HAS_V_DESCALE, num_warps,
                        VALID_D, work_ids, work_ready, work_empty, DYNAMIC, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)),
                    (_producer_persistent, (
                        q16_desc, k_desc, v_desc, q_stage, k_bufs, v_bufs, v_stage, q_ready, q_empty, k_ready, v_ready,
                        kv_empty,
                        k_ptr, v_ptr, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, block_table_ptr, num_seqs,
                        total_q, total_k, num_cache_blocks, max_blocks, stride_bt_seq, stride_k_blk, stride_k_slot,
                        stride_k_head, stride_v_blk, stride_v_slot, stride_v_head, k_rows_per_block,
                        k_rows_per_head, k_cols_per_head, v_rows_per_block, v_rows_per_head, v_cols_per_head,
                        n_tile_slots, num_q_heads, GROUP, CAUSAL, PAGED, PAGE_SIZE, PAGED_TMA, HAS_SEQUSED,
                        SEQ_FILTER, DECODE_MAX_Q, FP8, VALID_D, sched_ptr, work_ids, work_ready, work_empty,
                        DYNAMIC, DYNAMIC_TAIL, UNIFORM_TICKET)),
                ],
                [num_warps, PRODUCER_WARPS],
                [WORKER_REGS, TMA_PRODUCER_REGS if not GATHER else PRODUCER_REGS_],
            )  # fmt: skip
        else:
            _tile_program(q_desc, k_desc, v_desc, q16_desc, k_ptr, v_ptr, out_ptr, lse_ptr, cu_seqlens_q_ptr,
                          cu_seqlens_k_ptr, seqused_k_ptr, block_table_ptr, q_descale_ptr, k_descale_ptr,
                          v_descale_ptr, num_seqs, total_q, total_k, num_cache_blocks, max_blocks, softmax_scale,
                          stride_o_tok, stride_o_head, stride_lse_head, stride_bt_seq,
                          stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot, stride_v_head,
                          k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block, v_rows_per_head,
                          v_cols_per_head, stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head,
                          stride_vdesc_seq, stride_vdesc_head, GROUP, CAUSAL, PINGPONG, RETURN_LSE, PAGED,
                          PAGE_SIZE, PAGED_TMA, BLOCK_N, HAS_SEQUSED, SEQ_FILTER, DECODE_MAX_Q, STAGES, FP8,
                          P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE, LEAN_SOFTMAX,
                          QUANTIZE_Q, Q_MAX, HAS_Q_DESCALE, HAS_K_DESCALE,
                          HAS_V_DESCALE, num_warps, VALID_D, EARLY_K_RELEASE, ROW_SUM_MMA, CONSUMERS,
                          P_SMEM, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)  # fmt: skip

    @gluon.jit
    def _tile_program(q_desc, k_desc, v_desc, q16_desc, k_ptr, v_ptr, out_ptr, lse_ptr, cu_seqlens_q_ptr,
                      cu_seqlens_k_ptr, seqused_k_ptr, block_table_ptr, q_descale_ptr, k_descale_ptr, v_descale_ptr,
                      num_seqs, total_q, total_k, num_cache_blocks, max_blocks, softmax_scale,
                      stride_o_tok, stride_o_head, stride_lse_head, stride_bt_seq, stride_k_blk,
                      stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot, stride_v_head, k_rows_per_block,
                      k_rows_per_head, k_cols_per_head, v_rows_per_block, v_rows_per_head, v_cols_per_head,
                      stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head, stride_vdesc_seq,
                      stride_vdesc_head, GROUP: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr,
                      RETURN_LSE: gl.constexpr, PAGED: gl.constexpr, PAGE_SIZE: gl.constexpr,
                      PAGED_TMA: gl.constexpr, BLOCK_N: gl.constexpr, HAS_SEQUSED: gl.constexpr,
                      SEQ_FILTER: gl.constexpr, DECODE_MAX_Q: gl.constexpr, STAGES: gl.constexpr,
                      FP8: gl.constexpr, P_SCALE_LOG2: gl.constexpr, TWO_LEVEL: gl.constexpr, P_PER_TILE: gl.constexpr,
                      LEAN_SOFTMAX: gl.constexpr,
                      QUANTIZE_Q: gl.constexpr, Q_MAX: gl.constexpr, HAS_Q_DESCALE: gl.constexpr,
                      HAS_K_DESCALE: gl.constexpr, HAS_V_DESCALE: gl.constexpr, num_warps: gl.constexpr,
                      VALID_D: gl.constexpr, EARLY_K_RELEASE: gl.constexpr,
                      ROW_SUM_MMA: gl.constexpr, CONSUMERS: gl.constexpr, P_SMEM: gl.constexpr,
                      SOFTMAX_FENCE: gl.constexpr, MASK_PTX: gl.constexpr = False,
                      TWO_LEVEL_FMA: gl.constexpr = False):  # fmt: skip
        # One program per (q head, q tile slot): grid (Hq, slots). A consumer warpgroup per 64 rows: two on q_desc's
        # 128-row boxes, or three on three of its 64-row boxes (config `ws_consumers`)
        BLOCK_M: gl.constexpr = q_desc.block_type.shape[0] * (3 if CONSUMERS == 3 else 1)
        HEAD_DIM: gl.constexpr = q_desc.block_type.shape[1]
        ROWS: gl.constexpr = BLOCK_M // CONSUMERS
        q_head = gl.program_id(0)
        tile_id = gl.num_programs(1) - 1 - gl.program_id(1)  # the last sequences' tiles first
        kv_head = q_head // GROUP

        process, seq, seq_q_start, seq_q_len, q_tile_start, seq_k_start, seq_k_len, num_blocks, key_shift = (
            _tile_bounds(tile_id, cu_seqlens_q_ptr, cu_seqlens_k_ptr, seqused_k_ptr, num_seqs, total_q, total_k,
                         max_blocks, BLOCK_M, BLOCK_N, CAUSAL, PAGED, PAGE_SIZE, HAS_SEQUSED, SEQ_FILTER, DECODE_MAX_Q,
                         FP8 and v_desc.dtype.primitive_bitwidth == 8, 32 * num_warps, num_warps)
        )  # fmt: skip
        if process:
            if num_blocks == 0:
                if CONSUMERS == 3:  # in 64-row pieces: a 192-row arange is no power of two
                    for i in gl.static_range(CONSUMERS):
                        _store_empty(out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start + i * ROWS, q_head,
                                     stride_o_tok, stride_o_head, stride_lse_head, ROWS, HEAD_DIM, RETURN_LSE,
                                     num_warps, VALID_D)  # fmt: skip
                else:
                    _store_empty(out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, stride_o_tok,
                                 stride_o_head, stride_lse_head, BLOCK_M, HEAD_DIM, RETURN_LSE, num_warps,
                                 VALID_D)  # fmt: skip
            else:
                WIDEN_K: gl.constexpr = FP8 and q_desc.dtype.primitive_bitwidth == 16  # as the kernel's
                GATHER: gl.constexpr = (PAGED and not PAGED_TMA) or (FP8 and v_desc.dtype.primitive_bitwidth == 16)
                if CONSUMERS == 3:  # a 64-row piece per consumer warpgroup (see _load_q)
                    q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], q_desc.layout)
                else:
                    q_smem = gl.allocate_shared_memory(q_desc.dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
                if QUANTIZE_Q and CONSUMERS == 3:  # the producer's TMA stages the 16-bit q here; the consumers round
                    q_stage = gl.allocate_shared_memory(q16_desc.dtype, [CONSUMERS, ROWS, HEAD_DIM], q16_desc.layout)
                elif QUANTIZE_Q:  # it into q_smem
                    q_stage = gl.allocate_shared_memory(q16_desc.dtype, [BLOCK_M, HEAD_DIM], q16_desc.layout)
                else:
                    q_stage = q_smem
                if WIDEN_K:
                    k_bufs = gl.allocate_shared_memory(q_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], q_desc.layout)
                else:
                    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
                V_KEY_MAJOR: gl.constexpr = FP8 and v_desc.dtype.primitive_bitwidth == 8  # as the kernel's
                if V_KEY_MAJOR:
                    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
                else:
                    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
                if FP8 and GATHER:  # gathered fp8 V rows wait here for the producer's transpose (or widening)
                    STAGE_TILES: gl.constexpr = 4 if WIDEN_K else 2  # as the kernel's
                    v_stage = gl.allocate_shared_memory(k_desc.dtype, [STAGE_TILES, BLOCK_N, HEAD_DIM], k_desc.layout)
                else:
                    v_stage = q_smem  # unused
                if ROW_SUM_MMA:  # P @ ones: ROW_SUM_COLS rows of e4m3 ones, K-major like V's key-major slots
                    ones_smem = gl.allocate_shared_memory(v_desc.dtype, [ROW_SUM_COLS, BLOCK_N], v_desc.layout)
                    ones_layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
                    ones_smem.store(gl.full([ROW_SUM_COLS, BLOCK_N], 1.0, gl.float32, ones_layout).to(v_desc.dtype))
                    fence_async_shared()  # the generic-proxy stores before the consumers' wgmma reads
                    _thread_barrier()
                else:
                    ones_smem = q_smem  # unused
                if P_SMEM:  # each consumer warpgroup's P tile, the A operand of its P@V
                    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], v_desc.dtype)
                    p_bufs = gl.allocate_shared_memory(v_desc.dtype, [CONSUMERS, ROWS, BLOCK_N], p_layout)
                else:
                    p_bufs = q_smem  # unused
                q_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
                k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
                v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
                kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES * (1 + EARLY_K_RELEASE), 1],
                                                     mbarrier.MBarrierLayout())  # fmt: skip
                turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
                for i in gl.static_range(CONSUMERS):
                    mbarrier.init(turns.index(i), count=1)
                mbarrier.init(q_ready, count=1)
                # as in attention_fwd_hopper_kernel: per producer thread for cp.async, one for TMA and fp8's transpose
                READY_COUNT: gl.constexpr = 32 * PAGED_PRODUCER_WARPS if GATHER else 1
                V_READY_COUNT: gl.constexpr = 1 if FP8 else READY_COUNT
                K_READY_COUNT: gl.constexpr = 1 if WIDEN_K else READY_COUNT
                for i in gl.static_range(STAGES):
                    mbarrier.init(k_ready.index(i), count=K_READY_COUNT)
                    mbarrier.init(v_ready.index(i), count=V_READY_COUNT)
                    mbarrier.init(kv_empty.index(i), count=CONSUMERS)  # every consumer warpgroup hands a slot back
                    if EARLY_K_RELEASE:
                        mbarrier.init(kv_empty.index(STAGES + i), count=CONSUMERS)
                qk_scale, out_scale = _scales(softmax_scale, seq, kv_head, q_descale_ptr, k_descale_ptr, v_descale_ptr,
                                              stride_qdesc_seq, stride_qdesc_head, stride_kdesc_seq, stride_kdesc_head,
                                              stride_vdesc_seq, stride_vdesc_head, HAS_Q_DESCALE, HAS_K_DESCALE,
                                              HAS_V_DESCALE)  # fmt: skip
                ZERO_TAIL: gl.constexpr = not GATHER  # cp.async gathers zero-fill keys past the sequence themselves
                # a TMA producer is one warp issuing copies; a gathering one computes addresses (4 warps)
                PRODUCER_WARPS: gl.constexpr = PAGED_PRODUCER_WARPS if GATHER else 1
                WORKER_REGS: gl.constexpr = _partition_regs(GATHER, V_KEY_MAJOR, False)
                PRODUCER_REGS_: gl.constexpr = _partition_regs(GATHER, V_KEY_MAJOR, True)
                if CONSUMERS == 3:  # TMA loads only (plan_hopper_prefill): see CONSUMER_REGS_THREE
                    gl.warp_specialize(
                        [
                            (_consumer_default, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns,
                                                 q_stage, out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start,
                                                 q_head, seq_k_len, num_blocks, key_shift, qk_scale, out_scale,
                                                 stride_o_tok, stride_o_head, stride_lse_head, 0, ROWS, CAUSAL,
                                                 PINGPONG, RETURN_LSE, ZERO_TAIL, FP8, P_SCALE_LOG2, TWO_LEVEL,
                                                 P_PER_TILE, LEAN_SOFTMAX, QUANTIZE_Q, Q_MAX, num_warps, 0, 0, 0,
                                                 VALID_D, ones_smem, ROW_SUM_MMA, p_bufs, P_SMEM, SOFTMAX_FENCE,
                                                 MASK_PTX, TWO_LEVEL_FMA)),
                            (_consumer, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, q_stage,
                                         out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len,
                                         num_blocks, key_shift, qk_scale, out_scale, stride_o_tok, stride_o_head,
                                         stride_lse_head, ROWS, ROWS, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL, FP8,
                                         P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE, LEAN_SOFTMAX, QUANTIZE_Q, Q_MAX,
                                         num_warps, 0, 0, 0, VALID_D, 0, False, ones_smem, ROW_SUM_MMA, p_bufs,
                                         P_SMEM, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)),
                            (_consumer, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, q_stage,
                                         out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len,
                                         num_blocks, key_shift, qk_scale, out_scale, stride_o_tok, stride_o_head,
                                         stride_lse_head, 2 * ROWS, ROWS, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL,
                                         FP8, P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE, LEAN_SOFTMAX, QUANTIZE_Q, Q_MAX,
                                         num_warps, 0, 0, 0, VALID_D, 0, False, ones_smem, ROW_SUM_MMA, p_bufs,
                                         P_SMEM, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)),
                            (_producer, (q16_desc, k_desc, v_desc, q_stage, k_bufs, v_bufs, v_stage, q_ready,
                                         k_ready, v_ready, kv_empty, seq_q_start + q_tile_start, q_head * VALID_D,
                                         seq_k_start - key_shift, k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq,
                                         num_cache_blocks, max_blocks, seq_k_len, kv_head, stride_k_blk,
                                         stride_k_slot, stride_k_head, stride_v_blk, stride_v_slot, stride_v_head,
                                         k_rows_per_block, k_rows_per_head, k_cols_per_head, v_rows_per_block,
                                         v_rows_per_head, v_cols_per_head, num_blocks, 0, PAGED, PAGE_SIZE,
                                         PAGED_TMA, FP8, VALID_D)),
                        ],
                        [num_warps, num_warps, PRODUCER_WARPS],
                        [CONSUMER_REGS_THREE, CONSUMER_REGS_THREE, PRODUCER_REGS_],
                    )  # fmt: skip
                else:
                    gl.warp_specialize(
                        [
                            (_consumer_default, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns,
                                                 q_stage, out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start,
                                                 q_head, seq_k_len, num_blocks, key_shift, qk_scale, out_scale,
                                                 stride_o_tok, stride_o_head, stride_lse_head, 0,
                                                 ROWS, CAUSAL, PINGPONG, RETURN_LSE, ZERO_TAIL, FP8, P_SCALE_LOG2,
                                                 TWO_LEVEL, P_PER_TILE, LEAN_SOFTMAX, QUANTIZE_Q, Q_MAX, num_warps,
                                                 0, 0, 0, VALID_D, ones_smem, ROW_SUM_MMA, p_bufs, P_SMEM,
                                                 SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)),
                            (_consumer, (q_smem, k_bufs, v_bufs, q_ready, k_ready, v_ready, kv_empty, turns, q_stage,
                                         out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, seq_k_len,
                                         num_blocks, key_shift, qk_scale, out_scale,
                                         stride_o_tok, stride_o_head, stride_lse_head, ROWS, ROWS, CAUSAL, PINGPONG,
                                         RETURN_LSE, ZERO_TAIL, FP8, P_SCALE_LOG2, TWO_LEVEL, P_PER_TILE, LEAN_SOFTMAX,
                                         QUANTIZE_Q,
                                         Q_MAX, num_warps, 0, 0, 0, VALID_D, 0, False, ones_smem, ROW_SUM_MMA,
                                         p_bufs, P_SMEM, SOFTMAX_FENCE, MASK_PTX, TWO_LEVEL_FMA)),
                            (_producer, (q16_desc, k_desc, v_desc, q_stage, k_bufs, v_bufs, v_stage, q_ready, k_ready,
                                         v_ready, kv_empty, seq_q_start + q_tile_start, q_head * VALID_D,
                                         seq_k_start - key_shift, k_ptr, v_ptr, block_table_ptr, seq, stride_bt_seq,
                                         num_cache_blocks, max_blocks,
                                         seq_k_len, kv_head, stride_k_blk, stride_k_slot, stride_k_head, stride_v_blk,
                                         stride_v_slot, stride_v_head, k_rows_per_block, k_rows_per_head,
                                         k_cols_per_head, v_rows_per_block, v_rows_per_head, v_cols_per_head,
                                         num_blocks, 0, PAGED, PAGE_SIZE, PAGED_TMA, FP8, VALID_D)),
                        ],
                        [num_warps, PRODUCER_WARPS],
                        [WORKER_REGS, PRODUCER_REGS_],
                    )  # fmt: skip

    @gluon.jit
    def _store_empty(out_ptr, lse_ptr, seq_q_start, seq_q_len, q_tile_start, q_head, stride_o_tok, stride_o_head,
                     stride_lse_head, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, RETURN_LSE: gl.constexpr,
                     num_warps: gl.constexpr, VALID_D: gl.constexpr):  # fmt: skip
        # A tile whose rows see no key at all: output 0, lse -inf (as the portable kernel). VALID_D: out's head size
        # (<= HEAD_DIM, the tiles' width).
        layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1], [1, 0])
        o_row = q_tile_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        o_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
        i_tok = (seq_q_start + o_row).to(gl.int64)
        p_o = out_ptr + gl.expand_dims(i_tok * stride_o_tok, 1) + q_head * stride_o_head + gl.expand_dims(o_d, 0)
        zeros = gl.zeros([BLOCK_M, HEAD_DIM], out_ptr.dtype.element_ty, layout)
        if VALID_D < HEAD_DIM:
            gl.store(p_o, zeros, mask=gl.expand_dims(o_row < seq_q_len, 1) & gl.expand_dims(o_d < VALID_D, 0))
        else:
            gl.store(p_o, zeros, mask=gl.expand_dims(o_row < seq_q_len, 1))
        if RETURN_LSE:
            row_layout: gl.constexpr = gl.SliceLayout(1, layout)
            lse = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
            gl.store(lse_ptr + q_head.to(gl.int64) * stride_lse_head + i_tok, lse, mask=o_row < seq_q_len)


def plan_hopper_prefill(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                        softmax_scale: float, causal: bool, seq_filter: int, decode_max_q: int,
                        pingpong: bool = True, q_descale=None, k_descale=None, v_descale=None,
                        quantize_q: bool = False, two_level: bool = True, stages: int = 0,
                        paged_tma: bool = False, persistent_programs: int = 0, block_n: int = 0,
                        fp8_v16: bool = False, fp8_v16_contiguous: bool = False, p_per_tile: bool = False,
                        early_k_release: bool = False, lean_softmax: bool = False,
                        fp8_p_one_rounding: bool = False, dynamic: bool = False, dynamic_tail: int = 0,
                        uniform_ticket: bool = False, producer_regs: int = 0,
                        fp8_row_sum_mma: bool = False, consumers: int = 2, p_smem: bool = False,
                        softmax_fence: bool = False, serial_pv: bool = False, mask_ptx: bool = False,
                        two_level_fma: bool = False, v_copy_kernel: bool = False,
                        copies: list | None = None):  # fmt: skip
    """(kernel, grid, args, constexprs, options) of one warp-specialized prefill launch; `supports` must hold.

    fp8 K/V: V is read from its key-major copy (v_copy_kernel: by key_major.py's transpose kernel, else through
    torch's strided copies, made here): with `copies`, the kernel's launch is appended there, to run before this
    one, else it is run here. quantize_q rounds a 16-bit q to K's fp8
    type in the kernel. Descales: fp32 of shape [], [1] or [batch, Hk]. stages: K/V ring slots (0: tiles_for's).
    paged_tma: a paged cache whose pages `paged_tma_view` describes is read through TMA (else cp.async gathers).
    persistent_programs: > 0, a persistent grid of at most that many programs (one per SM slot) walks the tiles in
    fixed shares. block_n: keys per block (0: tiles_for's). fp8_v16: gathered fp8 V is widened to fp16 by the
    producer (no transpose) and P@V is a 16-bit wgmma; QK stays fp8. A 16-bit q not quantized (`supports`'
    widen_k): K and V, paged or contiguous, are gathered and widened to q's type and fp16, both wgmmas 16-bit.
    fp8_v16_contiguous: contiguous fp8 K/V are gathered and V widened as fp8_v16 does for pages (no key-major copy).
    p_per_tile (where P meets key-major fp8 V, one- or two-level P@V): P scaled per (row, key block) to fp8's max,
    the fp8 error study's (b), instead of the fixed power of two. early_k_release: a ring slot's K is handed back once
    its QK is done, its V after its P@V (see _release_k). lean_softmax: the row max as a tree (_row_max) and a 16-bit P
    packed two values per register as the P@V wants them (_to_p); the same arithmetic, fewer dependent steps.
    fp8_p_one_rounding: an fp8 P rounded to e4m3 once from fp32 (not through fp16), with the lean step.
    dynamic (persistent grid): the programs take tiles from a counter the launches on q's device share
    (`_scheduler`: one per stream, so launches on two streams at once do not share one), not in fixed shares.
    dynamic_tail: > 0, only the items of the last that many rounds come from the counter (the rest in fixed shares).
    uniform_ticket (dynamic): a drawn item made provably warp-uniform before the producer branches on it.
    producer_regs: > 0, the persistent TMA producer's registers per thread (0: PERSISTENT_PRODUCER_REGS).
    fp8_row_sum_mma (flat grid, two-level fp8 P@V): P's row sums from a wgmma of P and ones, not the CUDA cores.
    consumers: 3, three consumer warpgroups on 192-row tiles (a third softmax in flight while the tensor cores run
    the other two's matmuls) where the flat grid loads contiguous K/V through TMA at D <= 128; else two (128 rows).
    p_smem (flat grid, not fp8_row_sum_mma): P reaches its P@V through shared memory instead of registers.
    serial_pv (with pingpong, not fp8_row_sum_mma): each block's P@V is waited for before the next block's QK is
    issued (its product or P and S never hold registers at once).
    softmax_fence: each block's P@V waited for after its softmax's exponentials (ptxas moves the wait before them).
    mask_ptx: masked blocks compare each score's key once, in inline PTX (_mask_scores).
    two_level_fma (two-level fp8 P@V, not fp8_row_sum_mma): O is moved to a block's reference one block late, in the
    same FMA that adds the next block's product (_kv_step).
    """
    total_q, num_q_heads, valid_d = q.shape
    head_dim = tile_head_dim(valid_d)  # the tiles' D; a smaller head size is padded (supports' pad_head_dim)
    paged = block_table is not None
    fp8 = is_fp8(k.dtype)
    num_kv_heads = k.shape[-2]
    num_seqs = cu_seqlens_q.shape[0] - 1
    # a 16-bit q not rounded to fp8 (`supports`' widen_k): K widened to q's type, V to fp16, both gathered
    widened_k = widens_k(q.dtype, k.dtype, quantize_q)
    # V widened to fp16 by the gathering producer: paged with fp8_v16, and contiguous K/V that are gathered (K
    # widened too, or fp8_v16_contiguous)
    widened_v = widened_k or (fp8 and (fp8_v16 if paged else fp8_v16_contiguous))
    # 16-bit pages through TMA boxes (fp8 V is transposed or widened by the gathering producer; a padded head's box
    # would run into the next slot, whose unused values may be anything: gathers, masked per column)
    views = (paged_tma_view(k), paged_tma_view(v)) if paged and paged_tma and not fp8 and valid_d == head_dim else None
    paged_tma = views is not None and views[0] is not None and views[1] is not None
    default_block_n, default_stages = tiles_for(
        head_dim, paged and not fp8 and not paged_tma, fp8 and causal and not paged and not widened_v, widened_k
    )
    # the largest block that fits, and its ring depth
    widest_block_n, widest_stages = (default_block_n, default_stages) if widened_k else tiles_for(head_dim)
    if block_n not in (64, 128) or block_n > widest_block_n:  # what fits the shared memory and the tiles' layouts
        block_n = default_block_n
    stages_given = stages > 0
    if not stages:  # a block size other than the default: the ring depth that fits with the widest
        stages = default_stages if block_n == default_block_n else widest_stages
    if widened_k:
        stages = max(stages, WIDENED_K_MIN_STAGES)

    def descriptor(t: torch.Tensor, rows: int) -> GluonTensorDescriptor:
        # [tokens, heads * D] in boxes [rows, tile D]: a padded head's box runs into the next head (zeros past the
        # last one), which the kernel cancels (see _consumer)
        flat_shape = [t.shape[0], t.shape[1] * valid_d]
        layout = _smem_layout(rows, head_dim, t.dtype)
        return GluonTensorDescriptor(t, flat_shape, [t.stride(0), 1], [rows, head_dim], layout)

    page_rows = (0,) * 6
    if paged:
        page_size, num_cache_blocks, max_blocks = k.shape[1], k.shape[0], block_table.shape[1]
        kv_strides = (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2))
        total_k = 0
        if paged_tma:
            chunk = min(page_size, block_n)
            layout = _smem_layout(chunk, head_dim, k.dtype)
            k_desc, v_desc = (GluonTensorDescriptor(t, [rows, width], [row_stride, 1], [chunk, head_dim], layout)
                              for t, (rows, width, row_stride, _) in zip((k, v), views))  # fmt: skip
            page_rows = (*views[0][3], *views[1][3])
        elif fp8:  # for the slots' shape and swizzle only: K gathered, V gathered and transposed to [D, BLOCK_N]
            k_desc = _layout_descriptor(block_n, head_dim, k.dtype, q.device)
            if widened_v:  # or widened to fp16 [BLOCK_N, D]
                v_desc = _layout_descriptor(block_n, head_dim, torch.float16, q.device)
            else:
                v_desc = _layout_descriptor(head_dim, block_n, v.dtype, q.device)
        else:
            k_desc = v_desc = descriptor(q, block_n)  # for the slots' shape and swizzle only: K/V are gathered
    elif widened_v:  # contiguous fp8 K/V gathered like pages (rows of tokens), V widened (and K with a 16-bit q)
        k_desc = _layout_descriptor(block_n, head_dim, k.dtype, q.device)
        v_desc = _layout_descriptor(block_n, head_dim, torch.float16, q.device)
        kv_strides = (0, k.stride(0), k.stride(1), 0, v.stride(0), v.stride(1))
        page_size, num_cache_blocks, max_blocks = 1, 1, 1
        total_k = k.shape[0]
    else:
        k_desc = descriptor(k, block_n)
        if fp8:
            # [Hk * D, keys] in tiles [D, BLOCK_N]: keys contiguous, the K-major B operand of the fp8 P@V
            if copies is None:
                v_key_major = key_major_copy(v, key_order=True, kernel=v_copy_kernel)
            else:
                v_key_major = plan_key_major_storage(v, True, v_copy_kernel, copies)
            padded = v_key_major.shape[-1]
            layout = _smem_layout(head_dim, block_n, v.dtype)
            v_desc = GluonTensorDescriptor(v_key_major, [num_kv_heads * head_dim, padded], [padded, 1],
                                           [head_dim, block_n], layout)  # fmt: skip
        else:
            v_desc = descriptor(v, block_n)
        kv_strides = (0,) * 6
        page_size, num_cache_blocks, max_blocks = 1, 1, 1
        total_k = k.shape[0]
    # three consumer warpgroups: registers for them only beside a one-warp TMA producer, and no persistent grid;
    # their 192-row tiles load as three 64-row Q boxes (a TMA box is a power of two). Contiguous K/V only: the GPU
    # tests cover that (pages through TMA boxes would fit too, untested)
    three = consumers == 3 and persistent_programs == 0 and not paged and not widened_v and head_dim <= 128
    block_m, box_m = (3 * BLOCK_M // 2, BLOCK_M // 2) if three else (BLOCK_M, BLOCK_M)
    if three and block_n == 64 and not stages_given:
        stages = max(stages, 4)  # a deeper ring for the shorter blocks: fits beside the 192-row Q at D <= 128
    # QUANTIZE_Q: q_desc (never loaded) only gives q's fp8 tiles; the producer loads the 16-bit q through q16_desc
    q_desc = _layout_descriptor(box_m, head_dim, k.dtype, q.device) if quantize_q else descriptor(q, box_m)
    q16_desc = descriptor(q, box_m) if quantize_q else q_desc
    n_tile_slots = total_q // block_m + num_seqs
    if persistent_programs > 0:
        grid: tuple[int, ...] = (max(1, min(persistent_programs, num_q_heads * n_tile_slots)),)
    else:
        grid = (num_q_heads, n_tile_slots)
    args = (
        q_desc, k_desc, v_desc, q16_desc,
        k if paged or widened_v else out, v if paged or widened_v else out, out, lse if lse is not None else out,
        cu_seqlens_q, cu_seqlens_k if cu_seqlens_k is not None else cu_seqlens_q,
        seqused_k if seqused_k is not None else cu_seqlens_q,
        block_table if paged else cu_seqlens_q,
        *(d if d is not None else out for d in (q_descale, k_descale, v_descale)),
        plan_cache.stream_state(_scheduler, q.device) if dynamic and persistent_programs > 0 else cu_seqlens_q,
        num_seqs, total_q, total_k, num_cache_blocks, max_blocks, float(softmax_scale),
        out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
        block_table.stride(0) if paged else 0, *kv_strides, *page_rows,
        *(s for d in (q_descale, k_descale, v_descale) for s in descale_strides(d)),
        n_tile_slots, num_q_heads,
    )  # fmt: skip
    # three warpgroups' 16-bit P tiles do not fit beside their Q and two K/V stages at D 128 (254 KB; fp8: 139 KB)
    p_smem_flat = p_smem and persistent_programs == 0 and not (three and v.element_size() == 2 and head_dim > 64)
    row_sum_mma = fp8_row_sum_mma and fp8 and not widened_v and two_level and not p_per_tile and not persistent_programs
    row_sum_mma = row_sum_mma and not p_smem_flat and not serial_pv
    constexprs = dict(
        GROUP=num_q_heads // num_kv_heads,
        CAUSAL=causal,
        # 2: ping-pong with serial steps (each block's P@V done before the next QK is issued, _kv_step_serial)
        PINGPONG=2 if pingpong and serial_pv else pingpong,
        RETURN_LSE=lse is not None,
        PAGED=paged,
        PAGE_SIZE=page_size,
        PAGED_TMA=paged and paged_tma,
        BLOCK_N=block_n,
        HAS_SEQUSED=seqused_k is not None,
        SEQ_FILTER=seq_filter,
        DECODE_MAX_Q=decode_max_q,
        STAGES=stages,
        FP8=fp8,
        # P's factor for an fp8 P@V's range (a 16-bit P@V needs none)
        P_SCALE_LOG2=int(math.log2(p_scale(v.dtype))) if fp8 and not widened_v else 0,
        TWO_LEVEL=two_level,
        P_PER_TILE=p_per_tile and fp8 and not widened_v,
        EARLY_K_RELEASE=early_k_release,
        # an fp8 P exists only where fp8 V stays key-major; elsewhere one rounding changes nothing
        LEAN_SOFTMAX=2 if fp8_p_one_rounding and fp8 and not widened_v else int(lean_softmax),
        LAUNCH_DEPENDENTS=False,  # set by the launcher's plan of a mixed batch (attention._overlapped)
        QUANTIZE_Q=quantize_q,
        Q_MAX=fp8_max(k.dtype) if quantize_q else 0.0,
        HAS_Q_DESCALE=q_descale is not None,
        HAS_K_DESCALE=k_descale is not None,
        HAS_V_DESCALE=v_descale is not None,
        PERSISTENT=persistent_programs > 0,
        # a second Q buffer (the next tile's Q loads during this one) where shared memory has room: not at D 256.
        # QUANTIZE_Q needs one: the consumers hand the 16-bit staging tile back once they have rounded it (early in
        # the tile, so the next one loads during this one) and each warpgroup rewrites only its own fp8 rows
        Q_BUFS=2 if persistent_programs > 0 and head_dim <= 128 and not quantize_q else 1,
        VALID_D=valid_d,
        DYNAMIC=dynamic and persistent_programs > 0,
        DYNAMIC_TAIL=dynamic_tail if dynamic and persistent_programs > 0 else 0,
        UNIFORM_TICKET=uniform_ticket and dynamic and persistent_programs > 0,
        TMA_PRODUCER_REGS=producer_regs or getattr(PERSISTENT_PRODUCER_REGS, "value", PERSISTENT_PRODUCER_REGS),
        ROW_SUM_MMA=row_sum_mma,
        CONSUMERS=3 if three else 2,
        P_SMEM=p_smem_flat,
        SOFTMAX_FENCE=softmax_fence,
        MASK_PTX=mask_ptx,
        TWO_LEVEL_FMA=two_level_fma and fp8 and not widened_v and two_level and not row_sum_mma,
    )
    return attention_fwd_hopper_kernel, grid, args, constexprs, {"num_warps": NUM_WARPS}


@functools.cache
def _scheduler(device: torch.device, stream: int) -> torch.Tensor:
    """The dynamic persistent grid's counter of a stream: int64 [base, tickets], zeroed once; every launch leaves
    base equal to tickets (see _producer_persistent), so no launch resets it and CUDA graphs replay it as is. One
    per stream: two launches at once would draw each other's tickets (a graph holds its capture stream's)."""
    return torch.zeros(2, dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=64)
def _smem_layout(rows: int, cols: int, dtype: torch.dtype):
    """The swizzled shared-memory layout of a [rows, cols] tile (cached: building one costs ~10 us of host time)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], _GL_DTYPES[dtype])


@functools.lru_cache(maxsize=64)
def _layout_descriptor(rows: int, cols: int, dtype: torch.dtype, device: torch.device):
    """A descriptor over a small tile of its own, for kernels that take only its block shape, dtype and layout
    (slots filled by gathers, a q quantized in the kernel): never loaded through."""
    tile = torch.empty((rows, cols), dtype=dtype, device=device)
    return GluonTensorDescriptor(tile, [rows, cols], [cols, 1], [rows, cols], _smem_layout(rows, cols, dtype))


def paged_tma_view(cache: torch.Tensor):
    """A 2-D view of a paged cache [num_blocks, page, Hk, D] in which each (block, kv head)'s keys are consecutive
    rows, for TMA boxes of a page's keys: (rows, width, row stride, (rows per block, rows per kv head, columns per kv
    head)); None when the strides allow none (TMA: 16-byte row stride, fewer than 2^31 rows).

    Heads side by side in a row (vLLM's [blocks, page, Hk, D], also as K/V halves of [blocks, 2, page, Hk, D]): rows
    are keys, a head is a column offset. Heads-major pages ([blocks, Hk, page, D] viewed as [blocks, page, Hk, D]):
    rows of D, a head is a row offset. The view never reaches past the cache's last element.
    """
    num_blocks, page, num_heads, head_dim = cache.shape
    block_stride, slot_stride, head_stride, dim_stride = cache.stride()
    if dim_stride != 1 or num_blocks == 0:
        return None
    if head_stride == head_dim and slot_stride >= num_heads * head_dim and block_stride % slot_stride == 0:
        row_stride, width = slot_stride, num_heads * head_dim
        placement = (block_stride // slot_stride, 0, head_dim)
        rows = (num_blocks - 1) * placement[0] + page
    elif slot_stride == head_dim and head_stride % head_dim == 0 and block_stride % head_dim == 0:
        row_stride, width = head_dim, head_dim
        placement = (block_stride // head_dim, head_stride // head_dim, 0)
        rows = (num_blocks - 1) * placement[0] + (num_heads - 1) * placement[1] + page
    else:
        return None
    if (row_stride * cache.element_size()) % 16 or rows >= 2**31:
        return None
    return rows, width, row_stride, placement


__all__ = ["HAS_GLUON", "plan_hopper_prefill", "supports", "tiles_for", "triton"]
