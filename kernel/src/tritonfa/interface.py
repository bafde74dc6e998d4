"""Public entry point: argument checking, defaults, output allocation and the torch custom op.

Layers: `flash_attn_varlen_func` (checks and defaults, host-only) -> `varlen_fwd_eager` (output and lse buffers),
called directly in eager mode and through its `tritonfa::varlen_fwd` custom op while torch.compile traces ->
`varlen_fwd_into` (no allocation; what the vLLM backend calls) -> `kernels.attention.attention_forward` (typed
launcher) -> Triton kernel.
Every check here reads only shapes, dtypes, devices and Python values: never tensor contents (no host sync). The
contents of the index tensors are checked only on request (`validate=True` or TRITONFA_VALIDATE=1, see
`tritonfa.validation`); the kernel itself never reads or writes outside its tensors, whatever they hold.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tritonfa import validation
from tritonfa.configs import detect_arch
from tritonfa.fp8 import FP8_DTYPES, default_fp8_dtype, is_fp8
from tritonfa.kernels.attention import MAX_SPLITS, attention_forward, compile_calls

MAX_HEAD_DIM = 256
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, *FP8_DTYPES)

_NVIDIA_ARCHS = ("hopper", "ampere", "blackwell")
_FNUZ_DTYPES = tuple(d for d in (getattr(torch, "float8_e4m3fnuz", None), getattr(torch, "float8_e5m2fnuz", None)) if d)

# Arguments vLLM's flash_attn_varlen_func accepts that change nothing for a forward-only kernel.
_IGNORED_KWARGS = ("deterministic", "fa_version", "scheduler_metadata", "cp_world_size", "cp_rank")


def _check_tensor(name: str, t: Any, *, dims: tuple[int, ...], dtypes: tuple[torch.dtype, ...], device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() not in dims:
        raise ValueError(f"{name} must have {' or '.join(map(str, dims))} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} like q, got {t.device}")


def _check_scale(name: str, t: Any, device, num_seqs: int, num_kv_heads: int) -> None:
    if t is None:
        return
    _check_tensor(name, t, dims=(0, 1, 2), dtypes=(torch.float32,), device=device)
    if t.dim() == 1 and t.shape[0] != 1:
        raise ValueError(f"{name} must have shape [], [1] or [batch, num_kv_heads], got {tuple(t.shape)}")
    if t.dim() == 2 and tuple(t.shape) != (num_seqs, num_kv_heads):
        raise ValueError(
            f"{name} must have shape [batch={num_seqs}, num_kv_heads={num_kv_heads}], got {tuple(t.shape)}"
        )


def _check_mixed_precision(tensors: tuple[tuple[str, torch.Tensor], ...]) -> None:
    """fp16 and bf16 must not meet among q/k/v: neither holds the other's values, so the mix is a caller's bug
    (FlashAttention refuses it too). Reads dtypes only.

    The mixes that stay allowed have a type that holds both sides exactly, which the dots run in: fp8 with one
    16-bit type (an fp8 KV cache) in that type, two fp8 types in fp16, fp32 with anything in fp32.
    """
    sixteen_bit = [(name, t.dtype) for name, t in tensors if t.dtype in (torch.float16, torch.bfloat16)]
    for name, dtype in sixteen_bit[1:]:
        first_name, first_dtype = sixteen_bit[0]
        if dtype != first_dtype:
            raise TypeError(
                f"{first_name} ({first_dtype}) and {name} ({dtype}) mix fp16 with bf16; convert one of them "
                "(q, k and v may mix fp16 or bf16 only with fp8 or fp32)"
            )


def _normalize_window(window_size: Any, causal: bool) -> tuple[int, int]:
    if window_size is None:
        left, right = -1, -1
    else:
        if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
            raise ValueError(f"window_size must be a (left, right) pair, got {window_size!r}")
        left, right = (int(w) for w in window_size)
        if left < -1 or right < -1:
            raise ValueError(f"window_size entries must be >= -1 (-1 = unbounded), got {window_size!r}")
    if causal:
        right = 0  # causal is a window ending on the diagonal, whatever right edge was asked for (FA semantics)
    return left, right


def default_output_dtype(q_dtype: torch.dtype, output_scale: torch.Tensor | None, arch: str) -> torch.dtype:
    if output_scale is not None:
        return q_dtype if is_fp8(q_dtype) else default_fp8_dtype(arch)
    return q_dtype if not is_fp8(q_dtype) else torch.bfloat16


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    max_seqlen_q: int,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_k: int,
    cu_seqlens_k: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    *,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] | list[int] | None = None,
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    s_aux: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    q_descale: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
    output_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    return_softmax_lse: bool = False,
    return_attn_probs: bool = False,
    num_splits: int = 0,
    validate: bool | None = None,
    **ignored: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention forward over a variable-length batch; keyword-compatible with vLLM's flash_attn_varlen_func.

    q: [total_q, Hq, D]; k, v: [total_k, Hk, D(v)] with cu_seqlens_k, or paged [num_blocks, block_size, Hk, D(v)]
    with block_table [batch, max_blocks] and seqused_k [batch]. Returns out [total_q, Hq, Dv] (and lse fp32
    [Hq, total_q] if return_softmax_lse). Full contract: kernel/SEMANTICS.md; tritonfa.reference implements it.
    validate: check the contents of cu_seqlens_q/k, seqused_k and block_table before the launch (a host sync; see
    `tritonfa.validation`); None (default) follows the TRITONFA_VALIDATE environment variable.
    """
    unknown = set(ignored) - set(_IGNORED_KWARGS)
    if unknown:
        raise TypeError(f"flash_attn_varlen_func got unsupported arguments: {sorted(unknown)}")
    if dropout_p:
        raise ValueError(f"dropout_p must be 0 (tritonfa is an inference forward kernel), got {dropout_p}")
    if return_attn_probs:
        raise ValueError("return_attn_probs=True is not supported (use return_softmax_lse=True for the lse)")

    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    device = q.device
    _check_tensor("q", q, dims=(3,), dtypes=_FLOAT_DTYPES, device=device)
    paged = block_table is not None
    kv_dims = (4,) if paged else (3,)
    _check_tensor("k", k, dims=kv_dims, dtypes=_FLOAT_DTYPES, device=device)
    _check_tensor("v", v, dims=kv_dims, dtypes=_FLOAT_DTYPES, device=device)
    _check_mixed_precision((("q", q), ("k", k), ("v", v)))
    total_q, num_q_heads, head_dim = q.shape
    num_kv_heads, head_dim_k = k.shape[-2], k.shape[-1]
    head_dim_v = v.shape[-1]
    if head_dim_k != head_dim:
        raise ValueError(f"k head size {head_dim_k} must equal q head size {head_dim}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"v shape {tuple(v.shape)} must match k shape {tuple(k.shape)} except the last dimension")
    if paged and (k.shape[0] < 1 or k.shape[1] < 1):
        raise ValueError(f"k (paged) must have num_blocks >= 1 and block_size >= 1, got shape {tuple(k.shape)}")
    for name, size in (("q", head_dim), ("v", head_dim_v)):
        if not 1 <= size <= MAX_HEAD_DIM:
            raise ValueError(f"{name} head size must be in [1, {MAX_HEAD_DIM}], got {size}")
    if num_kv_heads < 1 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"the number of q heads ({num_q_heads}) must be a multiple of the number of k/v heads ({num_kv_heads})"
        )

    _check_tensor("cu_seqlens_q", cu_seqlens_q, dims=(1,), dtypes=(torch.int32,), device=device)
    num_seqs = cu_seqlens_q.shape[0] - 1
    if num_seqs < 1:
        raise ValueError(f"cu_seqlens_q must have batch + 1 >= 2 entries, got {cu_seqlens_q.shape[0]}")
    if block_table is not None:
        _check_tensor("block_table", block_table, dims=(2,), dtypes=(torch.int32,), device=device)
        if block_table.shape[0] != num_seqs:
            raise ValueError(f"block_table must have batch={num_seqs} rows, got {block_table.shape[0]}")
        if seqused_k is None:
            raise ValueError("seqused_k is required with block_table (the KV length of each sequence)")
        if cu_seqlens_k is not None:
            raise ValueError("cu_seqlens_k must be None with block_table (paged KV lengths come from seqused_k)")
    elif cu_seqlens_k is None:
        raise ValueError("cu_seqlens_k is required for contiguous k/v (or pass block_table and seqused_k)")
    else:
        _check_tensor("cu_seqlens_k", cu_seqlens_k, dims=(1,), dtypes=(torch.int32,), device=device)
        if cu_seqlens_k.shape[0] != num_seqs + 1:
            raise ValueError(f"cu_seqlens_k must have batch + 1 = {num_seqs + 1} entries, got {cu_seqlens_k.shape[0]}")
    if seqused_k is not None:
        _check_tensor("seqused_k", seqused_k, dims=(1,), dtypes=(torch.int32,), device=device)
        if seqused_k.shape[0] != num_seqs:
            raise ValueError(f"seqused_k must have batch = {num_seqs} entries, got {seqused_k.shape[0]}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 0 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be an int in [0, {MAX_SPLITS}] (0 = auto), got {num_splits!r}")
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"{name} must be a non-negative int, got {value!r}")

    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(head_dim)
    if not isinstance(softcap, (int, float)) or softcap < 0:
        raise ValueError(f"softcap must be a float >= 0 (0 = off), got {softcap!r}")
    window_left, window_right = _normalize_window(window_size, causal)

    if alibi_slopes is not None:
        _check_tensor("alibi_slopes", alibi_slopes, dims=(1, 2), dtypes=(torch.float32,), device=device)
        if alibi_slopes.shape[-1] != num_q_heads or (alibi_slopes.dim() == 2 and alibi_slopes.shape[0] != num_seqs):
            raise ValueError(f"alibi_slopes must have shape [{num_q_heads}] or [{num_seqs}, {num_q_heads}]")
    if bias is not None:
        _check_tensor("bias", bias, dims=(4,), dtypes=(torch.float16, torch.bfloat16, torch.float32), device=device)
        b, h, sq, sk = bias.shape
        if b not in (1, num_seqs) or h not in (1, num_q_heads) or sq < max_seqlen_q or sk < max_seqlen_k:
            raise ValueError(
                f"bias must have shape [1|{num_seqs}, 1|{num_q_heads}, >={max_seqlen_q}, >={max_seqlen_k}], "
                f"got {tuple(bias.shape)}"
            )
    if s_aux is not None:
        _check_tensor("s_aux", s_aux, dims=(1,), dtypes=(torch.float32, torch.float16, torch.bfloat16), device=device)
        if s_aux.shape[0] != num_q_heads:
            raise ValueError(f"s_aux must have shape [{num_q_heads}], got {tuple(s_aux.shape)}")
    for name, scale in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        _check_scale(name, scale, device, num_seqs, num_kv_heads)
    if output_scale is not None:
        _check_tensor("output_scale", output_scale, dims=(0, 1), dtypes=(torch.float32,), device=device)
        if output_scale.numel() != 1:
            raise ValueError(f"output_scale must hold one value, got shape {tuple(output_scale.shape)}")

    # The launcher detects the architecture again (a cached lookup): it is also called through the custom op, whose
    # schema carries tensors and numbers only, and by the vLLM backend directly.
    arch = detect_arch(device)
    if arch in _NVIDIA_ARCHS:
        for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
            if t is not None and t.dtype in _FNUZ_DTYPES:
                raise TypeError(
                    f"{name} has dtype {t.dtype}, an AMD MI300 format that NVIDIA GPUs cannot compute with; "
                    "use torch.float8_e4m3fn / torch.float8_e5m2 (the descale absorbs the 2x range difference)"
                )
    if validation.wanted(validate) and validation.contents_readable(device):
        validation.check_contents(
            total_q=total_q,
            total_k=0 if paged else k.shape[0],
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            seqused_k=seqused_k,
            block_table=block_table,
            num_blocks=k.shape[0] if paged else 0,
            block_size=k.shape[1] if paged else 1,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
        )
    if out is None:
        out = torch.empty(
            (total_q, num_q_heads, head_dim_v), dtype=default_output_dtype(q.dtype, output_scale, arch), device=device
        )
    else:
        _check_tensor("out", out, dims=(3,), dtypes=_FLOAT_DTYPES, device=device)
        if tuple(out.shape) != (total_q, num_q_heads, head_dim_v):
            raise ValueError(f"out must have shape {(total_q, num_q_heads, head_dim_v)}, got {tuple(out.shape)}")

    # Eager callers skip the dispatcher (its argument handling costs more host time than the launch); torch.compile
    # traces the custom op, which has a fake implementation.
    forward = varlen_fwd if torch.compiler.is_compiling() else varlen_fwd_eager
    lse = forward(
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, bias, s_aux,
        q_descale, k_descale, v_descale, output_scale, max_seqlen_q, max_seqlen_k, float(softmax_scale),
        window_left, window_right, float(softcap), int(num_splits), return_softmax_lse,
    )  # fmt: skip
    return (out, lse) if return_softmax_lse else out


def varlen_fwd_eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    block_table: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None,
    bias: torch.Tensor | None,
    s_aux: torch.Tensor | None,
    q_descale: torch.Tensor | None,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
    output_scale: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    window_left: int,
    window_right: int,
    softcap: float,
    num_splits: int,
    return_lse: bool,
) -> torch.Tensor:
    """Writes `out`; returns lse [Hq, total_q] fp32 (an empty tensor when return_lse is False)."""
    total_q, num_q_heads = q.shape[0], q.shape[1]
    lse_shape = (num_q_heads, total_q) if return_lse else (0,)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    varlen_fwd_into(
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, bias, s_aux, q_descale,
        k_descale, v_descale, output_scale, max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
        softcap, num_splits, lse if return_lse else None,
    )  # fmt: skip
    return lse


def varlen_fwd_into(
    q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, bias, s_aux, q_descale, k_descale,
    v_descale, output_scale, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, window_left: int,
    window_right: int, softcap: float, num_splits: int, lse: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """`varlen_fwd_eager`'s arguments without return_lse: writes `out` (and `lse` [Hq, total_q] fp32 if given) and
    allocates nothing (a caller that keeps no lse, such as the vLLM backend, skips the empty one's allocation)."""
    if q.shape[0] == 0:
        return
    attention_forward(
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, bias, s_aux, q_descale,
        k_descale, v_descale, output_scale, max_seqlen_q, max_seqlen_k, softmax_scale, window_left, window_right,
        softcap, num_splits,
    )  # fmt: skip


def compile_varlen_fwd(calls: list[tuple]) -> None:
    """Compile, side by side, the kernels these `varlen_fwd` calls (their positional arguments) would launch and that
    have not run yet; nothing runs, `out` stays as it is. For a warm-up of several calls: they then find their
    kernels compiled instead of compiling call after call. A no-op in Triton's interpreter."""
    forward_calls = []
    for args in calls:
        q, return_lse = args[0], args[-1]
        if q.shape[0] == 0:
            continue
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device) if return_lse else None
        forward_calls.append((*args[:4], lse, *args[4:-1]))
    compile_calls(forward_calls)


# The same function as a torch custom op, for torch.compile (and callers that want the dispatcher).
varlen_fwd = torch.library.custom_op("tritonfa::varlen_fwd", varlen_fwd_eager, mutates_args=("out",))


@varlen_fwd.register_fake
def _varlen_fwd_fake(q, k, v, out, cu_seqlens_q, *args) -> torch.Tensor:
    return_lse = args[-1]
    lse_shape = (q.shape[1], q.shape[0]) if return_lse else (0,)
    return q.new_empty(lse_shape, dtype=torch.float32)
