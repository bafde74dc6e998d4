"""Where the time of one timed call goes: the bench's prefill timer (do_bench: L2 flushed, CUDA events around each
call) replayed under the torch profiler, per call: the events' time, the kernels' time inside it, the GPU's idle
time between them, the host's time in the call, and the CUDA runtime calls that can stall the host or the stream
(cudaMalloc / cudaFree / synchronizations). A call whose event time is its kernels' time is GPU-bound; one whose
idle time is large waits on the host (planning, launches) or on an allocation.

    python kernel/scripts/call_timeline.py --only fp8kv-prefill-b8x2048-causal --impls tritonfa,fa3
    python kernel/scripts/call_timeline.py --only fp8kv-prefill-b8x2048-causal --before prefill-b8x2048-causal

--before runs other workloads' tritonfa calls first in the same process (session 28 saw the fp8 KV prefill take
0.55 or 0.72-0.79 ms by what ran before it). Prints one table per workload x impl and writes --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tritonfa.bench.cases import make_case  # noqa: E402
from tritonfa.bench.peers import prepare  # noqa: E402
from tritonfa.bench.workloads import WORKLOADS  # noqa: E402

# runtime calls that block the host or serialize the stream
STALLS = ("cudaMalloc", "cudaFree", "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
          "cudaMemcpy", "cudaHostAlloc")  # fmt: skip
CALL_RANGE = re.compile(r"call\d+")  # record_function names of the timed calls


def matching(patterns: str) -> list:
    """The bench's workloads whose name holds one of the comma-separated substrings (^ / $ anchor one at the name's
    start / end, as variants.py --only); none for an empty string."""

    def hit(pattern: str, name: str) -> bool:
        core = pattern.removeprefix("^").removesuffix("$")
        if pattern.startswith("^") and not name.startswith(core):
            return False
        if pattern.endswith("$") and not name.endswith(core):
            return False
        return core in name

    wanted = [p for p in patterns.split(",") if p]
    return [w for w in WORKLOADS if any(hit(p, w.name) for p in wanted)]


def _timed_calls(run, calls: int, flush: torch.Tensor) -> list[tuple[float, float]]:
    """do_bench's loop: flush L2, event, call, event; (event ms, host ms of the call) per call."""
    import time

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    host = []
    for i in range(calls):
        flush.zero_()
        starts[i].record()
        t0 = time.perf_counter()
        with torch.profiler.record_function(f"call{i}"):
            run()
        host.append((time.perf_counter() - t0) * 1e3)
        ends[i].record()
    torch.cuda.synchronize()
    return [(s.elapsed_time(e), h) for s, e, h in zip(starts, ends, host)]


def timeline(run, calls: int = 10) -> dict:
    """Per call: event ms, host ms, kernel ms, GPU idle ms between its kernels, how late its first kernel started
    after the L2 flush ended (the host still planning or launching), and the stalling runtime calls."""
    from torch.profiler import ProfilerActivity, profile

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")  # do_bench's L2 flush size
    for _ in range(3):  # warm: compiles, plan cache
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        timed = _timed_calls(run, calls, flush)
    events = prof.events()
    windows = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("call"))
    kernels = gpu_kernels(events)
    stalls = [(e.time_range.start, e.name) for e in events if any(e.name.startswith(s) for s in STALLS)]
    return per_call(timed, windows, kernels, stalls)


def gpu_kernels(events) -> list[tuple[int, int, str]]:
    """(start, end, name) of the GPU rows, less the callN ranges the profiler mirrors onto the GPU row (those
    would count each call twice)."""
    return sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in events
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
        and not CALL_RANGE.fullmatch(e.name)
    )  # fmt: skip


def busy_us(spans: list[tuple[int, int, str]]) -> float:
    """Time covered by at least one kernel: kernels that overlap (a PDL launch starts in its predecessor's tail)
    count once."""
    total, reach = 0.0, float("-inf")
    for s, e, _ in sorted(spans):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


def per_call(timed: list, windows: list, kernels: list, stalls: list) -> dict:
    """Rows per timed call from the trace (times in us): the stream runs flush, the call's kernels, flush, ...; the
    flushes are the longest fill kernels (256 MB: ~85 us on an H100, a split-KV lse fill is far shorter)."""
    fills = [k for k in kernels if "fill" in k[2].lower()]
    longest = max((e - s for s, e, _ in fills), default=0)

    def is_flush(s, e, n):
        return "fill" in n.lower() and e - s > longest / 2

    flush_ends = [e for s, e, n in kernels if is_flush(s, e, n)]
    rows = []
    for i, ((event_ms, host_ms), (w_start, w_end)) in enumerate(zip(timed, windows)):
        if i >= len(flush_ends):
            break
        after = flush_ends[i]
        until = flush_ends[i + 1] if i + 1 < len(flush_ends) else float("inf")
        mine = [(s, e, n) for s, e, n in kernels if after <= s < until and not is_flush(s, e, n)]
        busy = busy_us(mine) / 1e3
        span = (max(e for _, e, _ in mine) - mine[0][0]) / 1e3 if mine else 0.0
        rows.append(dict(
            event_ms=event_ms, host_ms=host_ms, kernel_ms=busy, idle_ms=max(span - busy, 0.0),
            late_ms=(mine[0][0] - after) / 1e3 if mine else 0.0,
            kernels=[f"{n[:60]} {(e - s) / 1e3:.4f} ms" for s, e, n in mine],
            stalls=sorted({n for t, n in stalls if w_start <= t < w_end}),
        ))  # fmt: skip
    keys = ("event_ms", "host_ms", "kernel_ms", "idle_ms", "late_ms")
    return dict(calls=rows, median={k: statistics.median(r[k] for r in rows) for k in keys} if rows else {})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", required=True, help="workload name substrings, comma-separated (^ / $ anchors)")
    parser.add_argument("--impls", default="tritonfa")
    parser.add_argument("--before", default="", help="workloads whose tritonfa calls run first (comma-separated)")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("call_timeline.py profiles GPU calls")
    device = torch.device("cuda")
    for workload in matching(args.before):
        run = prepare("tritonfa", make_case(workload, device)).run
        for _ in range(20):
            run()
    torch.cuda.synchronize()
    report = {}
    for workload in matching(args.only):
        case = make_case(workload, device)
        for impl in [i for i in args.impls.split(",") if i] or ["tritonfa"]:
            result = timeline(prepare(impl, case).run, args.calls)
            report[f"{workload.name}/{impl}"] = result
            m = result["median"]
            print(f"{workload.name:34} {impl:9} event {m['event_ms']:.4f} ms | kernels {m['kernel_ms']:.4f} | idle "
                  f"{m['idle_ms']:.4f} | late {m['late_ms']:.4f} | host {m['host_ms']:.4f}")  # fmt: skip
            last = result["calls"][-1]
            print(f"  kernels: {', '.join(last['kernels'])}; stalls: {', '.join(last['stalls']) or 'none'}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
