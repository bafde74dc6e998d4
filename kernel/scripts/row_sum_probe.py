"""GPU probe for `ws_fp8_row_sum_mma` (fp8 P's row sums from P @ ones on the tensor cores), in two parts:

1. The wgmma alone: a standalone Gluon kernel (one warpgroup) computes A @ ones for a random [64, K] e4m3 A held in
   registers as the prefill holds P, with the ones an [N, K] e4m3 tile in shared memory (128-byte swizzle, K-major,
   as the prefill's), N = 8 and 16, alone and right after an A @ V wgmma from the same registers (the prefill's
   order). Every column must equal A's row sums exactly (sums of e4m3 values, fp32 accumulation, K <= 128).
   Then which keys each variant reads (`which_keys`: row r of A has 1 at key r and 2 at key r + 64).
2. The prefill: its output with the option over its output without it, per query row, for fp8 q/k/v non-causal on
   the flat grid. A wrong l shows as a per-row ratio far from 1 that is constant along D (rows scaled by
   l_true / l); with q = 0 every P is equal, so the ratio is the same in every row. Within fp8 P's rounding: 1 +- 1%.

    python kernel/scripts/row_sum_probe.py        # on a Hopper GPU
"""

import json
import os

import torch

import tritonfa
from tritonfa.kernels import attention_hopper

if attention_hopper.HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    @gluon.jit
    def ones_mma_kernel(a_ptr, out_ptr, N: gl.constexpr, K: gl.constexpr, WITH_PV: gl.constexpr):
        # a: [64, K] e4m3 row-major; out: [64, N] fp32 = a @ ones [K, N] (WITH_PV: issued after a @ ones [K, 64])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32]
        )
        pv_layout: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 32]
        )
        blocked: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
        rows = gl.arange(0, 64, layout=gl.SliceLayout(1, blocked))
        cols = gl.arange(0, K, layout=gl.SliceLayout(0, blocked))
        b_a = gl.load(a_ptr + gl.expand_dims(rows, 1) * K + gl.expand_dims(cols, 0))  # [64, K]
        swizzled: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        ones_smem = gl.allocate_shared_memory(gl.float8e4nv, [N, K], swizzled)
        ones_smem.store(gl.full([N, K], 1.0, gl.float32, blocked).to(gl.float8e4nv))
        v_smem = gl.allocate_shared_memory(gl.float8e4nv, [64, K], swizzled)  # V key-major: [D, K]
        v_smem.store(gl.full([64, K], 1.0, gl.float32, blocked).to(gl.float8e4nv))
        fence_async_shared()
        attention_hopper._thread_barrier()
        acc = gl.zeros([64, N], gl.float32, acc_layout)
        if WITH_PV:
            a_pv = gl.convert_layout(b_a, gl.DotOperandLayout(operand_index=0, parent=pv_layout, k_width=4))
            pv_tok = warpgroup_mma(a_pv, v_smem.permute((1, 0)), gl.zeros([64, 64], gl.float32, pv_layout),
                                   use_acc=False, is_async=True)  # fmt: skip
            a_l = gl.convert_layout(a_pv, gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=4))
            l_tok = warpgroup_mma(a_l, ones_smem.permute((1, 0)), acc, use_acc=False, is_async=True)
            b_pv, acc = warpgroup_mma_wait(num_outstanding=0, deps=(pv_tok, l_tok))
        else:
            a_l = gl.convert_layout(b_a, gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=4))
            l_tok = warpgroup_mma(a_l, ones_smem.permute((1, 0)), acc, use_acc=False, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(l_tok,))
        o_rows = gl.arange(0, 64, layout=gl.SliceLayout(1, acc_layout))
        o_cols = gl.arange(0, N, layout=gl.SliceLayout(0, acc_layout))
        gl.store(out_ptr + gl.expand_dims(o_rows, 1) * N + gl.expand_dims(o_cols, 0), acc)


def wgmma_alone() -> None:
    gen = torch.Generator(device="cuda").manual_seed(2)
    key_len = 128
    a = (torch.rand(64, key_len, device="cuda", generator=gen) * 8).to(torch.float8_e4m3fn)  # [64, K]
    want = a.float().sum(dim=1)  # [64]
    for cols in (8, 16):
        for with_pv in (False, True):
            out = torch.full((64, cols), float("nan"), device="cuda")
            ones_mma_kernel[(1,)](a, out, cols, key_len, with_pv, num_warps=4)
            ratio = out / want[:, None]
            print(
                f"A @ ones, N {cols}, after A @ V {with_pv}: exact {torch.equal(out, want[:, None].expand_as(out))}, "
                f"out / row sum {ratio.min().item():.4f}..{ratio.max().item():.4f}"
            )


def which_keys() -> None:
    """Which keys each A @ ones reads: row r of A holds 1 at key r and 2 at key r + 64 (K = 128), zeros elsewhere,
    so a row's output is 3 when the wgmma reads both keys, 1 or 2 when it reads only one, 0 when neither; anything
    else is another row's or uninitialized data."""
    key_len = 128
    a = torch.zeros(64, key_len, device="cuda")
    rows = torch.arange(64, device="cuda")
    a[rows, rows] = 1.0
    a[rows, rows + 64] = 2.0
    a = a.to(torch.float8_e4m3fn)
    names = {3.0: "both", 1.0: "low key only", 2.0: "high key only", 0.0: "neither"}
    for cols in (8, 16):
        for with_pv in (False, True):
            out = torch.full((64, cols), float("nan"), device="cuda")
            ones_mma_kernel[(1,)](a, out, cols, key_len, with_pv, num_warps=4)
            first = out[:, 0].tolist()
            summary = {}
            for r, value in enumerate(first):
                summary.setdefault(names.get(value, "other"), []).append(r)
            spread = (out.max(dim=1).values - out.min(dim=1).values).max().item()
            print(f"keys read, N {cols}, after A @ V {with_pv}: "
                  + "; ".join(f"{k}: rows {v[:8]}{'...' if len(v) > 8 else ''} ({len(v)})" for k, v in summary.items())
                  + f"; max spread across columns {spread:.3g}")  # fmt: skip


def prefill(seq_len: int, head_size: int, zero_q: bool, hopper: dict) -> torch.Tensor:
    os.environ["TRITONFA_CONFIG"] = json.dumps({"hopper": hopper})
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(seq_len, 8, head_size, device="cuda", generator=gen)  # [T, HQ, D]
    k = torch.randn(seq_len, 2, head_size, device="cuda", generator=gen)  # [T, HKV, D]
    v = torch.randn(seq_len, 2, head_size, device="cuda", generator=gen)
    if zero_q:
        q = q * 0
    cu = torch.tensor([0, seq_len], device="cuda", dtype=torch.int32)
    fp8 = torch.float8_e4m3fn
    out = tritonfa.flash_attn_varlen_func(
        q.to(fp8), k.to(fp8), v.to(fp8), max_seqlen_q=seq_len, cu_seqlens_q=cu, max_seqlen_k=seq_len,
        cu_seqlens_k=cu, softmax_scale=head_size**-0.5, causal=False,
    )  # fmt: skip
    return out.float()


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    wgmma_alone()
    which_keys()
    for head_size in (64, 128):
        for seq_len in (128, 256, 300):
            for zero_q in (True, False):
                flat = {"ws_persistent": False}
                ratio = prefill(seq_len, head_size, zero_q, {"ws_fp8_row_sum_mma": True, **flat})
                ratio = (ratio / prefill(seq_len, head_size, zero_q, flat))[:, 0, :]  # head 0: [T, D]
                per_row = ratio.median(dim=1).values
                spread = (ratio.max(dim=1).values - ratio.min(dim=1).values)[:4]
                print(
                    f"D {head_size} keys {seq_len} q=0 {zero_q}: row ratio rows 0-3 "
                    f"{[round(x, 3) for x in per_row[:4].tolist()]}, all rows {per_row.min().item():.3f}.."
                    f"{per_row.max().item():.3f}, spread along D {[round(x, 4) for x in spread.tolist()]}"
                )


if __name__ == "__main__":
    main()
