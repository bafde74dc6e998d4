"""Where an illegal-address fault of one kernel call comes from (GPU): the call with one launch setting changed at a
time, each in its own process (a fault ends the CUDA context), the ptxas builds on the machine, the kernel's SASS,
and the faulting instruction from a CUDA core dump where cuda-gdb is installed.

    python kernel/scripts/fault_probe.py --out DIR [--only base,prefetch-off,...]

The case (H100, session 29: random combination 239 of seed 385944552, now tests/kernel/test_paged.py::
test_two_key_pages_alibi_and_a_wider_v): pages of 2 keys, D 80 / Dv 112, ALiBi, GQA 2:1, no causal mask, which
the portable prefill (8 warps, 128 x 64 tiles, block ids a step ahead) stopped the GPU on; compute-sanitizer
named no access. Session 29's run (H100): base faults; block ids in-step, 64-bit cache offsets, 1 stage, or the same
PTX through CUDA 13.0's ptxas (triton 3.6 bundles 12.8) run clean - a ptxas 12.8 miscompile. The launcher now plans
pages of fewer than 4 keys without the look-ahead ("planned").
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CASE = dict(seqlens_q=[63, 351], seqlens_k=[483, 351], num_heads=(2, 1), head_size=80, head_size_v=112,
            kv_layout="paged_kv_interleaved", block_size=2)  # fmt: skip
# name -> (make_inputs overrides, constexpr overrides of the prefill launch, launch option overrides). "base" is
# the faulting launch of session 29: block ids a step ahead (since then the launcher plans pages of 2 keys without
# them: "planned"); the others change one thing of it.
FAULT = {"PREFETCH_BLOCK_IDS": True}
VARIANTS = {
    "base": ({}, FAULT, {}),
    "planned": ({}, {}, {}),
    "k-rows": ({}, {**FAULT, "K_ROWS": True}, {}),
    "offsets-64": ({}, {**FAULT, "CACHE_OFFSETS_32": False}, {}),
    "stages-1": ({}, FAULT, {"num_stages": 1}),
    "no-alibi": ({"alibi": False}, FAULT, {}),
    "pages-4": ({"block_size": 4}, FAULT, {}),
    "dv-80": ({"head_size_v": 80}, FAULT, {}),
}


def run_one(name: str) -> None:
    """Child: the case with VARIANTS[name] applied to every prefill launch (BLOCK_M >= 64), checked against the
    reference; exits non-zero on a fault or a wrong result."""
    sys.path.insert(0, str(REPO / "tests" / "kernel"))
    import torch
    from attn_testing import TOLERANCES, check_against_reference, make_inputs

    from tritonfa.kernels import attention

    inputs_over, constexprs, options = VARIANTS[name]
    case = {**CASE, **{k: v for k, v in inputs_over.items() if k != "alibi"}}
    plan = attention.plan_attention

    def patched(*args, **kwargs):
        launches = plan(*args, **kwargs)
        return [
            dataclasses.replace(
                launch, constexprs={**launch.constexprs, **constexprs}, options={**launch.options, **options}
            )  # fmt: skip
            if launch.fn is attention.attention_fwd_kernel and launch.constexprs.get("BLOCK_M", 0) >= 64
            else launch
            for launch in launches
        ]

    attention.plan_attention = patched
    torch.manual_seed(0)
    inputs = make_inputs(**case)
    kwargs = dict(causal=False)
    if inputs_over.get("alibi", True):
        kwargs["alibi_slopes"] = (torch.rand(case["num_heads"][0], device="cuda") * 0.5).to(torch.float32)
    check_against_reference(inputs, *TOLERANCES[torch.bfloat16], **kwargs)
    torch.cuda.synchronize()
    print("ok")


def ptxas_builds() -> list[str]:
    import triton

    found = [os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")]
    patterns = ["/usr/local/cuda*/bin/ptxas", f"{sys.prefix}/lib/python3*/site-packages/nvidia/*/bin/ptxas",
                f"{sys.prefix}/lib/python3*/site-packages/nvidia/cu*/bin/ptxas"]  # fmt: skip
    for pattern in patterns:
        found += sorted(glob.glob(pattern))
    if shutil.which("ptxas"):
        found.append(shutil.which("ptxas"))
    return [p for i, p in enumerate(found) if os.path.isfile(p) and p not in found[:i]]


def version(ptxas: str) -> str:
    text = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    return text.strip().splitlines()[-1] if text.strip() else "?"


def child(name: str, out: Path, env_extra: dict, tag: str, core_dump: bool = False) -> dict:
    cache = Path(tempfile.mkdtemp(prefix=f"cache-{tag}-", dir=out))
    core = Path(tempfile.gettempdir()) / f"fault-probe-core-{tag}"  # GPU core dumps are large: not in --out
    env = dict(os.environ, TRITONFA_TEST_DEVICE="cuda", TRITONFA_PLAN_CACHE="0", TRITON_CACHE_DIR=str(cache),
               **env_extra)  # fmt: skip
    if core_dump:
        env.update(CUDA_ENABLE_COREDUMP_ON_EXCEPTION="1", CUDA_COREDUMP_FILE=str(core))
    env["PYTHONPATH"] = f"{REPO / 'kernel' / 'src'}:{env.get('PYTHONPATH', '')}"
    done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    (out / f"{tag}.log").write_text(done.stdout + done.stderr)
    tail = (done.stderr.strip().splitlines() or [""])[-1][:200]
    row = dict(variant=tag, ok=done.returncode == 0, error="" if done.returncode == 0 else tail)
    cubins = sorted(glob.glob(f"{cache}/**/attention_fwd_kernel.cubin", recursive=True))
    import triton

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for i, cubin in enumerate(cubins):
        sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True).stdout
        (out / f"{tag}-kernel{i}.sass").write_text(sass)
    cores = sorted(glob.glob(f"{core}*")) if core_dump else []
    if cores and shutil.which("cuda-gdb"):
        gdb = subprocess.run(["cuda-gdb", "-batch", "-ex", f"target cudacore {cores[0]}", "-ex", "info cuda kernels",
                              "-ex", "print $errorpc", "-ex", "x/4i $errorpc", "-ex", "x/4i $pc"],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        (out / f"{tag}-cuda-gdb.log").write_text(gdb.stdout + gdb.stderr)
        row["cuda_gdb"] = (gdb.stdout.strip().splitlines() or [""])[-6:]
    row["core_dumps"] = len(cores)
    shutil.rmtree(cache, ignore_errors=True)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="fault_probe")
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--core-dump", action="store_true", help="a CUDA core dump of each fault, read by cuda-gdb")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_one(args.child)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in [n for n in args.only.split(",") if n] or list(VARIANTS):
        rows.append(child(name, out, {}, name, args.core_dump))
        print(json.dumps(rows[-1]), flush=True)
    builds = ptxas_builds()
    print("ptxas builds:", [(b, version(b)) for b in builds], flush=True)
    for i, ptxas in enumerate(builds[1:]):  # the first is triton's own: the runs above
        rows.append(child("base", out, {"TRITON_PTXAS_PATH": ptxas}, f"base-ptxas{i + 1}", args.core_dump))
        rows[-1]["ptxas"] = f"{ptxas} ({version(ptxas)})"
        print(json.dumps(rows[-1]), flush=True)
    (out / "fault_probe.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
