"""When each SM's persistent prefill program ends (GPU): the static-share model of the persistent grid missed twice
(sessions 8 and 28), and the mixed-batch decode launch's span (session 29: 208 us of 1558 for b4x4096 non-causal,
whose tiles are equal) says its programs end far apart. This measures the end times instead of modelling them.

Per call (L2 flushed, as the bench): a one-program stamp kernel (the start), the call's launches up to the Gluon
prefill - made to release its programmatic dependents at once (LAUNCH_DEPENDENTS) - and, as that dependent, a probe
grid whose programs each read %globaltimer and %smid when they start and then hold their SM for HOLD_US. A probe
program cannot share an SM with a prefill program (it asks for 128 KB of shared memory), so the first probe start on
each SM is when that SM's prefill programs ended; the hold keeps a second probe program off the SMs that free
first. The call's other launches (the empty decode launch of a prefill batch) are left out. An SM no probe reached
shows as fewer common SMs than the GPU has.

    python kernel/scripts/program_ends.py --only ^prefill-b4x4096-noncausal$,^prefill-varlen16-causal$ --out ends.json
    python kernel/scripts/program_ends.py --only ^prefill-varlen16-causal$ --variant ws-dynamic   # variants.py's

Per workload: the SMs' end times after the start (first / median / last, us), the spread, and how alike the order
of the SMs is from call to call (Spearman's rank correlation, mean over pairs of calls: near 1 = the same SMs are
late every call, i.e. per-SM speed; near 0 = the order is noise).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

sys.path.insert(0, str(Path(__file__).resolve().parent))  # call_timeline.py beside this file
from call_timeline import matching  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from tritonfa.bench.cases import make_case  # noqa: E402
from tritonfa.bench.peers import prepare  # noqa: E402

HOLD_US = 600  # longer than any spread seen (208 us), so no SM takes two probe programs before every SM freed
PROBES_PER_SM = 1  # one probe program fits an SM at a time (PROBE_SHARED_BYTES)
PROBE_SHARED_BYTES = 128 * 1024  # fits an idle SM (228 KB), not beside a prefill program (208 KB at D 128)


@gluon.jit
def _stamp_kernel(out_ptr, hold_ns, SHARED_BYTES: gl.constexpr):
    """out[pid] = (start %globaltimer, %smid), then spin until start + hold_ns. The shared buffer (one row of it
    written, or the compiler drops it) makes the program need an SM whose prefill program has ended (a small program
    would fit beside it: the Gluon prefill leaves ~17K registers and ~19 KB of shared memory free)."""
    if SHARED_BYTES > 0:  # kept only if touched: one word of it is written
        layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
        buffer = gl.allocate_shared_memory(gl.int8, [SHARED_BYTES // 1024, 1024], layout)
        row: gl.constexpr = gl.BlockedLayout([1, 32], [1, 32], [1, 1], [1, 0])
        buffer.slice(0, 1).store(gl.zeros([1, 1024], gl.int8, layout=row))
    pid = gl.program_id(0)
    start = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
    smid = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    gl.store(out_ptr + pid * 2, start)
    gl.store(out_ptr + pid * 2 + 1, smid.to(gl.int64))
    now = start
    while now - start < hold_ns:
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                        pack=1)  # fmt: skip


def planned_launches(run) -> list:
    """The launches one call of `run` plans (nothing runs): the plan cache's entry point returns them instead."""
    from tritonfa.kernels import attention, plan_cache

    captured = []
    original = plan_cache.run
    plan_cache.run = lambda planner, args: captured.extend(planner(*args))
    try:
        run()
    finally:
        plan_cache.run = original
    names = [launch.fn.__name__ for launch in captured]
    if attention.attention_hopper.attention_fwd_hopper_kernel.__name__ not in names:
        raise SystemExit(f"no Gluon prefill launch in this call's plan: {names}")
    return captured


def probed_call(launches: list, stamps: torch.Tensor, flush: torch.Tensor, sms: int) -> None:
    from tritonfa.kernels import attention

    flush.zero_()
    _stamp_kernel[(1,)](stamps, 0, 0, num_warps=1)
    for launch in launches:
        if launch.fn is attention.attention_hopper.attention_fwd_hopper_kernel:
            dataclasses.replace(launch, constexprs={**launch.constexprs, "LAUNCH_DEPENDENTS": True})()
            _stamp_kernel[(PROBES_PER_SM * sms,)](stamps[2:], HOLD_US * 1000, PROBE_SHARED_BYTES, num_warps=1,
                                                  launch_pdl=True)  # fmt: skip
            return
        launch()


def sm_end_times(stamps: list[int]) -> dict[int, float]:
    """{smid: us after the start stamp} from one call's stamps [start, smid0, t1, sm1, ...]: each SM's first probe."""
    start = stamps[0]
    first: dict[int, float] = {}
    for t, sm in zip(stamps[2::2], stamps[3::2]):
        us = (t - start) / 1e3
        if sm not in first or us < first[sm]:
            first[sm] = us
    return first


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def summarize(calls: list[dict[int, float]]) -> dict:
    """Per call: first / median / last end and the spread (us); over calls: the SMs every call saw and the mean rank
    correlation of their end times between pairs of calls."""
    rows = []
    for ends in calls:
        times = sorted(ends.values())
        rows.append(dict(sms=len(times), first_us=times[0], median_us=statistics.median(times), last_us=times[-1],
                         spread_us=times[-1] - times[0]))  # fmt: skip
    common = sorted(set.intersection(*(set(c) for c in calls))) if calls else []
    pairs = list(itertools.combinations(range(len(calls)), 2))
    rho = [spearman([calls[i][s] for s in common], [calls[j][s] for s in common]) for i, j in pairs]
    late = sorted(common, key=lambda s: -statistics.fmean(c[s] for c in calls))[:8]
    keys = ("first_us", "median_us", "last_us", "spread_us")
    return dict(
        calls=rows, median={k: statistics.median(r[k] for r in rows) for k in keys} if rows else {},
        common_sms=len(common), rank_correlation=statistics.fmean(rho) if rho else None, latest_sms=late,
        ends_us={str(sm): [round(c[sm], 1) for c in calls] for sm in common},  # per SM, one value per call
    )  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", required=True, help="workload name substrings, comma-separated (^ / $ anchors)")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--variant", default="default", help="a prefill variant of variants.py (its TRITONFA_CONFIG)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    from variants import PREFILL_VARIANTS  # beside this file

    config = dict(PREFILL_VARIANTS[args.variant])
    os.environ.update(config.pop("env", {}))
    if config:  # read at each call (tritonfa.configs), so setting it here is enough
        os.environ["TRITONFA_CONFIG"] = json.dumps(config)
    if not torch.cuda.is_available():
        raise SystemExit("program_ends.py stamps GPU programs")
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device=device)
    stamps = torch.zeros(2 + 2 * PROBES_PER_SM * sms, dtype=torch.int64, device=device)
    report = {}
    for workload in matching(args.only):
        run = prepare("tritonfa", make_case(workload, device)).run
        for _ in range(3):  # compiles, plan cache
            run()
        launches = planned_launches(run)
        calls = []
        for _ in range(args.calls + 1):
            probed_call(launches, stamps, flush, sms)
            torch.cuda.synchronize()
            calls.append(sm_end_times(stamps.tolist()))
        result = summarize(calls[1:])  # the first probe call compiles the stamp kernel
        report[workload.name] = result
        m = result["median"]
        print(f"{workload.name:34} SMs {result['common_sms']:3d} | end first {m['first_us']:8.1f} median "
              f"{m['median_us']:8.1f} last {m['last_us']:8.1f} us | spread {m['spread_us']:6.1f} us | rank corr "
              f"{result['rank_correlation']:.2f} | latest SMs {result['latest_sms']}")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
