"""Shared helpers for the kernel tests: build varlen / paged inputs, call the public API and the reference, compare.

Everything here goes through `tritonfa.flash_attn_varlen_func` and `tritonfa.reference` only.
KV memory that no sequence may read (tokens past `seqused_k`, unused cache blocks, gaps between sequences) is
filled with NaN, so a kernel that lets such values reach the output fails loudly.
"""

import dataclasses
import importlib.util
import itertools
import math
import os
import random
from pathlib import Path

import pytest
import torch

import tritonfa
from tritonfa.configs import DECODE_MAX_SEQLEN_Q, detect_arch, native_fp8_dot
from tritonfa.kernels.attention import decode_q_fp8_terms
from tritonfa.reference import attention_reference

DEVICE = os.environ["TRITONFA_TEST_DEVICE"]
ON_GPU = DEVICE == "cuda"

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz)
# e4m3fnuz is MI300's format: Triton on NVIDIA cannot convert it (the interface refuses it there, also when
# TRITONFA_ARCH names an NVIDIA architecture in the interpreter), the interpreter and ROCm can
_NVIDIA_ARCH = os.environ.get("TRITONFA_ARCH") in ("hopper", "ampere", "blackwell")
FP8_DTYPES_HERE = FP8_DTYPES if not (ON_GPU or _NVIDIA_ARCH) or torch.version.hip else FP8_DTYPES[:2]
PLATFORM_E4M3 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn

KV_LAYOUTS = ("contiguous", "paged", "paged_kv_interleaved", "paged_heads_major")


def load_script(name: str):
    """kernel/scripts/<name>.py as a module (the GPU tools are scripts, not part of the package)."""
    path = Path(__file__).resolve().parents[2] / "kernel" / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def scaled(cpu, gpu):
    """A size for the interpreter (kept small: it runs ~1e6 x slower) or for a real GPU."""
    return gpu if ON_GPU else cpu


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES or dtype == torch.float8_e5m2fnuz


def random_seqlens(batch: int, max_len: int, min_len: int = 0) -> list[int]:
    """Lengths biased towards tile edges (1, 63, 64, 65, ...) and zero, which break kernels most often."""
    edges = [n for n in (0, 1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 255, 257) if min_len <= n <= max_len]
    return [random.choice(edges) if random.random() < 0.5 else random.randint(min_len, max_len) for _ in range(batch)]


@dataclasses.dataclass
class AttnInputs:
    """Positional arguments of flash_attn_varlen_func plus the paged-KV keyword, on the test device."""

    q: torch.Tensor  # [total_q, Hq, D]
    k: torch.Tensor  # [total_k, Hk, D] or [num_blocks, block_size, Hk, D]
    v: torch.Tensor  # like k, head size Dv
    max_seqlen_q: int
    cu_seqlens_q: torch.Tensor  # int32 [batch + 1]
    max_seqlen_k: int
    cu_seqlens_k: torch.Tensor | None  # int32 [batch + 1]
    seqused_k: torch.Tensor | None  # int32 [batch]
    block_table: torch.Tensor | None  # int32 [batch, max_blocks]
    seqlens_q: list[int]
    seqlens_k: list[int]

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    @property
    def num_q_heads(self) -> int:
        return self.q.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[-2]

    def args(self) -> tuple:
        return (self.q, self.k, self.v, self.max_seqlen_q, self.cu_seqlens_q, self.max_seqlen_k, self.cu_seqlens_k,
                self.seqused_k)  # fmt: skip

    def describe(self) -> str:
        layout = f"paged bs={self.k.shape[1]}" if self.block_table is not None else "contiguous"
        return (
            f"seqlens_q={self.seqlens_q} seqlens_k={self.seqlens_k} heads={self.num_q_heads}/{self.num_kv_heads} "
            f"D={self.q.shape[-1]} Dv={self.v.shape[-1]} q:{self.q.dtype} k:{self.k.dtype} v:{self.v.dtype} {layout}"
        )


def _cu_seqlens(seqlens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(seqlens)], dtype=torch.int32, device=DEVICE)


def _random(shape, dtype: torch.dtype) -> torch.Tensor:
    # N(0, 1) is inside every fp8 range, so fp8 tensors are just rounded normals (real value = stored * descale)
    return torch.randn(shape, device=DEVICE).to(dtype)


def _nan(shape, dtype: torch.dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), device=DEVICE).to(dtype)


def make_inputs(
    seqlens_q: list[int],
    seqlens_k: list[int],
    *,
    num_heads: tuple[int, int] = (4, 2),
    head_size: int = 64,
    head_size_v: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
    kv_layout: str = "contiguous",
    block_size: int = 16,
    use_seqused_k: bool = False,
    packed_qkv: bool = False,
) -> AttnInputs:
    """Random inputs for one call.

    kv_layout: "contiguous" ([total_k, Hk, D] + cu_seqlens_k), "paged" ([num_blocks, bs, Hk, D]),
    "paged_kv_interleaved" (vLLM's [num_blocks, 2, bs, Hk, D].unbind(1): strided k/v views),
    "paged_heads_major" ([num_blocks, Hk, bs, D] permuted to [num_blocks, bs, Hk, D]).
    use_seqused_k (contiguous only): cu_seqlens_k spans extra NaN tokens per sequence that seqused_k excludes.
    packed_qkv (contiguous only, Lq == Lk, D == Dv): q/k/v are head slices of one [T, Hq + 2 Hk, D] tensor.
    """
    assert len(seqlens_q) == len(seqlens_k) and kv_layout in KV_LAYOUTS
    num_q_heads, num_kv_heads = num_heads
    head_size_v = head_size if head_size_v is None else head_size_v
    kv_dtype = dtype if kv_dtype is None else kv_dtype
    total_q = sum(seqlens_q)
    cu_seqlens_q = _cu_seqlens(seqlens_q)
    common = dict(
        max_seqlen_q=max(seqlens_q, default=0),
        cu_seqlens_q=cu_seqlens_q,
        max_seqlen_k=max(seqlens_k, default=0),
        seqlens_q=list(seqlens_q),
        seqlens_k=list(seqlens_k),
    )

    if packed_qkv:
        assert kv_layout == "contiguous" and seqlens_q == seqlens_k and head_size_v == head_size and kv_dtype == dtype
        qkv = _random((total_q, num_q_heads + 2 * num_kv_heads, head_size), dtype)
        q, k, v = qkv.split([num_q_heads, num_kv_heads, num_kv_heads], dim=1)
        return AttnInputs(q, k, v, cu_seqlens_k=cu_seqlens_q, seqused_k=None, block_table=None, **common)

    q = _random((total_q, num_q_heads, head_size), dtype)
    if kv_layout == "contiguous":
        spans = [n + (random.randint(1, 3) if use_seqused_k else 0) for n in seqlens_k]
        k = _nan((sum(spans), num_kv_heads, head_size), kv_dtype)
        v = _nan((sum(spans), num_kv_heads, head_size_v), kv_dtype)
        for start, n in zip([0, *itertools.accumulate(spans)], seqlens_k):
            k[start : start + n] = _random((n, num_kv_heads, head_size), kv_dtype)
            v[start : start + n] = _random((n, num_kv_heads, head_size_v), kv_dtype)
        seqused_k = torch.tensor(seqlens_k, dtype=torch.int32, device=DEVICE) if use_seqused_k else None
        return AttnInputs(q, k, v, cu_seqlens_k=_cu_seqlens(spans), seqused_k=seqused_k, block_table=None, **common)

    blocks_per_seq = [math.ceil(n / block_size) for n in seqlens_k]
    num_blocks = sum(blocks_per_seq) + 3  # spare blocks stay NaN and are what unused table entries point to
    k_cache, v_cache = _paged_caches(kv_layout, num_blocks, block_size, num_kv_heads, head_size, head_size_v, kv_dtype)
    block_ids = torch.randperm(num_blocks).tolist()
    spare = block_ids[sum(blocks_per_seq) :]
    width = max(blocks_per_seq, default=0) + 1
    block_table = torch.tensor([random.choice(spare)], dtype=torch.int32).repeat(len(seqlens_k), width)
    used = 0
    for b, n in enumerate(seqlens_k):
        ids = block_ids[used : used + blocks_per_seq[b]]
        used += blocks_per_seq[b]
        block_table[b, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
        for t in range(0, n, block_size):
            rows = min(block_size, n - t)
            k_cache[ids[t // block_size], :rows] = _random((rows, num_kv_heads, head_size), kv_dtype)
            v_cache[ids[t // block_size], :rows] = _random((rows, num_kv_heads, head_size_v), kv_dtype)
    seqused_k = torch.tensor(seqlens_k, dtype=torch.int32, device=DEVICE)
    return AttnInputs(
        q, k_cache, v_cache, cu_seqlens_k=None, seqused_k=seqused_k, block_table=block_table.to(DEVICE), **common
    )


def _paged_caches(layout, num_blocks, block_size, num_kv_heads, head_size, head_size_v, dtype):
    """NaN-filled k/v caches [num_blocks, bs, Hk, D(v)] with the strides of the requested layout."""
    if layout == "paged":
        return (
            _nan((num_blocks, block_size, num_kv_heads, head_size), dtype),
            _nan((num_blocks, block_size, num_kv_heads, head_size_v), dtype),
        )
    if layout == "paged_kv_interleaved":
        width = max(head_size, head_size_v)
        kv_cache = _nan((num_blocks, 2, block_size, num_kv_heads, width), dtype)
        k_cache, v_cache = kv_cache.unbind(1)
        return k_cache[..., :head_size], v_cache[..., :head_size_v]
    return (
        _nan((num_blocks, num_kv_heads, block_size, head_size), dtype).transpose(1, 2),
        _nan((num_blocks, num_kv_heads, block_size, head_size_v), dtype).transpose(1, 2),
    )


def fp8_descale(kind: str, batch: int, num_kv_heads: int) -> torch.Tensor:
    """Random fp32 descale of shape [] ("scalar"), [1] ("one") or [batch, Hk] ("per_head")."""
    shape = {"scalar": (), "one": (1,), "per_head": (batch, num_kv_heads)}[kind]
    return (0.25 + torch.rand(shape, device=DEVICE)).to(torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# Calls


def run_kernel(inputs: AttnInputs, **kwargs):
    return tritonfa.flash_attn_varlen_func(*inputs.args(), block_table=inputs.block_table, **kwargs)


# how the kernel stores or schedules the result, not what the result is
KERNEL_ONLY_KWARGS = ("out", "output_scale", "num_splits")


def run_reference(inputs: AttnInputs, **kwargs):
    for ignored in KERNEL_ONLY_KWARGS:
        kwargs.pop(ignored, None)
    return attention_reference(*inputs.args(), block_table=inputs.block_table, **kwargs)


def random_alibi(batch: int, num_q_heads: int, per_sequence: bool) -> torch.Tensor:
    shape = (batch, num_q_heads) if per_sequence else (num_q_heads,)
    return (torch.rand(shape, device=DEVICE) * 0.5).to(torch.float32)


def random_sinks(num_q_heads: int) -> torch.Tensor:
    return (torch.randn(num_q_heads, device=DEVICE) * 2).to(torch.float32)


def random_bias(inputs: AttnInputs, broadcast_batch: bool, broadcast_heads: bool, dtype=torch.float32) -> torch.Tensor:
    shape = (
        1 if broadcast_batch else inputs.batch,
        1 if broadcast_heads else inputs.num_q_heads,
        max(inputs.max_seqlen_q, 1),
        max(inputs.max_seqlen_k, 1),
    )
    return torch.randn(shape, device=DEVICE).to(dtype)


# ---------------------------------------------------------------------------------------------------------------
# Checks


def _first_bad(mask: torch.Tensor) -> str:
    index = tuple(int(i) for i in mask.nonzero()[0])
    return f"{int(mask.sum())} of {mask.numel()}, first at {index}"


def assert_written(out: torch.Tensor, name: str = "out") -> None:
    """No NaN left: every element was written (outputs start NaN-poisoned)."""
    bad = out.float().isnan()
    assert not bad.any(), f"{name} has NaN (unwritten or poisoned memory read): {_first_bad(bad)}"


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, msg: str = "", name="out"):
    assert_written(actual, name)
    torch.testing.assert_close(
        actual.to(expected.dtype), expected, atol=atol, rtol=rtol, msg=lambda m: f"{name}: {m}\n{msg}"
    )


def assert_lse_close(lse: torch.Tensor, ref_lse: torch.Tensor, atol: float = 2e-3, msg: str = ""):
    """lse fp32 [Hq, total_q]; -inf exactly where the reference has -inf (rows that see no key and no sink)."""
    assert lse.dtype == torch.float32, f"lse dtype {lse.dtype}"
    assert lse.shape == ref_lse.shape, f"lse shape {tuple(lse.shape)} != {tuple(ref_lse.shape)}"
    assert_written(lse, "lse")
    empty = torch.isneginf(ref_lse)
    mismatch = torch.isneginf(lse) != empty
    assert not mismatch.any(), f"lse -inf rows differ from the reference: {_first_bad(mismatch)}\n{msg}"
    torch.testing.assert_close(
        lse[~empty].double(), ref_lse[~empty], atol=atol, rtol=0, msg=lambda m: f"lse: {m}\n{msg}"
    )


def max_abs(x: torch.Tensor) -> float:
    return x.abs().max().item() if x.numel() else 0.0


def rounding_floor(dtype: torch.dtype, magnitude: float) -> float:
    """Two units of rounding of `dtype` at `magnitude` (the error of just storing the result)."""
    if dtype in (torch.float32, torch.float64):
        dtype = torch.float32
    return 2 * torch.finfo(dtype).eps * max(magnitude, 1e-3)


def assert_within_low_precision_error(
    out: torch.Tensor,
    ref: torch.Tensor,
    low_precision_ref: torch.Tensor,
    msg: str = "",
    floor: float | None = None,
    factor: float = 2.0,
):
    """FA-style oracle: |kernel - ref| <= factor (2) |PyTorch low-precision reference - ref| + rounding floor (max
    norms)."""
    assert_written(out)
    kernel_error = max_abs(out.double() - ref)
    reference_error = max_abs(low_precision_ref.double() - ref)
    if floor is None:
        floor = rounding_floor(out.dtype, max_abs(ref))
    bound = factor * reference_error + floor
    assert kernel_error <= bound, (
        f"kernel error {kernel_error:.3g} > {factor:g} x low-precision reference error {reference_error:.3g} + floor "
        f"{floor:.3g}\n{msg}"
    )


# (dtype, atol, rtol) against the float64 reference, for 16/32-bit q/k/v (Liger style)
DTYPE_ATOL_RTOL = [
    pytest.param(torch.float16, 2e-3, 2e-3, id="fp16"),
    pytest.param(torch.bfloat16, 1e-2, 1e-2, id="bf16"),
    pytest.param(torch.float32, 2e-5, 2e-5, id="fp32"),
]
TOLERANCES = {p.values[0]: p.values[1:] for p in DTYPE_ATOL_RTOL}
LSE_ATOL = 1e-3


def describe_call(inputs: AttnInputs, kwargs: dict) -> str:
    shown = {k: (f"tensor{tuple(v.shape)}:{v.dtype}" if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return f"{inputs.describe()} {shown}"


def check_against_reference(inputs: AttnInputs, atol: float, rtol: float, lse_atol: float = LSE_ATOL, **kwargs):
    """Run kernel and float64 reference with the same arguments; compare out (and lse). Returns the kernel out."""
    msg = describe_call(inputs, kwargs)
    out, lse = run_kernel(inputs, return_softmax_lse=True, **kwargs)
    ref, ref_lse = run_reference(inputs, return_softmax_lse=True, **kwargs)
    assert out.shape == ref.shape, f"out shape {tuple(out.shape)} != {tuple(ref.shape)}\n{msg}"
    assert_close(out, ref, atol, rtol, msg)
    assert_lse_close(lse, ref_lse, lse_atol, msg)
    return out


def check_low_precision(inputs: AttnInputs, lse_extra: float = 0.0, **kwargs) -> torch.Tensor:
    """FA-style oracle for fp8 inputs or outputs: the kernel's error against the float64 reference is bounded by
    the error of the PyTorch low-precision reference (16-bit math, P through V's fp8 type). Returns the kernel out.
    lse_extra: what the lse may differ by beyond that (e.g. a 16-bit q's native fp8 QK, fp8_qk_accumulation_bound).
    """
    msg = describe_call(inputs, kwargs)
    out, lse = run_kernel(inputs, return_softmax_lse=True, **kwargs)
    ref, ref_lse = run_reference(inputs, return_softmax_lse=True, **kwargs)
    emulate = inputs.q.dtype if not is_fp8(inputs.q.dtype) else (out.dtype if not is_fp8(out.dtype) else torch.bfloat16)
    v_fp8 = inputs.v.dtype if is_fp8(inputs.v.dtype) else None
    low_precision = run_reference(inputs, emulate_dtype=emulate, fp8_p_round_trip=v_fp8, **kwargs)
    if v_fp8 is not None:
        # The kernels round P through fp8 on one of two grids: a fixed power of two (Hopper's Gluon prefill) or each
        # key block's max at fp8's max (the portable kernel). The two roundings are independent draws; with few keys
        # nothing averages out and one can be far luckier than the other (CI: 2 keys, kernel 0.030 against 0.0023 on
        # the power-of-two grid and 0.031 on the kernel's own). The oracle takes the reference that errs more.
        on_max_grid = run_reference(inputs, emulate_dtype=emulate, fp8_p_round_trip=v_fp8, fp8_p_to_max=True, **kwargs)
        if max_abs(on_max_grid.double() - ref) > max_abs(low_precision.double() - ref):
            low_precision = on_max_grid
    output_scale = kwargs.get("output_scale")
    if output_scale is None:
        # With fp8 V the P @ V dot is an fp8 MMA: on Hopper (and the interpreter's model of it) its accumulator keeps
        # 13 mantissa bits, cut once per 32-deep step of a key block; the float64-accumulating low-precision
        # reference has no such error, which an fp32 output shows (one block of up to 128 keys: 4 steps).
        floor = rounding_floor(out.dtype, max_abs(ref))
        factor = 2.0
        if is_fp8(inputs.v.dtype):
            floor += max_abs(ref) * (128 // FP8_MMA_K_STEP) * FP8_MMA_RELATIVE_CUT
            # P through fp8: the reference rounds P on one grid per row (relative to the row's max), the kernels on
            # one per key block (relative to the block's max), so the two errors are independent draws of the same
            # size and their maxima over a call differ by chance: 2x was exceeded about once in a few hundred calls
            # (interpreter, [33, 5] x [33, 70] q/k/v in e4m3: 300 seeds up to 0.98 of it, one CI run 1.07)
            factor = FP8_P_ERROR_FACTOR
        assert_within_low_precision_error(out, ref, low_precision, msg, floor=floor, factor=factor)
    else:
        # compare what the fp8 output means (stored * output_scale); the floor is 16-bit, fp8 rounding is in both
        assert_within_low_precision_error(
            out.double() * output_scale.double(),
            ref,
            _quantize_output(low_precision, output_scale, out.dtype),
            msg,
            floor=rounding_floor(torch.bfloat16, max_abs(ref)),
        )
    qk_bound = fp8_qk_accumulation_bound(inputs, kwargs, keys_as_rows_q_terms(inputs))
    assert_lse_close(lse, ref_lse, LSE_ATOL + qk_bound + lse_extra, msg)
    return out


def keys_as_rows_q_terms(inputs: AttnInputs) -> int:
    """How many e4m3 terms the decode tiles split a 16-bit q into, each a native fp8 QK dot (keys-as-rows tiles,
    `decode_keys_as_rows`): 2, or 1 with fp8_q_for_fp8_kv; 0 when the call has no decode row or its decode tile
    keeps a 16-bit dot. The launcher's own choice, so the oracle follows the configuration in force."""
    if not any(0 < n <= DECODE_MAX_SEQLEN_Q for n in inputs.seqlens_q):
        return 0
    return decode_q_fp8_terms(inputs.q, inputs.k, inputs.v)


# the oracle's factor where P goes through fp8 (check_low_precision)
FP8_P_ERROR_FACTOR = 2.5
# Hopper's fp8 MMA (k = 32 per step) keeps 13 mantissa bits below its largest addend: a step's sum is cut by up to
# 2^-13 of it (a bound for sums of like magnitudes; the interpreter's model cuts each product too, which a long
# chain of small products into a large accumulator feels: tritonfa.interpreter_fixes._sm90_fp8_dot)
FP8_MMA_K_STEP = 32
FP8_MMA_RELATIVE_CUT = 2.0**-13


def fp8_qk_accumulation_bound(inputs: AttnInputs, kwargs: dict, q_terms: int = 0) -> float:
    """Worst-case score error of a native fp8 QK^T dot on Hopper, and so of the lse (a smooth max of the scores;
    softcap only compresses): one cut of <= 2^-13 x |accumulator| per 32-deep step, |accumulator| <= sum_d |q_d k_d|
    <= ||q|| ||k|| (Cauchy-Schwarz), times softmax scale and descales. FlashAttention-3 has the same error. 0 when
    the dot is not a native fp8 one (16-bit dots accumulate in full fp32). q_terms > 0: a 16-bit q the kernel
    splits into that many fp8 terms, each a native fp8 dot into one accumulator."""
    q, k = inputs.q, inputs.k
    fp8_dot = q.dtype == k.dtype and q.dtype in FP8_DTYPES and native_fp8_dot(detect_arch(q.device), q.dtype)
    if not (fp8_dot or q_terms):
        return 0.0
    head_size = q.shape[-1]
    steps = math.ceil(max(head_size, FP8_MMA_K_STEP) / FP8_MMA_K_STEP) * max(q_terms, 1)

    def max_row_norm(x: torch.Tensor) -> float:  # unused cache slots are NaN: they hold no key
        return torch.nan_to_num(x.double(), nan=0.0).norm(dim=-1).max().item() if x.numel() else 0.0

    def max_descale(name: str) -> float:
        descale = kwargs.get(name)
        return descale.abs().max().item() if descale is not None else 1.0

    scale = kwargs.get("softmax_scale") or head_size**-0.5
    scale *= max_descale("q_descale") * max_descale("k_descale")
    return steps * FP8_MMA_RELATIVE_CUT * max_row_norm(q) * max_row_norm(k) * scale


def _quantize_output(result: torch.Tensor, output_scale: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """What an fp8 output stores, read back: clamp(result / output_scale) rounded to fp8, times output_scale."""
    fp8_max = torch.finfo(fp8_dtype).max
    stored = (result / output_scale.double()).clamp(-fp8_max, fp8_max).to(fp8_dtype)
    return stored.double() * output_scale.double()
