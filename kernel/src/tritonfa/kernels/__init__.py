"""Triton kernels and their launchers, plus the specs CI uses to cross-compile them for GPUs it does not have."""

from __future__ import annotations

import torch

from tritonfa.configs import all_configs
from tritonfa.fp8 import default_fp8_dtype, fp8_max, p_scale
from tritonfa.kernels.attention import (
    _TORCH_TO_TL,
    _dot_dtypes,
    attention_fwd_kernel,
    combine_splits_kernel,
    dot_precision,
)

_POINTERS = (
    "q_ptr", "k_ptr", "v_ptr", "out_ptr", "lse_ptr", "cu_seqlens_q_ptr", "cu_seqlens_k_ptr", "seqused_k_ptr",
    "block_table_ptr", "alibi_ptr", "bias_ptr", "sink_ptr", "q_descale_ptr", "k_descale_ptr", "v_descale_ptr",
    "out_scale_ptr", "split_out_ptr", "split_lse_ptr",
)  # fmt: skip
_FLOAT_SCALARS = ("softmax_scale", "softcap")


def _pointer_type(dtype: torch.dtype) -> str:
    return "*" + str(_TORCH_TO_TL[dtype]).replace("float", "fp").replace("bfloat16", "bf16").replace("fp8e", "fp8e")


def _variants(arch: str) -> list[dict]:
    """Representative dtype/feature combinations the dispatcher produces on `arch` (split-KV: decode-style)."""
    fp8 = default_fp8_dtype(arch)
    bf16 = torch.bfloat16
    return [
        dict(q=bf16, kv=bf16, out=bf16, paged=False, features=False, split=False),
        dict(q=bf16, kv=bf16, out=bf16, paged=True, features=True, split=False),
        dict(q=bf16, kv=bf16, out=bf16, paged=True, features=True, split=True),
        dict(q=bf16, kv=fp8, out=bf16, paged=True, features=False, split=False),
        dict(q=fp8, kv=fp8, out=fp8, paged=False, features=False, split=False),
    ]


def _signature(fn, constexpr_names: set[str], pointer_dtypes: dict[str, torch.dtype]) -> dict[str, str]:
    signature = {}
    for name in fn.arg_names:
        if name in constexpr_names:
            signature[name] = "constexpr"
        elif name in pointer_dtypes:
            signature[name] = _pointer_type(pointer_dtypes[name])
        elif name in ("cu_seqlens_q_ptr", "cu_seqlens_k_ptr", "seqused_k_ptr", "block_table_ptr"):
            signature[name] = "*i32"
        elif name in _POINTERS:
            signature[name] = "*fp32"
        elif name in _FLOAT_SCALARS:
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
    return signature


def _combine_specs(arch: str) -> list[dict]:
    """The split-KV merge kernel for the head sizes and outputs (16-bit, fp8 with output_scale) it sees."""
    fp8 = default_fp8_dtype(arch)
    specs = []
    constexpr_names = {combine_splits_kernel.arg_names[i] for i in combine_splits_kernel.constexprs}
    for head_dim_v in (64, 128, 256):
        for out_dtype in (torch.bfloat16, fp8):
            fp8_out = out_dtype == fp8
            constexprs = dict(
                HEAD_DIM_V=head_dim_v, BLOCK_DV=head_dim_v, BLOCK_SPLITS=16, HAS_SINK=True, HAS_OUT_SCALE=fp8_out,
                RETURN_LSE=True, OUT_MAX=fp8_max(out_dtype) if fp8_out else 0.0,
            )  # fmt: skip
            name = f"combine_splits[{arch} dv{head_dim_v} out:{out_dtype}]".replace("torch.", "")
            signature = _signature(combine_splits_kernel, constexpr_names, {"out_ptr": out_dtype})
            specs.append(
                dict(
                    name=name, fn=combine_splits_kernel, signature=signature, constexprs=constexprs,
                    options=dict(num_warps=4, num_stages=1),
                )
            )  # fmt: skip
    return specs


def cross_compile_specs(arch: str) -> list[dict]:
    """One spec per (config the dispatcher can pick on `arch`) x (representative feature variant).

    Each spec: name, fn, signature (arg -> Triton type string), constexprs, options (num_warps, ...).
    """
    specs = []
    constexpr_names = {attention_fwd_kernel.arg_names[i] for i in attention_fwd_kernel.constexprs}
    for block_d, config in all_configs(arch):
        for variant in _variants(arch):
            qk_dtype, pv_dtype = _dot_dtypes(arch, variant["q"], variant["kv"], variant["kv"])
            head_dim = block_d
            group = 4
            h_pack = group if config.pack_gqa else 1
            fp8_out = variant["out"] not in (torch.float16, torch.bfloat16, torch.float32)
            constexprs = dict(
                GROUP=group, H_PACK=h_pack, HEAD_CHUNKS=1, HEAD_DIM=head_dim, HEAD_DIM_V=head_dim,
                BLOCK_D=block_d, BLOCK_DV=block_d, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                PAGED=variant["paged"], HAS_SEQUSED=variant["paged"], USE_WINDOW=True,
                HAS_SOFTCAP=variant["features"], HAS_ALIBI=variant["features"], HAS_BIAS=variant["features"],
                HAS_SINK=variant["features"], HAS_Q_DESCALE=variant["q"] != torch.bfloat16,
                HAS_K_DESCALE=variant["kv"] != torch.bfloat16, HAS_V_DESCALE=variant["kv"] != torch.bfloat16,
                HAS_OUT_SCALE=fp8_out, RETURN_LSE=variant["features"],
                QK_DTYPE=_TORCH_TO_TL[qk_dtype], PV_DTYPE=_TORCH_TO_TL[pv_dtype],
                V_IS_FP8=variant["kv"] != torch.bfloat16,
                P_SCALE=p_scale(variant["kv"]) if variant["kv"] != torch.bfloat16 else 1.0,
                OUT_MAX=fp8_max(variant["out"]) if fp8_out else 0.0,
                DOT_PRECISION=dot_precision(arch, qk_dtype, pv_dtype), SPLIT_KV=variant["split"],
            )  # fmt: skip
            pointer_dtypes = {"q_ptr": variant["q"], "k_ptr": variant["kv"], "v_ptr": variant["kv"]}
            pointer_dtypes["out_ptr"] = variant["out"]
            signature = _signature(attention_fwd_kernel, constexpr_names, pointer_dtypes)
            tag = "paged" if variant["paged"] else "varlen"
            name = (
                f"attention_fwd[{arch} d{head_dim} m{config.block_m} n{config.block_n} "
                f"w{config.num_warps} s{config.num_stages}"
                f"{' packed' if config.pack_gqa else ''} q:{variant['q']} kv:{variant['kv']} {tag}"
                f"{' all-features' if variant['features'] else ''}{' split-kv' if variant['split'] else ''}]"
            ).replace("torch.", "")
            specs.append(
                dict(
                    name=name,
                    fn=attention_fwd_kernel,
                    signature=signature,
                    constexprs=constexprs,
                    options=config.launch_options(arch),
                )
            )
    return specs + _combine_specs(arch)
