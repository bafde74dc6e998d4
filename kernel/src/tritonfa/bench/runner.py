"""The run: every workload, every impl on the same inputs, checked against the reference, then timed."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time

import torch

from .cases import Case, ReferenceCheck, make_case, reference_check, tolerance
from .errors import Unsupported, one_line
from .peers import prepare
from .timing import Reps, measure, release_memory, synchronize, timer_for
from .workloads import Workload


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Row:
    """One (workload, impl) of the table and the JSON: its numbers and check, or why it has none."""

    workload: str
    impl: str
    status: str  # "ok", "wrong" (timed, but failed the reference check), "unsupported", "failed"
    ms: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    error: float | None = None
    ok: bool = False
    ratio: float | None = None  # tritonfa's speed / this impl's (on tritonfa's row: / the best peer's)
    best_peer: str | None = None  # on tritonfa's row
    first_call_s: float | None = None  # first call incl. compilation / autotuning
    timer: str | None = None
    checked: str | None = None
    note: str = ""
    reason: str = ""


def run_impl(impl: str, case: Case, check: ReferenceCheck, reps: Reps) -> Row:
    w = case.workload
    row = Row(workload=w.name, impl=impl, status="failed", checked=check.description)
    prepared = None
    try:
        prepared = prepare(impl, case)
        row.note = prepared.note
        start = time.perf_counter()
        out = prepared.run()
        synchronize(case.device)
        row.first_call_s = time.perf_counter() - start
        row.error = check.error(prepared.to_varlen(out))
        del out
        row.ok = math.isfinite(row.error) and row.error <= tolerance(w)
        row.ms, row.timer = measure(prepared.run, timer_for(w, case.device), reps)
        row.tflops = w.flops / row.ms / 1e9
        row.gbps = w.bytes_moved / row.ms / 1e6
        row.status = "ok" if row.ok else "wrong"
    except Unsupported as reason:
        row.status, row.reason = "unsupported", one_line(str(reason))
    except Exception as error:  # noqa: BLE001 - a peer failing (OOM, unsupported dtype, ...) must not stop the run
        row.status, row.reason = "failed", one_line(error)
        if case.device.type == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.synchronize()
    finally:
        del prepared
        if row.status == "failed":
            # after an OOM, give the next impl the memory back (otherwise once per workload)
            release_memory(case.device)
    return row


def fill_ratios(rows: list[Row]) -> None:
    """ratio = tritonfa's speed over each peer's, and on tritonfa's row over the fastest correct peer's."""
    by_workload: dict[str, list[Row]] = {}
    for row in rows:
        by_workload.setdefault(row.workload, []).append(row)
    for group in by_workload.values():
        ours = next((r for r in group if r.impl == "tritonfa" and r.ms), None)
        peers = [r for r in group if r.impl != "tritonfa" and r.ok and r.ms]
        if ours is None:
            continue
        for peer in peers:
            peer.ratio = peer.ms / ours.ms
        if peers:
            best = min(peers, key=lambda r: r.ms)
            ours.ratio, ours.best_peer = best.ms / ours.ms, best.impl


def run_workloads(
    workloads: list[Workload], impls: list[str], device: torch.device, reps: Reps, interpreter: bool, seed: int
) -> list[Row]:
    """One Row per (workload, impl); `interpreter`: kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1),
    whose numeric bugs are patched first so that bf16 and fp8 are checked as on a GPU."""
    if interpreter:
        from ..interpreter_fixes import patch_triton_interpreter

        patch_triton_interpreter()
    rows: list[Row] = []
    started = time.perf_counter()
    for index, workload in enumerate(workloads, 1):
        prefix = f"[{index}/{len(workloads)}] {workload.name}"
        log(f"{prefix}: {workload.describe()}")
        case = check = None
        try:
            case = make_case(workload, device, seed=seed + index)
            check = reference_check(case)
        except Exception as error:  # noqa: BLE001 - e.g. OOM building inputs: record it, go on
            log(f"{prefix}: inputs/reference failed: {one_line(error)}")
            reason = f"inputs/reference: {one_line(error)}"
            rows.extend(Row(workload.name, impl, "failed", reason=reason) for impl in impls)
            del case, check
            release_memory(device)
            continue
        for impl in impls:
            row = run_impl(impl, case, check, reps)
            rows.append(row)
            elapsed = time.perf_counter() - started
            if row.ms is not None:
                headline = format_headline(workload, row)
                log(
                    f"{prefix}: {impl:<13} {row.ms:9.4f} ms {headline:>16}  err {row.error:.1e}"
                    f"{'' if row.ok else ' WRONG'}  first call {row.first_call_s:.1f} s  [{elapsed:.0f} s]"
                )
            else:
                log(f"{prefix}: {impl:<13} — {row.status}: {row.reason}  [{elapsed:.0f} s]")
        del case, check
        release_memory(device)
    fill_ratios(rows)
    return rows


def format_headline(workload: Workload, row: Row) -> str:
    if row.ms is None:
        return "—"
    if workload.metric == "tflops":
        return f"{row.tflops:.1f} TFLOP/s"
    if workload.metric == "gbps":
        return f"{row.gbps:.0f} GB/s"
    return f"{row.tflops:.1f} TFLOP/s"  # a mixed batch: its ms come first on the line anyway
