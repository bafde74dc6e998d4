"""Tile, warp and pipelining choices per GPU architecture, with an environment override.

The launcher asks `select_config(arch, ...)` once per call. The choice depends only on the architecture, the padded
head sizes, the query/KV dtypes and whether the batch is decode-shaped (a bucket of `max_seqlen_q`), never on exact
lengths, so changing lengths or batch size never triggers a recompile.

Override: `TRITONFA_CONFIG` holds JSON (or a path to a JSON file), either one flat dict of fields applied to every
call, e.g. `{"block_m": 64, "num_stages": 2}`, or a dict keyed by architecture name with such dicts as values.
`TRITONFA_ARCH` forces the detected architecture (tests use it to exercise ROCm paths on the CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import torch

from tritonfa.fp8 import OCP_FP8_DTYPES

ARCHS = ("hopper", "ampere", "blackwell", "cdna2", "cdna3", "cdna4", "rdna", "interpreter")

# Decode-shaped batches (every sequence has at most this many new queries) pack the query heads of one KV head into
# the rows of a tile, so each K/V tile is read once per KV head instead of once per query head.
DECODE_MAX_SEQLEN_Q = 16


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    block_m: int  # rows of a query tile (query tokens x packed heads)
    block_n: int  # keys per inner-loop step
    num_warps: int
    num_stages: int
    pack_gqa: bool = False  # put the GROUP query heads of a KV head into one tile's rows
    waves_per_eu: int = 0  # AMD only: occupancy hint, 0 = compiler default
    tma: bool = False  # contiguous K/V through tensor descriptors (Hopper's TMA) instead of pointer loads
    fp8_q_for_fp8_kv: bool = False  # opt-in: a 16-bit q with an fp8 KV cache is rounded to fp8 (per-row scale)
    tma_key_major_v: bool = False  # with tma: fp8 V's key-major copy through a descriptor too (Hopper: on)
    # fp8 V's key-major copy (Hopper, Blackwell prefill; the portable kernel's fp8 path) by key_major.py's transpose
    # kernel; False: torch's strided copies, which move the bytes at a tenth of a plain copy's speed (H100, session
    # 40: 114 us for 16384 keys x 8 heads x 128). H100, session 41, 8 pairs: fp8 b8x2048 non-causal -9.4% (8/8),
    # b4x4096 non-causal -5.3% (7/8); the copy's GPU time 117 -> 12 us
    v_copy_kernel: bool = True
    k_rows: bool = False  # pointer loads of K as rows like V (paged prefill: fewer address instructions; unmeasured)
    # paged decode tiles fetch the block ids a step ahead, as prefill tiles always do: the K/V loads then depend on
    # no load of their own step and Triton's pipeliner keeps num_stages - 1 buffers instead of (num_stages - 1) // 2
    # (sm_90, D 128: fp8 128-key blocks, 4 stages: 1 -> 3 buffers, 106 KB, 255 registers; bf16 64-key blocks, 3
    # stages: 2 buffers, 72 KB, 144 registers: three programs per SM). "fp8": fp8 caches only; True: every cache.
    # Opt-in until measured (16-bit 128-key tiles with 4 stages would hold 3 x 64 KB: one program per SM)
    decode_prefetch_ids: bool | str = False
    # Hopper decode tiles (< 64 rows) with an fp8 K: QK as K q^T, so the keys are the 64-row side of an fp8 wgmma
    # that reads K from shared memory as it is (a 16-row QK is an mma.sync, fp16 only on sm_90: every K element was
    # widened in registers); a 16-bit q as two e4m3 terms (hi + the rest: a bf16 q exactly, fp16 ~8 bits) unless
    # fp8_q_for_fp8_kv rounds it to one; P@V as V^T P^T, a 16-bit wgmma, V widened four values per word. Opt-in:
    # 42% fewer instructions per block on sm_90, but 6% slower on the H200 (session 18: fp8-KV b64x2048 0.108 vs
    # 0.102 ms; each block waits on its wgmmas and two block-wide barriers). "tile": where _KEYS_AS_ROWS_DECODE has a
    # tile for the head size and the call has a bf16 or fp8 q (an fp16 q keeps its exact fp16 dot), that tile runs
    # it; other calls keep this config's tile with the setting off
    decode_keys_as_rows: bool | str = False
    # Hopper decode: fp8-KV paged decode calls the Gluon decode kernel covers (kernels/attention_hopper_decode.py: a
    # producer warp keeps decode_gluon_stages 64-key blocks of K/V in flight through TMA) go there (Hopper D 128:
    # on, see _KEYS_AS_ROWS_DECODE; 2 stages: 3 and 4 were slower, more shared memory per program)
    decode_gluon: bool = False
    decode_gluon_stages: int = 2
    # with decode_gluon: an e4m3 q with its descale (what vLLM sends for an fp8 cache) goes there too (Hopper D 128:
    # on; else such calls keep the keys-as-rows tile)
    decode_gluon_fp8_q: bool = False
    # Gluon decode: each block's V widened into its ring slot (K's and V's fp8 bytes are read by then) and P @ V
    # reading it from shared memory, instead of the transposing convert into the A operand in registers (16 of the
    # block's 24 barriers; V's rows past the sequence zeroed in the last block only; P's row sums per thread, summed
    # once after the loop); the slot goes back to the producer after P @ V instead of before the softmax (Hopper
    # D 128: on, see _KEYS_AS_ROWS_DECODE)
    decode_gluon_v16_smem: bool = False
    # Gluon decode for the calls the portable kernel would split (few sequences x KV heads, long contexts: vLLM at
    # batch <= 32 with 8 KV heads on an H200): per-split partial results, merged by combine_splits_kernel (Hopper
    # D 128: on, see _KEYS_AS_ROWS_DECODE)
    decode_gluon_split: bool = False
    # Hopper prefill: calls the warp-specialized Gluon kernel covers (kernels/attention_hopper.py) go there
    warp_specialized: bool = False
    ws_pingpong: bool = True  # with warp_specialized: the two consumer warpgroups alternate their matmuls (FA3)
    # with warp_specialized: contiguous fp8 K/V (D <= 128; q fp8, or 16-bit with fp8_q_for_fp8_kv) go there too
    ws_fp8: bool = False
    # with ws_fp8: paged fp8 K/V too (V gathered and transposed by the producer warps; Hopper: on)
    ws_fp8_paged: bool = False
    # with ws_fp8_paged: the producer widens gathered fp8 V to fp16 (exact) instead of transposing it, and P@V is a
    # 16-bit wgmma (QK stays fp8; P keeps 10 mantissa bits instead of 3). Hopper: on
    ws_fp8_paged_v16: bool = False
    # with ws_fp8: contiguous fp8 K/V gathered like pages and V widened to fp16 the same way (no key-major copy of V
    # per call; a 16-bit P@V in 128-key blocks, persistent): True for every call, "causal" for causal ones (Hopper:
    # "causal"; H200, session 11, fp8 q/k/v b8x2048 causal 0.599 -> 0.570 ms, FA3 0.562, error 2.0e-2 -> 1.6e-3;
    # non-causal, where the fp8 P@V's double rate counts over every key, not yet measured)
    ws_fp8_v16_contiguous: bool | str = False
    # with ws_fp8: a 16-bit q with fp8 K/V, paged (with ws_fp8_paged) or contiguous, not rounded (fp8_q_for_fp8_kv off)
    # goes there too: the producer gathers K and V and widens them to q's type and fp16 (exact), both dots 16-bit.
    # H200, session 10, b8x2048 causal: 1.123 -> 0.964 ms contiguous, 1.750 -> 1.104 paged (flat grid); its GPU
    # tests passed in session 11 once at least 3 K/V slots were kept (two deadlocked at D 64: WIDENED_K_MIN_STAGES).
    # Hopper: on
    ws_fp8_k16: bool = False
    # with ws_fp8: a 16-bit q with fp8 K/V (e4m3 or e5m2, not rounded: fp8_q_for_fp8_kv off) has K and V widened to
    # q's type by one launch before the attention (kernels/widen_kv.py: each key widened once, not once per query
    # tile and q head), then runs the 16-bit Gluon prefill (paged: over a gathered copy); calls whose copy would pass
    # attention.WIDEN_COPY_MAX_BYTES keep ws_fp8_k16. Hopper: on
    ws_fp8_widen_copy: bool = False
    # Gluon prefill, a 16-bit q on a paged cache of its own type: the pages gathered into a contiguous copy by the same
    # launch (kernels/widen_kv.py), then the contiguous prefill, instead of the producer's TMA box per page (H200,
    # session 43, b8x2048 causal: paged 0.560 ms against contiguous 0.496, the fp8 cache's gathered copy 0.531).
    # Opt-in until measured
    ws_paged_gather_copy: bool = False
    ws_fp8_two_level: bool = True  # fp8 P@V: each block's product added to O in fp32, not chained in the MMA
    # where P meets key-major fp8 V (non-causal contiguous fp8 prefill; one- or two-level P@V): P scaled per (row, key
    # block) to fp8's max - the fp8 error study's (b), what the portable kernel does - instead of a fixed 2^8; O and
    # l kept at the block's max (session 34: no multiply per O value). Hopper: on (H100, session 35: fp8 b4x4096
    # non-causal +0.4% mean over 8 pairs against the default's own repeat -0.45%, error 2.21e-2 against 2.48e-2)
    ws_fp8_p_per_tile: bool = False
    # Gluon prefill: a ring slot's K is handed back to the producer as soon as its QK is done and its V after its P@V
    # (FA3's separate K / V pipelines), not both after the P@V: the next K loads a block earlier. Hopper: on, with
    # ws_lean_softmax (H100, session 26: the pair 4-19% faster every round on six prefill workloads)
    ws_early_k_release: bool = False
    # Gluon prefill: each block's row max folded as a tree (gl.max alone is a chain of 31 dependent FMNMX per row at
    # 128 keys before the exponentials can start) and a 16-bit P converted two values per register in the order the
    # P@V reads them (per-value converts cost 32 PRMT swaps per block on sm_90); bit-identical output. Hopper: on
    # (alone it moved nothing; with ws_early_k_release see there)
    ws_lean_softmax: bool = False
    # Gluon prefill, where P meets key-major fp8 V (non-causal contiguous fp8): P rounded to e4m3 once from fp32
    # (two cvt per four values) instead of through fp16 (four), with the lean step; the rounding differs from the
    # default's double rounding in rare ties. Hopper: on (H100, session 27: fp8 b4x4096 non-causal 1-5% faster every
    # round, the same error)
    ws_fp8_p_one_rounding: bool = False
    # Hopper, a mixed batch (prefill and decode sequences): the decode launch is a programmatic dependent of the Gluon
    # prefill launch, so its programs take the SMs the prefill's last programs leave instead of waiting for all of
    # them. Hopper: on (H100, session 27: mixed 4x512+60 4.0-4.5% faster every round, the same bits)
    mixed_pdl: bool = False
    ws_stages: int = 0  # K/V ring slots of the Gluon prefill; 0 = attention_hopper.tiles_for's
    ws_paged_tma: bool = False  # Gluon prefill: paged K/V through TMA boxes of a page's keys (else cp.async gathers)
    # Gluon prefill: a persistent grid (one program per SM slot walks the tiles; the next tile's loads overlap this
    # one's end) instead of one program per tile
    ws_persistent: bool = False
    # Gluon prefill, persistent grid: the programs take tiles from a device counter (one atomic per tile, in flight
    # during the tile before) instead of fixed shares, so a program that runs ahead takes more: True for every
    # launch, "causal" for causal ones (Hopper: "causal", with a tail of 4; H100, session 31, against fixed shares:
    # varlen16 -2.2%, b1x8192 -2.5%, b8x2048 -1.5%, fp8 b8x2048 -1.7%, but b4x4096 non-causal +1.4%, whose tiles are
    # equal; session 32, fixed shares against it: b8x2048 +3.0%, b1x8192 +6.6%, varlen +2.1%). Session 8 (H200)
    # measured it fully dynamic: varlen -2%, b1x8192 and mixed slower
    ws_dynamic: bool | str = False
    # ws_dynamic: only the items of the last N rounds (N x programs) come from the counter, the rest go out in fixed
    # shares (0: every item from the counter). Session 30 (H100): the fully dynamic grid's SMs end within 10 us but
    # each item costs more than in fixed shares (varlen +6% mean SM busy time); this keeps the fixed order but the end
    ws_dynamic_tail: int = 0
    # ws_dynamic on paged K/V too: off, the TMA-page producer ran 25% slower with it (H100, session 31, b8x2048 causal
    # paged, tails 2 and 4; its sm_90 SASS has 3x the collective fallbacks around the per-page TMA issues)
    ws_dynamic_paged: bool = False
    # ws_dynamic: the drawn item made provably warp-uniform (a `redux.sync`) before the producer branches on it. Without
    # it ptxas guards the producer's loop for divergence: sm_90 SASS, D 128 causal, tail 4, contiguous 24 WARPSYNC
    # (fixed shares: 1), TMA pages 52 WARPSYNC, 45 BSSY and 62 TMA issue sites (1 / 10 / 34); with it 1 / 14 / 34.
    # Contiguous K/V gained nothing from it (H100, session 32: b8x2048 +4.3%, b1x8192 +0.7%, varlen +0.1%; session 33:
    # -0.2%, -0.4%, -2.9%); TMA pages under the counter did (session 33, with `ws_dynamic_paged`: b8x2048 paged -3.1%,
    # 22 of 24 rounds). "paged": on paged launches only
    ws_uniform_ticket: bool | str = False
    # Gluon prefill on the persistent grid with TMA loads: registers per thread of the producer warpgroup (0: 56,
    # `attention_hopper.PERSISTENT_PRODUCER_REGS`). The three warpgroups share 504 per thread: at 56 one consumer
    # warpgroup is held to 208, and the fp8 non-causal consumer (O, one block's P@V and S) spills in its inner loops.
    # 24 (H100, session 32): bf16 b4x4096 non-causal -1.2%, TMA pages -1.4%, varlen -0.5%, b8x2048 +0.4% (mean)
    ws_producer_regs: int = 0
    # Gluon prefill, flat grid, two-level fp8 P@V (fp8 q/k/v non-causal): P's row sums (l) from one more wgmma, P @ a
    # [BLOCK_N, 16] tile of ones, instead of a sum of the fp32 P on the CUDA cores (64 FADD per thread and block), and
    # of the fp8 P the P@V uses. Wrong on the GPU, do not use: H100, session 33, with an 8-column tile and session 39
    # with 16 columns (kernel error 1.05 at D 64, 2.9e3 at D 128; the GPU test is a strict xfail until it is fixed)
    ws_fp8_row_sum_mma: bool = False
    # Gluon prefill on the flat grid, contiguous K/V (TMA), D <= 128: consumer warpgroups per program, 2 (128-row
    # tiles) or 3 (192-row tiles: while the tensor cores run two warpgroups' matmuls, a third runs its softmax).
    # Registers: 160 / 168 per consumer thread instead of 240, so D 128 fits only 64-key blocks (one-level for fp8).
    # H100, session 35: -9% (bf16) / -10% (fp8 one-level) against two consumers on the same 64-key blocks, but +3..+11%
    # against the default's 128-key blocks (PERF_NOTES). Opt-in
    ws_consumers: int = 2
    # Gluon prefill on the flat grid: P reaches its P@V through a shared-memory tile per consumer warpgroup instead of
    # registers (a store, a fence and a warpgroup barrier per block), so the registers P held while its P@V ran are
    # free: three consumer warpgroups (160 registers) with 128-key blocks at D 128. H100, session 37: with three
    # consumers and one-level fp8 P@V, fp8 b4x4096 non-causal -12.0% (8/8 rounds) but error 2.49e-2 against 2.21e-2
    # (P at a fixed scale: `ws_fp8_p_per_tile` then needed two levels; since session 38 it does not, see
    # `ws_fp8_three_consumers`)
    ws_p_smem: bool = False
    # Gluon prefill with ping-pong: each consumer warpgroup waits for a block's P@V (and adds it to O) before it
    # issues the next block's QK, so the P@V's product (two-level fp8) or a 16-bit P in registers never holds
    # registers beside S: with three consumers, the two-level fp8 P@V with P in shared memory has 0 spill
    # instructions instead of 288, and 16-bit D 128 with P in registers fits 128-key blocks. A warpgroup's softmax
    # then overlaps only the other warpgroups' matmuls. Opt-in (not yet measured)
    ws_serial_pv: bool = False
    # Gluon prefill, fp8 q/k/v non-causal with contiguous K/V read key-major on the flat grid (D 128): three consumer
    # warpgroups, P through shared memory (`ws_p_smem`), serial steps (`ws_serial_pv`) with the two-level P@V, whatever
    # `ws_consumers`, `ws_p_smem` and `ws_serial_pv` say for other calls. H100, session 39, fp8 b4x4096 non-causal
    # against the default, 8 pairs each: -2.7% mean / -3.5% median, 7/8 (default-again +0.0%), then in a second run
    # +0.6% mean / -1.4% median, 5/8 (default-again -2.0%): a gain within the noise, so opt-in. Mean output at 32k keys
    # 0.9986 of the reference's, as the default's. Its first form chained P@V in the MMA (one-level; -10..-12%) and
    # lost the output's magnitude on the GPU: mean 0.928 / 0.855 / 0.602 of the reference's at 4k / 8k / 32k keys
    # (kernel/scripts/fp8_long_context.py; Hopper's fp8 MMA keeps 13 mantissa bits of what it adds into)
    ws_fp8_three_consumers: bool = False
    # Gluon prefill: each block's P@V waited for after the softmax's exponentials. ptxas schedules the wait right
    # after the row max (sm_90 SASS, every Gluon prefill: a wgmma wait goes as early as its basic block allows), so a
    # warpgroup's exponentials never overlap its own P@V; a loop ptxas cannot remove, on the row sums, ends that
    # block (`attention_hopper._after_softmax`). H100, session 37: slower, fp8 b4x4096 non-causal +13% (0/4 rounds),
    # bf16 +7% (1/4): off
    ws_softmax_fence: bool = False
    # Gluon prefill: a masked block (the causal diagonal, a sequence's last keys) compares each score's key once,
    # against its row's end (the sequence's, causally the diagonal's + 1), in inline PTX: one setp and one selp per
    # score where the gl.where form compiles to two compares per column and row and two selects per score, or to a
    # mask hoisted above the S wait and packed into register bits (sm_90 SASS, masked step per warp: bf16 D 128
    # causal 746 -> 650 instructions, fp8 widened V 731 -> 635, fp8 key-major V in 128-key blocks 1100 -> 708;
    # interior steps unchanged). H100, session 40 (8 pairs): bf16 b8x2048 causal -0.8% (4/8), varlen16 causal -1.2%
    # (7/8), fp8 b8x2048 causal -1.0% median (6/8), default-again within 0.6%: on for Hopper
    ws_mask_ptx: bool = False
    # Gluon prefill, two-level fp8 P@V: O = (O + PV_j) * alpha_{j+1} (one FADD and one FMUL per O value and block)
    # becomes O = O * alpha_j + PV_j, one FFMA, with O's move to a block's reference one block late (alpha kept a
    # step longer). The fp8 key-major interior step is 539 instructions per warp, 134 of them FADD and 66 FMUL
    # (sm_90 SASS): -64. H100, session 40: its GPU tests pass, fp8 non-causal b4x4096 -0.5% / b8x2048 +2.0% (8
    # pairs, noise): the step is not issue-bound. Opt-in
    ws_two_level_fma: bool = False
    ws_block_n: int = 0  # Gluon prefill: keys per block, 64 or 128 (0: attention_hopper.tiles_for's)
    # Gluon prefill: 16-bit head sizes other than 64/128/256 (multiples of 8, e.g. 80, 96) in tiles of the next of
    # those instead of the portable kernel (Hopper: on)
    ws_pad_head_dim: bool = False
    # NVIDIA: registers per thread the compiler may use (ptxas maxnreg; 0 = its choice). Portable kernel only: e.g.
    # 128 fits four 4-warp programs per SM
    max_registers: int = 0

    def launch_options(self, arch: str) -> dict:
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if arch in ("cdna2", "cdna3", "cdna4", "rdna") and self.waves_per_eu:
            options["waves_per_eu"] = self.waves_per_eu
        if arch in ("ampere", "hopper", "blackwell") and self.max_registers:
            options["maxnreg"] = self.max_registers
        return options


def detect_arch(device: torch.device) -> str:
    """Architecture family of `device`; `TRITONFA_ARCH` overrides it."""
    forced = os.environ.get("TRITONFA_ARCH")
    if forced:
        if forced not in ARCHS:
            raise ValueError(f"TRITONFA_ARCH must be one of {ARCHS}, got {forced!r}")
        return forced
    if device.type != "cuda":
        return "interpreter"
    return _detect_cuda_arch(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _detect_cuda_arch(index: int) -> str:
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        gcn = getattr(props, "gcnArchName", "").split(":")[0]
        if gcn.startswith("gfx94"):
            return "cdna3"
        if gcn.startswith("gfx95"):
            return "cdna4"
        if gcn.startswith(("gfx90a", "gfx908")):
            return "cdna2"  # MI200 / MI100: no fp8 dots (CDNA3 brought them)
        return "rdna" if gcn.startswith(("gfx11", "gfx12")) else "cdna3"
    if props.major == 9:
        return "hopper"
    if props.major >= 10:
        return "blackwell"
    return "ampere"


def native_fp8_dot(arch: str, dtype: torch.dtype) -> bool:
    """Whether `tl.dot` on two tensors of fp8 `dtype` runs natively on `arch` (else operands are upcast)."""
    if arch in ("hopper", "blackwell", "cdna4"):
        return dtype in OCP_FP8_DTYPES
    if arch == "cdna3":
        return dtype in (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
    if arch == "interpreter":
        return True
    return False


_HOPPER_PREFILL = dict(
    pack_gqa=True,
    tma=True,
    tma_key_major_v=True,
    warp_specialized=True,
    ws_persistent=True,
    ws_paged_tma=True,
    ws_fp8=True,
    ws_fp8_paged=True,
    ws_fp8_paged_v16=True,
    ws_fp8_v16_contiguous="causal",
    ws_fp8_k16=True,
    ws_fp8_widen_copy=True,
    ws_pad_head_dim=True,
    ws_early_k_release=True,
    ws_lean_softmax=True,
    ws_fp8_p_one_rounding=True,
    ws_fp8_p_per_tile=True,
    ws_dynamic="causal",
    ws_dynamic_tail=4,
    ws_mask_ptx=True,
    mixed_pdl=True,
)

# (arch, decode) -> {padded head size upper bound: config}; the first bound >= the padded head size wins.
_TABLE: dict[tuple[str, bool], dict[int, AttentionConfig]] = {
    # Hopper: chosen by the config sweep recorded in PERF_NOTES.md (H200, 2026-12-02).
    # warp_specialized: the Gluon kernel takes the calls it covers (H200, session 5: b8x2048 causal 0.717 -> 0.600 ms,
    # paged 0.864 -> 0.720, D 256 0.680 -> 0.582; kernel/results/2026-12-03-h200-session5)
    # tma_key_major_v: fp8 prefill reads V's key-major copy through descriptors (b8x2048 causal 1.206 -> 0.799 ms,
    # fp8 KV 1.519 -> 1.120; same run)
    # ws_persistent, ws_paged_tma, ws_fp8 (H200, session 7, each against the config before it, same run): b8x2048
    # causal 0.620 -> 0.553 ms (persistent), paged 0.715 -> 0.636 (persistent + paged TMA), fp8 q/k/v b8x2048 causal
    # 0.799 -> 0.636 and b4x4096 2.331 -> 1.587 (ws_fp8); kernel/results/2026-12-03-h200-session7
    # ws_fp8_paged, ws_pad_head_dim (H200, session 8, same run): paged fp8 q/k/v b8x2048 causal 1.434 -> 1.177 ms,
    # D 96 b8x2048 causal 0.834 -> 0.647; kernel/results/2026-12-03-h200-session8
    # ws_fp8_paged_v16 (H200, session 9, same run): paged fp8 q/k/v b8x2048 causal 1.174 -> 0.622 ms (FA3 0.587),
    # vLLM fp8 KV end to end 1.029x -> 1.002x FLASH_ATTN; kernel/results/2026-12-04-h200-session9
    # ws_fp8_k16 (H200, session 10, against the portable kernel): fp8 KV with a bf16 q, b8x2048 causal 1.123 -> 0.964
    # ms, paged 1.750 -> 1.104; ws_fp8_v16_contiguous "causal" (session 11, same run): fp8 q/k/v b8x2048 causal
    # 0.599 -> 0.570 (FA3 0.562); kernel/results/2026-12-04-h200-session10 and -session11
    # ws_fp8_widen_copy (H200, session 14, against k16, same process): fp8 KV with a bf16 q, b8x2048 causal 0.825 ->
    # 0.581 ms (bf16 0.573), paged 1.030 -> 0.589 (bf16 paged 0.590); kernel/results/2026-12-04-h200-session14
    ("hopper", False): {
        64: AttentionConfig(128, 64, 8, 3, **_HOPPER_PREFILL),
        128: AttentionConfig(128, 64, 8, 3, **_HOPPER_PREFILL),
        256: AttentionConfig(128, 64, 8, 2, **_HOPPER_PREFILL),
    },
    ("hopper", True): {
        # d64: 16x64 tiles with 5 stages took 0.083 ms vs 0.100 ms for 16x128 (b64 x 2048 paged, H200;
        # kernel/results/2026-12-03-h200-session3)
        64: AttentionConfig(16, 64, 4, 5, pack_gqa=True),
        # e4m3 K with a bf16 or fp8 q: the keys-as-rows tile (_KEYS_AS_ROWS_DECODE); others keep this 16x128 tile
        128: AttentionConfig(16, 128, 4, 4, pack_gqa=True, decode_keys_as_rows="tile"),
        256: AttentionConfig(16, 64, 4, 2, pack_gqa=True),
    },
    ("blackwell", False): {
        128: AttentionConfig(128, 64, 8, 3),
        256: AttentionConfig(128, 64, 8, 2),
    },
    ("blackwell", True): {256: AttentionConfig(16, 64, 4, 2, pack_gqa=True)},
    ("ampere", False): {
        64: AttentionConfig(128, 64, 4, 3),
        128: AttentionConfig(128, 64, 4, 2),
        256: AttentionConfig(64, 32, 4, 2),
    },
    ("ampere", True): {256: AttentionConfig(16, 64, 4, 2, pack_gqa=True)},
    ("cdna3", False): {
        128: AttentionConfig(128, 64, 4, 1, waves_per_eu=2),
        256: AttentionConfig(64, 64, 4, 1, waves_per_eu=1),
    },
    ("cdna3", True): {256: AttentionConfig(16, 64, 4, 1, pack_gqa=True, waves_per_eu=2)},
    # MI200 (64 KiB LDS like MI300): MI300's tiles, untuned
    ("cdna2", False): {
        128: AttentionConfig(128, 64, 4, 1, waves_per_eu=2),
        256: AttentionConfig(64, 64, 4, 1, waves_per_eu=1),
    },
    ("cdna2", True): {256: AttentionConfig(16, 64, 4, 1, pack_gqa=True, waves_per_eu=2)},
    ("cdna4", False): {
        128: AttentionConfig(128, 64, 4, 1, waves_per_eu=2),
        256: AttentionConfig(64, 64, 4, 1, waves_per_eu=1),
    },
    ("cdna4", True): {256: AttentionConfig(16, 64, 4, 1, pack_gqa=True, waves_per_eu=2)},
    ("rdna", False): {256: AttentionConfig(64, 32, 4, 1)},
    ("rdna", True): {256: AttentionConfig(16, 32, 4, 1, pack_gqa=True)},
    # The interpreter runs tiles as numpy arrays: big tiles mean fewer Python-level steps.
    ("interpreter", False): {256: AttentionConfig(64, 64, 4, 1)},
    ("interpreter", True): {256: AttentionConfig(16, 64, 4, 1, pack_gqa=True)},
}

# arch -> {head size bound (as in _TABLE's decode row): config}: the keys-as-rows decode tile that a decode config
# with decode_keys_as_rows="tile" hands the fp8-K calls it covers (kernels/attention._decode_config). Hopper D 128:
# 64-key blocks, 2 stages, ptxas held to 128 registers (sm_90: 0 spills, 47 KB shared): four programs per SM
# instead of two; fp8-KV decode b64x2048 paged, every round: H100 (session 20) 0.1155 -> 0.1089 ms (-5.6%), H200
# (session 21) 0.1023 -> 0.1000 ms (-2.2%) (kernel/results/2026-12-05-h100-session20, 2026-12-05-h200-session21)
# The fp8-KV paged calls the Gluon decode covers go there instead (decode_gluon): b64x2048 paged, every round,
# 0.0996-0.1005 -> 0.0805-0.0809 ms (H200, session 23; kernel/results/2026-12-05-h200-session23); with an e4m3 q
# (vLLM's fp8 cache) too (decode_gluon_fp8_q): every round 0.1054-0.1064 -> 0.1005-0.1018 ms (H100, session 24).
# V widened into its ring slot (decode_gluon_v16_smem), every round (H100, session 25): fp8-KV b64x2048 0.1021-0.1031
# -> 0.1004-0.1008 ms, fp8 (e4m3 q) 0.1014-0.1017 -> 0.1005-0.1006; with the split calls in the Gluon kernel too
# (decode_gluon_split), fp8 b8x32768 0.2077-0.2090 (portable split) -> 0.2012-0.2033 ms (split alone 0.2036-0.2057)
_HOPPER_D128_DECODE = AttentionConfig(16, 64, 4, 2, pack_gqa=True, decode_keys_as_rows=True, max_registers=128,
                                      decode_gluon=True, decode_gluon_fp8_q=True, decode_gluon_v16_smem=True,
                                      decode_gluon_split=True)  # fmt: skip
_KEYS_AS_ROWS_DECODE: dict[str, dict[int, AttentionConfig]] = {"hopper": {128: _HOPPER_D128_DECODE}}


# Shared memory per program (bytes) that a config may plan for; Triton fails to launch a kernel that needs more.
_SHARED_MEMORY = {"hopper": 227 * 1024, "blackwell": 227 * 1024, "ampere": 163 * 1024, "cdna2": 64 * 1024,
                  "cdna3": 64 * 1024, "cdna4": 160 * 1024, "rdna": 64 * 1024}  # fmt: skip


def select_config(arch: str, block_d: int, max_seqlen_q: int, element_bytes: int = 2) -> AttentionConfig:
    decode = max_seqlen_q <= DECODE_MAX_SEQLEN_Q
    by_head_size = _TABLE[(arch, decode)]
    config = _apply_override(arch, by_head_size[_head_size_bound(by_head_size, block_d)])
    # The table is tuned (and launch-checked) for 16-bit and fp8 inputs; fp32 inputs need smaller tiles.
    return fit_shared_memory(arch, config, block_d, element_bytes) if element_bytes > 2 else config


def select_keys_as_rows_config(arch: str, block_d: int) -> AttentionConfig | None:
    """The keys-as-rows decode tile of `arch` for this head size (`decode_keys_as_rows="tile"`), else None.

    The caller checks that keys-as-rows applies to the call and otherwise keeps select_config's decode tile.
    """
    config = _KEYS_AS_ROWS_DECODE.get(arch, {}).get(_head_size_bound(_TABLE[(arch, True)], block_d))
    return None if config is None else _apply_override(arch, config)


def _head_size_bound(by_head_size: dict[int, AttentionConfig], block_d: int) -> int:
    """The table row of a padded head size: the first bound >= it, else the largest."""
    return next((b for b in sorted(by_head_size) if b >= block_d), max(by_head_size))


def fit_shared_memory(arch: str, config: AttentionConfig, block_d: int, element_bytes: int) -> AttentionConfig:
    """Shrink stages, then key tiles, then query tiles until Q + the pipelined K/V tiles fit in shared memory.

    The estimate matched Triton 3.6's own count on an H200 (294912 bytes for 64x128 tiles, 2 stages, D 256).
    """
    budget = _SHARED_MEMORY.get(arch)
    if budget is None:
        return config

    def need(c: AttentionConfig) -> int:
        return (c.block_m + 2 * max(c.num_stages, 1) * c.block_n) * block_d * element_bytes

    while need(config) > budget:
        if config.num_stages > 2:
            config = dataclasses.replace(config, num_stages=config.num_stages - 1)
        elif config.block_n > 32:
            config = dataclasses.replace(config, block_n=config.block_n // 2)
        elif config.block_m > 16:
            config = dataclasses.replace(config, block_m=config.block_m // 2)
        else:
            break
    return config


def all_configs(arch: str) -> list[tuple[int, AttentionConfig]]:
    """Every (largest padded head size, config) pair the dispatcher can pick on `arch` (for cross-compiling)."""
    tables = [table for (table_arch, _), table in _TABLE.items() if table_arch == arch]
    tables.append(_KEYS_AS_ROWS_DECODE.get(arch, {}))
    return [(bound, _apply_override(arch, config)) for table in tables for bound, config in table.items()]


def _apply_override(arch: str, config: AttentionConfig) -> AttentionConfig:
    raw = os.environ.get("TRITONFA_CONFIG")
    if not raw:
        return config
    override = _parse_override(raw)
    if any(isinstance(v, dict) for v in override.values()):
        override = override.get(arch, {})
    fields = {f.name for f in dataclasses.fields(AttentionConfig)}
    unknown = set(override) - fields
    if unknown:
        raise ValueError(f"TRITONFA_CONFIG has unknown fields {sorted(unknown)}; known: {sorted(fields)}")
    return dataclasses.replace(config, **override)


@functools.lru_cache(maxsize=8)
def _parse_override(raw: str) -> dict:
    text = raw
    if not raw.lstrip().startswith("{"):
        with open(raw) as f:
            text = f.read()
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise ValueError("TRITONFA_CONFIG must be a JSON object")
    return parsed
