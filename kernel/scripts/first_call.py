"""Where a workload's first call goes (issue 11: a new config's first call compiles in <= 5 s).

Each workload runs in a fresh process with an empty Triton cache (`TRITON_CACHE_DIR` in a temporary folder). A tiny
unrelated Triton kernel runs first, so Triton's own one-time build (its CUDA utilities, compiled from C) is not
counted: what is timed is a new config's first call in a process that has used Triton before (--cold: without that,
as a user's very first call after installing). The first call is split by timers wrapped around Triton's compile
(`triton.compiler.compile`), each of its backend stages (TTIR/TTGIR passes, LLVM IR, PTX, ptxas; through Triton's
`add_stages_inspection_hook`; the front end is compile's time outside them) and its C launcher builds (one per new
kernel signature, with the host's C compiler), and everything else (planning, allocation, the launch itself); then a
second call of the same shape (no compilation: should be milliseconds). (cProfile attributed no time to
`triton.compile` on the H200 host's Python 3.12, session 18: timers do not depend on the profiler.)

    python kernel/scripts/first_call.py [--only prefill-b8x2048-causal,fp8kv-prefill] [--out DIR] [--cold]

GPU only. One line per workload, and `first_call.json` in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import triton
import triton.language as tl

# Triton's stage names (the backend's `stages` dict) -> the names printed
STAGES = {
    "ttir": "TTIR",
    "ttgir": "TTGIR",
    "llir": "LLVM IR",
    "ptx": "PTX",
    "cubin": "ptxas",
}


def instrument() -> dict[str, float]:
    """Wrap Triton's compile, its backend stages and its C launcher builds in timers; returns the seconds per part,
    filled as kernels compile in this process."""
    import collections

    import triton.backends.nvidia.driver as nvidia_driver
    import triton.compiler

    seconds: dict[str, float] = collections.defaultdict(float)

    def timed(part: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds[part] += time.perf_counter() - start

        return wrapper

    # JITFunction binds `triton.compiler.compile` when a kernel first runs, so this must precede every first call
    triton.compiler.compile = timed("triton.compile", triton.compiler.compile)
    for builder in ("compile_module_from_src", "compile_module_from_file"):  # triton 3.6, later releases
        if hasattr(nvidia_driver, builder):
            setattr(nvidia_driver, builder, timed("C launcher", getattr(nvidia_driver, builder)))

    def wrap_stages(backend=None, stages=None, options=None, language=None, capability=None):
        if backend is None:  # later releases also ask the hook for a cache-key suffix: none (timing changes no code)
            return "", ""
        for name in list(stages):
            stages[name] = timed(STAGES.get(name, name), stages[name])

    triton.knobs.runtime.add_stages_inspection_hook = wrap_stages
    return seconds


@triton.jit
def _add_one(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) + 1)


def warm_triton(device) -> None:
    """Triton's one-time setup (its CUDA utilities module, built from C on first use) through an unrelated kernel."""
    import torch

    x = torch.zeros(1, device=device)
    _add_one[(1,)](x)
    torch.cuda.synchronize()


def measure(name: str, cold: bool) -> dict:
    """In this (fresh) process: the first and second call of workload `name`, the first one's parts timed."""
    import torch

    from tritonfa.bench.cases import make_case
    from tritonfa.bench.peers import prepare
    from tritonfa.bench.workloads import WORKLOADS

    workload = next(w for w in WORKLOADS if w.name == name)
    device = torch.device("cuda")
    torch.zeros(1, device=device)  # the CUDA context first: not part of any kernel's first call
    seconds = instrument()
    if not cold:
        warm_triton(device)
        seconds.clear()
    prepared = prepare("tritonfa", make_case(workload, device))
    start = time.perf_counter()
    prepared.run()
    torch.cuda.synchronize()
    first = time.perf_counter() - start
    start = time.perf_counter()
    prepared.run()
    torch.cuda.synchronize()
    second = time.perf_counter() - start
    backend = sum(seconds.get(stage, 0.0) for stage in STAGES.values())
    stages = {"front end": max(seconds.get("triton.compile", 0.0) - backend, 0.0)}
    stages.update({stage: seconds.get(stage, 0.0) for stage in STAGES.values()})
    stages.update({part: seconds.get(part, 0.0) for part in ("triton.compile", "C launcher")})
    return dict(workload=name, cold=cold, first_s=first, second_s=second, stages_s=stages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="prefill-b8x2048-causal,fp8kv-prefill-b8x2048-causal,decode-b64x2048-paged")
    parser.add_argument("--out", default=".")
    parser.add_argument("--cold", action="store_true", help="count Triton's one-time setup too")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(args.worker, args.cold)))
        return 0
    rows = []
    for name in (n for n in args.only.split(",") if n):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TRITON_CACHE_DIR": cache}
            command = [sys.executable, __file__, "--worker", name, *(["--cold"] if args.cold else [])]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: failed\n{done.stderr[-2000:]}")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        stages = row["stages_s"]
        parts = " ".join(f"{k} {v:.2f}" for k, v in stages.items() if k not in ("triton.compile", "C launcher"))
        other = row["first_s"] - stages["triton.compile"] - stages["C launcher"]
        print(
            f"{name:<40} first {row['first_s']:.2f} s (triton.compile {stages['triton.compile']:.2f}: {parts}; "
            f"C launcher {stages['C launcher']:.2f}; other {other:.2f}) second {row['second_s'] * 1e3:.1f} ms",
            flush=True,
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_call.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
