"""A/B experiment on a GPU: tritonfa under several configs (TRITONFA_CONFIG overrides) on the benchmark workloads.

Every variant's output is checked against `tritonfa.reference` (the same check as `python -m tritonfa.bench`) and
timed with the bench's timers (do_bench for prefill, CUDA-graph replays for decode and mixed batches); the peers
(FA3 where vLLM's flash-attention imports, cuDNN SDPA, FlexAttention; --peers) run once per workload in the same
process, so ratios compare like with like.

    python kernel/scripts/variants.py --plan prefill --out results_dir     # or --plan decode / mixed / all
    python kernel/scripts/variants.py --plan decode --only b64x2048 --variants default,bn64-s3
    python kernel/scripts/variants.py --plan prefill --only b4x4096 --variants default,ws-early-k-release --rounds 2

Writes <out>/variants-<plan>.jsonl (one row per workload x variant) and prints a table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# name -> TRITONFA_CONFIG override (applied to every config the dispatcher picks in that run); an "env" entry sets
# environment variables for that run instead
# three consumer warpgroups with 64-key blocks (4 ring slots): the D 128 consumers fit 160 registers there. These
# and THREE_P_SMEM keep their session 35-37 meaning for fp8 non-causal whatever ws_fp8_three_consumers is set to
# (it would set P in shared memory and serial steps there)
THREE_BN64 = {"ws_consumers": 3, "ws_persistent": False, "ws_block_n": 64, "ws_fp8_three_consumers": False}
THREE_P_SMEM = {"ws_consumers": 3, "ws_persistent": False, "ws_p_smem": True, "ws_fp8_three_consumers": False}
# causal fp8 on V's key-major copy instead of V widened by the producer; the flat grid with 128-key blocks
KEY_MAJOR = {"ws_fp8_v16_contiguous": False}
KEY_MAJOR_FLAT_BN128 = {**KEY_MAJOR, "ws_persistent": False, "ws_block_n": 128}
PREFILL_VARIANTS = {
    "default": {},
    # the default again, through an override: the noise floor beside every A/B (session 33: every variant of the
    # mixed batch came out +0.89% in all 40 pairs, two different kernels alike - the order, see --order)
    "default-again": {"ws_dynamic_tail": 4},
    "no-tma": {"tma": False},
    "bn128-s2": {"block_n": 128, "num_stages": 2},
    "s4": {"num_stages": 4},
    "bm64-w4": {"block_m": 64, "num_warps": 4, "num_stages": 3},
    "bm64-w4-bn128": {"block_m": 64, "block_n": 128, "num_warps": 4, "num_stages": 3},
    "bm128-w4": {"block_m": 128, "num_warps": 4, "num_stages": 3},
    "fp8q-on": {"fp8_q_for_fp8_kv": True},
    "v-row-major": {"env": {"TRITONFA_FP8_V_TRANSPOSE": "0"}},
    "v-tma": {"tma_key_major_v": True},
    "k-rows": {"k_rows": True},
    "ws": {"warp_specialized": True},  # Hopper: the warp-specialized Gluon prefill (contiguous 16-bit only)
    "ws-nopp": {"warp_specialized": True, "ws_pingpong": False},
    # fp8 on the Gluon prefill: fp8 q/k/v; a 16-bit q with an fp8 KV cache needs fp8_q_for_fp8_kv too
    "ws-fp8": {"ws_fp8": True},
    "ws-fp8-one-level": {"ws_fp8": True, "ws_fp8_two_level": False},
    "ws-fp8-q8": {"ws_fp8": True, "fp8_q_for_fp8_kv": True},
    # the same with V read through its key-major copy (fp8 P@V), for causal calls too (where V is widened by default)
    "ws-fp8-q8-key-major": {"ws_fp8": True, "fp8_q_for_fp8_kv": True, "ws_fp8_v16_contiguous": False},
    "ws-fp8-s3": {"ws_fp8": True, "fp8_q_for_fp8_kv": True, "ws_stages": 3},
    "ws-fp8-s4": {"ws_fp8": True, "fp8_q_for_fp8_kv": True, "ws_stages": 4},
    "ws-paged-tma": {"ws_paged_tma": True},  # paged prefill: TMA boxes of a page's keys instead of cp.async gathers
    "ws-persistent": {"ws_persistent": True},  # Gluon prefill on a persistent grid
    "ws-persistent-paged-tma": {"ws_persistent": True, "ws_paged_tma": True},
    # fp8 with 64-key blocks: no spills (two-level P@V spills 24 instructions in the 128-key loop), 37% more per key
    "ws-fp8-bn64": {"ws_fp8": True, "fp8_q_for_fp8_kv": True, "ws_block_n": 64},
    "ws-flat": {"ws_persistent": False},  # one program per tile (the persistent grid is the Hopper default)
    "ws-static": {"ws_dynamic": False},  # the persistent grid's fixed shares only (Hopper's default before session 31)
    # every tile from a device counter, on every persistent launch (the default: the last 4 rounds, causal, contiguous)
    "ws-dynamic": {"ws_dynamic": True, "ws_dynamic_tail": 0},
    # fixed shares but the last 1 / 2 / 4 rounds' items from the counter (the balance at the end only)
    "ws-dynamic-tail1": {"ws_dynamic": True, "ws_dynamic_tail": 1},
    "ws-dynamic-tail2": {"ws_dynamic": True, "ws_dynamic_tail": 2},
    "ws-dynamic-tail4": {"ws_dynamic": True, "ws_dynamic_tail": 4},
    "ws-dynamic-tail6": {"ws_dynamic": True, "ws_dynamic_tail": 6},
    "ws-dynamic-tail8": {"ws_dynamic": True, "ws_dynamic_tail": 8},
    # the default's dynamic tail on paged K/V too (TMA pages ran 25% slower with it, session 31)
    "ws-dynamic-paged": {"ws_dynamic_paged": True},
    # the drawn item made warp-uniform for the producer (config ws_uniform_ticket): with the default's tail, on pages
    # too, and every tile from the counter
    "ws-uniform-ticket": {"ws_uniform_ticket": True},
    "ws-uniform-ticket-paged": {"ws_uniform_ticket": True, "ws_dynamic_paged": True},
    # the counter with the uniform ticket on TMA pages only (contiguous launches: the default's own kernel)
    "ws-paged-uniform": {"ws_uniform_ticket": "paged", "ws_dynamic_paged": True},
    "ws-dynamic-uniform": {"ws_dynamic": True, "ws_dynamic_tail": 0, "ws_uniform_ticket": True},
    # the persistent TMA producer's registers (56 by default): the consumers get what it leaves (504 per thread)
    "ws-producer-regs24": {"ws_producer_regs": 24},
    "ws-producer-regs32": {"ws_producer_regs": 32},
    "ws-fp8-row-sum-mma": {"ws_fp8_row_sum_mma": True},  # fp8 l from P @ ones on the tensor cores
    # three consumer warpgroups on 192-row tiles (flat grid, TMA loads): fp8 non-causal is flat already; the 16-bit
    # and causal launches with the persistent grid off
    "ws-three-consumers": {"ws_consumers": 3, "ws_persistent": False, "ws_fp8_three_consumers": False},
    # fp8 q/k/v non-causal: three consumer warpgroups, P per key block through shared memory, serial steps, two-level
    # P@V (its one-level first form is ws-three-consumers-p-smem-one-level)
    "ws-fp8-three-consumers": {"ws_fp8_three_consumers": True},
    # fp8 q/k/v non-causal on two consumers (the default; beside a default that turns ws_fp8_three_consumers on)
    "ws-fp8-two-consumers": {"ws_fp8_three_consumers": False},
    # with three K/V ring slots instead of two (172 KB of shared memory)
    "ws-fp8-three-consumers-stages-3": {"ws_fp8_three_consumers": True, "ws_stages": 3},
    # fp8 q/k/v causal with three consumers and P per key block through shared memory, in 128-key blocks, V read
    # key-major instead of widened to fp16 (ws_fp8_v16_contiguous): serial steps with the two-level P@V, and the
    # one-level P@V (both slower, session 39)
    "ws-fp8-causal-three-serial": {
        **THREE_P_SMEM,
        "ws_serial_pv": True,
        "ws_fp8_v16_contiguous": False,
        "ws_block_n": 128,
    },
    "ws-fp8-causal-three": {
        **THREE_P_SMEM,
        "ws_fp8_two_level": False,
        "ws_fp8_v16_contiguous": False,
        "ws_block_n": 128,
    },
    # causal fp8 with V read key-major (fp8 P@V, P per key block, two levels) on the default two consumers: on the
    # default grid and on the flat one; beside ws-fp8-v16-contiguous-flat (V widened, flat grid) they separate the
    # grid from the V format in ws-fp8-causal-three's +28% (session 39)
    "ws-fp8-causal-key-major": KEY_MAJOR,
    "ws-fp8-causal-key-major-flat": {**KEY_MAJOR, "ws_persistent": False},
    # the flat one in 128-key blocks (tiles_for picks 64 for key-major fp8 V; 128 does not fit the persistent grid)
    "ws-fp8-causal-key-major-flat-bn128": KEY_MAJOR_FLAT_BN128,
    # with 64-key blocks (128-key blocks spill at D 128), and fp8 P@V chained in the MMA (one level)
    "ws-three-consumers-bn64": THREE_BN64,
    "ws-three-consumers-bn64-one-level": {**THREE_BN64, "ws_fp8_two_level": False},
    # with P through shared memory (config ws_p_smem): 128-key blocks fit three consumers' 160 registers
    "ws-three-consumers-p-smem": THREE_P_SMEM,
    "ws-three-consumers-p-smem-one-level": {**THREE_P_SMEM, "ws_fp8_two_level": False},
    # each P@V waited for before the next QK is issued (ws_serial_pv): the two-level fp8 P@V at three consumers
    # without spills; 16-bit D 128 at three consumers with P in registers and 128-key blocks
    "ws-three-consumers-p-smem-serial": {**THREE_P_SMEM, "ws_serial_pv": True},
    "ws-three-consumers-serial": {"ws_consumers": 3, "ws_persistent": False, "ws_serial_pv": True},
    # masked blocks compare each score's key once, in inline PTX (session 39: fewer instructions per masked step)
    "ws-mask-ptx": {"ws_mask_ptx": True},
    "ws-fp8-causal-key-major-mask-ptx": {**KEY_MAJOR, "ws_mask_ptx": True},
    "ws-fp8-causal-key-major-flat-bn128-mask-ptx": {**KEY_MAJOR_FLAT_BN128, "ws_mask_ptx": True},
    # two-level fp8 P@V: O's rescale one block late, in the FFMA that adds the block's product (session 40)
    "ws-two-level-fma": {"ws_two_level_fma": True},
    # fp8 V's key-major copy by torch's strided copies instead of the Triton transpose (kernels/key_major.py)
    "v-copy-torch": {"v_copy_kernel": False},
    "ws-fp8-causal-key-major-flat-bn128-fma": {**KEY_MAJOR_FLAT_BN128, "ws_two_level_fma": True},
    "ws-three-consumers-p-smem-serial-fma": {**THREE_P_SMEM, "ws_serial_pv": True, "ws_two_level_fma": True},
    # causal fp8 on key-major V with both cuts of the masked and the interior step (mask in PTX, FFMA rescale)
    "ws-fp8-causal-key-major-mask-ptx-fma": {**KEY_MAJOR, "ws_mask_ptx": True, "ws_two_level_fma": True},
    "ws-fp8-causal-key-major-flat-bn128-mask-ptx-fma": {
        **KEY_MAJOR_FLAT_BN128,
        "ws_mask_ptx": True,
        "ws_two_level_fma": True,
    },
    # each block's P@V waited for after the softmax's exponentials (ptxas puts that wait before them otherwise)
    "ws-softmax-fence": {"ws_softmax_fence": True},
    "ws-softmax-fence-one-level": {"ws_softmax_fence": True, "ws_fp8_two_level": False},
    "ws-three-consumers-p-smem-fence": {**THREE_P_SMEM, "ws_softmax_fence": True, "ws_fp8_two_level": False},
    # their controls: two consumers with the same blocks and ring (what the third warpgroup alone changes)
    "ws-bn64-flat": {"ws_persistent": False, "ws_block_n": 64, "ws_stages": 4},
    "ws-bn64-flat-one-level": {"ws_persistent": False, "ws_block_n": 64, "ws_stages": 4, "ws_fp8_two_level": False},
    "ws-uniform-ticket-noncausal": {"ws_dynamic": True, "ws_uniform_ticket": True},  # the tail on every launch
    "ws-fp8-paged": {"ws_fp8_paged": True},  # paged fp8 on the Gluon prefill (V transposed by the producer)
    "ws-fp8-paged-q8": {"ws_fp8_paged": True, "fp8_q_for_fp8_kv": True},
    # paged fp8 with V widened to fp16 by the producer and a 16-bit P@V (no transpose)
    "ws-fp8-paged-v16": {"ws_fp8_paged_v16": True},
    "ws-fp8-paged-v16-q8": {"ws_fp8_paged_v16": True, "fp8_q_for_fp8_kv": True},
    "ws-fp8-paged-v16-bn64-s4": {"ws_fp8_paged_v16": True, "ws_block_n": 64, "ws_stages": 4},
    "ws-fp8-paged-v16-flat": {"ws_fp8_paged_v16": True, "ws_persistent": False},
    # a 16-bit q with fp8 K/V, not rounded: K and V gathered and widened by the producer (16-bit QK and P@V)
    "ws-fp8-k16": {"ws_fp8_k16": True, "ws_fp8_widen_copy": False},
    "ws-fp8-k16-flat": {"ws_fp8_k16": True, "ws_fp8_widen_copy": False, "ws_persistent": False},
    # a 16-bit q with fp8 K/V: K and V widened once by a launch before the 16-bit prefill (paged: gathered too;
    # Hopper's default since session 14)
    "ws-fp8-widen-copy": {"ws_fp8_widen_copy": True},
    # a 16-bit q on a paged cache of its type: the pages gathered into a contiguous copy by the same launch, then the
    # contiguous prefill (session 43)
    "ws-paged-gather-copy": {"ws_paged_gather_copy": True},
    # contiguous fp8 K/V gathered and V widened (no key-major copy, a 16-bit P@V), 128-key blocks on the persistent grid
    "ws-fp8-v16-contiguous": {"ws_fp8_v16_contiguous": True},
    # fp8 P scaled per (row, key block) where it meets key-major V (non-causal): the fp8 study's (b)
    "ws-fp8-p-per-tile": {"ws_fp8_p_per_tile": True},
    # K's ring slot handed back once its QK is done, V's after its P@V (the next K loads a block earlier)
    "ws-early-k-release": {"ws_early_k_release": True},
    # the softmax step's row max as a tree and a 16-bit P packed as the P@V reads it (same arithmetic)
    "ws-lean-softmax": {"ws_lean_softmax": True},
    "ws-lean-softmax-early-k": {"ws_lean_softmax": True, "ws_early_k_release": True},
    # fp8 P rounded once from fp32 where it meets key-major fp8 V (non-causal fp8: 32 conversions fewer per block)
    "ws-fp8-p-one-rounding": {"ws_fp8_p_one_rounding": True},
    # session 27's Hopper flips undone one at a time (session 28: is the fp8 KV contiguous prefill's slow mode theirs?)
    "no-mixed-pdl": {"mixed_pdl": False},
    "no-fp8-p-one-rounding": {"ws_fp8_p_one_rounding": False},
    # both: P rounded once into the P@V, which accumulates into O in the wgmma (64 FADD fewer per block)
    "ws-fp8-one-level-one-rounding": {"ws_fp8_p_one_rounding": True, "ws_fp8_two_level": False},
    "ws-fp8-v16-contiguous-flat": {"ws_fp8_v16_contiguous": True, "ws_persistent": False},
    # fp8 q with V widened (causal contiguous, paged): 64-key blocks in 4 slots, the keys in flight of 128 x 2 in
    # smaller steps (what 16-bit pages gained in session 8); not for k16 (its 3+ slots of 16-bit K do not fit 4)
    "ws-fp8-v16-bn64-s4": {"ws_block_n": 64, "ws_stages": 4},
    # the transposed V and fp8 P@V (session 8's paged fp8), for A/B against the widened V (the default since session 9)
    "ws-fp8-paged-v8": {"ws_fp8_paged_v16": False},
    # fp8 at D 128 with 64-key blocks: on the persistent grid (its consumers fit there with 64 keys)
    "ws-fp8-bn64-persistent": {"ws_block_n": 64},
    "ws-fp8-bn64-s3-persistent": {"ws_block_n": 64, "ws_stages": 3},
    "ws-pad-d": {"ws_pad_head_dim": True},  # head sizes like 96 in 128-wide Gluon tiles
    # key blocks and ring depth (16-bit pages at D 128 default to 64 keys x 4 slots, everything else to 128 x 2)
    "ws-bn128": {"ws_block_n": 128},
    "ws-bn64": {"ws_block_n": 64},
    "ws-bn64-s3": {"ws_block_n": 64, "ws_stages": 3},
    "ws-bn64-s4": {"ws_block_n": 64, "ws_stages": 4},
}
# Hopper's Gluon decode as it is the default there (session 24): the base of the Gluon variants below
_GLUON_DECODE = {"decode_keys_as_rows": "tile", "decode_gluon": True, "decode_gluon_fp8_q": True}
DECODE_VARIANTS = {
    "default": {},
    "bn64-s3": {"block_n": 64, "num_stages": 3},
    "bn64-s5": {"block_n": 64, "num_stages": 5},
    "bn32-s4": {"block_n": 32, "num_stages": 4},
    "bm64-bn64-s3": {"block_m": 64, "block_n": 64, "num_stages": 3},
    "w8": {"num_warps": 8},
    "fp8q-on": {"fp8_q_for_fp8_kv": True},
    "k-rows": {"k_rows": True},
    # deeper K/V pipelines: an fp8 stage is half a 16-bit one's bytes, so fp8 decode keeps fewer bytes in flight
    "s6": {"num_stages": 6},
    # paged fp8 decode: block ids a step ahead (sm_90 D 128: K/V buffers 1 -> 3, 106 KB, 255 registers, 0 spills)
    "prefetch-fp8-ids": {"decode_prefetch_ids": "fp8"},
    "prefetch-fp8-ids-s3": {"decode_prefetch_ids": "fp8", "num_stages": 3},
    # the same in 64-key blocks: 168 registers (3 programs per SM), s5: 4 buffers, 72 KB
    "prefetch-fp8-ids-bn64-s5": {"decode_prefetch_ids": "fp8", "block_n": 64, "num_stages": 5},
    "prefetch-fp8-ids-bn64-s4": {"decode_prefetch_ids": "fp8", "block_n": 64, "num_stages": 4},
    # 16-bit paged decode (sm_90 D 128): 64-key blocks, 3 stages: 2 buffers, 72 KB, 144 registers (3 programs per SM:
    # 192 KB in flight per SM against 2 x 64 KB now)
    "prefetch-ids-bn64-s3": {"decode_prefetch_ids": True, "block_n": 64, "num_stages": 3},
    # fp8 K decode: QK as K q^T, an fp8 wgmma over the keys, and P@V as V^T P^T (V widened into shared memory);
    # sm_90 D 128 paged: 620 instructions per block and warp in the loop against the default's 1077; H200 session 18:
    # +6% (+30% with the ids a step ahead)
    "keys-as-rows": {"decode_keys_as_rows": True},
    "keys-as-rows-prefetch": {"decode_keys_as_rows": True, "decode_prefetch_ids": "fp8"},
    "keys-as-rows-s3": {"decode_keys_as_rows": True, "num_stages": 3},
    # 64-key blocks: sm_90 137 registers and 48 KB shared (3 programs per SM, 12 warps, against 2 x 4 at 128 keys:
    # more independent block chains per SM; session 18 found the 128-key tile bound by each block's serial waits)
    "keys-as-rows-bn64-s4": {"decode_keys_as_rows": True, "block_n": 64, "num_stages": 4},
    "keys-as-rows-bn64-s5": {"decode_keys_as_rows": True, "block_n": 64, "num_stages": 5},  # 64 KB: still 3 per SM
    # with the block ids a step ahead: 129 registers, 63 KB (3 per SM), more K/V buffers
    "keys-as-rows-bn64-ids-s3": {
        "decode_keys_as_rows": True,
        "block_n": 64,
        "num_stages": 3,
        "decode_prefetch_ids": "fp8",
    },
    # four programs per SM (ptxas held to 128 registers; sm_90: keys-as-rows 64-key tiles 127-128 registers, 0 spills,
    # 47-48 KB; the default's 32-key tile 128, 1 spill, 14 KB): b64 x 8 KV heads = 512 programs fit 132 x 4 slots in
    # one wave instead of two
    "keys-as-rows-bn64-s3-r128": {"decode_keys_as_rows": True, "block_n": 64, "num_stages": 3, "max_registers": 128},
    "keys-as-rows-bn64-s2-r128": {"decode_keys_as_rows": True, "block_n": 64, "num_stages": 2, "max_registers": 128},
    "bn32-s4-r128": {"block_n": 32, "num_stages": 4, "max_registers": 128},
    # three programs per SM with the default tile in 64-key blocks (sm_90: 168 registers, 3 spilled words, 23 KB)
    "bn64-s4-r168": {"block_n": 64, "num_stages": 4, "max_registers": 168},
    "bn256-s3": {"block_n": 256, "num_stages": 3},
    # fewer registers per program (sm_90, fp8-KV decode tile 16 x 128 x 4 slots: 255 registers, 2 programs per SM, half
    # the bf16 decode's bytes in flight): 32-key blocks take 168 (3 programs) with 8-10 slots, 64-key ones 190-214
    "bn32-s8": {"block_n": 32, "num_stages": 8},
    "bn32-s10": {"block_n": 32, "num_stages": 10},
    "bn64-s8": {"block_n": 64, "num_stages": 8},
    # Hopper's fp8-K decode tile before session 20 (16 rows, mma.sync, 128 keys, 4 stages; K and V widened in registers)
    "no-keys-as-rows": {"decode_keys_as_rows": False},
    # the keys-as-rows tile of configs._KEYS_AS_ROWS_DECODE (D 128: 64 keys, 2 stages, 128 registers) for the calls
    # it covers (Hopper's D 128 default since session 21: the same as "default" there)
    "keys-as-rows-tile": {"decode_keys_as_rows": "tile"},
    # the Gluon fp8-KV decode (kernels/attention_hopper_decode.py): a producer warp keeps STAGES 64-key blocks in
    # flight through TMA (sm_90: 64 registers at launch, 41 / 57 / 74 KB: 4 / 3 / 3 programs per SM); 16-bit and
    # other calls keep the default. Hopper's default since session 23 with 2 stages (the same as "default" there);
    # "no-gluon-decode": the keys-as-rows tile it replaced
    "no-gluon-decode": {"decode_keys_as_rows": "tile", "decode_gluon": False},
    "gluon-decode-s2": {"decode_keys_as_rows": "tile", "decode_gluon": True, "decode_gluon_stages": 2},
    # an e4m3 q with its descale (vLLM's fp8 cache) there too: Hopper's default since session 24 (the same as
    # "default" there; H100: fp8 b64x2048 0.1054-0.1064 -> 0.1005-0.1018 ms)
    "gluon-fp8-q": {**_GLUON_DECODE},
    # V widened into its ring slot for P @ V, row sums per thread (decode_gluon_v16_smem: sm_90 SASS 24 -> 6
    # barriers and 471 -> ~330 instructions per 64-key block, 0 spills, same shared memory; the slot goes back
    # after P @ V)
    "gluon-v16-smem": {**_GLUON_DECODE, "decode_gluon_v16_smem": True},
    # with 3 stages (the slot is held through P @ V): an e4m3 q (vLLM's case, no q_lo buffer) fits 4 programs per
    # SM at 55 KB; a bf16 q needs 57.4 KB, 3 programs per SM
    "gluon-v16-smem-s3": {**_GLUON_DECODE, "decode_gluon_v16_smem": True, "decode_gluon_stages": 3},
    # the Gluon decode for calls the portable kernel splits (decode_gluon_split: per-split partial results and the
    # combine launch). Session 24 measured it only with the leaner block step that spilled (V read from its slot,
    # per-thread row sums: +46% on b64x2048; removed): 0.251 vs the portable split's 0.209 ms
    "gluon-split": {**_GLUON_DECODE, "decode_gluon_split": True},
    "gluon-split-v16-smem": {**_GLUON_DECODE, "decode_gluon_split": True, "decode_gluon_v16_smem": True},
    "gluon-decode-s3": {"decode_keys_as_rows": "tile", "decode_gluon": True, "decode_gluon_stages": 3},
    "gluon-decode-s4": {"decode_keys_as_rows": "tile", "decode_gluon": True, "decode_gluon_stages": 4},
}
# With decode_keys_as_rows="tile" (Hopper's D 128 decode default) an e4m3-K call runs the keys-as-rows tile and an
# override applies on top of that tile. So each variant keeps the meaning it was measured with: those of
# the 16-row tile turn keys-as-rows off, the keys-as-rows ones name their whole tile (128 keys, 4 stages unless they
# say otherwise)
_KEYS_AS_ROWS_TILE = {"block_n": 128, "num_stages": 4, "max_registers": 0}
for _name, _override in DECODE_VARIANTS.items():
    if _name != "default" and _override.get("decode_keys_as_rows") != "tile":
        if _override.get("decode_keys_as_rows"):
            DECODE_VARIANTS[_name] = {**_KEYS_AS_ROWS_TILE, **_override}
        else:
            DECODE_VARIANTS[_name] = {"decode_keys_as_rows": False, **_override}
# shapes for A/Bs only, not in the bench or asv's history: b8x2048 without the causal mask, so a causal workload's
# cost can be split into its mask and its shorter key ranges (session 39: fp8 causal on key-major V runs at 60% of
# its non-causal b4x4096 throughput, bf16 at 85%)
DIAGNOSTIC_WORKLOADS = {
    "prefill-b8x2048-noncausal": {},
    "fp8-prefill-b8x2048-noncausal": {"q_dtype": "fp8_e4m3", "kv_dtype": "fp8_e4m3"},
}


def workloads_by_name() -> dict:
    """The bench's workloads and the diagnostic shapes above, by name."""
    from tritonfa.bench.workloads import WORKLOADS, Workload

    by_name = {w.name: w for w in WORKLOADS}
    for name, dtypes in DIAGNOSTIC_WORKLOADS.items():
        by_name[name] = Workload(name, "prefill", seqlens_q=(2048,) * 8, seqlens_k=(2048,) * 8, causal=False, **dtypes)
    return by_name


PLANS = {
    "prefill": (
        [
            "prefill-b8x2048-causal",
            "prefill-b1x8192-causal",
            "prefill-b4x4096-noncausal",
            "prefill-varlen16-causal",
            "prefill-b8x2048-causal-paged",
            "prefill-d96-b8x2048-causal",
            "prefill-d256-b8x2048-causal",
            "fp8-prefill-b8x2048-causal",
            "fp8-prefill-b4x4096-noncausal",
            "fp8kv-prefill-b8x2048-causal",
            "fp8kv-prefill-b8x2048-causal-paged",
            "fp8-prefill-b8x2048-causal-paged",
            *DIAGNOSTIC_WORKLOADS,
        ],
        PREFILL_VARIANTS,
    ),
    "decode": (
        [
            "decode-b64x2048-paged",
            "fp8kv-decode-b64x2048-paged",
            "fp8-decode-b64x2048-paged",
            "decode-b8x32768-paged",
            "fp8-decode-b8x32768-paged",
            "decode-b256x1024-paged",
            "decode-q4-b64x2048-paged",
            "decode-d64-b64x2048-paged",
            "decode-d256-b64x2048-paged",
            "decode-b64x2048-paged-bs1",
            "decode-b64x2048-paged-bs256",
        ],
        DECODE_VARIANTS,
    ),
    # the prefill part of a mixed batch is the Gluon launch on Hopper: its schedules; and the decode launch as a
    # programmatic dependent of it (config `mixed_pdl`)
    "mixed": (
        ["mixed-4x512+60-paged"],
        {
            **{
                name: PREFILL_VARIANTS[name]
                for name in (
                    "default",
                    "default-again",
                    "ws-persistent",
                    "ws-paged-tma",
                    "ws-persistent-paged-tma",
                    "ws-bn128",
                    "ws-static",
                    "ws-dynamic",
                    "ws-dynamic-tail2",
                    "ws-dynamic-paged",
                    "ws-uniform-ticket-paged",
                    "ws-paged-uniform",
                    "ws-producer-regs24",
                    "ws-paged-gather-copy",
                )
            },
            "mixed-pdl": {"mixed_pdl": True},
        },
    ),
}
PEERS = ("fa3", "sdpa-cudnn", "flex")  # FA3 where vllm.vllm_flash_attn imports, else reported unsupported


def matches(name: str, pattern: str) -> bool:
    """--only pattern: a substring of the workload name; a leading ^ / trailing $ anchors it at the start / end."""
    if pattern.startswith("^") and pattern.endswith("$"):
        return name == pattern[1:-1]
    if pattern.startswith("^"):
        return name.startswith(pattern[1:])
    if pattern.endswith("$"):
        return name.endswith(pattern[:-1])
    return pattern in name


def round_schedule(runs: list, rounds: int, order: str = "rotate") -> list[tuple[int, int, object]]:
    """(round, position in the round, run) in the order they run: every run once per round; "rotate": round r
    starts at runs[r % len(runs)], so each run takes each place in turn; "fixed": runs' order every round."""
    schedule = []
    for r in range(max(1, rounds)):
        shift = r % len(runs) if order == "rotate" and runs else 0
        schedule += [(r, position, run) for position, run in enumerate(runs[shift:] + runs[:shift])]
    return schedule


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", default="all", help=f"one of {sorted(PLANS)} or all")
    parser.add_argument("--out", default=".", help="folder for the JSONL results")
    parser.add_argument("--only", default="", help="comma-separated substrings of workload names (^ and $ anchor one)")
    parser.add_argument("--variants", default="", help="comma-separated variant names (default: all of the plan)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated peers (default {','.join(PEERS)})")
    parser.add_argument("--no-peers", action="store_true", help="no peers")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run each workload's list (peers, variants) this many times in turn; the summary takes "
                             "each one's best (drift within a process shows as round-to-round changes)")  # fmt: skip
    parser.add_argument("--order", choices=("rotate", "fixed"), default="rotate",
                        help="rotate: round r starts at the list's entry r (mod its length), so no run is always "
                             "first (session 33: two different kernels each came out +0.89%% in every round after "
                             "the default); fixed: the list's order every round")  # fmt: skip
    args = parser.parse_args(argv)

    import torch

    from tritonfa.bench import FULL_REPS, make_case, reference_check, run_impl

    by_name = workloads_by_name()
    plans = sorted(PLANS) if args.plan == "all" else args.plan.split(",")
    only = [s for s in args.only.split(",") if s]
    wanted = [s for s in args.variants.split(",") if s]
    # a filter that selects nothing is a mistake (a regular expression where substrings are expected: session 24
    # lost a step to one): say so before any GPU work
    unknown = [p for p in plans if p not in PLANS]
    planned = [name for p in plans if p in PLANS for name in PLANS[p][0]]
    unmatched = [s for s in only if not any(matches(name, s) for name in planned)]
    unknown_variants = [v for v in wanted if not any(v in PLANS[p][1] for p in plans if p in PLANS)]
    if unknown or unmatched or unknown_variants:
        parser.error(f"unknown plans {unknown}, --only entries matching no workload of the plans {unmatched}, "
                     f"unknown variants {unknown_variants} (--only takes substrings; ^ and $ anchor one)")  # fmt: skip
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
    table = []
    for plan in plans:
        names, variants = PLANS[plan]
        sink = open(out_dir / f"variants-{plan}.jsonl", "a")
        for name in names:
            if only and not any(matches(name, s) for s in only):
                continue
            workload = by_name[name]
            case = make_case(workload, device)
            check = reference_check(case)
            impls = [] if args.no_peers else [p for p in args.peers.split(",") if p]
            runs = [(impl, "peer", None) for impl in impls]
            runs += [
                ("tritonfa", label, cfg)
                for label, cfg in variants.items()
                if (not wanted or label in wanted)
                and ("fp8_q_for_fp8_kv" not in cfg or (workload.fp8_kv and not workload.fp8_q))
                and (("env" not in cfg and "tma_key_major_v" not in cfg) or workload.fp8_kv)
            ]
            for rnd, position, (impl, label, cfg) in round_schedule(runs, args.rounds, args.order):
                env = dict((cfg or {}).get("env", {}))
                if cfg is not None:
                    env["TRITONFA_CONFIG"] = json.dumps({k: v for k, v in cfg.items() if k != "env"})
                os.environ.update(env)
                start = time.perf_counter()
                row = run_impl(impl, case, check, FULL_REPS)
                for key in env:
                    os.environ.pop(key, None)
                record = dict(
                    plan=plan, workload=name, impl=impl, variant=label, config=cfg, status=row.status, ms=row.ms,
                    tflops=row.tflops, gbps=row.gbps, error=row.error, reason=row.reason,
                    first_call_s=row.first_call_s, wall_s=time.perf_counter() - start, round=rnd,
                    position=position,
                )  # fmt: skip
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                table.append(record)
                metric = (
                    f"{row.tflops or 0:7.1f} TFLOP/s" if workload.kind == "prefill" else f"{row.gbps or 0:7.0f} GB/s"
                )
                ms = f"{row.ms:.4f}" if row.ms else "-"
                print(
                    f"{name:32s} {impl:10s} {label:14s} r{rnd} {row.status:11s} {ms:>8s} ms {metric} "
                    f"err {row.error if row.error is not None else float('nan'):.1e} {row.reason or ''}",
                    flush=True,
                )
            del case
            torch.cuda.empty_cache()
        sink.close()
    print("\nsummary (best tritonfa variant per workload vs best peer)")
    for name in dict.fromkeys(r["workload"] for r in table):
        rows = [r for r in table if r["workload"] == name and r["status"] == "ok" and r["ms"]]
        ours = [r for r in rows if r["impl"] == "tritonfa"]
        peers = [r for r in rows if r["impl"] != "tritonfa"]
        if not ours:
            print(f"{name:32s} no correct tritonfa variant")
            continue
        best = min(ours, key=lambda r: r["ms"])
        default = min((r for r in ours if r["variant"] == "default"), key=lambda r: r["ms"], default=None)
        peer = min(peers, key=lambda r: r["ms"]) if peers else None
        print(
            f"{name:32s} best {best['variant']:14s} {best['ms']:.4f} ms"
            + (f" | default {default['ms']:.4f}" if default else "")
            + (f" | {peer['impl']} {peer['ms']:.4f} ms, best/peer speed {peer['ms'] / best['ms']:.2f}x" if peer else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
