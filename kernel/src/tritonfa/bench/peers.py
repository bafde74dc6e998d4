"""The implementations a row compares: tritonfa and its peers, each behind `prepare(impl, case)`.

Peers: torch SDPA (flash, cuDNN and math backends, dense [B, H, L, D] views, GQA through `enable_gqa`),
FlexAttention (torch.compile on a GPU, causal and varlen through block masks), FlashAttention-3 from the vLLM
bundle (`vllm.vllm_flash_attn.flash_attn_varlen_func(..., fa_version=3)`: contiguous, paged and fp8) and vLLM's
Triton `unified_attention`. Each `prepare_*` does its set-up (layout copies, compiles, block masks) outside the
timed region and returns the call to time, or raises `Unsupported` for a workload the peer cannot run.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import warnings
from collections.abc import Callable

import torch

from .cases import Case
from .errors import Unsupported, one_line

PEERS = ("fa3", "sdpa-cudnn", "sdpa-flash", "flex", "vllm-unified", "sdpa-math")
DEFAULT_GPU_PEERS = ("fa3", "sdpa-cudnn", "sdpa-flash", "flex", "vllm-unified")
IMPLS = ("tritonfa", *PEERS)


@dataclasses.dataclass
class Prepared:
    """The call to time, how to view its output as [total_q, Hq, D], and a note for the table."""

    run: Callable[[], torch.Tensor]
    to_varlen: Callable[[torch.Tensor], torch.Tensor] = lambda out: out  # -> [total_q, Hq, D]
    note: str = ""


def _need_cuda(case: Case, what: str) -> None:
    if case.device.type != "cuda":
        raise Unsupported(f"{what} needs CUDA")


def prepare_tritonfa(case: Case) -> Prepared:
    import tritonfa  # the installed package, unlike the oracle: under asv, the commit being measured

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
                why = " | ".join(one_line(str(w.message), 200) for w in caught) or one_line(error, 100)
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
        raise Unsupported(f"vllm.vllm_flash_attn not importable: {one_line(error)}") from None
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
            errors.append(f"{module}: {one_line(error)}")
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
