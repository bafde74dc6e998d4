"""The benchmark workloads as plain data: one definition shared by `python -m tritonfa.bench` and asv.

A `Workload` names its shapes, heads, dtypes and KV layout, and knows how much work it is: the (query, key) pairs
a query can see (causal masks are bottom-right aligned, as in the kernel), the FLOPs those pairs cost and the
bytes a decode step must move. It holds no tensors; `tritonfa.bench.make_case` builds them.

`WORKLOADS` are the GPU shapes (Llama-3-8B heads unless noted); `smoke_scaled` shrinks one to a size the Triton
interpreter runs in about a second, keeping every feature (GQA ratio, head size, paging, fp8, mixed batch).
"""

from __future__ import annotations

import dataclasses
import random

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8_e4m3": 1}
OUT_DTYPE = "bf16"  # every workload writes a 16-bit output (fp8 inputs included), like vLLM's attention layers


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "prefill" (compute-bound: TFLOP/s), "decode" (memory-bound: GB/s) or "mixed" (both in one launch: ms)
    seqlens_q: tuple[int, ...]
    seqlens_k: tuple[int, ...]
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    causal: bool = True
    q_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    paged: bool = False  # KV in a block cache [num_blocks, block_size, Hk, D] behind a block table
    block_size: int = 16

    def __post_init__(self):
        if len(self.seqlens_q) != len(self.seqlens_k):
            raise ValueError(f"{self.name}: seqlens_q and seqlens_k must have the same length")
        if any(q > k for q, k in zip(self.seqlens_q, self.seqlens_k)):
            raise ValueError(f"{self.name}: every query must have its own key (seqlen_q <= seqlen_k)")
        if self.kind not in ("prefill", "decode", "mixed"):
            raise ValueError(f"{self.name}: unknown kind {self.kind!r}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_q_heads must be a multiple of num_kv_heads")

    @property
    def batch(self) -> int:
        return len(self.seqlens_q)

    @property
    def total_q(self) -> int:
        return sum(self.seqlens_q)

    @property
    def total_k(self) -> int:
        return sum(self.seqlens_k)

    @property
    def max_seqlen_q(self) -> int:
        return max(self.seqlens_q)

    @property
    def max_seqlen_k(self) -> int:
        return max(self.seqlens_k)

    @property
    def uniform(self) -> bool:
        """All sequences have the same lengths, so a dense [B, H, L, D] layout holds the batch (SDPA, flex)."""
        return len(set(self.seqlens_q)) == 1 and len(set(self.seqlens_k)) == 1

    @property
    def fp8_q(self) -> bool:
        return self.q_dtype.startswith("fp8")

    @property
    def fp8_kv(self) -> bool:
        return self.kv_dtype.startswith("fp8")

    @property
    def metric(self) -> str:
        """The headline number of a row: TFLOP/s for prefill, GB/s for decode, ms for a mixed batch."""
        return {"prefill": "tflops", "decode": "gbps", "mixed": "ms"}[self.kind]

    @property
    def visible_pairs(self) -> int:
        return sum(visible_pairs(lq, lk, self.causal) for lq, lk in zip(self.seqlens_q, self.seqlens_k))

    @property
    def flops(self) -> int:
        """QK^T and PV over the visible pairs only: 2 FLOPs per multiply-add, D each, per query head."""
        return 4 * self.head_dim * self.visible_pairs * self.num_q_heads

    @property
    def bytes_moved(self) -> int:
        """K and V each sequence reads once (paged: only its used tokens), plus q in and the output out."""
        kv = self.total_k * self.num_kv_heads * self.head_dim * 2 * DTYPE_BYTES[self.kv_dtype]
        q = self.total_q * self.num_q_heads * self.head_dim * DTYPE_BYTES[self.q_dtype]
        out = self.total_q * self.num_q_heads * self.head_dim * DTYPE_BYTES[OUT_DTYPE]
        return kv + q + out

    def describe(self) -> str:
        if self.uniform:
            lq, lk = self.seqlens_q[0], self.seqlens_k[0]
            lengths = f"b{self.batch}x{lq}" if lq == lk else f"b{self.batch}, q {lq}, k {lk}"
        else:
            lengths = (
                f"{self.batch} seqs, q {min(self.seqlens_q)}..{self.max_seqlen_q}, "
                f"k {min(self.seqlens_k)}..{self.max_seqlen_k}"
            )
        layout = f"paged bs{self.block_size}" if self.paged else "contiguous"
        return (
            f"{lengths}, heads {self.num_q_heads}/{self.num_kv_heads}, D {self.head_dim}, "
            f"q {self.q_dtype}, kv {self.kv_dtype}, {'causal' if self.causal else 'non-causal'}, {layout}"
        )


def visible_pairs(seqlen_q: int, seqlen_k: int, causal: bool) -> int:
    """(query, key) pairs a sequence computes; causal is bottom-right aligned (query i sees keys <= i + Lk - Lq)."""
    if seqlen_q <= 0 or seqlen_k <= 0:
        return 0
    if not causal:
        return seqlen_q * seqlen_k
    # query i sees i + Lk - Lq + 1 keys (never more than Lk), so the counts run over first..Lk
    first = max(1, seqlen_k - seqlen_q + 1)
    return seqlen_k * (seqlen_k + 1) // 2 - (first - 1) * first // 2


def _dense(batch: int, length: int) -> dict:
    return dict(seqlens_q=(length,) * batch, seqlens_k=(length,) * batch)


def _decode(batch: int, context: int) -> dict:
    return dict(kind="decode", seqlens_q=(1,) * batch, seqlens_k=(context,) * batch, paged=True)


def _varlen_lengths(count: int, low: int, high: int, seed: int) -> tuple[int, ...]:
    rng = random.Random(seed)  # fixed seed: the same "random" batch in every run and in asv's history
    return tuple(rng.randint(low, high) for _ in range(count))


_VARLEN = _varlen_lengths(16, 64, 4096, seed=0)
_MIXED_Q = (512,) * 4 + (1,) * 60  # 4 chunked prefills (512 new tokens on 2048 cached) + 60 decodes
_MIXED_K = (2048 + 512,) * 4 + (2048,) * 60

WORKLOADS: tuple[Workload, ...] = (
    Workload("prefill-b8x2048-causal", "prefill", **_dense(8, 2048)),
    Workload("prefill-b1x8192-causal", "prefill", **_dense(1, 8192)),
    Workload("prefill-b4x4096-noncausal", "prefill", **_dense(4, 4096), causal=False),
    Workload("prefill-varlen16-causal", "prefill", seqlens_q=_VARLEN, seqlens_k=_VARLEN),
    Workload("prefill-d96-b8x2048-causal", "prefill", **_dense(8, 2048), num_kv_heads=32, head_dim=96),
    Workload("prefill-d256-b8x2048-causal", "prefill", **_dense(8, 2048), num_q_heads=16, head_dim=256),
    Workload("fp8-prefill-b8x2048-causal", "prefill", **_dense(8, 2048), q_dtype="fp8_e4m3", kv_dtype="fp8_e4m3"),
    Workload(
        "fp8-prefill-b4x4096-noncausal",
        "prefill",
        **_dense(4, 4096),
        causal=False,
        q_dtype="fp8_e4m3",
        kv_dtype="fp8_e4m3",
    ),
    Workload("fp8kv-prefill-b8x2048-causal", "prefill", **_dense(8, 2048), kv_dtype="fp8_e4m3"),
    Workload("decode-b64x2048-paged", **_decode(64, 2048)),
    Workload("fp8kv-decode-b64x2048-paged", **_decode(64, 2048), kv_dtype="fp8_e4m3"),
    # vLLM's fp8 KV cache decode: vLLM quantizes q to fp8 itself (the backend's supports_quant_query_input)
    Workload("fp8-decode-b64x2048-paged", **_decode(64, 2048), q_dtype="fp8_e4m3", kv_dtype="fp8_e4m3"),
    Workload("decode-b8x32768-paged", **_decode(8, 32768)),
    # vLLM's fp8 cache at low concurrency and long contexts: a split-KV decode
    Workload("fp8-decode-b8x32768-paged", **_decode(8, 32768), q_dtype="fp8_e4m3", kv_dtype="fp8_e4m3"),
    Workload("mixed-4x512+60-paged", "mixed", seqlens_q=_MIXED_Q, seqlens_k=_MIXED_K, paged=True),
    # Paged prefill (what vLLM runs: every prefill reads the block cache): compare with prefill-b8x2048-causal.
    Workload("prefill-b8x2048-causal-paged", "prefill", **_dense(8, 2048), paged=True),
    # A paged fp8 KV cache with a bf16 q: compare with fp8kv-prefill-b8x2048-causal
    Workload("fp8kv-prefill-b8x2048-causal-paged", "prefill", **_dense(8, 2048), kv_dtype="fp8_e4m3", paged=True),
    # vLLM's fp8 KV cache prefill: vLLM quantizes q to fp8 itself (the backend's supports_quant_query_input)
    Workload(
        "fp8-prefill-b8x2048-causal-paged",
        "prefill",
        **_dense(8, 2048),
        q_dtype="fp8_e4m3",
        kv_dtype="fp8_e4m3",
        paged=True,
    ),
    Workload("decode-b256x1024-paged", **_decode(256, 1024)),
    # Speculative decoding: 4 new queries per sequence (still decode-shaped).
    Workload("decode-q4-b64x2048-paged", "decode", seqlens_q=(4,) * 64, seqlens_k=(2048,) * 64, paged=True),
    Workload("decode-d64-b64x2048-paged", **_decode(64, 2048), head_dim=64),
    Workload("decode-d256-b64x2048-paged", **_decode(64, 2048), num_q_heads=16, head_dim=256),
    Workload("decode-b64x2048-paged-bs1", **_decode(64, 2048), block_size=1),
    Workload("decode-b64x2048-paged-bs256", **_decode(64, 2048), block_size=256),
)


def smoke_scaled(workload: Workload) -> Workload:
    """A tiny copy for the interpreter (CPU dry run): lengths / 64, at most 3 sequences, 4/2 or 2/2 heads.

    A mixed batch keeps two prefills and three decodes, its prefills shrunk less (new tokens / 16) so that
    max_seqlen_q stays prefill-shaped, as on the GPU.
    """

    def shrink(length: int) -> int:
        return 1 if length == 1 else max(8, length // 64)

    if workload.kind == "mixed":
        prefills = [i for i, lq in enumerate(workload.seqlens_q) if lq > 1][:2]
        decodes = [i for i, lq in enumerate(workload.seqlens_q) if lq == 1][:3]
        seqlens_q, seqlens_k = [], []
        for i in prefills + decodes:
            lq, lk = workload.seqlens_q[i], workload.seqlens_k[i]
            new_q = lq // 16 if lq > 1 else 1
            seqlens_q.append(new_q)
            seqlens_k.append(new_q + shrink(lk - lq))
    else:
        keep = range(min(workload.batch, 3))
        seqlens_q = [shrink(workload.seqlens_q[i]) for i in keep]
        seqlens_k = [shrink(workload.seqlens_k[i]) for i in keep]
    grouped = workload.num_q_heads > workload.num_kv_heads
    return dataclasses.replace(
        workload,
        seqlens_q=tuple(seqlens_q),
        seqlens_k=tuple(seqlens_k),
        num_q_heads=4 if grouped else 2,
        num_kv_heads=2,
    )


def select(workloads: tuple[Workload, ...], only: list[str] | None) -> list[Workload]:
    """Workloads whose name contains any of the `only` substrings (all of them when `only` is empty)."""
    if not only:
        return list(workloads)
    return [w for w in workloads if any(pattern in w.name for pattern in only)]
