"""Timers and the ceilings printed next to them (copy bandwidth, matmul throughput, measured in the same run).

Prefill rows take the median of `triton.testing.do_bench` (CUDA events around each call, L2 flushed between
calls); decode and mixed rows, whose kernels are short enough for launch overhead to matter, the median of
`triton.testing.do_bench_cudagraph` (one CUDA graph of back-to-back calls, events around each replay). Every impl of
a row uses the row's timer. On the CPU: wall clock, not a performance number.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from .errors import one_line
from .workloads import Workload


@dataclasses.dataclass(frozen=True)
class Reps:
    """How long each timer measures: do_bench's warm-up and repetitions, one graph's length, calls on the CPU."""

    warmup_ms: int
    rep_ms: int
    graph_ms: float  # length of one CUDA-graph replay (back-to-back calls)
    cpu_calls: int


FULL_REPS = Reps(warmup_ms=25, rep_ms=100, graph_ms=20.0, cpu_calls=1)
QUICK_REPS = Reps(warmup_ms=5, rep_ms=25, graph_ms=5.0, cpu_calls=1)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@triton.jit
def _add_one(x_ptr):
    tl.store(x_ptr, tl.load(x_ptr) + 1)


def triton_startup_s(device: torch.device) -> float:
    """Seconds of Triton's one-time start-up in this process (its CUDA utilities module, built from C when the cache
    has none; the driver's state), through the first launch of a trivial kernel (its own small compile included)
    before the first workload, so that a workload's "first call" is its own compiles and launches
    (kernel/scripts/first_call.py times first calls alike)."""
    start = time.perf_counter()
    x = torch.zeros(1, device=device)
    _add_one[(1,)](x)
    synchronize(device)
    return time.perf_counter() - start


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def time_events(fn: Callable, reps: Reps) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=reps.warmup_ms, rep=reps.rep_ms, return_mode="median")


def time_cuda_graph(fn: Callable, reps: Reps) -> float:
    """Median ms per call over replays of one graph of back-to-back calls (no launch overhead, no L2 flush)."""
    import triton.testing

    return triton.testing.do_bench_cudagraph(fn, rep=reps.graph_ms, return_mode="median")


def time_cpu(fn: Callable, reps: Reps) -> float:
    times = []
    for _ in range(reps.cpu_calls):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def timer_for(workload: Workload, device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu-wall"
    return "events" if workload.kind == "prefill" else "cuda-graph"


def measure(fn: Callable, timer: str, reps: Reps) -> tuple[float, str]:
    """(median ms, timer actually used): a peer that cannot be captured in a graph falls back to events."""
    if timer == "cpu-wall":
        return time_cpu(fn, reps), timer
    if timer == "cuda-graph":
        try:
            return time_cuda_graph(fn, reps), timer
        except Exception as error:  # noqa: BLE001 - capture failures come in many types
            torch.cuda.synchronize()
            return time_events(fn, reps), f"events (graph capture failed: {one_line(error, 60)})"
    return time_events(fn, reps), timer


TIMER_DESCRIPTIONS = {
    "events": "triton.testing.do_bench median (CUDA events per call, L2 flushed)",
    "cuda-graph": "triton.testing.do_bench_cudagraph median (CUDA-graph replays of back-to-back calls)",
    "cpu-wall": "wall clock of one call (CPU: interpreter / eager torch, not a performance number)",
}


def measure_ceilings(device: torch.device, reps: Reps) -> dict:
    """Copy bandwidth (read + write bytes) and matmul throughput on this device, in this run."""
    on_gpu = device.type == "cuda"
    timer = "events" if on_gpu else "cpu-wall"
    cpu_reps = dataclasses.replace(reps, cpu_calls=3)
    ceilings: dict = {}

    def attempt(key, what):
        try:
            ceilings[key] = what()
        except Exception as error:  # noqa: BLE001 - a missing ceiling is reported, not fatal
            ceilings[key] = None
            ceilings[key + "_error"] = one_line(error)
        finally:
            release_memory(device)

    def copy_gbps():
        numel = (1 << 30 if on_gpu else 1 << 24) // 2  # 1 GiB of bf16 on the GPU
        src = torch.empty(numel, dtype=torch.bfloat16, device=device).normal_()
        dst = torch.empty_like(src)
        ms, _ = measure(lambda: dst.copy_(src), timer, reps if on_gpu else cpu_reps)
        return 2 * src.numel() * src.element_size() / ms / 1e6

    def matmul_tflops():
        n = 8192 if on_gpu else 512
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        ms, _ = measure(lambda: a @ b, timer, reps if on_gpu else cpu_reps)
        return 2 * n**3 / ms / 1e9

    def scaled_mm_tflops():
        n = 8192 if on_gpu else 256
        fp8 = torch.float8_e4m3fn
        a = torch.randn(n, n, device=device).to(fp8)
        b = torch.randn(n, n, device=device).to(fp8).t()  # column-major second operand, as _scaled_mm requires
        one = torch.ones((), device=device)

        def run():
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)

        ms, _ = measure(run, timer, reps if on_gpu else cpu_reps)
        return 2 * n**3 / ms / 1e9

    attempt("copy_gbps", copy_gbps)
    attempt("bf16_matmul_tflops", matmul_tflops)
    attempt("fp8_scaled_mm_tflops", scaled_mm_tflops)
    ceilings["notes"] = (
        "copy: 1 GiB device-to-device, read+write bytes; matmul: 8192^3 bf16 `a @ b`; "
        "fp8: 8192^3 torch._scaled_mm e4m3 -> bf16, use_fast_accum=True"
        if on_gpu
        else "CPU dry run: small sizes, meaningless"
    )
    return ceilings
