"""Plain-torch attention reference: the oracle for tests and benchmarks.

`attention_reference` implements the whole contract of `tritonfa.flash_attn_varlen_func` (kernel/SEMANTICS.md)
with one Python loop over sequences and dense per-sequence math. It shares no code with the kernel on purpose: it
is meant to be obviously right, not fast.

Inputs are dequantized first (`stored.to(compute_dtype) * descale`), so by default the result is the exact
answer for the values the kernel sees. Two options turn it into a "PyTorch low-precision reference" for the
FA-style oracle (kernel error <= 2 * low-precision-reference error + rounding floor):

- `emulate_dtype`: round the dequantized q/k/v, the scores, P and the output to that dtype, the way a torch
  implementation running in bf16/fp16 would.
- `fp8_p_round_trip`: quantize P the way the kernel does when V is fp8: unnormalized P (in [0, 1]) times
  P_SCALE, rounded through that fp8 dtype, divided by P_SCALE; the softmax denominator keeps unquantized P.
  With `fp8_p_to_max`, times the fp8 dtype's largest value instead (the grid of a kernel that scales each key
  block's P to fp8's max, as the portable kernel does: the same grid where a row's keys fit one block).
"""

import contextlib
import math

import torch

__all__ = ["attention_reference", "fp8_p_scale", "full_fp32_matmul"]


def fp8_p_scale(dtype: torch.dtype) -> float:
    """P_SCALE for an fp8 V dtype: the largest power of two <= the dtype's max (e4m3fn 256, e4m3fnuz 128)."""
    return 2.0 ** math.floor(math.log2(torch.finfo(dtype).max))


def _round_through(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return x if dtype is None else x.to(dtype).to(x.dtype)


def _per_kv_head_descale(descale: torch.Tensor | None, batch_idx: int, compute_dtype: torch.dtype):
    """Descale of sequence `batch_idx` as a [Hk] tensor or a 0-d tensor (shapes [], [1] or [batch, Hk])."""
    if descale is None:
        return None
    if descale.numel() == 1:
        return descale.reshape(()).to(compute_dtype)
    if descale.dim() != 2:
        raise ValueError(f"descale must have shape [], [1] or [batch, Hk], got {tuple(descale.shape)}")
    return descale[batch_idx].to(compute_dtype)


def _dequantize(x: torch.Tensor, descale: torch.Tensor | None, group: int, compute_dtype: torch.dtype):
    """x [L, H, D] stored values -> real values; descale [Hk] is repeated over the `group` q heads of a kv head."""
    x = x.to(compute_dtype)
    if descale is None:
        return x
    if descale.dim() == 0:
        return x * descale
    return x * descale.repeat_interleave(group)[None, :, None]


def _row_max(x: torch.Tensor) -> torch.Tensor:
    """Max over the last dim, keepdim; -inf when that dim is empty (a sequence with no keys)."""
    if x.shape[-1] == 0:
        return x.new_full((*x.shape[:-1], 1), -math.inf)
    return x.amax(dim=-1, keepdim=True)


def _window_bounds(window_size, causal: bool) -> tuple[int, int]:
    """(left, right) key offsets around the query's diagonal; -1 = unbounded. causal means right = 0."""
    left, right = (-1, -1) if window_size is None else (int(window_size[0]), int(window_size[1]))
    if causal:
        right = 0
    return left, right


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    max_seqlen_q: int,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_k: int,
    cu_seqlens_k: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    s_aux: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    return_softmax_lse: bool = False,
    compute_dtype: torch.dtype = torch.float64,
    emulate_dtype: torch.dtype | None = None,
    fp8_p_round_trip: torch.dtype | None = None,
    fp8_p_to_max: bool = False,
):
    """Attention over a varlen (optionally paged) batch, computed densely per sequence.

    Arguments mirror `tritonfa.flash_attn_varlen_func`. Returns `out` [total_q, Hq, Dv] in `compute_dtype`, and
    with `return_softmax_lse` also `lse` [Hq, total_q] (natural log of the softmax denominator, sink included;
    -inf for rows that see no key and have no sink). Rows that see no key are 0. Rows of q outside every
    sequence (beyond cu_seqlens_q[-1]) are 0 / -inf.
    """
    total_q, num_q_heads, head_size = q.shape
    num_kv_heads, head_size_v = v.shape[-2], v.shape[-1]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"Hq={num_q_heads} is not a multiple of Hk={num_kv_heads}")
    group = num_q_heads // num_kv_heads
    paged = block_table is not None
    if paged and seqused_k is None:
        raise ValueError("block_table requires seqused_k")
    if not paged and cu_seqlens_k is None:
        raise ValueError("contiguous k/v require cu_seqlens_k")
    scale = head_size**-0.5 if softmax_scale is None else float(softmax_scale)
    left, right = _window_bounds(window_size, causal)
    device = q.device
    cd = compute_dtype

    out = torch.zeros(total_q, num_q_heads, head_size_v, dtype=cd, device=device)
    lse = torch.full((num_q_heads, total_q), -math.inf, dtype=cd, device=device)

    cu_q = cu_seqlens_q.tolist()
    cu_k = cu_seqlens_k.tolist() if cu_seqlens_k is not None else None
    used_k = seqused_k.tolist() if seqused_k is not None else None
    for b in range(len(cu_q) - 1):
        q_start, q_end = cu_q[b], cu_q[b + 1]
        seqlen_q = q_end - q_start
        seqlen_k = used_k[b] if used_k is not None else cu_k[b + 1] - cu_k[b]
        if seqlen_q == 0:
            continue

        if paged:
            block_size = k.shape[1]
            i_tok = torch.arange(seqlen_k, device=device)
            i_blk = block_table[b, i_tok // block_size].long()
            k_b = k[i_blk, i_tok % block_size]  # [Lk, Hk, D]
            v_b = v[i_blk, i_tok % block_size]  # [Lk, Hk, Dv]
        else:
            k_b = k[cu_k[b] : cu_k[b] + seqlen_k]  # [Lk, Hk, D]
            v_b = v[cu_k[b] : cu_k[b] + seqlen_k]  # [Lk, Hk, Dv]

        q_b = _dequantize(q[q_start:q_end], _per_kv_head_descale(q_descale, b, cd), group, cd)  # [Lq, Hq, D]
        k_b = _dequantize(k_b, _per_kv_head_descale(k_descale, b, cd), 1, cd)
        v_b = _dequantize(v_b, _per_kv_head_descale(v_descale, b, cd), 1, cd)
        k_b = k_b.repeat_interleave(group, dim=1)  # [Lk, Hq, D]
        v_b = v_b.repeat_interleave(group, dim=1)  # [Lk, Hq, Dv]
        q_b, k_b, v_b = (_round_through(x, emulate_dtype) for x in (q_b, k_b, v_b))

        scores = torch.einsum("qhd,khd->hqk", q_b, k_b) * scale  # [Hq, Lq, Lk]
        scores = _round_through(scores, emulate_dtype)
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)

        i_q = torch.arange(seqlen_q, device=device)[:, None]
        i_k = torch.arange(seqlen_k, device=device)[None, :]
        # bottom-right alignment: query i sits on key i + Lk - Lq
        diagonal = i_q + seqlen_k - seqlen_q  # [Lq, 1]
        if alibi_slopes is not None:
            slopes = alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes  # [Hq]
            scores = scores - slopes.to(cd)[:, None, None] * (diagonal - i_k).abs()
        if bias is not None:
            bias_b = bias[b if bias.shape[0] > 1 else 0, :, :seqlen_q, :seqlen_k].to(cd)  # [Hq|1, Lq, Lk]
            scores = scores + bias_b

        visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)  # [Lq, Lk]
        if left >= 0:
            visible &= i_k >= diagonal - left
        if right >= 0:
            visible &= i_k <= diagonal + right
        scores = scores.masked_fill(~visible, -math.inf)

        # the sink is one more logit in the denominator with no value row
        logits = scores
        if s_aux is not None:
            sink = s_aux.to(cd)[:, None, None].expand(num_q_heads, seqlen_q, 1)  # [Hq, Lq, 1]
            logits = torch.cat([scores, sink], dim=-1)
        row_max = _row_max(logits)  # [Hq, Lq, 1]
        row_max_safe = torch.where(torch.isinf(row_max), 0.0, row_max)
        denominator = torch.exp(logits - row_max_safe).sum(dim=-1, keepdim=True)  # [Hq, Lq, 1]
        lse_b = torch.log(denominator) + row_max_safe  # -inf where the denominator is 0
        safe_denominator = torch.where(denominator > 0, denominator, 1.0)

        if fp8_p_round_trip is not None:
            # kernel-like: P relative to the max visible score lies in [0, 1] before quantization
            visible_max = _row_max(scores)
            visible_max = torch.where(torch.isinf(visible_max), 0.0, visible_max)
            p_scale = torch.finfo(fp8_p_round_trip).max if fp8_p_to_max else fp8_p_scale(fp8_p_round_trip)
            p_unnormalized = torch.exp(scores - visible_max)  # [Hq, Lq, Lk]
            p_quantized = (p_unnormalized * p_scale).to(fp8_p_round_trip).to(cd) / p_scale
            probs = p_quantized * torch.exp(visible_max - row_max_safe) / safe_denominator
        else:
            probs = _round_through(torch.exp(scores - row_max_safe) / safe_denominator, emulate_dtype)

        out_b = torch.einsum("hqk,khd->qhd", probs, v_b)  # [Lq, Hq, Dv]
        out[q_start:q_end] = _round_through(out_b, emulate_dtype)
        lse[:, q_start:q_end] = lse_b[..., 0]

    return (out, lse) if return_softmax_lse else out


@contextlib.contextmanager
def full_fp32_matmul():
    """No TF32 in fp32 matmuls on the GPU while the block runs, whatever was set globally (vLLM sets TF32 on).

    torch >= 2.9 has `fp32_precision` next to the legacy `allow_tf32`, and reading the legacy flag after the new one
    was set raises: use the new one where it exists, and put back exactly what was there.
    """
    matmul = torch.backends.cuda.matmul
    flag, full = ("fp32_precision", "ieee") if hasattr(matmul, "fp32_precision") else ("allow_tf32", False)
    saved = getattr(matmul, flag)
    setattr(matmul, flag, full)
    try:
        yield
    finally:
        setattr(matmul, flag, saved)
