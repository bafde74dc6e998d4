"""Small kernels in the shape of `tritonfa.kernels.cross_compile_specs`, for testing ci/crosscompile.py alone.

Not collected by pytest (no `test_` prefix); imported by tests/ci/test_crosscompile.py in a subprocess and
in-process. Must be imported without TRITON_INTERPRET, or @triton.jit gives an interpreter function.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl


@triton.jit
def _tile_attention(
    Q,
    K,
    V,
    Out,
    seqlen,
    stride_m,
    sm_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    # one query tile against all keys: the same dot/softmax/dot structure as the real kernel, much smaller
    i_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o_d = tl.arange(0, HEAD_DIM)
    m_m = i_m < seqlen
    b_q = tl.load(Q + i_m[:, None].to(tl.int64) * stride_m + o_d[None, :], mask=m_m[:, None], other=0.0)
    b_m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    b_l = tl.zeros([BLOCK_M], tl.float32)
    b_acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start in range(0, seqlen, BLOCK_N):
        i_n = start + tl.arange(0, BLOCK_N)
        m_n = i_n < seqlen
        o_kv = i_n[:, None].to(tl.int64) * stride_m + o_d[None, :]
        b_k = tl.load(K + o_kv, mask=m_n[:, None], other=0.0)
        b_v = tl.load(V + o_kv, mask=m_n[:, None], other=0.0)
        b_s = tl.dot(b_q, tl.trans(b_k)) * sm_scale  # [BM, BN]
        b_s = tl.where(m_n[None, :], b_s, float("-inf"))
        b_m_new = tl.maximum(b_m, tl.max(b_s, 1))
        b_p = tl.exp(b_s - b_m_new[:, None])
        alpha = tl.exp(b_m - b_m_new)
        b_l = b_l * alpha + tl.sum(b_p, 1)
        b_acc = b_acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v)
        b_m = b_m_new
    b_o = b_acc / b_l[:, None]
    tl.store(Out + i_m[:, None].to(tl.int64) * stride_m + o_d[None, :], b_o.to(Out.dtype.element_ty), mask=m_m[:, None])


@triton.jit
def _broken(X, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    a = tl.load(X + i, mask=i < N)
    b = tl.reshape(a, (BLOCK // 16, 16))
    tl.store(X + i, tl.dot(b, b), mask=i < N)  # a [16, 16] tile through [256] pointers: no broadcast


SIGNATURE = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "Out": "*bf16", "seqlen": "i32", "stride_m": "i32",
             "sm_scale": "fp32"}  # fmt: skip


def cross_compile_specs(arch: str) -> list[dict[str, Any]]:
    amd = arch in ("cdna3", "cdna4")  # called with tritonfa.configs' architecture families
    specs = []
    for bm, bn, warps, stages in [(64, 32, 4, 1 if amd else 2), (128, 64, 8, 2 if amd else 3)]:
        options: dict[str, Any] = {"num_warps": warps, "num_stages": stages}
        if amd:
            options["waves_per_eu"] = 2
        specs.append(
            {
                "name": f"tile_attention_m{bm}_n{bn}_w{warps}",
                "fn": _tile_attention,
                "signature": dict(SIGNATURE),  # constexprs omitted on purpose: the script fills them in
                "constexprs": {"BLOCK_M": bm, "BLOCK_N": bn, "HEAD_DIM": 64},
                "options": options,
            }
        )
    return specs


def broken_specs(arch: str) -> list[dict[str, Any]]:
    return cross_compile_specs(arch)[:1] + [
        {
            "name": "broken",
            "fn": _broken,
            "signature": {"X": "*fp16", "N": "i32", "BLOCK": "constexpr"},
            "constexprs": {"BLOCK": 256},
            "options": {"num_warps": 4},
        }
    ]


def bad_signature_specs(arch: str) -> list[dict[str, Any]]:
    spec = cross_compile_specs(arch)[0]
    del spec["signature"]["sm_scale"]
    return [spec]


def empty_specs(arch: str) -> list[dict[str, Any]]:
    return []
