"""fp8 error study of the attention forward: `python accuracy/fp8_error_study.py` (with tritonfa installed).

Relative L2 error of the output against a float64 reference (`tritonfa.reference`, on the bf16 inputs a model
would hand the kernel) for

- modes: `bf16` (baseline), `fp8kv` (bf16 q, fp8 K/V cache), `fp8qkv` (fp8 q, K and V), per-tensor scales
  (descale = amax / fp8 max, the best a static per-layer scale can do); `fp8kv_q8`: the fp8 K/V cache with the
  kernel's opt-in `fp8_q_for_fp8_kv` (the bf16 q rounded to fp8 in the kernel with a power-of-two scale per row,
  so QK is an fp8 dot), measured with 16-bit P and P's power-of-two scale only;
- P (softmax probabilities) handling, the `strategy`:
  `p16`        P kept in 16 bits (bf16 without fp8; fp16 with fp8 V, which fp16 holds exactly): no P quantization;
  `calibrated` (a) one fixed scale calibrated offline, as the seed (vLLM 0.9's Triton FAv2 with a checkpoint
               `prob_scale`): fp8_max / amax, amax = the largest softmax probability seen on a calibration draw;
  `per_tile`   (b) a scale per (row, KV tile) from the row maximum of the tile: fp8_max / max_j P_ij, the tile's
               PV product rescaled by its inverse before it joins the fp32 accumulator: what tritonfa's portable
               kernel and Hopper's Gluon prefill do (P taken relative to the tile's row max, exp2 offset of
               log2(fp8 max));
  `pow2`       (c) a fixed power of two, the largest <= fp8 max (256 for e4m3fn): what Hopper's Gluon prefill does
               with an fp8 P@V when `ws_fp8_p_per_tile` is off, and FlashAttention-3 (exp2 offset of 8);
  `unscaled`   P cast to fp8 as is (scale 1), what vLLM 0.24's TRITON_ATTN does with an fp8 q: a reference point.
- input scenarios meant to look like a model's attention: Gaussian, outlier channels in K, large logits, an
  attention sink (a key with a huge logit and a near-zero value, as LLMs put on the first token), and a long
  context with a sink (decode-like: few queries at the end of a long KV).

Which P the kernel itself uses depends on the device and the call, and the study asks the launcher (its plan for
each mode's inputs): fp8 P scaled per tile (`per_tile`) where V meets P in an fp8 dot (the portable kernel on CPU
and ROCm, Hopper's Gluon fp8 P@V; `pow2` there with `ws_fp8_p_per_tile` off), 16-bit P where V reaches the dot
widened to fp16 (Hopper's Gluon prefill with V widened, decode tiles). Every combination is measured with
`emulate_attention`, a torch re-implementation of the kernel's blocked online softmax (same BLOCK_N tiling as the
planned launch, same running max in the log2 domain, P rounded at the same point, same epilogue), and the kernel's
own combinations are
measured both ways: the emulation is trusted for the others because it matches the kernel on these (the run says
so, or says where it does not and exits 1).

CPU (no GPU visible): the kernel runs in Triton's interpreter at a small scale (this script switches the
interpreter on and applies the same interpreter fixes as tests/conftest.py). GPU: full size (32/8 heads, D 128,
4k prefill, 32k context). Writes fp8_error_table.json and fp8_error_table.md next to this script (the committed
tables of the accuracy suite), or into --out-dir.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
LOG2E = 1.4426950408889634

FP8_NAMES = {
    "e4m3fn": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "e4m3fnuz": torch.float8_e4m3fnuz,
}


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    q_fp8: bool
    kv_fp8: bool
    label: str
    q_row_fp8: bool = False  # a 16-bit q the kernel rounds to fp8 per row (config fp8_q_for_fp8_kv)


MODES = {
    "bf16": Mode("bf16", False, False, "bf16 q/k/v"),
    "fp8kv": Mode("fp8kv", False, True, "fp8 KV, bf16 q"),
    "fp8qkv": Mode("fp8qkv", True, True, "fp8 q/k/v"),
    "fp8kv_q8": Mode("fp8kv_q8", False, True, "fp8 KV, bf16 q to fp8 per row", q_row_fp8=True),
}
FP8_MODES = ("fp8kv", "fp8qkv")
STRATEGIES = ("p16", "calibrated", "per_tile", "pow2", "unscaled")
FP8_P_STRATEGIES = ("calibrated", "per_tile", "pow2")  # the candidates for the kernel's default
STRATEGY_LABELS = {
    "p16": "16-bit P",
    "calibrated": "(a) fixed calibrated",
    "per_tile": "(b) per-tile row max",
    "pow2": "(c) fixed 2^k",
    "unscaled": "unscaled (vLLM TRITON_ATTN, fp8 q)",
}
# The P strategies the kernel runs (which one, per call: `kernel_numerics`)
KERNEL_STRATEGIES = ("p16", "per_tile", "pow2")
# The opt-in fp8 q's rows in the table: 16-bit P and the power of two (what Hopper's Gluon prefill runs with it);
# the portable kernel's per-tile P for that mode is checked against its emulation by tests/accuracy, not tabled
Q8_STRATEGIES = ("p16", "pow2")
# |kernel - emulation| / ||ref|| at most this share of the emulated error: the emulation stands for the kernel
# (GPU: tensor-core accumulation order is not modelled; CPU interpreter: ~0.1%)
EMULATION_AGREEMENT = 0.25


def table_rows() -> list[tuple[str, str]]:
    """Every (mode, strategy) the study measures: the bf16 baseline, each fp8 mode x each P strategy, and the opt-in
    per-row fp8 q with the kernel's two P strategies."""
    return [
        ("bf16", "p16"),
        *((mode, strategy) for mode in FP8_MODES for strategy in STRATEGIES),
        *(("fp8kv_q8", strategy) for strategy in Q8_STRATEGIES),
    ]


# ---------------------------------------------------------------------------------------------------------------
# Scenarios


@dataclasses.dataclass(frozen=True)
class Sizes:
    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    prefill: tuple[int, ...]  # causal prefill lengths (Lq = Lk), one per sequence
    long_q: tuple[int, ...]  # long-context scenario: queries at the end of ...
    long_k: tuple[int, ...]  # ... this many keys
    calibration_len: int


SIZES = {
    # Triton's interpreter: a few seconds per kernel call
    "cpu": Sizes("cpu", 4, 2, 128, (256, 160), (32, 24), (2048, 1200), 256),
    # Llama-3-8B's attention shape (32 q / 8 kv heads, D 128), 4k prefill, 32k context
    "gpu": Sizes("gpu", 32, 8, 128, (4096, 3000), (128, 64), (32768, 20000), 2048),
    # for tests: one tiny case per scenario
    "tiny": Sizes("tiny", 2, 1, 64, (96,), (16,), (320,), 64),
}


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    long: bool  # decode-like shape (long_q queries over long_k keys) instead of a causal prefill
    logit_std: float  # std of the (scaled) attention logits of ordinary keys
    sink_gap: float | None = None  # sink logit above the ordinary ones: log(Lk) + this; None = no sink
    sink_value: float = 0.05  # std of the sink's value vector (LLM sinks carry near-zero values)
    k_outliers: bool = False


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("gauss", "q, k, v ~ N(0, 1): logits with std 1", False, 1.0),
        Scenario(
            "outlier_k",
            "K with per-channel offsets and 4/128 outlier channels (x6, offset 10): the per-tensor K scale is set "
            "by the outliers; logits std ~2",
            False,
            1.0,
            k_outliers=True,
        ),
        Scenario("large_logits", "logits with std 4: peaked attention on a few keys", False, 4.0),
        Scenario(
            "sink",
            "attention sink: key 0 scores log(Lk)+2 above the others (logit std 1.5) and has a near-zero value",
            False,
            1.5,
            sink_gap=2.0,
        ),
        Scenario("long", "long context: a few queries at the end of a long KV, logit std 1.5", True, 1.5),
        Scenario(
            "long_heavy_sink",
            "long context with a dominant sink (log(Lk)+4.5: ~97% of the mass, as in many LLM heads) whose value "
            "is ~0 (std 0.002): the output comes from keys whose P are ~1e-6 of the max",
            True,
            1.5,
            sink_gap=4.5,
            sink_value=0.002,
        ),
    )
}


@dataclasses.dataclass
class Batch:
    """One varlen batch: bf16 tensors (what a model hands the kernel) and its lengths."""

    q: torch.Tensor  # [total_q, Hq, D] bf16
    k: torch.Tensor  # [total_k, Hk, D] bf16
    v: torch.Tensor  # [total_k, Hk, D] bf16
    seqlens_q: list[int]
    seqlens_k: list[int]

    def cu_seqlens(self, lengths: list[int]) -> torch.Tensor:
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        return torch.tensor(cu, dtype=torch.int32, device=self.q.device)

    @property
    def cu_seqlens_q(self) -> torch.Tensor:
        return self.cu_seqlens(self.seqlens_q)

    @property
    def cu_seqlens_k(self) -> torch.Tensor:
        return self.cu_seqlens(self.seqlens_k)


def make_batch(scenario: Scenario, sizes: Sizes, seed: int, device, *, calibration: bool = False) -> Batch:
    """Inputs of `scenario`, drawn on the CPU (same values on every device) and rounded to bf16.

    calibration=True draws a causal prefill from position 0 (how calibration prompts are run) instead.
    """
    g = torch.Generator().manual_seed(seed)
    hq, hk, d = sizes.num_q_heads, sizes.num_kv_heads, sizes.head_dim
    if calibration:
        seqlens_q = seqlens_k = [sizes.calibration_len]
    elif scenario.long:
        seqlens_q, seqlens_k = list(sizes.long_q), list(sizes.long_k)
    else:
        seqlens_q = seqlens_k = list(sizes.prefill)
    total_q, total_k = sum(seqlens_q), sum(seqlens_k)
    sigma = math.sqrt(scenario.logit_std)  # q.k / sqrt(D) has std sigma_q * sigma_k
    q = torch.randn(total_q, hq, d, generator=g) * sigma
    k = torch.randn(total_k, hk, d, generator=g) * sigma
    v = torch.randn(total_k, hk, d, generator=g)
    if scenario.k_outliers:
        # real K caches: a constant offset per channel (it shifts every logit of a row alike) and a few channels
        # one to two orders of magnitude above the rest, which q mostly ignores
        offsets = torch.randn(hk, d, generator=g)
        channels = torch.randperm(d, generator=g)[:4]
        k = k + offsets
        signs = torch.where(torch.rand(hk, len(channels), generator=g) < 0.5, -1.0, 1.0)
        k[:, :, channels] = k[:, :, channels] * 6.0 + 10.0 * signs
        q[:, :, channels] *= 0.15
        v[:, :, channels[:2]] *= 4.0
    if scenario.sink_gap is not None:
        # a direction u that ordinary keys lack; every query has a fixed component `a` along it and key 0 of each
        # sequence is b * u, so its logit is a * b / sqrt(D) exactly, the same for every query
        u = torch.randn(d, generator=g)
        u = u / u.norm()
        k = k - (k @ u)[..., None] * u
        q = q - (q @ u)[..., None] * u
        a = 4.0
        q = q + a * u
        start = 0
        for length in seqlens_k:
            gap = math.log(length) + scenario.sink_gap
            k[start] = (gap * math.sqrt(d) / a) * u
            v[start] = scenario.sink_value * torch.randn(hk, d, generator=g)
            start += length
    return Batch(
        q.to(device=device, dtype=torch.bfloat16),
        k.to(device=device, dtype=torch.bfloat16),
        v.to(device=device, dtype=torch.bfloat16),
        seqlens_q,
        seqlens_k,
    )


# ---------------------------------------------------------------------------------------------------------------
# Quantization


def quantize_per_tensor(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (stored fp8, fp32 0-d descale) with descale = amax / fp8 max: real value = stored * descale."""
    fp8_max = torch.finfo(dtype).max
    amax = x.float().abs().amax().clamp_min(1e-12)
    descale = (amax / fp8_max).to(torch.float32)
    stored = (x.float() / descale).clamp(-fp8_max, fp8_max).to(dtype)
    return stored, descale


def round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Round an fp32 tensor through `dtype` (fp8: saturating, as Triton's fp32 -> fp8 conversion on NVIDIA)."""
    if dtype.itemsize == 1:
        limit = torch.finfo(dtype).max
        x = x.clamp(-limit, limit)
    return x.to(dtype).to(torch.float32)


def p16_dtype(mode: Mode) -> torch.dtype:
    """16-bit P: bf16 without fp8; fp16 with fp8 V (fp16 holds e4m3 exactly), as the kernel's 16-bit P@V with fp8 V
    (V widened to fp16 on Hopper's Gluon prefill and in decode tiles)."""
    return torch.float16 if mode.q_fp8 or mode.kv_fp8 else torch.bfloat16


@dataclasses.dataclass
class Inputs:
    """What one (mode) hands the kernel: stored tensors and descales (None = 1)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_descale: torch.Tensor | None
    k_descale: torch.Tensor | None
    v_descale: torch.Tensor | None
    kernel_q: torch.Tensor | None = None  # what the kernel gets instead of q (q is what the emulation computes with)
    kernel_config: str | None = None  # TRITONFA_CONFIG for the kernel call


def round_q_per_row(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q as `fp8_q_for_fp8_kv` has the kernel see it: each (token, head) row divided by the power of two that brings
    its largest |q| within the fp8 max, rounded to fp8, multiplied back (exact in q's 16-bit type)."""
    amax = q.float().abs().amax(-1, keepdim=True)
    scale = torch.where(
        amax > 0, torch.exp2(torch.ceil(torch.log2(amax.clamp_min(1e-30) / torch.finfo(dtype).max))), 1.0
    )
    return (round_to(q.float() / scale, dtype) * scale).to(q.dtype)


def mode_inputs(batch: Batch, mode: Mode, fp8: torch.dtype) -> Inputs:
    q, k, v = batch.q, batch.k, batch.v
    q_descale = k_descale = v_descale = None
    if mode.kv_fp8:
        k, k_descale = quantize_per_tensor(k, fp8)
        v, v_descale = quantize_per_tensor(v, fp8)
    if mode.q_fp8:
        q, q_descale = quantize_per_tensor(q, fp8)
    if mode.q_row_fp8:
        config = json.dumps({"fp8_q_for_fp8_kv": True})
        return Inputs(round_q_per_row(q, fp8), k, v, None, k_descale, v_descale, kernel_q=q, kernel_config=config)
    return Inputs(q, k, v, q_descale, k_descale, v_descale)


# ---------------------------------------------------------------------------------------------------------------
# Emulation of the kernel's blocked online softmax


@contextlib.contextmanager
def _kernel_config(inputs: Inputs):
    """TRITONFA_CONFIG set to the mode's kernel config (if any) for the duration."""
    previous = os.environ.get("TRITONFA_CONFIG")
    if inputs.kernel_config is not None:
        os.environ["TRITONFA_CONFIG"] = inputs.kernel_config
    try:
        yield
    finally:
        if inputs.kernel_config is not None:
            if previous is None:
                del os.environ["TRITONFA_CONFIG"]
            else:
                os.environ["TRITONFA_CONFIG"] = previous


def kernel_numerics(batch: Batch, inputs: Inputs, mode: Mode) -> tuple[str, int, torch.dtype]:
    """(P strategy, BLOCK_N, P's type under `p16`) of the launch that computes these inputs' first sequence, as the
    launcher plans it on this device (nothing runs): where V meets P in an fp8 dot, `per_tile` (`pow2` in Hopper's
    Gluon prefill with `ws_fp8_p_per_tile` off); `p16` where it reaches the dot in 16 bits - fp16 beside fp8 V
    widened in the kernel, q's type where K and V were widened to it before the prefill (Hopper's
    `ws_fp8_widen_copy`: the prefill is a 16-bit call)."""
    from tritonfa.kernels.attention import plan_attention

    q = inputs.kernel_q if inputs.kernel_q is not None else inputs.q
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=q.device)
    with _kernel_config(inputs):
        launches = plan_attention(
            q, inputs.k, inputs.v, out, None, batch.cu_seqlens_q, batch.cu_seqlens_k, None, None, None, None, None,
            inputs.q_descale, inputs.k_descale, inputs.v_descale, None, max(batch.seqlens_q), max(batch.seqlens_k),
            q.shape[-1] ** -0.5, -1, 0, 0.0, num_splits=1,
        )  # fmt: skip
    # the attention launch (a widening launch may come first)
    constexprs = next(c for c in (launch.constexprs for launch in launches) if "P_SCALE_LOG2" in c or "V_IS_FP8" in c)
    widened_before = False
    if "P_SCALE_LOG2" in constexprs:  # Hopper's Gluon prefill: an fp8 P only for an fp8 P@V (V not widened)
        fp8_p = constexprs["FP8"] and constexprs["P_SCALE_LOG2"] != 0
        # per key block at fp8's max (`ws_fp8_p_per_tile`, Hopper's default), else a fixed power of two
        strategy = ("per_tile" if constexprs.get("P_PER_TILE") else "pow2") if fp8_p else "p16"
        widened_before = mode.kv_fp8 and not constexprs["FP8"]
    else:  # the portable kernel
        strategy = "per_tile" if constexprs["V_IS_FP8"] else "p16"
    return strategy, constexprs["BLOCK_N"], q.dtype if widened_before else p16_dtype(mode)


def _scalar(t: torch.Tensor | None, device) -> torch.Tensor:
    return torch.ones((), dtype=torch.float32, device=device) if t is None else t.reshape(()).float()


def emulate_attention(
    inputs: Inputs,
    seqlens_q: list[int],
    seqlens_k: list[int],
    *,
    strategy: str,
    block_n: int,
    p_dtype: torch.dtype,
    calibrated_scale: float | None = None,
    softmax_scale: float | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Causal attention computed the way tritonfa's kernel computes it, in torch, with P handled per `strategy`.

    Per sequence and KV tile of `block_n` keys (tiles start at multiples of block_n, like the kernel's loop):
    s = fp32(q . k) * fp32(softmax_scale * q_descale * k_descale * log2 e); m_new = max(m, rowmax s);
    alpha = exp2(m - m_new); p = exp2(s - m_new); l = l * alpha + rowsum p; acc = acc * alpha + round(p) . v.
    Epilogue: acc * (1 / l) [* 1 / P scale] [* v_descale], rounded to out_dtype. `p_dtype` is the fp8 type P is
    rounded to (V's) or a 16-bit type for strategy "p16". Dots are fp32 sums of exact products, as on the
    interpreter; tensor-core accumulation order (and Hopper's reduced-precision fp8 accumulation) is not modelled.
    """
    q, k, v = inputs.q, inputs.k, inputs.v
    device = q.device
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    group = num_q_heads // k.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    # the kernel: qk_scale = softmax_scale * q_descale * k_descale (fp32), then scores * (qk_scale * LOG2E)
    qk_scale = torch.tensor(scale, dtype=torch.float32, device=device)
    qk_scale = qk_scale * _scalar(inputs.q_descale, device) * _scalar(inputs.k_descale, device)
    score_factor = qk_scale * torch.tensor(LOG2E, dtype=torch.float32, device=device)
    fp8_p = strategy != "p16"
    fp8_max = torch.finfo(p_dtype).max if fp8_p else 1.0
    fixed_scale = {"pow2": _pow2_p_scale(p_dtype) if fp8_p else 1.0, "calibrated": calibrated_scale,
                   "unscaled": 1.0}.get(strategy)  # fmt: skip
    if strategy == "calibrated" and calibrated_scale is None:
        raise ValueError("strategy 'calibrated' needs calibrated_scale")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {STRATEGIES}")

    from tritonfa.reference import full_fp32_matmul

    out = torch.empty(q.shape[0], num_q_heads, v.shape[-1], dtype=out_dtype, device=device)
    q_start = k_start = 0
    with full_fp32_matmul():
        for len_q, len_k in zip(seqlens_q, seqlens_k):
            q_seq = q[q_start : q_start + len_q].float().transpose(0, 1)  # [Hq, Lq, D]
            k_seq = k[k_start : k_start + len_k].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, Lk, D]
            v_seq = v[k_start : k_start + len_k].float().repeat_interleave(group, dim=1).transpose(0, 1)
            i_q = torch.arange(len_q, device=device)[:, None] + (len_k - len_q)  # aligned key position of query i
            m = torch.full((num_q_heads, len_q), -math.inf, device=device)
            l = torch.zeros(num_q_heads, len_q, device=device)
            acc = torch.zeros(num_q_heads, len_q, v.shape[-1], device=device)
            for start in range(0, len_k, block_n):
                i_k = torch.arange(start, min(start + block_n, len_k), device=device)[None, :]
                s = torch.matmul(q_seq, k_seq[:, start : start + block_n].transpose(1, 2)) * score_factor
                s = s.masked_fill(~(i_k <= i_q), -math.inf)  # [Hq, Lq, BN]
                m_new = torch.maximum(m, s.amax(-1))
                m_safe = torch.where(m_new == -math.inf, 0.0, m_new)
                alpha = torch.exp2(m - m_safe)
                acc = acc * alpha[..., None]
                v_tile = v_seq[:, start : start + block_n]
                if strategy == "per_tile":
                    # as the portable kernel computes it: P relative to the tile's row max, whose P is fp8's max;
                    # the tile's sum and product are brought to the running max's scale by beta in fp32
                    m_tile = s.amax(-1)
                    m_tile_safe = torch.where(m_tile == -math.inf, m_safe, m_tile)
                    p = torch.exp2(s - (m_tile_safe - math.log2(fp8_max))[..., None])
                    beta = torch.exp2(m_tile_safe - m_safe) * (1.0 / fp8_max)
                    l = l * alpha + p.sum(-1) * beta
                    acc = acc + torch.matmul(round_to(p, p_dtype), v_tile) * beta[..., None]
                else:
                    p = torch.exp2(s - m_safe[..., None])
                    l = l * alpha + p.sum(-1)
                    p_fixed = p if not fp8_p else p * fixed_scale
                    acc = acc + torch.matmul(round_to(p_fixed, p_dtype), v_tile)
                m = m_new
            l_safe = torch.where(l == 0.0, 1.0, l)
            factor = 1.0 / l_safe
            if fp8_p and strategy != "per_tile":
                factor = factor * torch.tensor(1.0 / fixed_scale, dtype=torch.float32, device=device)
            factor = factor * _scalar(inputs.v_descale, device)
            out[q_start : q_start + len_q] = (acc * factor[..., None]).transpose(0, 1).to(out_dtype)
            q_start += len_q
            k_start += len_k
    return out


def _pow2_p_scale(dtype: torch.dtype) -> float:
    from tritonfa.fp8 import p_scale

    return p_scale(dtype)


def calibrate_prob_amax(scenario: Scenario, sizes: Sizes, seed: int, device) -> float:
    """Largest softmax probability on a calibration draw (a causal prefill from position 0, as calibration prompts
    run), the statistic a Quark-style calibration stores as the P quantizer's amax. Row 0 sees only key 0, so with
    causal prompts this is 1.0: the seed's calibrated scale is fp8_max / 1."""
    batch = make_batch(scenario, sizes, seed, device, calibration=True)
    q = batch.q.double().transpose(0, 1)
    k = batch.k.double().repeat_interleave(sizes.num_q_heads // sizes.num_kv_heads, dim=1).transpose(0, 1)
    length = batch.seqlens_q[0]
    s = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(sizes.head_dim)
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    probs = torch.softmax(s.masked_fill(~causal, -math.inf), dim=-1)
    return float(probs.amax())


# ---------------------------------------------------------------------------------------------------------------
# Measurements


def reference_output(batch: Batch) -> torch.Tensor:
    from tritonfa.reference import attention_reference

    return attention_reference(
        batch.q, batch.k, batch.v, max(batch.seqlens_q), batch.cu_seqlens_q, max(batch.seqlens_k),
        batch.cu_seqlens_k, causal=True, compute_dtype=torch.float64,
    )  # fmt: skip


def kernel_output(batch: Batch, inputs: Inputs) -> torch.Tensor:
    """tritonfa's kernel on the mode's inputs (one KV split, as the emulation)."""
    from tritonfa import flash_attn_varlen_func

    with _kernel_config(inputs):
        return flash_attn_varlen_func(
            inputs.kernel_q if inputs.kernel_q is not None else inputs.q, inputs.k, inputs.v, max(batch.seqlens_q),
            batch.cu_seqlens_q, max(batch.seqlens_k), batch.cu_seqlens_k, causal=True, q_descale=inputs.q_descale,
            k_descale=inputs.k_descale, v_descale=inputs.v_descale, num_splits=1,
        )  # fmt: skip


@dataclasses.dataclass
class Error:
    rel_l2: float  # ||out - ref|| / ||ref|| over the whole output
    row_p99: float  # 99th percentile over (token, head) rows of the row's relative L2 error

    def as_dict(self) -> dict:
        return {"rel_l2": self.rel_l2, "row_p99": self.row_p99}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> Error:
    diff = out.double() - ref
    rel_l2 = (diff.norm() / ref.norm().clamp_min(1e-300)).item()
    row_ref = ref.norm(dim=-1).flatten()
    row_err = diff.norm(dim=-1).flatten()
    keep = row_ref > 1e-3 * row_ref.square().mean().sqrt()  # rows whose reference is not ~0
    rows = (row_err[keep] / row_ref[keep]).float()
    row_p99 = torch.quantile(rows.cpu(), 0.99).item() if rows.numel() else float("nan")
    return Error(rel_l2, row_p99)


@dataclasses.dataclass
class Row:
    scenario: str
    mode: str
    strategy: str
    emulated: Error
    kernel: Error | None = None
    kernel_implements: bool = False  # the kernel's own P strategy for this mode on this device (kernel_numerics)
    kernel_vs_emulation: float | None = None  # ||kernel - emulation|| / ||ref||
    p_scale: float | None = None
    p_error: float | None = None  # ||emulated - emulated with 16-bit P|| / ||ref||: what P quantization adds

    def as_dict(self) -> dict:
        return {
            "scenario": self.scenario,
            "mode": self.mode,
            "strategy": self.strategy,
            "kernel_implements": self.kernel_implements,
            "p_scale": self.p_scale,
            "emulated": self.emulated.as_dict(),
            "kernel": self.kernel.as_dict() if self.kernel else None,
            "kernel_vs_emulation": self.kernel_vs_emulation,
            "p_error": self.p_error,
        }


def measure_scenario(
    scenario: Scenario,
    sizes: Sizes,
    fp8: torch.dtype,
    device: torch.device,
    *,
    seed: int,
    run_kernel: bool,
    rows: list[tuple[str, str]] | None = None,
) -> tuple[list[Row], dict]:
    """Every requested (mode, strategy) on one scenario; returns the rows and facts about the inputs."""
    batch = make_batch(scenario, sizes, seed, device)
    ref = reference_output(batch)
    amax = calibrate_prob_amax(scenario, sizes, seed + 7919, device)
    calibrated = torch.finfo(fp8).max / amax
    facts = {
        "seqlens_q": batch.seqlens_q,
        "seqlens_k": batch.seqlens_k,
        "calibration_prob_amax": amax,
        "logit_std": _logit_std(batch),
    }
    if scenario.sink_gap is not None:
        facts["sink_mass_mean"] = _sink_mass(batch)
    out_rows = []
    wanted = rows or table_rows()
    for mode_name in dict.fromkeys(m for m, _ in wanted):
        mode = MODES[mode_name]
        inputs = mode_inputs(batch, mode, fp8)
        kernel_strategy, block_n, kernel_p16 = kernel_numerics(batch, inputs, mode)
        facts.setdefault("block_n", {})[mode_name] = block_n
        facts.setdefault("kernel_p", {})[mode_name] = kernel_strategy
        kernel_out = p16_out = None
        # 16-bit P first: the other strategies' P-quantization error is measured against it
        strategies = sorted((s for m, s in wanted if m == mode_name), key=lambda s: s != "p16")
        for strategy in strategies:
            p_dtype = kernel_p16 if strategy == "p16" else fp8
            p_scale = {"calibrated": calibrated, "pow2": _pow2_p_scale(fp8), "unscaled": 1.0}.get(strategy)
            if strategy == "p16" and mode.kv_fp8:
                p_scale = None
            emulated = emulate_attention(
                inputs, batch.seqlens_q, batch.seqlens_k, strategy=strategy, block_n=block_n, p_dtype=p_dtype,
                calibrated_scale=calibrated,
            )  # fmt: skip
            row = Row(scenario.name, mode_name, strategy, relative_error(emulated, ref), p_scale=p_scale,
                      kernel_implements=strategy == kernel_strategy)  # fmt: skip
            if strategy == "p16":
                p16_out = emulated
            elif p16_out is not None:
                row.p_error = ((emulated.double() - p16_out.double()).norm() / ref.norm()).item()
            if run_kernel and row.kernel_implements:
                if kernel_out is None:
                    kernel_out = kernel_output(batch, inputs)
                row.kernel = relative_error(kernel_out, ref)
                row.kernel_vs_emulation = ((kernel_out.double() - emulated.double()).norm() / ref.norm()).item()
            out_rows.append(row)
    return out_rows, facts


def _logit_std(batch: Batch) -> float:
    """Std of q.k / sqrt(D) over the first sequence's visible (causal) pairs, first KV head group, sink excluded."""
    len_q, len_k = batch.seqlens_q[0], batch.seqlens_k[0]
    q = batch.q[:len_q, 0].double()
    k = batch.k[1:len_k, 0].double()
    s = q @ k.T / math.sqrt(q.shape[-1])
    visible = torch.arange(1, len_k, device=s.device)[None, :] <= torch.arange(len_q, device=s.device)[:, None] + (
        len_k - len_q
    )
    return float(s[visible].std()) if visible.any() else float("nan")


def _sink_mass(batch: Batch) -> float:
    """Mean softmax probability on key 0 over the first sequence's queries (head 0)."""
    len_q, len_k = batch.seqlens_q[0], batch.seqlens_k[0]
    q = batch.q[:len_q, 0].double()
    k = batch.k[:len_k, 0].double()
    s = q @ k.T / math.sqrt(q.shape[-1])
    visible = torch.arange(len_k, device=s.device)[None, :] <= torch.arange(len_q, device=s.device)[:, None] + (
        len_k - len_q
    )
    return float(torch.softmax(s.masked_fill(~visible, -math.inf), -1)[:, 0].mean())


# ---------------------------------------------------------------------------------------------------------------
# Summary, recommendation, output


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summarize(rows: list[Row]) -> dict:
    """Per (mode, strategy): geometric mean and worst case over scenarios of the emulated rel. L2 error, and the
    geometric mean of the error P quantization adds (vs 16-bit P)."""
    summary = {}
    for mode, strategy in table_rows():
        selected = [r for r in rows if (r.mode, r.strategy) == (mode, strategy)]
        if selected:
            errors = [r.emulated.rel_l2 for r in selected]
            p_errors = [r.p_error for r in selected if r.p_error is not None]
            summary[f"{mode}/{strategy}"] = {
                "geomean": geomean(errors),
                "worst": max(errors),
                "p_error_geomean": geomean(p_errors) if p_errors else None,
                "p_error_worst": max(p_errors) if p_errors else None,
            }
    return summary


# Switching the kernel away from (c) must buy at least this much (total error, some fp8 mode)
GEOMEAN_MARGIN = 0.05
WORST_MARGIN = 0.10


def emulation_gaps(rows: list[Row]) -> list[Row]:
    """The kernel's own rows where the emulation does not stand for it: ||kernel - emulation|| above
    EMULATION_AGREEMENT of the emulated error (bf16: above 1e-3 of ||ref||)."""
    return [
        r for r in rows
        if r.kernel_vs_emulation is not None
        and r.kernel_vs_emulation > max(EMULATION_AGREEMENT * r.emulated.rel_l2, 1e-3 if r.mode == "bf16" else 0.0)
    ]  # fmt: skip


def kernel_p_by_mode(rows: list[Row]) -> dict[str, set[str]]:
    """mode -> the P strategies the kernel ran it with in this study (one per scenario)."""
    kernel_p: dict[str, set[str]] = {}
    for r in rows:
        if r.kernel_implements:
            kernel_p.setdefault(r.mode, set()).add(r.strategy)
    return kernel_p


def recommend(rows: list[Row], summary: dict, max_emulation_gap: float) -> tuple[str, list[str]]:
    """(chosen default strategy, paragraphs): the rule is stated in the text and applied to this run's numbers."""

    def get(mode, strategy, key):
        value = summary.get(f"{mode}/{strategy}", {}).get(key)
        return float("nan") if value is None else value

    lines = [
        f"Rule: the kernel keeps (c), the fixed power of two, unless (a) or (b) lowers the total error of an fp8 mode "
        f"by at least {GEOMEAN_MARGIN:.0%} (geomean over the scenarios) or its worst scenario by at least "
        f"{WORST_MARGIN:.0%}. (c) needs no calibration, rescales exactly and costs nothing per tile; (b) costs one "
        "multiply of the [BLOCK_M, D] PV product per KV tile (the dot can no longer accumulate in place); (a) needs "
        "a per-layer scale from a calibration run and saturates P when that run saw only probabilities < 1."
    ]
    wins: dict[str, str] = {}
    for mode in FP8_MODES:
        c_geo, c_worst = get(mode, "pow2", "geomean"), get(mode, "pow2", "worst")
        for strategy in ("per_tile", "calibrated"):
            geo, worst = get(mode, strategy, "geomean"), get(mode, strategy, "worst")
            if geo <= (1 - GEOMEAN_MARGIN) * c_geo or worst <= (1 - WORST_MARGIN) * c_worst:
                if mode not in wins or geo < get(mode, wins[mode], "geomean"):
                    wins[mode] = strategy
        lines.append(
            f"{MODES[mode].label}: total error geomean / worst: (a) {_pct(get(mode, 'calibrated', 'geomean'))} / "
            f"{_pct(get(mode, 'calibrated', 'worst'))}, (b) {_pct(get(mode, 'per_tile', 'geomean'))} / "
            f"{_pct(get(mode, 'per_tile', 'worst'))}, (c) {_pct(c_geo)} / {_pct(c_worst)}; 16-bit P "
            f"{_pct(get(mode, 'p16', 'geomean'))} / {_pct(get(mode, 'p16', 'worst'))}; unscaled "
            f"{_pct(get(mode, 'unscaled', 'geomean'))} / {_pct(get(mode, 'unscaled', 'worst'))}. Error added by P "
            f"quantization alone (geomean / worst): (a) {_pct(get(mode, 'calibrated', 'p_error_geomean'))} / "
            f"{_pct(get(mode, 'calibrated', 'p_error_worst'))}, (b) {_pct(get(mode, 'per_tile', 'p_error_geomean'))}"
            f" / {_pct(get(mode, 'per_tile', 'p_error_worst'))}, (c) {_pct(get(mode, 'pow2', 'p_error_geomean'))} / "
            f"{_pct(get(mode, 'pow2', 'p_error_worst'))}."
        )
    if wins:
        chosen = min(set(wins.values()), key=lambda s: sum(get(m, s, "geomean") for m in FP8_MODES))
        lines.append(
            f"Outcome: {STRATEGY_LABELS[chosen]} clears the margin in {', '.join(MODES[m].label for m in wins)}: "
            f"recommended default: {STRATEGY_LABELS[chosen]}."
        )
    else:
        chosen = "pow2"
        lines.append(
            "Outcome: neither (a) nor (b) clears the margin in any fp8 mode: recommended default: keep (c), the "
            "fixed power of two the kernel uses."
        )
    kernel_p = kernel_p_by_mode(rows)
    sixteen = [MODES[m].label for m, strategies in kernel_p.items() if m != "bf16" and strategies == {"p16"}]
    if sixteen:
        lines.append(
            f"On this device the kernel keeps P in 16 bits for {', '.join(sixteen)} (V widened to fp16 before the "
            "P@V: Hopper's Gluon prefill for causal contiguous and paged calls): no P scaling applies there, and "
            "its error is the 16-bit P row, below any fp8 P strategy. The rule above decides P's scaling where the "
            "kernel rounds P to fp8 (the portable kernel on ROCm and in the interpreter; Hopper's non-causal fp8 "
            "prefill with key-major V)."
        )
    p16, pow2 = get("fp8kv", "p16", "geomean"), get("fp8kv", "pow2", "geomean")
    if math.isfinite(p16) and math.isfinite(pow2) and kernel_p.get("fp8kv") == {"pow2"}:
        lines.append(
            f"fp8 KV with a bf16 q: because V is fp8 the kernel quantizes P there too; 16-bit P (V upcast) would "
            f"take the geomean error from {_pct(pow2)} to {_pct(p16)}."
        )
    if math.isfinite(max_emulation_gap):
        gaps = emulation_gaps(rows)
        fp8_errors = [r.emulated.rel_l2 for r in rows if r.mode != "bf16"]
        if gaps:
            where = ", ".join(
                f"{r.scenario} {MODES[r.mode].label} {STRATEGY_LABELS[r.strategy]} ({r.kernel_vs_emulation:.2e} vs "
                f"an error of {_pct(r.emulated.rel_l2)})"
                for r in gaps
            )  # fmt: skip
            lines.append(
                f"Emulation check FAILED: the emulation differs from the kernel by more than {EMULATION_AGREEMENT:.0%} "
                f"of the error being measured in {where}: there the emulated rows do not stand for the kernel."
            )
        else:
            lines.append(
                f"Emulation check: on the kernel's own combinations the emulation differs from the kernel by at most "
                f"{max_emulation_gap:.2e} of ||ref||, against fp8 errors of {_pct(min(fp8_errors))} and up: the "
                "emulated rows stand for the kernel's numerics."
            )
    return chosen, lines


def _pct(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{100 * x:.3g}%"


def collect_header(device: torch.device, sizes: Sizes, fp8: torch.dtype, seed: int) -> dict:
    import triton

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": _git_commit(),
        "device": gpu or f"cpu ({platform.processor() or platform.machine()}), Triton interpreter",
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "scale": sizes.name,
        "sizes": dataclasses.asdict(sizes),
        "fp8_dtype": str(fp8).replace("torch.", ""),
        "seed": seed,
    }


def _git_commit() -> str:
    try:
        here = Path(__file__).resolve().parent
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def markdown(header: dict, scenario_facts: dict, rows: list[Row], summary: dict, chosen: str, advice: list[str]):
    scenarios = list(scenario_facts)
    scale = header["scale"]
    sizes = header["sizes"]
    lines = [
        "# fp8 attention error table",
        "",
    ]
    if header["interpreter"] or scale != "gpu":
        lines += [
            f"> **{scale.upper()} / Triton-interpreter scale** ({sizes['num_q_heads']} q / {sizes['num_kv_heads']} "
            f"kv heads, D {sizes['head_dim']}, prefill {list(sizes['prefill'])}, long context "
            f"{list(sizes['long_q'])} queries over {list(sizes['long_k'])} keys). The GPU run "
            "(`python accuracy/fp8_error_study.py` on a GPU, full size) overwrites this file.",
            "",
        ]
    lines += [
        f"Generated by `python accuracy/fp8_error_study.py` on {header['device']} ({header['date']}, commit "
        f"{header['git_commit'] or '?'}, torch {header['torch']}, triton {header['triton']}); fp8 = "
        f"{header['fp8_dtype']}, per-tensor scales (amax / fp8 max), seed {header['seed']}.",
        "",
        "Relative L2 error of the attention output vs a float64 reference on the same bf16 inputs, "
        "`||out - ref|| / ||ref||`, causal. Emulated = torch emulation of the kernel's blocked online softmax "
        "(same BLOCK_N tiles, running max, rounding points); kernel = tritonfa's Triton kernel (one KV split).",
        "",
        "P strategies: **(a)** one fixed scale calibrated offline (seed): fp8_max / amax(P) over a calibration "
        "prefill; **(b)** per (row, KV tile) scale fp8_max / rowmax(P_tile); **(c)** fixed power of two "
        "<= fp8 max (the kernel's, FA3's); *unscaled*: P cast as is (vLLM 0.24 TRITON_ATTN with fp8 q); "
        "*16-bit P*: no P quantization (bf16 without fp8, fp16 with fp8 V). **(kernel)**: the P this device's "
        "kernel runs for the mode (the launcher's plan).",
        "",
        "## Emulated error, all modes x strategies (rel. L2, %)",
        "",
        "| mode | P | " + " | ".join(scenarios) + " | geomean | worst |",
        "|---|---|" + "---|" * (len(scenarios) + 2),
    ]
    for mode, strategy in table_rows():
        cells = []
        for name in scenarios:
            row = _find(rows, name, mode, strategy)
            cells.append(_pct(row.emulated.rel_l2).rstrip("%") if row else "")
        s = summary.get(f"{mode}/{strategy}", {})
        cells += [_pct(s.get("geomean", float("nan"))).rstrip("%"), _pct(s.get("worst", float("nan"))).rstrip("%")]
        implemented = [r for r in rows if (r.mode, r.strategy) == (mode, strategy) and r.kernel_implements]
        marker = ""
        if implemented:
            everywhere = len(implemented) == len(scenarios)
            marker = " **(kernel)**" if everywhere else f" **(kernel in {len(implemented)} of {len(scenarios)})**"
        lines.append(f"| {MODES[mode].label} | {STRATEGY_LABELS[strategy]}{marker} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## 99th-percentile row error (per token and head, %)",
        "",
        "| mode | P | " + " | ".join(scenarios) + " |",
        "|---|---|" + "---|" * len(scenarios),
    ]
    for mode, strategy in table_rows():
        cells = []
        for name in scenarios:
            row = _find(rows, name, mode, strategy)
            cells.append(_pct(row.emulated.row_p99).rstrip("%") if row else "")
        lines.append(f"| {MODES[mode].label} | {STRATEGY_LABELS[strategy]} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Error added by P quantization alone (‖out − out with 16-bit P‖ / ‖ref‖, %, same mode)",
        "",
        "| mode | P | " + " | ".join(scenarios) + " | geomean |",
        "|---|---|" + "---|" * (len(scenarios) + 1),
    ]
    for mode, strategy in table_rows():
        if strategy == "p16":
            continue
        cells = []
        for name in scenarios:
            row = _find(rows, name, mode, strategy)
            cells.append(_pct(row.p_error).rstrip("%") if row and row.p_error is not None else "")
        geo = summary.get(f"{mode}/{strategy}", {}).get("p_error_geomean")
        lines.append(
            f"| {MODES[mode].label} | {STRATEGY_LABELS[strategy]} | " + " | ".join(cells)
            + f" | {_pct(geo if geo is not None else float('nan')).rstrip('%')} |"
        )  # fmt: skip
    kernel_rows = [r for r in rows if r.kernel is not None]
    if kernel_rows:
        lines += [
            "",
            "## Real kernel vs emulation (the modes the kernel implements)",
            "",
            "| scenario | mode | P | kernel rel. L2 | emulated rel. L2 | kernel p99 row | emulated p99 row "
            "| ‖kernel − emulated‖ / ‖ref‖ |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in kernel_rows:
            lines.append(
                f"| {r.scenario} | {MODES[r.mode].label} | {STRATEGY_LABELS[r.strategy]} | {_pct(r.kernel.rel_l2)} "
                f"| {_pct(r.emulated.rel_l2)} | {_pct(r.kernel.row_p99)} | {_pct(r.emulated.row_p99)} "
                f"| {r.kernel_vs_emulation:.2e} |"
            )
    lines += [
        "",
        "## Scenarios",
        "",
        "| scenario | description | Lq | Lk | logit std | notes |",
        "|---|---|---|---|---|---|",
    ]
    for name, facts in scenario_facts.items():
        notes = [f"BLOCK_N {facts.get('block_n')}", f"calibration amax(P) {facts['calibration_prob_amax']:.3g}"]
        if "sink_mass_mean" in facts:
            notes.append(f"mean sink probability {facts['sink_mass_mean']:.2f}")
        lines.append(
            f"| {name} | {SCENARIOS[name].description} | {facts['seqlens_q']} | {facts['seqlens_k']} "
            f"| {facts['logit_std']:.2f} | {'; '.join(notes)} |"
        )
    lines += ["", f"## Recommendation: {STRATEGY_LABELS[chosen]}", ""]
    for paragraph in advice:
        lines += [paragraph, ""]
    return "\n".join(lines).rstrip() + "\n"


def _find(rows: list[Row], scenario: str, mode: str, strategy: str) -> Row | None:
    return next((r for r in rows if (r.scenario, r.mode, r.strategy) == (scenario, mode, strategy)), None)


def print_table(rows: list[Row], scenarios: list[str]) -> None:
    head = f"{'mode':<15} {'P':<30}" + "".join(f"{s:>13}" for s in scenarios)
    print(head)
    print("-" * len(head))
    for mode, strategy in table_rows():
        cells = []
        for name in scenarios:
            row = _find(rows, name, mode, strategy)
            cell = _pct(row.emulated.rel_l2) if row else ""
            if row and row.kernel is not None:
                cell += f"|k{_pct(row.kernel.rel_l2)}"
            cells.append(f"{cell:>13}")
        print(f"{MODES[mode].label:<15} {STRATEGY_LABELS[strategy]:<30}" + "".join(cells))
    print("(emulated rel. L2; |kX% = the real kernel on the same inputs)")


def run_study(
    sizes: Sizes,
    fp8: torch.dtype,
    device: torch.device,
    *,
    scenarios: list[str],
    seed: int = 0,
    run_kernel: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """The whole study; returns the JSON document (header, scenarios, rows, summary, recommendation)."""
    header = collect_header(device, sizes, fp8, seed)
    rows: list[Row] = []
    facts = {}
    for index, name in enumerate(scenarios):
        start = time.perf_counter()
        scenario_rows, facts[name] = measure_scenario(
            SCENARIOS[name], sizes, fp8, device, seed=seed + 1000 * index, run_kernel=run_kernel
        )
        rows += scenario_rows
        log(f"[accuracy] {name}: {len(scenario_rows)} rows in {time.perf_counter() - start:.1f} s")
    summary = summarize(rows)
    gaps = [r.kernel_vs_emulation for r in rows if r.kernel_vs_emulation is not None]
    chosen, advice = recommend(rows, summary, max(gaps) if gaps else float("nan"))
    return {
        "header": header,
        "scenarios": facts,
        "rows": [r.as_dict() for r in rows],
        "summary": summary,
        "recommendation": {"strategy": chosen, "text": advice},
        "emulation_matches_kernel": not emulation_gaps(rows),
        "_rows": rows,
    }


def write_outputs(document: dict, out_dirs: list[Path]) -> list[Path]:
    rows = document["_rows"]
    text = markdown(
        document["header"], document["scenarios"], rows, document["summary"], document["recommendation"]["strategy"],
        document["recommendation"]["text"],
    )  # fmt: skip
    plain = {k: v for k, v in document.items() if not k.startswith("_")}
    written = []
    for out_dir in out_dirs:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "fp8_error_table.md").write_text(text)
        (out_dir / "fp8_error_table.json").write_text(json.dumps(plain, indent=1) + "\n")
        written += [out_dir / "fp8_error_table.md", out_dir / "fp8_error_table.json"]
    return written


# ---------------------------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python accuracy/fp8_error_study.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--size", choices=["auto", *SIZES], default="auto", help="auto: gpu on a GPU, cpu in the interpreter"
    )
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated subset of {list(SCENARIOS)}")
    parser.add_argument("--fp8", choices=list(FP8_NAMES), default="e4m3fn", help="fp8 format of q/k/v and P")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-kernel", action="store_true", help="emulation only (skip the real kernel)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where fp8_error_table.{md,json} go (default: accuracy/, next to this script)",
    )
    return parser.parse_args(argv)


def _reexec_with_interpreter() -> None:
    """Kernels are decorated when tritonfa is imported, so the interpreter is switched on in a fresh process;
    CUDA is hidden there as torch has already looked for it in this one."""
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]], env)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    use_gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch sees no CUDA device", file=sys.stderr)
        return 2
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    if use_gpu and interpreter:
        print("TRITON_INTERPRET=1 is set: unset it to run the kernel on the GPU", file=sys.stderr)
        return 2
    if not use_gpu:
        if not interpreter:
            _reexec_with_interpreter()
        from tritonfa.interpreter_fixes import patch_triton_interpreter

        patch_triton_interpreter()
    device = torch.device("cuda" if use_gpu else "cpu")
    sizes = SIZES[args.size if args.size != "auto" else ("gpu" if use_gpu else "cpu")]
    fp8 = FP8_NAMES[args.fp8]
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = set(scenarios) - set(SCENARIOS)
    if unknown:
        print(f"unknown scenarios {sorted(unknown)}; known: {list(SCENARIOS)}", file=sys.stderr)
        return 2
    run_kernel = not args.no_kernel
    if run_kernel and use_gpu and fp8 in (torch.float8_e4m3fnuz,) and not torch.version.hip:
        print("[accuracy] e4m3fnuz is MI300's format: the kernel cannot run it on NVIDIA; emulation only")
        run_kernel = False
    document = run_study(sizes, fp8, device, scenarios=scenarios, seed=args.seed, run_kernel=run_kernel)
    print_table(document["_rows"], scenarios)
    print()
    for paragraph in document["recommendation"]["text"]:
        print(paragraph)
    for path in write_outputs(document, [args.out_dir or HERE]):
        print(f"[accuracy] wrote {path}")
    if not document["emulation_matches_kernel"]:
        print("[accuracy] the emulation does not match the kernel (see 'Emulation check')", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
