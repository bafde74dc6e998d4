"""The tensors of one workload, shared by every impl of a row, and the reference check of an output."""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch

# relative import: asv loads this package from the checkout next to an older installed tritonfa (see __init__)
from ..reference import attention_reference, full_fp32_matmul
from .workloads import OUT_DTYPE, Workload

# fp8 tensors are stored as value / FP8_DESCALE; a power of two keeps dequantization exact
FP8_DESCALE = 1.0 / 16.0
# relative L2 error above which an output counts as wrong. 16-bit: bf16 rounding gives ~3e-3. fp8: a kernel that
# rounds P to e4m3 for the PV dot (as tritonfa and FA3 do) lands at ~2.5e-2 on these inputs (the reference with
# fp8_p_round_trip says so). In Triton's interpreter too: the runner applies tritonfa.interpreter_fixes there.
TOLERANCE_16BIT = 2e-2
TOLERANCE_FP8 = 8e-2
# the reference materializes [heads, Lq, Lk] scores per sequence: cap that at 2^29 fp32 values (2 GiB)
REFERENCE_SCORE_BUDGET = 1 << 29
REFERENCE_MAX_SEQS = 5

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}


@dataclasses.dataclass
class Case:
    """The tensors of one workload on one device, shared by every impl (so all see the same inputs)."""

    workload: Workload
    device: torch.device
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


def make_case(workload: Workload, device: torch.device, *, seed: int = 0) -> Case:
    """Random inputs for `workload` on `device` (deterministic for a given seed)."""
    w = workload
    generator = torch.Generator(device=device).manual_seed(seed)
    q_dtype, kv_dtype = DTYPES[w.q_dtype], DTYPES[w.kv_dtype]
    q = _random((w.total_q, w.num_q_heads, w.head_dim), q_dtype, device, generator)
    k_tokens = _random((w.total_k, w.num_kv_heads, w.head_dim), kv_dtype, device, generator)
    v_tokens = _random((w.total_k, w.num_kv_heads, w.head_dim), kv_dtype, device, generator)
    descale = torch.tensor(FP8_DESCALE, dtype=torch.float32, device=device)
    case = Case(
        workload=w,
        device=device,
        q=q,
        k_tokens=k_tokens,
        v_tokens=v_tokens,
        cu_seqlens_q=_cumulative(w.seqlens_q, device),
        cu_seqlens_k=_cumulative(w.seqlens_k, device),
        seqused_k=torch.tensor(w.seqlens_k, dtype=torch.int32, device=device),
        q_descale=descale if w.fp8_q else None,
        k_descale=descale if w.fp8_kv else None,
        v_descale=descale if w.fp8_kv else None,
        out_dtype=DTYPES[OUT_DTYPE],
    )
    if w.paged:
        host_generator = torch.Generator().manual_seed(seed)
        case.k_cache, case.v_cache, case.block_table = _to_paged(
            k_tokens, v_tokens, w.seqlens_k, w.block_size, host_generator
        )
    return case


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


def tolerance(workload: Workload) -> float:
    return TOLERANCE_FP8 if workload.fp8_q or workload.fp8_kv else TOLERANCE_16BIT
