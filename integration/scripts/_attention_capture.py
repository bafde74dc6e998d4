"""Check a backend's attention outputs inside a running vLLM engine against float64 ALiBi attention (Bloom's).

`install(model, recorder)` wraps the `forward` of every attention layer's impl (whatever the backend: CUSTOM,
TRITON_ATTN, ...). Each call runs unchanged; while the recorder wants more samples, the wrapper then reads what the
call saw — the query, the paged cache (already holding the step's K/V), the step's lengths and block table, the
layer's scale and ALiBi slopes — computes the exact result in float64 and records how far the backend's output is
from it. The reference is Bloom's definition as transformers writes it: bias = slope_h * key position (slopes from
transformers' `build_alibi_tensor`, independent of vLLM's and of tritonfa's), causal mask, softmax. So one engine
run settles which backend computes ALiBi right, in the exact steps vLLM schedules (chunked prefills with cached
context next to decodes).

Error scale: every backend rounds P to its 16-bit input type for the P @ V product and rounds the output, so an
exact-up-to-rounding bf16 result is within `2^-8 * (sum_j p_j |v_j| + |out|)` of float64 (bf16's unit roundoff;
fp32 models run fp32 or tf32 dots and land far inside it). `ratio` = max |error| / that bound: <= 1 is rounding,
a misplaced bias is >> 1 (the steepest Bloom head's slope is 0.7 per position).

Pure PyTorch, no GPU needed (tests/integration/test_attention_capture.py runs it on the CPU backend).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

BF16_UNIT_ROUNDOFF = 2.0**-8


def hf_bloom_slopes(num_heads: int, device) -> torch.Tensor:
    """Bloom's per-head slopes as transformers computes them (float64 [num_heads])."""
    try:
        from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    except ImportError:  # transformers without Bloom: the paper's closed form (what build_alibi_tensor implements)
        return _closed_form_slopes(num_heads).to(device)
    # build_alibi_tensor(mask [1, 2]) = slope_h * [0, 1] per head: position 1 holds the slope
    return build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float64)[:, 0, 1].to(device)


def _closed_form_slopes(num_heads: int) -> torch.Tensor:
    closest = 2 ** math.floor(math.log2(num_heads))
    slopes = [2.0 ** (-8.0 * (h + 1) / closest) for h in range(closest)]
    extra = [2.0 ** (-4.0 * (2 * h + 1) / closest) for h in range(num_heads - closest)]
    return torch.tensor(slopes + extra, dtype=torch.float64)


def split_cache(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[num_blocks, block_size, Hk, D] K and V views of one layer's cache, as vLLM lays it out (0.24 and 0.33+)."""
    if kv_cache.dim() == 5:  # 0.24: (num_blocks, 2, block_size, Hk, D)
        return kv_cache[:, 0], kv_cache[:, 1]
    kv = kv_cache.transpose(1, 2)  # 0.33+: (num_blocks, Hk, block_size, 2 * D)
    return kv[..., :head_size], kv[..., head_size:]


def gather_sequence(cache: torch.Tensor, block_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first seq_len tokens of one sequence from a paged cache [num_blocks, block_size, Hk, D]."""
    block_size = cache.shape[1]
    blocks = block_row[: (seq_len + block_size - 1) // block_size].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:seq_len]


def alibi_reference(q, k, v, slopes, scale):
    """float64 causal attention of one sequence's last q.shape[0] positions with Bloom's bias.

    q [Lq, Hq, D]; k, v [L, Hk, D]; slopes [Hq]. Returns (out [Lq, Hq, D], magnitude = sum_j p_j |v_j|).
    """
    q, k, v = q.double(), k.double(), v.double()
    query_len, num_heads = q.shape[0], q.shape[1]
    seq_len, group = k.shape[0], num_heads // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    positions = torch.arange(seq_len, device=q.device, dtype=torch.float64)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale + slopes.double()[:, None, None] * positions
    query_pos = torch.arange(seq_len - query_len, seq_len, device=q.device)
    future = torch.arange(seq_len, device=q.device)[None, :] > query_pos[:, None]
    probs = scores.masked_fill(future, -math.inf).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v), torch.einsum("hqk,khd->qhd", probs, v.abs())


def step_kind(query_lens: list[int], seq_lens: list[int]) -> str:
    """'mixed' (a prefill chunk with cached context), 'prefill' (prefills from position 0) or 'decode'."""
    if any(q > 1 and s > q for q, s in zip(query_lens, seq_lens)):
        return "mixed"
    return "prefill" if any(q > 1 for q in query_lens) else "decode"


def step_lengths(metadata) -> tuple[list[int], list[int], list[int]]:
    """(query starts, query lengths, KV lengths) of a step's real sequences, read to the host (a GPU sync)."""
    starts = metadata.query_start_loc.tolist()
    query_lens = [b - a for a, b in zip(starts[:-1], starts[1:])]
    seq_lens = metadata.seq_lens.tolist()[: len(query_lens)]
    return starts[:-1], query_lens, seq_lens


def check_call(impl, query, kv_cache, metadata, output, lengths=None) -> dict:
    """Compare one finished attention call with the float64 reference. Syncs with the GPU (testing only).

    Tensor parallelism 1: the reference takes the slopes of all impl.num_heads heads.
    """
    num_tokens = int(metadata.num_actual_tokens)
    starts, query_lens, seq_lens = lengths or step_lengths(metadata)
    key_cache, value_cache = split_cache(kv_cache, impl.head_size)
    slopes = hf_bloom_slopes(impl.num_heads, query.device)
    layer_slopes = impl.alibi_slopes
    slope_error = float((layer_slopes.to(slopes) - slopes).abs().max()) if layer_slopes is not None else math.inf
    worst_ratio = max_err = 0.0
    for b, (start, query_len, seq_len) in enumerate(zip(starts, query_lens, seq_lens)):
        if query_len == 0 or start >= num_tokens:
            continue  # CUDA-graph padding
        k = gather_sequence(key_cache, metadata.block_table[b], seq_len)
        v = gather_sequence(value_cache, metadata.block_table[b], seq_len)
        ref, magnitude = alibi_reference(query[start : start + query_len], k, v, slopes, impl.scale)
        err = (output[start : start + query_len].double() - ref).abs()
        bound = BF16_UNIT_ROUNDOFF * (magnitude + ref.abs())
        worst_ratio = max(worst_ratio, float((err / bound.clamp(min=1e-30)).max()))
        max_err = max(max_err, float(err.max()))
    return {
        "kind": step_kind(query_lens, seq_lens),
        "ratio": worst_ratio,
        "max_abs_err": max_err,
        "slope_error": slope_error,
        "tokens": num_tokens,
        "max_context": max((s - q for q, s in zip(query_lens, seq_lens)), default=0),
    }


@dataclass
class Recorder:
    """Collects check_call results: up to `per_kind` calls of each step kind per layer."""

    per_kind: int = 4
    records: list = field(default_factory=list)
    _counts: dict = field(default_factory=dict)

    def wants(self, layer_name: str, kind: str) -> bool:
        return self._counts.get((layer_name, kind), 0) < self.per_kind

    def add(self, layer_name: str, record: dict) -> None:
        key = (layer_name, record["kind"])
        self._counts[key] = self._counts.get(key, 0) + 1
        self.records.append({"layer": layer_name, **record})

    def summary(self) -> dict:
        """Per step kind: calls checked, worst ratio, worst absolute error; and the worst slope mismatch."""
        kinds: dict = {}
        for r in self.records:
            s = kinds.setdefault(r["kind"], {"calls": 0, "ratio": 0.0, "max_abs_err": 0.0, "max_context": 0})
            s["calls"] += 1
            s["ratio"] = max(s["ratio"], r["ratio"])
            s["max_abs_err"] = max(s["max_abs_err"], r["max_abs_err"])
            s["max_context"] = max(s["max_context"], r["max_context"])
        slope_error = max((r["slope_error"] for r in self.records), default=math.inf)
        return {"kinds": kinds, "slope_error": slope_error, "calls": len(self.records)}


def install(model, recorder: Recorder) -> int:
    """Wrap the impl.forward of every attention layer of `model`; returns how many were wrapped."""
    wrapped = 0
    for name, module in model.named_modules():
        impl = getattr(module, "impl", None)
        if impl is None or not hasattr(module, "attn_backend") or getattr(impl, "_capture_wrapped", False):
            continue
        original = impl.forward

        def forward(layer, query, key, value, kv_cache, attn_metadata, output, *args, _name=name, _impl=impl,
                    _original=original, **kwargs):  # fmt: skip
            result = _original(layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
            if attn_metadata is not None:
                lengths = step_lengths(attn_metadata)
                if recorder.wants(_name, step_kind(*lengths[1:])):
                    recorder.add(_name, check_call(_impl, query, kv_cache, attn_metadata, output, lengths))
            return result

        impl.forward = forward
        impl._capture_wrapped = True
        wrapped += 1
    return wrapped
