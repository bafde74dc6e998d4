"""Where a workload's first call goes (issue 11: a new config's first call compiles in <= 5 s).

Each workload runs in a fresh process with an empty Triton cache (`TRITON_CACHE_DIR` in a temporary folder). A tiny
unrelated Triton kernel runs first, so Triton's own one-time build (its CUDA utilities, compiled from C) is not
counted: what is timed is a new config's first call in a process that has used Triton before (--cold: without that,
as a user's very first call after installing). The first call is split by timers wrapped around Triton's compile
(`triton.compiler.compile`), each of its backend stages (TTIR/TTGIR passes, LLVM IR, PTX, ptxas; through Triton's
`add_stages_inspection_hook`; the front end is compile's time outside them) and its C launcher builds (one per new
kernel signature, with the host's C compiler), and everything else (planning, allocation, the launch itself); then a
second call of the same shape (no compilation: should be milliseconds). Where a call has several new kernels they
compile side by side (tritonfa.kernels.launch.compile_ahead): the parts then add up to more than the first call's
wall time, and "other" reads negative (each kernel's compile is then listed under the row on the call's timeline:
its start, its end and its own stages, so the kernel the call waited for shows); TRITONFA_COMPILE_AHEAD=0 gives the
one-after-the-other split. (cProfile attributed no time to `triton.compile` on the H200 host's Python 3.12,
session 18: timers do not depend on the profiler.)

    python kernel/scripts/first_call.py [--only prefill-b8x2048-causal,^mixed] [--out DIR] [--cold]
    python kernel/scripts/first_call.py --cross-compile [--side-by-side] [--only ...] [--out DIR]

One line per workload, and `first_call.json` in --out. GPU, except --cross-compile: no GPU needed (CI's machine),
the launches the first call plans on an H200 (132 SMs, the default config; meta tensors of the workload's shapes)
are compiled for sm_90 here, each stage timed, with ci/crosscompile.py's compile (triton ships ptxas): the
compilation part of a first call, on this machine's CPU (the H200 host's stage times were about this 2-core
machine's, sessions 18/19), without the C launcher build (it needs the CUDA driver) or the launch.
--side-by-side compiles them one thread per kernel variant as tritonfa's compile_ahead does on a GPU (wall time
in `wall_s`; the per-kernel seconds then overlap).
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

# Triton's stage names (the backend's `stages` dict) -> the names printed
STAGES = {
    "ttir": "TTIR",
    "ttgir": "TTGIR",
    "llir": "LLVM IR",
    "ptx": "PTX",
    "cubin": "ptxas",
}


def with_front_end(compile_s: float, stages: dict[str, float]) -> dict[str, float]:
    """The backend stages' seconds with the front end first: the compile's time outside them."""
    return {"front end": max(compile_s - sum(stages.values()), 0.0), **stages}


def instrument(compiles: list | None = None) -> dict[str, float]:
    """Wrap Triton's compile, its backend stages and its C launcher builds in timers; returns the seconds per part,
    filled as kernels compile in this process. With `compiles`, each compile also appends one entry to it: the
    kernel's name, when it started and ended (perf_counter) and its own stages (kernels that compile side by side
    overlap: the entries show which one the call waited for)."""
    import collections
    import threading

    import triton.backends.nvidia.driver as nvidia_driver
    import triton.compiler

    seconds: dict[str, float] = collections.defaultdict(float)
    current = threading.local()  # the compile entry of this thread (compile_ahead compiles on several)

    def timed(part: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                seconds[part] += spent
                entry = getattr(current, "entry", None)
                if entry is not None and part != "triton.compile":
                    entry["stages_s"][part] = entry["stages_s"].get(part, 0.0) + spent

        return wrapper

    def timed_compile(fn):
        def wrapper(src, *args, **kwargs):
            kernel = getattr(getattr(src, "fn", None), "__name__", None) or getattr(src, "name", "?")
            current.entry = entry = dict(kernel=kernel, start=time.perf_counter(), stages_s={})
            try:
                return fn(src, *args, **kwargs)
            finally:
                entry["end"] = time.perf_counter()
                compiles.append(entry)
                current.entry = None

        return wrapper

    # JITFunction binds `triton.compiler.compile` when a kernel first runs, so this must precede every first call
    compile_fn = triton.compiler.compile if compiles is None else timed_compile(triton.compiler.compile)
    triton.compiler.compile = timed("triton.compile", compile_fn)
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


def measure(name: str, cold: bool) -> dict:
    """In this (fresh) process: the first and second call of workload `name`, the first one's parts timed."""
    import torch

    from tritonfa.bench.cases import make_case
    from tritonfa.bench.peers import prepare
    from tritonfa.bench.timing import triton_startup_s
    from tritonfa.bench.workloads import WORKLOADS

    workload = next(w for w in WORKLOADS if w.name == name)
    device = torch.device("cuda")
    torch.zeros(1, device=device)  # the CUDA context first: not part of any kernel's first call
    compiles: list[dict] = []
    seconds = instrument(compiles)
    if not cold:  # Triton's one-time start-up through a trivial kernel, as the bench does: not a config's first call
        triton_startup_s(device)
        seconds.clear()
        compiles.clear()
    prepared = prepare("tritonfa", make_case(workload, device))
    call_start = time.perf_counter()
    prepared.run()
    torch.cuda.synchronize()
    first = time.perf_counter() - call_start
    start = time.perf_counter()
    prepared.run()
    torch.cuda.synchronize()
    second = time.perf_counter() - start
    stages = with_front_end(
        seconds.get("triton.compile", 0.0), {stage: seconds.get(stage, 0.0) for stage in STAGES.values()}
    )
    stages.update({part: seconds.get(part, 0.0) for part in ("triton.compile", "C launcher")})
    return dict(workload=name, cold=cold, first_s=first, second_s=second, stages_s=stages,
                kernels=kernel_timeline(compiles, call_start))  # fmt: skip


def kernel_timeline(compiles: list[dict], call_start: float) -> list[dict]:
    """The first call's compiles in the order they started: each kernel's start and end in seconds from the call's
    start, and its stages (its front end: its compile's time outside them)."""
    timeline = []
    for entry in sorted(compiles, key=lambda e: e["start"]):
        total = entry["end"] - entry["start"]
        timeline.append(dict(kernel=entry["kernel"], start_s=entry["start"] - call_start,
                             end_s=entry["end"] - call_start, seconds=total,
                             stages_s=with_front_end(total, entry["stages_s"])))  # fmt: skip
    return timeline


H200_SMS = 132


def _meta_call(workload) -> dict:
    """plan_attention's arguments for `workload` on the meta device (no memory), as the public API passes them."""
    import torch

    from tritonfa.bench.cases import DTYPES, OUT_DTYPE

    w, meta = workload, dict(device="meta")
    q_dtype, kv_dtype = DTYPES[w.q_dtype], DTYPES[w.kv_dtype]
    q = torch.empty((w.total_q, w.num_q_heads, w.head_dim), dtype=q_dtype, **meta)
    cu_seqlens_q = torch.empty((w.batch + 1,), dtype=torch.int32, **meta)
    if w.paged:
        pages = [-(-n // w.block_size) for n in w.seqlens_k]
        k = torch.empty((max(1, sum(pages)), w.block_size, w.num_kv_heads, w.head_dim), dtype=kv_dtype, **meta)
        block_table = torch.empty((w.batch, max(1, max(pages))), dtype=torch.int32, **meta)
        cu_seqlens_k, seqused_k = None, torch.empty((w.batch,), dtype=torch.int32, **meta)
    else:
        k = torch.empty((w.total_k, w.num_kv_heads, w.head_dim), dtype=kv_dtype, **meta)
        block_table, seqused_k = None, None
        cu_seqlens_k = torch.empty((w.batch + 1,), dtype=torch.int32, **meta)
    descale = torch.empty((), dtype=torch.float32, **meta)
    return dict(
        q=q, k=k, v=torch.empty_like(k),
        out=torch.empty((w.total_q, w.num_q_heads, w.head_dim), dtype=DTYPES[OUT_DTYPE], **meta), lse=None,
        cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, seqused_k=seqused_k, block_table=block_table,
        alibi_slopes=None, bias=None, s_aux=None, q_descale=descale if w.fp8_q else None,
        k_descale=descale if w.fp8_kv else None, v_descale=descale if w.fp8_kv else None, output_scale=None,
        max_seqlen_q=w.max_seqlen_q, max_seqlen_k=w.max_seqlen_k, softmax_scale=w.head_dim**-0.5,
        window_left=-1, window_right=0 if w.causal else -1, softcap=0.0, num_splits=0, arch="hopper",
    )  # fmt: skip


def sm90_specs(launches) -> dict:
    """ci/crosscompile.py's spec of each distinct kernel variant among these launches, in plan order (launch.py's
    compiled key -> spec): what a GPU would compile for them."""
    import tritonfa.kernels as kernels
    from tritonfa.kernels import attention_hopper
    from tritonfa.kernels import launch as launch_module

    specs: dict = {}
    for launch in launches:
        variant = launch_module._compiled_key(0, launch.fn, launch.args, launch.constexprs, launch.options)
        if variant in specs:
            continue
        if launch.fn is attention_hopper.attention_fwd_hopper_kernel:  # Gluon: compiled from its arguments
            spec = dict(fn=launch.fn, bound_args=launch.args, constexprs=launch.constexprs, options=launch.options,
                        gluon=True)  # fmt: skip
        else:
            signature, constexprs, attrs = kernels._signature(launch)
            spec = dict(fn=launch.fn, signature=signature, constexprs=constexprs, attrs=attrs, options=launch.options)
        specs[variant] = dict(spec, name=launch.fn.__name__)
    return specs


def cross_compile(name: str, side_by_side: bool = False) -> dict:
    """In this (fresh) process, no GPU: the launches of workload `name`'s first call on an H200, compiled for sm_90
    with the stages timed; one entry per kernel (name, seconds, registers, spills) and the stage sums."""
    import tritonfa.kernels as kernels
    from tritonfa.bench.workloads import WORKLOADS
    from tritonfa.kernels import attention

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ci"))
    import crosscompile

    workload = next(w for w in WORKLOADS if w.name == name)
    attention._multiprocessor_count = lambda device: H200_SMS  # the grid and split choices of the card, not meta's
    seconds = instrument()
    specs = sm90_specs(kernels.plan_attention(**_meta_call(workload)))  # one thread each with side_by_side

    start = time.perf_counter()
    if side_by_side:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(specs)) as pool:
            results = list(pool.map(lambda spec: crosscompile.compile_one("sm_90", spec), specs.values()))
    else:
        results = [crosscompile.compile_one("sm_90", spec) for spec in specs.values()]
    wall = time.perf_counter() - start
    compiled = []
    for result in results:
        if not result.ok:
            raise RuntimeError(f"{name}: {result.name} did not compile for sm_90: {result.error}")
        compiled.append(dict(kernel=result.name, seconds=result.seconds, regs=result.regs, spills=result.spills))
    stages = {stage: seconds.get(stage, 0.0) for stage in STAGES.values()}
    total = sum(kernel["seconds"] for kernel in compiled)
    stages = with_front_end(total, stages)
    return dict(workload=name, cross_compile="sm_90", side_by_side=side_by_side, kernels=compiled, compile_s=total,
                wall_s=wall, stages_s=stages)  # fmt: skip


def select_workloads(only: str, known: list[str]) -> tuple[list[str], list[str]]:
    """(workload names, entries matching none) of --only: exact names, or entries anchored with a leading ^ or a
    trailing $ as substring patterns (gpu_session.sh's '+' between entries cannot carry a name with a '+' in it,
    such as mixed-4x512+60-paged: '^mixed' can)."""
    names: list[str] = []
    unknown: list[str] = []
    for entry in filter(None, only.split(",")):
        if entry.startswith("^") or entry.endswith("$"):
            core = entry.removeprefix("^").removesuffix("$")
            found = [
                n for n in known
                if core in n and (not entry.startswith("^") or n.startswith(core))
                and (not entry.endswith("$") or n.endswith(core))
            ]  # fmt: skip
        else:
            found = [entry] if entry in known else []
        names += [n for n in found if n not in names]
        if not found:
            unknown.append(entry)
    return names, unknown


def run_worker(script: str, worker_args: list[str]) -> dict | None:
    """`script --worker WORKER_ARGS` in a fresh process with an empty Triton cache (outside the interpreter): the JSON
    of its last output line, or None where it failed (its error printed)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TRITON_CACHE_DIR": cache}
        env.pop("TRITON_INTERPRET", None)  # under the interpreter @triton.jit compiles nothing
        command = [sys.executable, script, "--worker", *worker_args]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"{worker_args[0]}: failed\n{done.stderr[-2000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="prefill-b8x2048-causal,fp8kv-prefill-b8x2048-causal,decode-b64x2048-paged")
    parser.add_argument("--out", default=".")
    parser.add_argument("--cold", action="store_true", help="count Triton's one-time setup too")
    parser.add_argument("--cross-compile", action="store_true", help="no GPU: compile the first call for sm_90 here")
    parser.add_argument("--side-by-side", action="store_true", help="with --cross-compile: as compile_ahead does")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        row = cross_compile(args.worker, args.side_by_side) if args.cross_compile else measure(args.worker, args.cold)
        print(json.dumps(row))
        return 0
    from tritonfa.bench.workloads import WORKLOADS

    names, unknown = select_workloads(args.only, [w.name for w in WORKLOADS])
    if unknown:  # checked here: a worker would only fail with a traceback per name
        parser.error(f"--only names no workload of tritonfa.bench.workloads: {unknown} (exact names, or ^/$-anchored "
                     "patterns, comma-separated)")  # fmt: skip
    rows = []
    for name in names:
        flags = ["--cold"] if args.cold else ["--cross-compile"] if args.cross_compile else []
        flags += ["--side-by-side"] if args.side_by_side else []
        row = run_worker(__file__, [name, *flags])
        if row is None:
            continue
        rows.append(row)
        stages = row["stages_s"]
        if args.cross_compile:
            parts = " ".join(f"{k} {v:.2f}" for k, v in stages.items())
            kernels = ", ".join(f"{k['kernel']} {k['seconds']:.2f} s ({k['regs']} registers)" for k in row["kernels"])
            how = "side by side" if row["side_by_side"] else "one after the other"
            print(f"{name:<40} sm_90 compile {row['wall_s']:.2f} s {how} ({parts}): {kernels}", flush=True)
            continue
        parts = " ".join(f"{k} {v:.2f}" for k, v in stages.items() if k not in ("triton.compile", "C launcher"))
        other = row["first_s"] - stages["triton.compile"] - stages["C launcher"]
        print(
            f"{name:<40} first {row['first_s']:.2f} s (triton.compile {stages['triton.compile']:.2f}: {parts}; "
            f"C launcher {stages['C launcher']:.2f}; other {other:.2f}) second {row['second_s'] * 1e3:.1f} ms",
            flush=True,
        )
        for kernel in row.get("kernels", []):
            own = " ".join(f"{k} {v:.2f}" for k, v in kernel["stages_s"].items())
            print(f"{'':<40}   {kernel['kernel']} {kernel['start_s']:.2f} -> {kernel['end_s']:.2f} s ({own})",
                  flush=True)  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "first_call.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
