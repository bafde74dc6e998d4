"""Where ptxas puts the P@V wait in a minimal Gluon attention loop (sm_90, no GPU needed).

One warpgroup, one loop: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued async, wait for S (1 group left), softmax,
wait for the P@V (0 left). FA3's loop keeps the exponentials between the two waits (the softmax overlaps its own
warpgroup's P@V); the Gluon prefill's SASS has the second wait right after the first (PERF_NOTES, session 12).
This compiles the loop in a few shapes and prints each one's sequence of wgmma issues (HGMMA), waits
(WARPGROUP.DEPBAR) and exponentials (MUFU.EX2), so a shape that keeps the overlap can be found before the product
kernel is changed:

    .nox/crosscompile-triton-3-6-0/bin/python kernel/scripts/wgmma_wait_probe.py [--dump DIR]

Shapes: `base` (the product kernel's order), `rescale-between` (O takes the previous block's factor between the two
issues, FA3's older order), `rescale-first` (before both issues), `p-in-smem` (P@V's A operand from shared memory),
`rescale-between-handover` (with a ping-pong hand-over - an mbarrier arrive - after the P@V issue, as the Gluon
prefill has), `handover-before-rescale` (the hand-over right after the QK issue).
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
}


@gluon.jit
def _probe_loop(q_desc, k_desc, out_ptr, n_blocks, SHAPE: gl.constexpr, num_warps: gl.constexpr):
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
    for j in range(n_blocks):
        if SHAPE == 2:
            b_o = b_o * gl.expand_dims(gl.convert_layout(alpha_prev, gl.SliceLayout(1, o_layout)), 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(j % 2).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if SHAPE == 5:
            mbarrier.arrive(turn, count=1)
        if SHAPE == 1 or SHAPE == 4 or SHAPE == 5:
            b_o = b_o * gl.expand_dims(gl.convert_layout(alpha_prev, gl.SliceLayout(1, o_layout)), 1)
        if SHAPE == 3:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dump", help="write each shape's PTX and SASS under this folder")
    args = parser.parse_args(argv)
    import triton

    rows = torch.empty((1024, 128), dtype=torch.bfloat16, device="meta")
    q_desc = TensorDescriptor(rows, [1024, 128], [128, 1], [64, 128],
                              gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16))  # fmt: skip
    k_desc = TensorDescriptor(rows, [1024, 128], [128, 1], [128, 128],
                              gl.NVMMASharedLayout.get_default_for([128, 128], gl.bfloat16))  # fmt: skip
    out = torch.empty((64, 128), dtype=torch.float32, device="meta")
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    for name, shape in SHAPES.items():
        spec = dict(name=name, fn=_probe_loop, bound_args=(q_desc, k_desc, out, 8), constexprs=dict(SHAPE=shape),
                    options={"num_warps": 4}, gluon=True)  # fmt: skip
        compiled = crosscompile._compile_bound(spec, GPUTarget("cuda", 90, 32))
        folder = os.path.join(args.dump or "/tmp", f"wgmma-wait-{name}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "k.cubin"), "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", os.path.join(folder, "k.cubin")],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
        if args.dump:
            with open(os.path.join(folder, "k.ptx"), "w") as f:
                f.write(compiled.asm["ptx"])
            with open(os.path.join(folder, "k.sass"), "w") as f:
                f.write(sass)
        print(f"{name:16} {sequence(sass)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
