"""Host time per launcher call (`attention_forward`: plan + launch): Triton's binding, the prepared launch, the
prepared launch with the plan cache (whose served keys call their compiled kernels directly: `plan_cache.run`).

No vLLM needed (integration/scripts/hostcost.py measures the whole backend beside FA3). Paged bf16 K/V, Llama-3-8B's
heads (32 q / 8 kv, D 128), 16-slot pages; per case and mode the best of --repeats loops of --calls calls without a
sync, the modes in turn twice (the first round also warms; the second counts). Outputs of every mode must be equal.
A case ending in -fp8 reads an fp8 (e4m3) cache with the bf16 q (vLLM's fp8 KV cache: on Hopper a prefill widens it
into scratch copies first); one ending in -qkv8 is a non-causal prefill of contiguous e4m3 q/k/v with as many queries
as keys (on Hopper: V's key-major copy, a launch of the plan, then the prefill).

    python kernel/scripts/launch_hostcost.py [--cases b1x256,b64x2048,b1x2048q512,b1x2048q512-fp8,b1x512-qkv8]
    python kernel/scripts/launch_hostcost.py --plan-only [--arch hopper]   # any machine: planning alone, meta tensors
    python kernel/scripts/launch_hostcost.py --cases b1x512-qkv8 --profile   # + where a served call's host time goes
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
import timeit

import torch

from tritonfa.kernels import launch as launch_module
from tritonfa.kernels import plan_cache
from tritonfa.kernels.attention import attention_forward, plan_attention

HEADS, KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
# mode -> (TRITONFA_PREPARED_LAUNCH, TRITONFA_PLAN_CACHE)
MODES = {"Triton": ("0", "0"), "prepared": ("1", "0"), "prepared + plan cache": ("1", "1")}


def parse_case(text: str) -> tuple[int, int, int, torch.dtype]:
    """b<batch>x<kv len>[q<query len>][-fp8] -> (batch, kv len, query len, cache dtype); b<batch>x<len>-qkv8 ->
    (batch, len, len, None): contiguous fp8 q/k/v."""
    if text.endswith("-qkv8"):
        batch, ctx = text.removesuffix("-qkv8").removeprefix("b").split("x")
        return int(batch), int(ctx), int(ctx), None
    text, fp8, _ = text.partition("-fp8")
    batch, rest = text.removeprefix("b").split("x")
    ctx, _, query = rest.partition("q")
    return int(batch), int(ctx), int(query or 1), torch.float8_e4m3fn if fp8 else torch.bfloat16


def launcher_args(batch: int, ctx: int, query: int, kv_dtype: torch.dtype | None, device: str) -> tuple:
    if kv_dtype is None:  # contiguous e4m3 q/k/v, non-causal, bf16 out
        fp8 = torch.float8_e4m3fn
        q, k, v = (torch.randn(batch * ctx, h, HEAD_DIM, device=device).to(fp8) for h in (HEADS, KV_HEADS, KV_HEADS))
        cu_seqlens = torch.arange(0, batch * ctx + 1, ctx, dtype=torch.int32, device=device)
        out = torch.empty(q.shape, dtype=torch.bfloat16, device=device)
        return (q, k, v, out, None, cu_seqlens, cu_seqlens, None, None, None, None, None, None, None, None, None,
                ctx, ctx, HEAD_DIM**-0.5, -1, -1, 0.0)  # fmt: skip
    pages = batch * -(-ctx // PAGE)
    q = torch.randn(batch * query, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device)
    k = torch.randn(pages, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=device).to(kv_dtype)
    v = torch.randn_like(k, dtype=torch.bfloat16).to(kv_dtype)
    cu_seqlens_q = torch.arange(0, batch * query + 1, query, dtype=torch.int32, device=device)
    seqused_k = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    block_table = torch.arange(pages, dtype=torch.int32, device=device).view(batch, -1)
    out = torch.empty_like(q)
    return (q, k, v, out, None, cu_seqlens_q, None, seqused_k, block_table, None, None, None, None, None, None, None,
            query, ctx, HEAD_DIM**-0.5, -1, 0, 0.0)  # fmt: skip


def host_us(args: tuple, calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            attention_forward(*args)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def profile_served(case: str, args: tuple, calls: int, top: int) -> None:
    """cProfile over `calls` served calls (prepared launch + plan cache, already warm): the functions with the most
    time of their own, to say where a served call's host time goes (Python, the binding, TMA descriptor encoding)."""
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        attention_forward(*args)
    profiler.disable()
    torch.cuda.synchronize()
    print(f"--- {case}: {calls} served calls under cProfile (slower than unprofiled), top {top} by own time")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def plan_only(cases: list[str], arch: str, calls: int, repeats: int) -> None:
    """Planning alone on meta tensors (no GPU, nothing launched): a full plan against the plan cache's."""
    print(f"host us per plan ({arch}, meta tensors), best of {repeats} x {calls}")
    for case in cases:
        call = launcher_args(*parse_case(case), "meta")

        def planner(*a):
            return plan_attention(*a, arch=arch)

        def full(call=call):
            return planner(*call)

        def cached(call=call):
            return plan_cache.plan(planner, call)

        plan_cache.clear()
        for _ in range(3):
            cached()
        state = plan_cache._PLANS.get(plan_cache.call_key(call))
        times = [min(timeit.repeat(f, number=calls, repeat=repeats)) / calls * 1e6 for f in (full, cached)]
        served = "served from the cache" if state != plan_cache._UNCACHEABLE else "not cacheable: planned in full"
        print(f"{case:14} plan {times[0]:6.1f} us | plan cache {times[1]:6.1f} us ({served})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="b1x256,b64x2048,b1x2048q512,b1x2048q512-fp8")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plan-only", action="store_true", help="planning alone on meta tensors (any machine)")
    parser.add_argument("--arch", default="hopper", help="with --plan-only: the architecture planned for")
    parser.add_argument("--profile", action="store_true", help="then cProfile served calls of each case")
    args = parser.parse_args(argv)
    if args.plan_only:
        plan_only(args.cases.split(","), args.arch, args.calls, max(args.repeats, 5))
        return 0
    if not torch.cuda.is_available():
        raise SystemExit("launch_hostcost.py times GPU launches")
    print(f"host us per attention_forward call, {args.calls} calls without sync, best of {args.repeats}; "
          f"{torch.cuda.get_device_name()}")  # fmt: skip
    for case in args.cases.split(","):
        call = launcher_args(*parse_case(case), "cuda")
        times, outputs = {}, {}
        for _ in range(2):  # the first round warms (compiles, fills the caches)
            for mode, (prepared, cached_plans) in MODES.items():
                os.environ["TRITONFA_PREPARED_LAUNCH"], os.environ["TRITONFA_PLAN_CACHE"] = prepared, cached_plans
                times[mode] = host_us(call, args.calls, args.repeats)
                outputs.setdefault(mode, call[3].clone())
        os.environ["TRITONFA_PREPARED_LAUNCH"] = os.environ["TRITONFA_PLAN_CACHE"] = "1"
        if any(not torch.equal(out, outputs["Triton"]) for out in outputs.values()):
            raise SystemExit(f"{case}: the modes' outputs differ")
        row = " | ".join(f"{mode} {us:6.1f} us" for mode, us in times.items())
        print(f"{case:14} {row} (prepared launch {'on' if launch_module._enabled() else 'OFF'})")
        if args.profile:
            profile_served(case, call, args.calls, top=25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
