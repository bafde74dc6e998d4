"""Plumbing shared by the asv benchmarks: where shapes and the timing harness come from, and which mode runs.

The commit under test is the `tritonfa` installed in asv's Python (`pip install -e <that commit's kernel/>`). The
*measurement* side is always this checkout's: the benchmark package `kernel/src/tritonfa/bench/` (workloads,
`make_case`, `reference_check`, `run_workloads`, its timers) with the oracle (`reference.py`) and the interpreter
fixes it imports relatively, loaded from the files next to this suite under a private name, so every commit of the
history is measured on the same shapes with the same timers and checked against the same reference, including
commits older than those files. Importing this module needs only the standard library (`asv check` in CI runs
without torch).

Modes (environment variable TRITONFA_ASV_MODE):
  auto       (default) the GPU when torch sees one, else every benchmark is skipped (NotImplementedError in setup)
  gpu        the GPU; skipped when there is none
  cpu-smoke  Triton's interpreter on CPU, `smoke_scaled` shapes, wall clock of one call: proves the pipeline, the
             numbers are not performance (record them under a machine name like `cpu-interpreter`)
Other knobs: TRITONFA_ASV_IMPLS=tritonfa,flex (measure only these; the rest are skipped), TRITONFA_ASV_QUICK=1
(bench's QUICK_REPS), TRITONFA_ASV_E2E_KV=auto (end-to-end: only these kv-cache dtypes).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# this checkout's kernel/src/tritonfa, imported as package MEASURING without running its __init__ (which would
# import this checkout's kernel): only its bench subpackage and the modules that subpackage imports relatively
CHECKOUT_TRITONFA = REPO / "kernel" / "src" / "tritonfa"
MEASURING = "_tritonfa_asv_checkout"

MODE_ENV = "TRITONFA_ASV_MODE"
IMPLS_ENV = "TRITONFA_ASV_IMPLS"
QUICK_ENV = "TRITONFA_ASV_QUICK"
E2E_KV_ENV = "TRITONFA_ASV_E2E_KV"
MODES = ("auto", "gpu", "cpu-smoke")

# tritonfa and its reference lines (bench.py names); fa3 and vllm-unified only where vLLM imports (GPU + vLLM).
# A new name adds a parameter value: results recorded before it keep their values (no version bump needed).
IMPLS = ("tritonfa", "sdpa-cudnn", "flex", "fa3", "vllm-unified")


def _checkout_package() -> None:
    """Register MEASURING: a package whose modules are this checkout's tritonfa files; its __init__ never runs."""
    if MEASURING in sys.modules:
        return
    spec = importlib.machinery.ModuleSpec(MEASURING, None, is_package=True)
    spec.submodule_search_locations = [str(CHECKOUT_TRITONFA)]
    sys.modules[MEASURING] = importlib.util.module_from_spec(spec)


def workloads_module():
    """This checkout's `tritonfa/bench/workloads.py` (stdlib only): the shapes, for discovery and for measuring.

    Loaded alone by path, so discovery needs no torch, and registered under the name the bench package imports it
    by, so `harness()` later reuses this very module (one `Workload` class)."""
    name = f"{MEASURING}.bench.workloads"
    if name in sys.modules:
        return sys.modules[name]
    _checkout_package()
    spec = importlib.util.spec_from_file_location(name, CHECKOUT_TRITONFA / "bench" / "workloads.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


WORKLOADS = workloads_module().WORKLOADS
WORKLOAD_NAMES = [w.name for w in WORKLOADS]
KIND = {w.name: w.kind for w in WORKLOADS}


def env_list(name: str) -> list[str] | None:
    value = os.environ.get(name, "").strip()
    return [part.strip() for part in value.split(",") if part.strip()] or None


def mode() -> str:
    value = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV} must be one of {', '.join(MODES)}, not {value!r}")
    return value


def choose_device() -> tuple[str | None, str]:
    """('cuda' | 'cpu' | None, why). None: this machine cannot run the kernel benchmarks in the chosen mode.

    Call before anything imports triton: cpu-smoke switches the interpreter on here (the recipe sets it too).
    """
    chosen = mode()
    if chosen == "cpu-smoke":
        os.environ.setdefault("TRITON_INTERPRET", "1")
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
        if os.environ["TRITON_INTERPRET"] != "1":
            return None, "cpu-smoke needs TRITON_INTERPRET=1"
        return "cpu", "cpu-smoke: Triton interpreter, smoke-scaled shapes, wall clock (not performance)"
    try:
        import torch
    except ImportError as error:
        return None, f"torch is not importable ({error})"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return None, f"TRITON_INTERPRET=1 is set (for the interpreter series use {MODE_ENV}=cpu-smoke)"
    if not torch.cuda.is_available():
        return None, f"no GPU visible (mode {chosen}; {MODE_ENV}=cpu-smoke records the interpreter smoke series)"
    return "cuda", torch.cuda.get_device_name(0)


def harness():
    """This checkout's `tritonfa.bench`, run against the installed (commit under test) `tritonfa`.

    The bench package imports the oracle and the interpreter fixes relatively, so here they are this checkout's
    too, and the kernel absolutely (`import tritonfa`): the measuring side (shapes, oracle, timers) is the same for
    every commit, only the kernel changes. Nothing of the installed `tritonfa` is replaced.
    """
    import tritonfa  # noqa: F401 - the commit under test; fails loudly if none is installed

    workloads_module()
    return importlib.import_module(f"{MEASURING}.bench")


def installed_tritonfa() -> dict:
    try:
        spec = importlib.util.find_spec("tritonfa")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin:
        return {"path": None, "version": None}
    module = importlib.import_module("tritonfa")
    return {"path": str(Path(spec.origin).parent), "version": getattr(module, "__version__", None)}


def measure_kernels() -> dict:
    """Every (workload, impl) of the suite measured once, as plain data (asv pickles it for the track methods).

    Returns {"skip": reason} where the mode cannot run here; otherwise {"rows": {"workload|impl": row dict}, ...}.
    Rows come from bench.run_workloads: the reference check first, then bench's timer for the workload (GPU:
    do_bench median for prefill, CUDA-graph replay median for decode/mixed; both CUDA events).
    """
    device_name, why = choose_device()
    if device_name is None:
        return {"skip": why}
    started = time.perf_counter()
    bench = harness()
    import torch

    device = torch.device(device_name)
    interpreter = device_name == "cpu"
    workloads = list(WORKLOADS)
    if interpreter:
        workloads = [workloads_module().smoke_scaled(w) for w in workloads]
    wanted = env_list(IMPLS_ENV) or list(IMPLS)
    impls = [impl for impl in IMPLS if impl in wanted]
    if device_name == "cuda" and "flex" in impls:
        # as bench.main: inductor sizes its compile pool when its config is first imported; vLLM (fa3) would pin it
        importlib.import_module("torch._inductor.config")
    reps = bench.QUICK_REPS if os.environ.get(QUICK_ENV, "") not in ("", "0") else bench.FULL_REPS
    rows = bench.run_workloads(workloads, impls, device, reps, interpreter=interpreter, seed=0)
    by_key = {f"{row.workload}|{row.impl}": dataclasses.asdict(row) for row in rows}
    for w in workloads:
        for impl in IMPLS:
            if impl not in impls:
                by_key[f"{w.name}|{impl}"] = {"status": "disabled", "reason": f"not in {IMPLS_ENV}={','.join(wanted)}"}
    return {
        "rows": by_key,
        "device": why,
        "mode": mode(),
        "tritonfa": installed_tritonfa(),
        "elapsed_s": round(time.perf_counter() - started, 1),
    }


def kernel_row(cache: dict, workload: str, impl: str, metric: str) -> dict:
    """The measured row for asv's setup(): NotImplementedError = skip (asv's way), RuntimeError = failure.

    tritonfa failing or disagreeing with the reference is a failure; a reference line (peer) that cannot run a
    workload, or a metric that does not apply to its kind (GB/s of a prefill), is a skip.
    """
    if "skip" in cache:
        raise NotImplementedError(cache["skip"])
    kind = KIND[workload]
    if (metric == "tflops" and kind == "decode") or (metric == "gbps" and kind == "prefill"):
        raise NotImplementedError(f"{metric} is not a headline of {kind} workloads")
    row = cache["rows"].get(f"{workload}|{impl}")
    if row is None:
        raise NotImplementedError(f"{impl} was not measured on {workload}")
    status, reason = row.get("status"), row.get("reason", "")
    if status in ("ok",) and row.get(metric) is not None:
        return row
    if impl != "tritonfa":
        raise NotImplementedError(f"{impl} on {workload}: {status}: {reason}")
    if status == "wrong":
        raise RuntimeError(f"tritonfa on {workload} failed the reference check: rel. error {row.get('error')}")
    raise RuntimeError(f"tritonfa on {workload}: {status}: {reason}")
