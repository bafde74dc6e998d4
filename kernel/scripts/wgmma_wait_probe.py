"""Where ptxas puts the P@V wait in a minimal Gluon attention loop and in the product's prefill (sm_90, no GPU).

One warpgroup, one loop: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued async, wait for S (1 group left), softmax,
wait for the P@V (0 left). FA3's loop keeps the exponentials between the two waits (the softmax overlaps its own
warpgroup's P@V); the Gluon prefill's SASS has the second wait right after the first (PERF_NOTES, session 12).
This compiles the loop in a few shapes and prints each one's sequence of wgmma issues (HGMMA), waits
(WARPGROUP.DEPBAR) and exponentials (MUFU.EX2), so a shape that keeps the overlap can be found before the product
kernel is changed:

    .nox/crosscompile-triton-3-6-0/bin/python kernel/scripts/wgmma_wait_probe.py [--dump DIR]
    .nox/crosscompile-triton-3-6-0/bin/python kernel/scripts/wgmma_wait_probe.py --product [-k NAME_PART]

Shapes: `base` (the product kernel's order), `rescale-between` (O takes the previous block's factor between the two
issues, FA3's older order), `rescale-first` (before both issues), `p-in-smem` (P@V's A operand from shared memory),
`rescale-between-handover` (with a ping-pong hand-over - an mbarrier arrive - after the P@V issue, as the Gluon
prefill has), `handover-before-rescale` (the hand-over right after the QK issue). Session 16: `v-slot-loaded` (the
P@V's V slot offset by a zero read from global memory in the step: ptxas keeps the wait after the exponentials),
`k-wait` (an mbarrier wait before the QK, as every product step has), `k-wait-v-slot-loaded` (the load no longer
helps), `k-wait-sync-after-softmax` (a warp-wide no-op sync that needs l, before the P@V wait: what the product's
opt-in `ws_pv_wait_late` did until session 19 removed it, measured 18-23% slower on the H200 in session 17).

--product compiles the Hopper prefill's cross-compile specs (those whose name contains NAME_PART) and prints, for
each, the exponentials between each S wait (DEPBAR.LE 1) and the P@V wait after it: 0 = ptxas waits for the P@V
before the softmax.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import torch
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "ci"))
import crosscompile  # noqa: E402 - the repo's sm_90 cross-compile (Gluon kernels compiled from bound arguments)

SHAPES = {
    "base": 0,
    "rescale-between": 1,
    "rescale-first": 2,
    "p-in-smem": 3,
    "rescale-between-handover": 4,
    "handover-before-rescale": 5,
    "v-slot-loaded": 6,
    "k-wait": 7,
    "k-wait-v-slot-loaded": 8,
    "k-wait-sync-after-softmax": 9,
}


@gluon.jit
def _probe_loop(q_desc, k_desc, out_ptr, zero_ptr, n_blocks, SHAPE: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BN, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])  # fmt: skip
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BN, D], k_desc.layout)  # K and V share the tiles here
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BM, BN], q_desc.layout)
    s_zero = gl.zeros([BM, BN], gl.float32, s_layout)
    b_o = gl.zeros([BM, D], gl.float32, o_layout)
    m_i = gl.full([BM], -1e30, gl.float32, row_layout)
    l_i = gl.zeros([BM], gl.float32, row_layout)
    alpha_prev = gl.zeros([BM], gl.float32, row_layout)
    p = gl.zeros([BM, BN], gl.bfloat16, p_layout)
    turn = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())  # a ping-pong hand-over's barrier
    mbarrier.init(turn, count=1)
    k_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())  # SHAPE 7-9: K's arrival
    mbarrier.init(k_ready, count=1)
    for j in range(n_blocks):
        if SHAPE >= 7:
            mbarrier.wait(k_ready, j & 1)
        if SHAPE == 2:
            b_o = b_o * gl.expand_dims(gl.convert_layout(alpha_prev, gl.SliceLayout(1, o_layout)), 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(j % 2).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if SHAPE == 5:
            mbarrier.arrive(turn, count=1)
        if SHAPE == 1 or SHAPE == 4 or SHAPE == 5:
            b_o = b_o * gl.expand_dims(gl.convert_layout(alpha_prev, gl.SliceLayout(1, o_layout)), 1)
        if SHAPE == 6 or SHAPE == 8:
            zero = gl.load(zero_ptr)  # 0: a value ptxas cannot see, read in the step
            o_tok = warpgroup_mma(p, k_smem.index((1 - j % 2 + zero) % 2), b_o, is_async=True)
        elif SHAPE == 3:
            o_tok = warpgroup_mma(p_smem, k_smem.index(1 - j % 2), b_o, is_async=True)
        else:
            o_tok = warpgroup_mma(p, k_smem.index(1 - j % 2), b_o, is_async=True)
        if SHAPE == 4:
            mbarrier.arrive(turn, count=1)
        b_s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))
        m_new = gl.maximum(m_i, gl.max(b_s, 1))
        alpha = gl.exp2(m_i - m_new)
        b_p = gl.exp2(b_s - gl.expand_dims(m_new, 1))
        l_i = l_i * alpha + gl.sum(b_p, 1)
        m_i = m_new
        if SHAPE == 9:
            gl.inline_asm_elementwise(
                asm="{ .reg .pred p; setp.geu.f32 p, $1, 0f00000000; @p bar.warp.sync -1; mov.b32 $0, 0; }",
                constraints="=r,r", args=[l_i], dtype=gl.int32, is_pure=False, pack=1,
            )  # fmt: skip
        if SHAPE == 3:
            b_o = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok,))
            p_smem.store(b_p.to(gl.bfloat16))
            fence_async_shared()
        else:
            b_o, p = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p))
            p = gl.convert_layout(b_p.to(gl.bfloat16), p_layout)
        if SHAPE == 1 or SHAPE == 2 or SHAPE == 4 or SHAPE == 5:
            alpha_prev = alpha
        else:
            b_o = b_o * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)
    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (D // 8), D // 8], [num_warps, 1], [1, 0])
    b_out = b_o / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    b_out = gl.convert_layout(b_out, out_layout)
    o_row = gl.arange(0, BM, layout=gl.SliceLayout(1, out_layout))
    o_d = gl.arange(0, D, layout=gl.SliceLayout(0, out_layout))
    gl.store(out_ptr + gl.expand_dims(o_row, 1) * D + gl.expand_dims(o_d, 0), b_out)


def sequence(sass: str) -> str:
    """The kernel's HGMMA / DEPBAR / MUFU.EX2 instructions in order, runs counted: '16xHGMMA 2xDEPBAR 66xEX2'."""
    names = []
    for line in sass.splitlines():
        found = re.search(r"\b(HGMMA|WARPGROUP\.DEPBAR|MUFU\.EX2)\b", line)
        if found:
            names.append({"HGMMA": "HGMMA", "WARPGROUP.DEPBAR": "DEPBAR", "MUFU.EX2": "EX2"}[found.group(1)])
    runs: list[list] = []
    for name in names:
        if runs and runs[-1][1] == name:
            runs[-1][0] += 1
        else:
            runs.append([1, name])
    return " ".join(f"{count}x{name}" for count, name in runs)


def exps_between_waits(sass: str) -> list[int]:
    """For each S wait (WARPGROUP.DEPBAR.LE gsb0, 0x1) in order: the exponentials before the next wait."""
    counts: list[int] = []
    open_wait = False
    for line in sass.splitlines():
        if re.search(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x1\b", line):
            counts.append(0)
            open_wait = True
        elif "WARPGROUP.DEPBAR" in line:
            open_wait = False
        elif open_wait and "MUFU.EX2" in line:
            counts[-1] += 1
    return counts


def cuda_sass(compiled) -> str:
    """cuobjdump's SASS of a compiled kernel (the cuobjdump that ships in the triton wheel)."""
    import tempfile

    import triton

    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        return subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", path], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip


def product_waits(name_part: str) -> dict[str, list[int]]:
    """exps_between_waits of every Gluon prefill spec of the cross-compile (`cross_compile_specs("hopper")`'s) whose
    name contains name_part (only those are built: the portable kernels' specs need Triton out of interpreter mode)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
    from tritonfa.kernels import _hopper_prefill_specs

    found = {}
    for spec in _hopper_prefill_specs():
        if name_part in spec["name"]:
            compiled = crosscompile._compile_bound(spec, GPUTarget("cuda", 90, 32))
            found[spec["name"]] = exps_between_waits(cuda_sass(compiled))
    return found


def compile_shape(name: str):
    """The probe loop in one of SHAPES, compiled for sm_90."""
    rows = torch.empty((1024, 128), dtype=torch.bfloat16, device="meta")
    q_desc = TensorDescriptor(rows, [1024, 128], [128, 1], [64, 128],
                              gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16))  # fmt: skip
    k_desc = TensorDescriptor(rows, [1024, 128], [128, 1], [128, 128],
                              gl.NVMMASharedLayout.get_default_for([128, 128], gl.bfloat16))  # fmt: skip
    out = torch.empty((64, 128), dtype=torch.float32, device="meta")
    zero = torch.zeros((1,), dtype=torch.int32, device="meta")
    spec = dict(name=name, fn=_probe_loop, bound_args=(q_desc, k_desc, out, zero, 8),
                constexprs=dict(SHAPE=SHAPES[name]), options={"num_warps": 4}, gluon=True)  # fmt: skip
    return crosscompile._compile_bound(spec, GPUTarget("cuda", 90, 32))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dump", help="write each shape's PTX and SASS under this folder")
    parser.add_argument("--product", action="store_true", help="the product's Hopper prefill specs instead")
    parser.add_argument("-k", default="attention_fwd_hopper_kernel", help="with --product: specs whose name has this")
    args = parser.parse_args(argv)
    if args.product:
        for name, counts in product_waits(args.k).items():
            print(f"{' '.join(map(str, counts)):16} {name}")
        return 0
    for name in SHAPES:
        compiled = compile_shape(name)
        sass = cuda_sass(compiled)
        if args.dump:
            folder = os.path.join(args.dump, f"wgmma-wait-{name}")
            os.makedirs(folder, exist_ok=True)
            for suffix, text in (("ptx", compiled.asm["ptx"]), ("sass", sass)):
                with open(os.path.join(folder, f"k.{suffix}"), "w") as f:
                    f.write(text)
        print(f"{name:16} {sequence(sass)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
