"""`python -m tritonfa.bench`: the side-by-side benchmark's command line (see the package docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import sys
import time
from pathlib import Path

import torch

from .cases import TOLERANCE_16BIT, make_case, reference_check
from .peers import DEFAULT_GPU_PEERS, PEERS, prepare
from .report import collect_header, print_summary, print_table, write_json, write_png
from .runner import log, run_workloads
from .timing import FULL_REPS, QUICK_REPS, measure_ceilings, triton_startup_s
from .workloads import WORKLOADS, Workload, select, smoke_scaled


def smoke_check() -> tuple[bool, list[str]]:
    """Two short bf16 sequences (one with cached context), contiguous and paged KV, in Triton's interpreter (with
    tritonfa.interpreter_fixes applied); True if both match the reference."""
    from ..interpreter_fixes import patch_triton_interpreter

    patch_triton_interpreter()
    workload = Workload("smoke", "prefill", seqlens_q=(37, 20), seqlens_k=(37, 83), num_q_heads=4, num_kv_heads=2,
                        head_dim=64)  # fmt: skip
    lines, passed = [], True
    for paged in (False, True):
        w = dataclasses.replace(workload, paged=paged)
        case = make_case(w, torch.device("cpu"), seed=0)
        error = reference_check(case).error(prepare("tritonfa", case).run())
        ok = math.isfinite(error) and error <= TOLERANCE_16BIT
        passed &= ok
        lines.append(
            f"{w.describe()}: rel. L2 error {error:.2e} ({'ok' if ok else 'FAILED'}, tolerance {TOLERANCE_16BIT})"
        )
    return passed, lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tritonfa.bench",
        description="Time tritonfa against SDPA (flash, cuDNN), FlexAttention, FA3 and vLLM's unified_attention.",
    )
    parser.add_argument("--only", action="append", default=[], metavar="SUBSTR",
                        help="run workloads whose name contains SUBSTR (repeatable, or comma-separated)")  # fmt: skip
    parser.add_argument("--peers", default=None,
                        help=f"comma-separated peers from {','.join(PEERS)} (default on a GPU: "
                             f"{','.join(DEFAULT_GPU_PEERS)}; 'none' for tritonfa alone)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: a shorter, noisier run")
    parser.add_argument("--json", type=Path, help="write every number to this JSON file")
    parser.add_argument("--png", type=Path, help="write a bar chart to this PNG file")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="every workload at a tiny scale (CPU: in Triton's interpreter), to test the plumbing",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    return parser.parse_args(argv)


def _reexec_with_interpreter() -> None:
    """Kernels are decorated when tritonfa is imported (already done by `-m tritonfa.bench`), so the interpreter
    must be switched on in the environment of a fresh process; CUDA is hidden so vLLM's Triton code runs there too."""
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "tritonfa.bench", *sys.argv[1:]], env)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    only = [part for item in args.only for part in item.split(",") if part]
    if args.list:
        for workload in select(WORKLOADS, only):
            print(f"{workload.name:<32} {workload.describe()}")
        return 0

    use_gpu = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        log("--device cuda: torch sees no CUDA device")
        return 2
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    if use_gpu and interpreter:
        log("TRITON_INTERPRET=1 is set: unset it to time kernels on the GPU")
        return 2
    if not use_gpu and not interpreter:
        _reexec_with_interpreter()

    device = torch.device("cuda" if use_gpu else "cpu")
    if not use_gpu and not args.dry_run:
        log("No GPU (none visible, or --device cpu): no timings. Running the interpreter smoke check instead.")
        passed, lines = smoke_check()
        for line in lines:
            print(line)
        print("smoke check passed" if passed else "smoke check FAILED: the kernel disagrees with the reference")
        return 0 if passed else 1

    workloads = select(WORKLOADS, only)
    if not workloads:
        log(f"no workload matches --only {only}; see --list")
        return 2
    if args.dry_run:
        workloads = [smoke_scaled(w) for w in workloads]
    if args.peers is None:
        peers = list(DEFAULT_GPU_PEERS) if use_gpu and not args.dry_run else list(PEERS)
    else:
        peers = [p for p in args.peers.split(",") if p and p not in ("none", "tritonfa")]
    unknown = set(peers) - set(PEERS)
    if unknown:
        log(f"unknown peers {sorted(unknown)}; known: {', '.join(PEERS)}")
        return 2
    reps = QUICK_REPS if args.quick else FULL_REPS
    mode = ("dry run (tiny shapes)" if args.dry_run else "full") + (", quick" if args.quick else "")
    header = collect_header(device, mode)
    log(f"tritonfa bench on {header['device']}: {len(workloads)} workloads x {1 + len(peers)} impls ({mode})")
    if not use_gpu:
        log("No GPU: dry run in Triton's interpreter; timings are not performance numbers.")

    if use_gpu and "flex" in peers:
        # inductor sizes its compile pool when its config is imported; importing vLLM first would pin it to 1 thread
        # (vllm.env_override sets TORCHINDUCTOR_COMPILE_THREADS=1) and slow every FlexAttention compile
        importlib.import_module("torch._inductor.config")

    started = time.perf_counter()
    log("ceilings: copy bandwidth, bf16 matmul, fp8 _scaled_mm")
    ceilings = measure_ceilings(device, reps)
    if use_gpu:
        header["triton_startup_s"] = round(triton_startup_s(device), 2)
        log(f"Triton's one-time start-up: {header['triton_startup_s']} s (not in any workload's first call)")
    rows = run_workloads(workloads, ["tritonfa", *peers], device, reps, interpreter=not use_gpu, seed=args.seed)
    header["elapsed_s"] = round(time.perf_counter() - started, 1)

    print_table(header, ceilings, workloads, rows)
    print()
    print_summary(workloads, rows)
    print(f"elapsed {header['elapsed_s']} s")
    if args.json:
        write_json(args.json, header, ceilings, workloads, rows)
        log(f"wrote {args.json}")
    if args.png:
        if write_png(args.png, header, ceilings, workloads, rows):
            log(f"wrote {args.png}")
        else:
            log("matplotlib is not installed: no PNG")
    bad = [r for r in rows if r.impl == "tritonfa" and not r.ok]
    if bad:
        log("tritonfa failed on: " + ", ".join(f"{r.workload} ({r.status} {r.reason})".strip() for r in bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
