"""Side-by-side attention benchmark: `python -m tritonfa.bench [--only SUBSTR] [--quick] [--json P] [--png P]`.

On a GPU, in one process and on the same inputs, it times tritonfa against the peers that are importable:
torch SDPA (flash and cuDNN backends, dense [B, H, L, D] views, GQA through `enable_gqa`), FlexAttention
(torch.compile, causal and varlen through block masks), FlashAttention-3 from the vLLM bundle
(`vllm.vllm_flash_attn.flash_attn_varlen_func(..., fa_version=3)`: contiguous, paged and fp8) and vLLM's Triton
`unified_attention`. Every result is first checked against `tritonfa.reference` (fp32 on the GPU; big shapes on a
subset of sequences and heads); a peer that cannot run a workload shows "—" and the reason.

Timing: prefill rows take the median of `triton.testing.do_bench` (CUDA events around each call, L2 flushed
between calls); decode and mixed rows, whose kernels are short enough for launch overhead to matter, take the median
of CUDA-graph replays (one graph of back-to-back calls, events around each replay). Every impl of a row uses the
row's timer. TFLOP/s count only the visible (query, key) pairs; GB/s count the K/V bytes each sequence reads plus
q and the output (see `tritonfa.workloads`). The copy bandwidth and matmul throughput measured in the same run are
printed as ceilings.

Without a GPU it says so and runs a tiny smoke check of the kernel in Triton's interpreter against the reference
(exit status 1 if they disagree). `--dry-run` instead runs every workload at a tiny scale through the whole
pipeline (checks, table, JSON, PNG); on the CPU its timings are wall clock of the interpreter, not performance.

Reuse (asv): shapes live in `tritonfa.workloads.WORKLOADS`; `make_case(workload, device)` builds the inputs,
`prepare(impl, case).run` is the call to time, `reference_check(case).error(out)` the check.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import importlib
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from tritonfa.workloads import WORKLOADS, Workload, select, smoke_scaled

PEERS = ("fa3", "sdpa-cudnn", "sdpa-flash", "flex", "vllm-unified", "sdpa-math")
DEFAULT_GPU_PEERS = ("fa3", "sdpa-cudnn", "sdpa-flash", "flex", "vllm-unified")
IMPLS = ("tritonfa", *PEERS)

# fp8 tensors are stored as value / FP8_DESCALE; a power of two keeps dequantization exact
FP8_DESCALE = 1.0 / 16.0
# relative L2 error above which an output counts as wrong. 16-bit: bf16 rounding gives ~3e-3. fp8: a kernel that
# rounds P to e4m3 for the PV dot (as tritonfa and FA3 do) lands at ~2.5e-2 on these inputs (the reference with
# fp8_p_round_trip says so). Triton's interpreter casts to fp8 wrongly (triton#8322), ~4x that, hence its own bound.
TOLERANCE_16BIT = 2e-2
TOLERANCE_FP8 = 8e-2
TOLERANCE_FP8_INTERPRETER = 0.25
# the reference materializes [heads, Lq, Lk] scores per sequence: cap that at 2^29 fp32 values (2 GiB)
REFERENCE_SCORE_BUDGET = 1 << 29
REFERENCE_MAX_SEQS = 5


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# Inputs


def torch_dtype(name: str, interpreter: bool) -> torch.dtype:
    # Triton's interpreter multiplies bf16 bit patterns in tl.dot (triton#11584), so it runs fp16 instead
    if name == "bf16" and interpreter:
        return torch.float16
    return _DTYPES[name]


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}


class Unsupported(Exception):
    """A peer cannot run this workload (shown as "—", not as a failure)."""


@dataclasses.dataclass
class Case:
    """The tensors of one workload on one device, shared by every impl (so all see the same inputs)."""

    workload: Workload
    device: torch.device
    interpreter: bool
    q: torch.Tensor  # [total_q, Hq, D] (fp8: stored values)
    k_tokens: torch.Tensor  # [total_k, Hk, D] contiguous per sequence
    v_tokens: torch.Tensor
    cu_seqlens_q: torch.Tensor  # int32 [B + 1]
    cu_seqlens_k: torch.Tensor  # int32 [B + 1]
    seqused_k: torch.Tensor  # int32 [B]
    q_descale: torch.Tensor | None  # fp32 0-d, real = stored * descale
    k_descale: torch.Tensor | None
    v_descale: torch.Tensor | None
    out_dtype: torch.dtype
    k_cache: torch.Tensor | None = None  # paged workloads: [num_blocks, block_size, Hk, D]
    v_cache: torch.Tensor | None = None
    block_table: torch.Tensor | None = None  # int32 [B, max_blocks]
    _paged_copy: tuple | None = None

    @property
    def kv_args(self) -> dict:
        """The workload's own KV layout, as flash_attn_varlen_func keywords."""
        w = self.workload
        if w.paged:
            return dict(k=self.k_cache, v=self.v_cache, cu_seqlens_k=None, seqused_k=self.seqused_k,
                        block_table=self.block_table)  # fmt: skip
        return dict(k=self.k_tokens, v=self.v_tokens, cu_seqlens_k=self.cu_seqlens_k, seqused_k=None, block_table=None)

    def new_out(self) -> torch.Tensor:
        w = self.workload
        return torch.empty(w.total_q, w.num_q_heads, w.head_dim, dtype=self.out_dtype, device=self.device)

    def paged_kv(self, block_size: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k_cache, v_cache, block_table): the workload's cache if paged, else a paged copy (for paged-only peers)."""
        if self.workload.paged:
            return self.k_cache, self.v_cache, self.block_table
        if self._paged_copy is None:
            self._paged_copy = _to_paged(self.k_tokens, self.v_tokens, self.workload.seqlens_k, block_size, None)
        return self._paged_copy

    def dense_views(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [B, H, L, D] views of the token-major tensors (no copy); uniform batches only."""
        w = self.workload
        b, lq, lk = w.batch, w.seqlens_q[0], w.seqlens_k[0]
        q = self.q.view(b, lq, w.num_q_heads, w.head_dim).transpose(1, 2)
        k = self.k_tokens.view(b, lk, w.num_kv_heads, w.head_dim).transpose(1, 2)
        v = self.v_tokens.view(b, lk, w.num_kv_heads, w.head_dim).transpose(1, 2)
        return q, k, v


def _cumulative(lengths, device) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


def _to_paged(k_tokens, v_tokens, seqlens_k, block_size: int, generator):
    """Scatter token-major K/V into a block cache whose blocks are shuffled (as in a long-running server)."""
    device = k_tokens.device
    blocks_per_seq = [math.ceil(n / block_size) for n in seqlens_k]
    num_blocks = max(1, sum(blocks_per_seq))
    order = torch.randperm(num_blocks, generator=generator) if generator is not None else torch.randperm(num_blocks)
    block_table = torch.zeros(len(seqlens_k), max(1, max(blocks_per_seq)), dtype=torch.int32)
    slots = []
    next_block = 0
    for b, (length, count) in enumerate(zip(seqlens_k, blocks_per_seq)):
        block_table[b, :count] = order[next_block : next_block + count].to(torch.int32)
        next_block += count
        i_tok = torch.arange(length)
        slots.append(block_table[b, i_tok // block_size].long() * block_size + i_tok % block_size)
    slot_index = torch.cat(slots).to(device)
    cache_shape = (num_blocks, block_size, *k_tokens.shape[1:])

    def scatter(tokens):
        # through uint8 views: zeros and index_put need no fp8 kernels that way
        raw = tokens.view(torch.uint8)
        cache = torch.zeros((num_blocks * block_size, *raw.shape[1:]), dtype=torch.uint8, device=device)
        cache[slot_index] = raw
        return cache.view(tokens.dtype).view(cache_shape)

    return scatter(k_tokens), scatter(v_tokens), block_table.to(device)


def _random(shape, dtype: torch.dtype, device, generator) -> torch.Tensor:
    values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
    if dtype.itemsize == 1:
        return (values / FP8_DESCALE).to(dtype)
    return values.to(dtype)


def make_case(workload: Workload, device: torch.device, *, interpreter: bool = False, seed: int = 0) -> Case:
    """Random inputs for `workload` on `device` (deterministic for a given seed)."""
    w = workload
    generator = torch.Generator(device=device).manual_seed(seed)
    q_dtype = torch_dtype(w.q_dtype, interpreter)
    kv_dtype = torch_dtype(w.kv_dtype, interpreter)
    q = _random((w.total_q, w.num_q_heads, w.head_dim), q_dtype, device, generator)
    k_tokens = _random((w.total_k, w.num_kv_heads, w.head_dim), kv_dtype, device, generator)
    v_tokens = _random((w.total_k, w.num_kv_heads, w.head_dim), kv_dtype, device, generator)
    descale = torch.tensor(FP8_DESCALE, dtype=torch.float32, device=device)
    case = Case(
        workload=w,
        device=device,
        interpreter=interpreter,
        q=q,
        k_tokens=k_tokens,
        v_tokens=v_tokens,
        cu_seqlens_q=_cumulative(w.seqlens_q, device),
        cu_seqlens_k=_cumulative(w.seqlens_k, device),
        seqused_k=torch.tensor(w.seqlens_k, dtype=torch.int32, device=device),
        q_descale=descale if w.fp8_q else None,
        k_descale=descale if w.fp8_kv else None,
        v_descale=descale if w.fp8_kv else None,
        out_dtype=torch_dtype("bf16", interpreter),
    )
    if w.paged:
        host_generator = torch.Generator().manual_seed(seed)
        case.k_cache, case.v_cache, case.block_table = _to_paged(
            k_tokens, v_tokens, w.seqlens_k, w.block_size, host_generator
        )
    return case


# ---------------------------------------------------------------------------------------------------------------
# Implementations: each `prepare_*` returns a Prepared (or raises Unsupported) outside the timed region


@dataclasses.dataclass
class Prepared:
    run: Callable[[], torch.Tensor]
    to_varlen: Callable[[torch.Tensor], torch.Tensor] = lambda out: out  # -> [total_q, Hq, D]
    note: str = ""


def _need_cuda(case: Case, what: str) -> None:
    if case.device.type != "cuda":
        raise Unsupported(f"{what} needs CUDA")


def prepare_tritonfa(case: Case) -> Prepared:
    import tritonfa

    w = case.workload
    kv = case.kv_args
    out = case.new_out()

    def run():
        return tritonfa.flash_attn_varlen_func(
            case.q, kv["k"], kv["v"], w.max_seqlen_q, case.cu_seqlens_q, w.max_seqlen_k, kv["cu_seqlens_k"],
            kv["seqused_k"], causal=w.causal, block_table=kv["block_table"], q_descale=case.q_descale,
            k_descale=case.k_descale, v_descale=case.v_descale, out=out,
        )  # fmt: skip

    return Prepared(run, note="paged" if w.paged else "")


def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-math": SDPBackend.MATH,
    }[name]


def _dense_layout_or_raise(case: Case, what: str) -> None:
    w = case.workload
    if w.fp8_q or w.fp8_kv:
        raise Unsupported(f"{what}: no fp8 inputs")
    if not w.uniform:
        raise Unsupported(f"{what}: dense layout needs equal lengths (no varlen / mixed batches)")
    if w.causal and w.seqlens_q[0] not in (1, w.seqlens_k[0]):
        raise Unsupported(f"{what}: is_causal is top-left aligned, so only Lq == Lk (or decode) matches")


def prepare_sdpa(case: Case, name: str) -> Prepared:
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    w = case.workload
    if name == "sdpa-cudnn":
        _need_cuda(case, "cuDNN")
    _dense_layout_or_raise(case, name)
    backend = _sdpa_backend(name)
    # a single query sees every key, so decode runs non-causal (SDPA's causal mask is top-left aligned)
    is_causal = w.causal and w.seqlens_q[0] > 1
    gqa = w.num_q_heads != w.num_kv_heads
    batch, seqlen_q = w.batch, w.seqlens_q[0]

    def to_varlen(out):
        return out.transpose(1, 2).reshape(batch * seqlen_q, w.num_q_heads, w.head_dim)

    def runner(q, k, v, use_gqa):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=use_gqa)

        return run

    views = case.dense_views()
    group = w.num_q_heads // w.num_kv_heads

    def repeated_kv():
        q, k, v = views
        return (q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)), False

    attempts = [
        ("[B,H,L,D] views" + (" of the contiguous (not paged) KV" if w.paged else ""), lambda: (views, gqa)),
        # some backends reject strided views: contiguous [B, H, L, D] copies are the layout every backend takes
        ("contiguous [B,H,L,D] copies", lambda: (tuple(t.contiguous() for t in views), gqa)),
        # a backend without GQA gets K/V repeated to Hq heads (it then reads `group` times the bytes counted)
        ("KV heads repeated to Hq (backend without GQA)", repeated_kv),
    ]
    failures = []
    for note, build in attempts if gqa else attempts[:2]:
        tensors, use_gqa = build()
        run = runner(*tensors, use_gqa)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # SDPA says why a backend refused only in warnings
            try:
                run()
            except RuntimeError as error:
                why = " | ".join(_short(str(w.message), 200) for w in caught) or _short(error, 100)
                failures.append(f"{note}: {why}")
                continue
        return Prepared(run, to_varlen, note=note)
    raise RuntimeError("; ".join(failures))


_COMPILED_FLEX = None


def _flex_attention(compiled: bool):
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if _COMPILED_FLEX is None:
        # every workload is a new static shape: lift dynamo's recompile limit (8) so none falls back to eager
        dynamo_config = importlib.import_module("torch._dynamo.config")
        for limit in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, limit):
                setattr(dynamo_config, limit, max(getattr(dynamo_config, limit), 64))
                break
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX


def prepare_flex(case: Case) -> Prepared:
    from torch.nn.attention.flex_attention import create_block_mask

    w = case.workload
    if w.fp8_q or w.fp8_kv:
        raise Unsupported("flex: no fp8 inputs")
    if w.kind != "prefill":
        raise Unsupported("flex: prefill only (a decode shape costs another compile)")
    if any(lq != lk for lq, lk in zip(w.seqlens_q, w.seqlens_k)):
        raise Unsupported("flex: needs Lq == Lk")
    compiled = case.device.type == "cuda"
    flex = _flex_attention(compiled)
    gqa = w.num_q_heads != w.num_kv_heads
    device = case.device

    if w.uniform:
        q, k, v = case.dense_views()
        length = w.seqlens_q[0]
        block_mask = None
        if w.causal:
            block_mask = create_block_mask(
                lambda b, h, i_q, i_k: i_q >= i_k, B=None, H=None, Q_LEN=length, KV_LEN=length, device=device
            )

        def to_varlen(out):
            return out.transpose(1, 2).reshape(w.total_q, w.num_q_heads, w.head_dim)

        note = "dense"
    else:
        # varlen as one packed sequence with a document mask (the FlexAttention recipe for jagged batches)
        total = w.total_q
        q = case.q.unsqueeze(0).transpose(1, 2)  # [1, Hq, T, D]
        k = case.k_tokens.unsqueeze(0).transpose(1, 2)
        v = case.v_tokens.unsqueeze(0).transpose(1, 2)
        document = torch.repeat_interleave(
            torch.arange(w.batch, device=device), torch.tensor(w.seqlens_q, device=device)
        )  # [T]

        def document_mask(b, h, i_q, i_k):
            same = document[i_q] == document[i_k]
            return same & (i_q >= i_k) if w.causal else same

        block_mask = create_block_mask(document_mask, B=None, H=None, Q_LEN=total, KV_LEN=total, device=device)

        def to_varlen(out):
            return out[0].transpose(0, 1)

        note = "packed + document mask"

    def run():
        return flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)

    return Prepared(run, to_varlen, note=note if compiled else note + ", eager (no compile on CPU)")


def _quantize_q_fp8(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor fp8 q with its descale, as vLLM's attention layer quantizes queries for an fp8 KV cache."""
    fp8 = torch.float8_e4m3fn
    descale = (case.q.float().abs().amax() / torch.finfo(fp8).max).clamp(min=1e-12)
    return (case.q.float() / descale).to(fp8), descale


def prepare_fa3(case: Case) -> Prepared:
    _need_cuda(case, "FA3")
    try:
        from vllm.vllm_flash_attn import fa_version_unsupported_reason, flash_attn_varlen_func, is_fa_version_supported
    except Exception as error:  # noqa: BLE001 - any import failure means "not available here"
        raise Unsupported(f"vllm.vllm_flash_attn not importable: {_short(error)}") from None
    if not is_fa_version_supported(3):
        raise Unsupported(f"FA3: {fa_version_unsupported_reason(3)}")
    w = case.workload
    kv = case.kv_args
    q, q_descale, note = case.q, case.q_descale, "paged" if w.paged else ""
    if w.fp8_kv and not w.fp8_q:
        # FA3 needs q in the KV cache's dtype: vLLM quantizes q per tensor before the call (not timed here either)
        q, q_descale = _quantize_q_fp8(case)
        note = ", ".join(filter(None, [note, "q quantized to fp8 (as vLLM does)"]))
    elif w.fp8_q != w.fp8_kv:
        raise Unsupported("FA3: fp8 q needs fp8 k/v")
    descale_shape = (w.batch, w.num_kv_heads)  # FA3 takes [batch, Hk] descales; vLLM expands per-tensor scales
    descales = {}
    if w.fp8_kv:
        descales = dict(
            q_descale=q_descale.reshape(1, 1).expand(descale_shape),
            k_descale=case.k_descale.reshape(1, 1).expand(descale_shape),
            v_descale=case.v_descale.reshape(1, 1).expand(descale_shape),
        )
    out = case.new_out()

    def run():
        return flash_attn_varlen_func(
            q, kv["k"], kv["v"], w.max_seqlen_q, case.cu_seqlens_q, w.max_seqlen_k, kv["cu_seqlens_k"],
            kv["seqused_k"], causal=w.causal, block_table=kv["block_table"], out=out, fa_version=3, **descales,
        )  # fmt: skip

    return Prepared(run, note=note)


def _unified_attention():
    errors = []
    for module in ("vllm.v1.attention.ops.triton_unified_attention", "vllm.attention.ops.triton_unified_attention"):
        try:
            return importlib.import_module(module).unified_attention
        except Exception as error:  # noqa: BLE001 - the module moved between vLLM versions
            errors.append(f"{module}: {_short(error)}")
    raise Unsupported("unified_attention not importable: " + "; ".join(errors))


def prepare_vllm_unified(case: Case) -> Prepared:
    if case.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise Unsupported("vllm-unified needs CUDA or Triton's interpreter")
    unified_attention = _unified_attention()
    w = case.workload
    kv_quant_mode = {}
    if w.fp8_kv:
        from vllm.v1.kv_cache_interface import KVQuantMode

        kv_quant_mode = dict(kv_quant_mode=KVQuantMode.FP8_PER_TENSOR)
    elif w.fp8_q:
        raise Unsupported("vllm-unified: fp8 q needs an fp8 KV cache")
    k_cache, v_cache, block_table = case.paged_kv()
    one = torch.ones((), dtype=torch.float32, device=case.device)
    out = case.new_out()
    # vLLM's metadata builder: decode batches of at most 128 // Hk sequences take the split-KV ("3D") kernel
    threshold = 128 // w.num_kv_heads
    segments = 16
    head_dim_padded = 1 << (w.head_dim - 1).bit_length()
    split_kv = dict(
        seq_threshold_3D=threshold,
        num_par_softmax_segments=segments,
        softmax_segm_output=torch.empty(threshold, w.num_q_heads, segments, head_dim_padded, device=case.device),
        softmax_segm_max=torch.empty(threshold, w.num_q_heads, segments, device=case.device),
        softmax_segm_expsum=torch.empty(threshold, w.num_q_heads, segments, device=case.device),
    )

    def run():
        unified_attention(
            q=case.q, k=k_cache, v=v_cache, out=out, cu_seqlens_q=case.cu_seqlens_q, max_seqlen_q=w.max_seqlen_q,
            seqused_k=case.seqused_k, max_seqlen_k=w.max_seqlen_k, softmax_scale=w.head_dim**-0.5, causal=w.causal,
            window_size=(-1, -1), block_table=block_table, softcap=0.0, q_descale=case.q_descale,
            k_descale=case.k_descale if w.fp8_kv else one, v_descale=case.v_descale if w.fp8_kv else one,
            **split_kv, **kv_quant_mode,
        )  # fmt: skip
        return out

    return Prepared(run, note="paged" if w.paged else "paged copy (bs16) of the contiguous KV")


def prepare(impl: str, case: Case) -> Prepared:
    if impl == "tritonfa":
        return prepare_tritonfa(case)
    if impl.startswith("sdpa-"):
        return prepare_sdpa(case, impl)
    if impl == "flex":
        return prepare_flex(case)
    if impl == "fa3":
        return prepare_fa3(case)
    if impl == "vllm-unified":
        return prepare_vllm_unified(case)
    raise ValueError(f"unknown impl {impl!r}; known: {', '.join(IMPLS)}")


# ---------------------------------------------------------------------------------------------------------------
# Reference check


@dataclasses.dataclass
class ReferenceCheck:
    rows: torch.Tensor  # indices into total_q
    num_q_heads: int  # the first this many query heads
    expected: torch.Tensor  # [len(rows), num_q_heads, D] in the compute dtype
    description: str

    def error(self, out_varlen: torch.Tensor) -> float:
        got = out_varlen.index_select(0, self.rows)[:, : self.num_q_heads].to(self.expected.dtype)
        reference_norm = self.expected.norm().item()
        return (got - self.expected).norm().item() / max(reference_norm, 1e-30)


def _exact_float(t: torch.Tensor) -> torch.Tensor:
    """fp8 -> fp32 is exact (the descales still apply); it spares the reference indexing kernels for fp8."""
    return t.float() if t.element_size() == 1 else t


def reference_check(case: Case) -> ReferenceCheck:
    """Run `tritonfa.reference` on a subset big enough to catch errors and small enough to take seconds."""
    from tritonfa.reference import attention_reference, full_fp32_matmul

    w = case.workload
    if w.batch <= REFERENCE_MAX_SEQS:
        seqs = list(range(w.batch))
    else:
        largest = max(range(w.batch), key=lambda b: w.seqlens_q[b] * w.seqlens_k[b])
        seqs = sorted({0, 1, w.batch // 2, w.batch - 1, largest})
    group = w.num_q_heads // w.num_kv_heads
    biggest = max(w.seqlens_q[b] * w.seqlens_k[b] for b in seqs)
    kv_heads = max(1, min(w.num_kv_heads, REFERENCE_SCORE_BUDGET // max(1, group * biggest)))
    q_heads = kv_heads * group

    cu_q = [0, *itertools.accumulate(w.seqlens_q)]
    cu_k = [0, *itertools.accumulate(w.seqlens_k)]
    rows = torch.cat([torch.arange(cu_q[b], cu_q[b + 1]) for b in seqs]).to(case.device)
    q = _exact_float(case.q[:, :q_heads]).index_select(0, rows)
    sub_q = [w.seqlens_q[b] for b in seqs]
    sub_k = [w.seqlens_k[b] for b in seqs]
    kwargs = {}
    if w.paged:
        k = _exact_float(case.k_cache[:, :, :kv_heads])
        v = _exact_float(case.v_cache[:, :, :kv_heads])
        index = torch.tensor(seqs, device=case.device)
        kwargs = dict(seqused_k=case.seqused_k[index], block_table=case.block_table[index])
    else:
        k_rows = torch.cat([torch.arange(cu_k[b], cu_k[b + 1]) for b in seqs]).to(case.device)
        k = _exact_float(case.k_tokens[:, :kv_heads]).index_select(0, k_rows)
        v = _exact_float(case.v_tokens[:, :kv_heads]).index_select(0, k_rows)
        kwargs = dict(cu_seqlens_k=_cumulative(sub_k, case.device))
    compute_dtype = torch.float64 if case.device.type == "cpu" else torch.float32
    with full_fp32_matmul():
        expected = attention_reference(
            q, k, v, max(sub_q), _cumulative(sub_q, case.device), max(sub_k), causal=w.causal,
            q_descale=case.q_descale, k_descale=case.k_descale, v_descale=case.v_descale, compute_dtype=compute_dtype,
            **kwargs,
        )  # fmt: skip
    whole = len(seqs) == w.batch and q_heads == w.num_q_heads
    description = "all" if whole else f"seqs {seqs} of {w.batch}, q heads 0..{q_heads - 1} of {w.num_q_heads}"
    return ReferenceCheck(rows, q_heads, expected, description)


def tolerance(workload: Workload, interpreter: bool) -> float:
    if not (workload.fp8_q or workload.fp8_kv):
        return TOLERANCE_16BIT
    return TOLERANCE_FP8_INTERPRETER if interpreter else TOLERANCE_FP8


# ---------------------------------------------------------------------------------------------------------------
# Timers


@dataclasses.dataclass(frozen=True)
class Reps:
    warmup_ms: int
    rep_ms: int
    graph_ms: float  # length of one CUDA-graph replay (back-to-back calls)
    graph_replays: int
    cpu_calls: int


FULL_REPS = Reps(warmup_ms=25, rep_ms=100, graph_ms=20.0, graph_replays=10, cpu_calls=1)
QUICK_REPS = Reps(warmup_ms=5, rep_ms=25, graph_ms=5.0, graph_replays=5, cpu_calls=1)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_events(fn: Callable, reps: Reps) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=reps.warmup_ms, rep=reps.rep_ms, return_mode="median")


def time_cuda_graph(fn: Callable, reps: Reps) -> float:
    """Median ms per call over replays of one graph of back-to-back calls (no launch overhead, no L2 flush)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up outside capture (allocator, lazy init), on a side stream as capture requires
            fn()
    torch.cuda.current_stream().wait_stream(side)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    end.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    calls = max(1, min(1000, int(reps.graph_ms / estimate_ms)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    per_call = []
    for _ in range(reps.graph_replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(per_call)


def time_cpu(fn: Callable, reps: Reps) -> float:
    times = []
    for _ in range(reps.cpu_calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def timer_for(workload: Workload, device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-wall"
    return "events" if workload.kind == "prefill" else "cuda-graph"


def measure(fn: Callable, timer: str, reps: Reps) -> tuple[float, str]:
    """(median ms, timer actually used): a peer that cannot be captured in a graph falls back to events."""
    if timer == "cpu-wall":
        return time_cpu(fn, reps), timer
    if timer == "cuda-graph":
        try:
            return time_cuda_graph(fn, reps), timer
        except Exception as error:  # noqa: BLE001 - capture failures come in many types
            torch.cuda.synchronize()
            return time_events(fn, reps), f"events (graph capture failed: {_short(error, 60)})"
    return time_events(fn, reps), timer


TIMER_DESCRIPTIONS = {
    "events": "triton.testing.do_bench median (CUDA events per call, L2 flushed)",
    "cuda-graph": "median over CUDA-graph replays of back-to-back calls (events per replay)",
    "cpu-wall": "wall clock of one call (CPU: interpreter / eager torch, not a performance number)",
}


# ---------------------------------------------------------------------------------------------------------------
# Ceilings


def measure_ceilings(device: torch.device, reps: Reps) -> dict:
    """Copy bandwidth (read + write bytes) and matmul throughput on this device, in this run."""
    on_gpu = device.type == "cuda"
    timer = "events" if on_gpu else "cpu-wall"
    cpu_reps = dataclasses.replace(reps, cpu_calls=3)
    ceilings: dict = {}

    def attempt(key, what):
        try:
            ceilings[key] = what()
        except Exception as error:  # noqa: BLE001 - a missing ceiling is reported, not fatal
            ceilings[key] = None
            ceilings[key + "_error"] = _short(error)
        finally:
            _free(device)

    def copy_gbps():
        numel = (1 << 30 if on_gpu else 1 << 24) // 2  # 1 GiB of bf16 on the GPU
        src = torch.empty(numel, dtype=torch.bfloat16, device=device).normal_()
        dst = torch.empty_like(src)
        ms, _ = measure(lambda: dst.copy_(src), timer, reps if on_gpu else cpu_reps)
        return 2 * src.numel() * src.element_size() / ms / 1e6

    def matmul_tflops():
        n = 8192 if on_gpu else 512
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        ms, _ = measure(lambda: a @ b, timer, reps if on_gpu else cpu_reps)
        return 2 * n**3 / ms / 1e9

    def scaled_mm_tflops():
        n = 8192 if on_gpu else 256
        fp8 = torch.float8_e4m3fn
        a = torch.randn(n, n, device=device).to(fp8)
        b = torch.randn(n, n, device=device).to(fp8).t()  # column-major second operand, as _scaled_mm requires
        one = torch.ones((), device=device)

        def run():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)

        ms, _ = measure(run, timer, reps if on_gpu else cpu_reps)
        return 2 * n**3 / ms / 1e9

    attempt("copy_gbps", copy_gbps)
    attempt("bf16_matmul_tflops", matmul_tflops)
    attempt("fp8_scaled_mm_tflops", scaled_mm_tflops)
    ceilings["notes"] = (
        "copy: 1 GiB device-to-device, read+write bytes; matmul: 8192^3 bf16 `a @ b`; "
        "fp8: 8192^3 torch._scaled_mm e4m3 -> bf16, use_fast_accum=True"
        if on_gpu
        else "CPU dry run: small sizes, meaningless"
    )
    return ceilings


# ---------------------------------------------------------------------------------------------------------------
# The run


@dataclasses.dataclass
class Row:
    workload: str
    impl: str
    status: str  # "ok", "wrong" (timed, but failed the reference check), "unsupported", "failed"
    ms: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    error: float | None = None
    ok: bool = False
    ratio: float | None = None  # tritonfa's speed / this impl's (on tritonfa's row: / the best peer's)
    best_peer: str | None = None  # on tritonfa's row
    first_call_s: float | None = None  # first call incl. compilation / autotuning
    timer: str | None = None
    checked: str | None = None
    note: str = ""
    reason: str = ""


def _short(error: BaseException | str, limit: int = 160) -> str:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_impl(impl: str, case: Case, check: ReferenceCheck, reps: Reps) -> Row:
    w = case.workload
    row = Row(workload=w.name, impl=impl, status="failed", checked=check.description)
    prepared = None
    try:
        prepared = prepare(impl, case)
        row.note = prepared.note
        start = time.perf_counter()
        out = prepared.run()
        _synchronize(case.device)
        row.first_call_s = time.perf_counter() - start
        row.error = check.error(prepared.to_varlen(out))
        del out
        row.ok = math.isfinite(row.error) and row.error <= tolerance(w, case.interpreter)
        row.ms, row.timer = measure(prepared.run, timer_for(w, case.device), reps)
        row.tflops = w.flops / row.ms / 1e9
        row.gbps = w.bytes_moved / row.ms / 1e6
        row.status = "ok" if row.ok else "wrong"
    except Unsupported as reason:
        row.status, row.reason = "unsupported", _short(str(reason))
    except Exception as error:  # noqa: BLE001 - a peer failing (OOM, unsupported dtype, ...) must not stop the run
        row.status, row.reason = "failed", _short(error)
        if case.device.type == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    finally:
        del prepared
        if row.status == "failed":
            _free(case.device)  # after an OOM, give the next impl the memory back (otherwise once per workload)
    return row


def fill_ratios(rows: list[Row]) -> None:
    """ratio = tritonfa's speed over each peer's, and on tritonfa's row over the fastest correct peer's."""
    by_workload: dict[str, list[Row]] = {}
    for row in rows:
        by_workload.setdefault(row.workload, []).append(row)
    for group in by_workload.values():
        ours = next((r for r in group if r.impl == "tritonfa" and r.ms), None)
        peers = [r for r in group if r.impl != "tritonfa" and r.ok and r.ms]
        if ours is None:
            continue
        for peer in peers:
            peer.ratio = peer.ms / ours.ms
        if peers:
            best = min(peers, key=lambda r: r.ms)
            ours.ratio, ours.best_peer = best.ms / ours.ms, best.impl


def run_workloads(
    workloads: list[Workload], impls: list[str], device: torch.device, reps: Reps, interpreter: bool, seed: int
) -> list[Row]:
    rows: list[Row] = []
    started = time.perf_counter()
    for index, workload in enumerate(workloads, 1):
        prefix = f"[{index}/{len(workloads)}] {workload.name}"
        log(f"{prefix}: {workload.describe()}")
        case = check = None
        try:
            case = make_case(workload, device, interpreter=interpreter, seed=seed + index)
            check = reference_check(case)
        except Exception as error:  # noqa: BLE001 - e.g. OOM building inputs: record it, go on
            log(f"{prefix}: inputs/reference failed: {_short(error)}")
            reason = f"inputs/reference: {_short(error)}"
            rows.extend(Row(workload.name, impl, "failed", reason=reason) for impl in impls)
            del case, check
            _free(device)
            continue
        for impl in impls:
            row = run_impl(impl, case, check, reps)
            rows.append(row)
            elapsed = time.perf_counter() - started
            if row.ms is not None:
                headline = format_headline(workload, row)
                log(
                    f"{prefix}: {impl:<13} {row.ms:9.4f} ms {headline:>16}  err {row.error:.1e}"
                    f"{'' if row.ok else ' WRONG'}  first call {row.first_call_s:.1f} s  [{elapsed:.0f} s]"
                )
            else:
                log(f"{prefix}: {impl:<13} — {row.status}: {row.reason}  [{elapsed:.0f} s]")
        del case, check
        _free(device)
    fill_ratios(rows)
    return rows


def format_headline(workload: Workload, row: Row) -> str:
    if row.ms is None:
        return "—"
    if workload.metric == "tflops":
        return f"{row.tflops:.1f} TFLOP/s"
    if workload.metric == "gbps":
        return f"{row.gbps:.0f} GB/s"
    return f"{row.tflops:.1f} TFLOP/s"  # a mixed batch: its ms come first on the line anyway


# ---------------------------------------------------------------------------------------------------------------
# Header, table, JSON, chart


def git_commit() -> str:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if result.returncode == 0 and result.stdout.strip():
            return result.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("TRITONFA_COMMIT", "unknown")


def vllm_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def collect_header(device: torch.device, mode: str) -> dict:
    import triton

    on_gpu = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if on_gpu else f"CPU ({platform.processor() or platform.machine()})"
    return {
        "device": name,
        "mode": mode,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm": vllm_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if on_gpu else None,
        "python": platform.python_version(),
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "timers": TIMER_DESCRIPTIONS,
        "ratio": "tritonfa's speed / the peer's (>1: tritonfa faster); on tritonfa's row, / the fastest correct peer",
        "tolerance": {"16bit": TOLERANCE_16BIT, "fp8": TOLERANCE_FP8, "fp8_interpreter": TOLERANCE_FP8_INTERPRETER},
    }


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _ceiling_share(workload: Workload, row: Row, ceilings: dict) -> str:
    if row.ms is None:
        return ""
    if workload.metric == "gbps" and ceilings.get("copy_gbps"):
        return f"{100 * row.gbps / ceilings['copy_gbps']:.0f}% copy"
    if workload.metric == "tflops":
        key = "fp8_scaled_mm_tflops" if workload.fp8_q else "bf16_matmul_tflops"
        if ceilings.get(key):
            return f"{100 * row.tflops / ceilings[key]:.0f}% {'fp8 mm' if workload.fp8_q else 'mm'}"
    return ""


def table_lines(header: dict, ceilings: dict, workloads: list[Workload], rows: list[Row]) -> tuple[str, list, list]:
    """(title, column names, rows of cells) shared by the rich and the plain table."""
    title = (
        f"tritonfa bench — {header['device']} — {header['mode']} — {header['date']} — commit {header['commit']}\n"
        f"torch {header['torch']}, triton {header['triton']}, vLLM {header['vllm'] or 'not installed'}"
        f"{', interpreter' if header['interpreter'] else ''}\n"
        f"ceilings: copy {_fmt(ceilings.get('copy_gbps'), '.0f')} GB/s, "
        f"bf16 matmul {_fmt(ceilings.get('bf16_matmul_tflops'), '.0f')} TFLOP/s, "
        f"fp8 _scaled_mm {_fmt(ceilings.get('fp8_scaled_mm_tflops'), '.0f')} TFLOP/s"
    )
    columns = ["workload", "impl", "ms", "TFLOP/s", "GB/s", "of ceiling", "ratio", "rel. err", "note"]
    by_name = {w.name: w for w in workloads}
    cells = []
    for row in rows:
        workload = by_name[row.workload]
        if row.ms is None:
            cells.append(
                [row.workload, row.impl, "—", "—", "—", "", "", "—", _short(f"{row.status}: {row.reason}", 70)]
            )
            continue
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        if row.impl == "tritonfa" and row.best_peer:
            ratio += f" vs {row.best_peer}"
        note = ("WRONG (failed the reference check); " if not row.ok else "") + row.note
        if row.timer and row.timer not in ("events", "cuda-graph", "cpu-wall"):
            note += f" [{row.timer}]"
        cells.append([
            row.workload, row.impl, f"{row.ms:.4f}",
            _fmt(row.tflops, ".1f") if workload.kind != "decode" else "",
            _fmt(row.gbps, ".0f") if workload.kind != "prefill" else "",
            _ceiling_share(workload, row, ceilings), ratio, _fmt(row.error, ".1e"), note,
        ])  # fmt: skip
    return title, columns, cells


def print_table(header: dict, ceilings: dict, workloads: list[Workload], rows: list[Row]) -> None:
    title, columns, cells = table_lines(header, ceilings, workloads, rows)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(columns, *cells)]
        widths[-1] = min(widths[-1], 80)
        print(title)
        print("  ".join(name.ljust(width) for name, width in zip(columns, widths)))
        previous = None
        for line in cells:
            if previous is not None and line[0] != previous:
                print()
            previous = line[0]
            shown = [line[0] if line[1] == "tritonfa" else "", *line[1:]]
            print("  ".join(str(c)[:w].ljust(w) for c, w in zip(shown, widths)).rstrip())
        return
    table = Table(title=title, show_lines=False)
    for name in columns:
        table.add_column(name, justify="left" if name in ("workload", "impl", "note") else "right", overflow="fold")
    previous = None
    for line in cells:
        if previous is not None and line[0] != previous:
            table.add_section()
        previous = line[0]
        table.add_row(*[line[0] if line[1] == "tritonfa" else "", *line[1:]])
    Console(width=max(160, Console().width)).print(table)


def summary(workloads: list[Workload], rows: list[Row]) -> list[dict]:
    out = []
    for workload in workloads:
        ours = next((r for r in rows if r.workload == workload.name and r.impl == "tritonfa"), None)
        if ours is None:
            continue
        best = next((r for r in rows if r.workload == workload.name and r.impl == ours.best_peer), None)
        out.append({
            "workload": workload.name, "metric": workload.metric, "tritonfa_ms": ours.ms, "tritonfa_ok": ours.ok,
            "best_peer": ours.best_peer, "best_peer_ms": best.ms if best else None, "ratio": ours.ratio,
        })  # fmt: skip
    return out


def write_json(path: Path, header: dict, ceilings: dict, workloads: list[Workload], rows: list[Row]) -> None:
    document = {
        "schema": 1,
        "header": header,
        "ceilings": ceilings,
        "workloads": [
            dict(
                dataclasses.asdict(w),
                metric=w.metric,
                visible_pairs=w.visible_pairs,
                flops=w.flops,
                bytes_moved=w.bytes_moved,
                description=w.describe(),
            )
            for w in workloads
        ],
        "rows": [dataclasses.asdict(r) for r in rows],
        "summary": summary(workloads, rows),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_json_safe(document), indent=1, allow_nan=False, default=str) + "\n")


def _json_safe(value):
    """NaN / inf (a broken kernel's error) become strings: strict JSON has no literal for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def write_png(path: Path, header: dict, ceilings: dict, workloads: list[Workload], rows: list[Row]) -> bool:
    """Grouped bars per workload and impl: TFLOP/s (prefill), GB/s (decode), ms (mixed). False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [
        ("prefill", "tflops", "TFLOP/s (higher is better)", ceilings.get("bf16_matmul_tflops"), "bf16 matmul"),
        ("decode", "gbps", "GB/s (higher is better)", ceilings.get("copy_gbps"), "copy"),
        ("mixed", "ms", "ms (lower is better)", None, None),
    ]
    panels = [p for p in panels if any(w.kind == p[0] for w in workloads)]
    impls = [i for i in IMPLS if any(r.impl == i and r.ms is not None for r in rows)]
    colors = dict(zip(IMPLS, ("#d62728", "#1f77b4", "#2ca02c", "#98df8a", "#9467bd", "#ff7f0e", "#7f7f7f")))
    weights = [max(1, sum(w.kind == p[0] for w in workloads)) for p in panels]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4 + 1.3 * sum(weights), 5.5), gridspec_kw={"width_ratios": weights}, squeeze=False
    )
    width = 0.8 / max(1, len(impls))
    for ax, (kind, field, label, ceiling, ceiling_name) in zip(axes[0], panels):
        names = [w.name for w in workloads if w.kind == kind]
        for j, impl in enumerate(impls):
            values = []
            for name in names:
                row = next((r for r in rows if r.workload == name and r.impl == impl), None)
                values.append(getattr(row, field) if row is not None and row.ms is not None else 0.0)
            positions = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(names))]
            ax.bar(positions, values, width, label=impl, color=colors[impl])
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1)
            ax.text(len(names) - 0.5, ceiling, f" {ceiling_name} {ceiling:.0f}", va="bottom", ha="right", fontsize=8)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"tritonfa vs peers — {header['device']} — {header['mode']} — {header['date']} — {header['commit']}\n"
        f"torch {header['torch']}, triton {header['triton']}, vLLM {header['vllm'] or '—'}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------------------------------
# CPU smoke check (no GPU): the kernel in Triton's interpreter against the reference


def smoke_check() -> tuple[bool, list[str]]:
    """Two short fp16 sequences (one with cached context), contiguous and paged KV; True if both match."""
    import tritonfa
    from tritonfa.reference import attention_reference

    workload = Workload("smoke", "prefill", seqlens_q=(37, 20), seqlens_k=(37, 83), num_q_heads=4, num_kv_heads=2,
                        head_dim=64, q_dtype="fp16", kv_dtype="fp16")  # fmt: skip
    lines, passed = [], True
    for paged in (False, True):
        w = dataclasses.replace(workload, paged=paged)
        case = make_case(w, torch.device("cpu"), interpreter=True, seed=0)
        kv = case.kv_args
        args = (case.q, kv["k"], kv["v"], w.max_seqlen_q, case.cu_seqlens_q, w.max_seqlen_k, kv["cu_seqlens_k"],
                kv["seqused_k"])  # fmt: skip
        out = tritonfa.flash_attn_varlen_func(*args, causal=True, block_table=kv["block_table"])
        expected = attention_reference(*args, causal=True, block_table=kv["block_table"])
        error = ((out.double() - expected).norm() / expected.norm()).item()
        ok = math.isfinite(error) and error <= TOLERANCE_16BIT
        passed &= ok
        lines.append(
            f"{'paged bs16' if paged else 'contiguous'}: seqlens_q {w.seqlens_q}, seqlens_k {w.seqlens_k}, heads 4/2, "
            f"D 64, fp16, causal: rel. L2 error {error:.2e} ({'ok' if ok else 'FAILED'}, tolerance {TOLERANCE_16BIT})"
        )
    return passed, lines


# ---------------------------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tritonfa.bench",
        description="Time tritonfa against SDPA (flash, cuDNN), FlexAttention, FA3 and vLLM's unified_attention.",
    )
    parser.add_argument("--only", action="append", default=[], metavar="SUBSTR",
                        help="run workloads whose name contains SUBSTR (repeatable, or comma-separated)")  # fmt: skip
    parser.add_argument("--peers", default=None,
                        help=f"comma-separated peers from {','.join(PEERS)} (default on a GPU: "
                             f"{','.join(DEFAULT_GPU_PEERS)}; 'none' for tritonfa alone)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (for a short device lease)")
    parser.add_argument("--json", type=Path, help="write every number to this JSON file")
    parser.add_argument("--png", type=Path, help="write a bar chart to this PNG file")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="every workload at a tiny scale (CPU: in Triton's interpreter), to test the plumbing",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    return parser.parse_args(argv)


def _reexec_with_interpreter() -> None:
    """Kernels are decorated when tritonfa is imported (already done by `-m tritonfa.bench`), so the interpreter
    must be switched on in the environment of a fresh process; CUDA is hidden so vLLM's Triton code runs there too."""
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "tritonfa.bench", *sys.argv[1:]], env)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = [part for item in args.only for part in item.split(",") if part]
    if args.list:
        for workload in select(WORKLOADS, only):
            print(f"{workload.name:<32} {workload.describe()}")
        return 0

    use_gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        log("--device cuda: torch sees no CUDA device")
        return 2
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    if use_gpu and interpreter:
        log("TRITON_INTERPRET=1 is set: unset it to time kernels on the GPU")
        return 2
    if not use_gpu and not interpreter:
        _reexec_with_interpreter()

    device = torch.device("cuda" if use_gpu else "cpu")
    if not use_gpu and not args.dry_run:
        log("No GPU (none visible, or --device cpu): no timings. Running the interpreter smoke check instead.")
        passed, lines = smoke_check()
        for line in lines:
            print(line)
        print("smoke check passed" if passed else "smoke check FAILED: the kernel disagrees with the reference")
        return 0 if passed else 1

    workloads = select(WORKLOADS, only)
    if not workloads:
        log(f"no workload matches --only {only}; see --list")
        return 2
    if args.dry_run:
        workloads = [smoke_scaled(w) for w in workloads]
    if args.peers is None:
        peers = list(DEFAULT_GPU_PEERS) if use_gpu and not args.dry_run else list(PEERS)
    else:
        peers = [p for p in args.peers.split(",") if p and p not in ("none", "tritonfa")]
    unknown = set(peers) - set(PEERS)
    if unknown:
        log(f"unknown peers {sorted(unknown)}; known: {', '.join(PEERS)}")
        return 2
    reps = QUICK_REPS if args.quick else FULL_REPS
    mode = ("dry run (tiny shapes)" if args.dry_run else "full") + (", quick" if args.quick else "")
    header = collect_header(device, mode)
    log(f"tritonfa bench on {header['device']}: {len(workloads)} workloads x {1 + len(peers)} impls ({mode})")
    if not use_gpu:
        log("No GPU: dry run in Triton's interpreter (bf16 runs as fp16 there); timings are not performance numbers.")

    if use_gpu and "flex" in peers:
        # inductor sizes its compile pool when its config is imported; importing vLLM first would pin it to 1 thread
        # (vllm.env_override sets TORCHINDUCTOR_COMPILE_THREADS=1) and slow every FlexAttention compile
        importlib.import_module("torch._inductor.config")

    started = time.perf_counter()
    log("ceilings: copy bandwidth, bf16 matmul, fp8 _scaled_mm")
    ceilings = measure_ceilings(device, reps)
    rows = run_workloads(workloads, ["tritonfa", *peers], device, reps, interpreter=not use_gpu, seed=args.seed)
    header["elapsed_s"] = round(time.perf_counter() - started, 1)

    print_table(header, ceilings, workloads, rows)
    print()
    for item in summary(workloads, rows):
        ratio = "—" if item["ratio"] is None else f"{item['ratio']:.2f}x vs {item['best_peer']}"
        print(f"{item['workload']:<32} tritonfa {_fmt(item['tritonfa_ms'], '.4f')} ms  {ratio}")
    print(f"elapsed {header['elapsed_s']} s")
    if args.json:
        write_json(args.json, header, ceilings, workloads, rows)
        log(f"wrote {args.json}")
    if args.png:
        if write_png(args.png, header, ceilings, workloads, rows):
            log(f"wrote {args.png}")
        else:
            log("matplotlib is not installed: no PNG")
    bad = [r for r in rows if r.impl == "tritonfa" and not r.ok]
    if bad:
        log("tritonfa failed on: " + ", ".join(f"{r.workload} ({r.status} {r.reason})".strip() for r in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
