"""Host time per attention call: the CUSTOM backend's forward next to FA3's varlen call and the layers in between.

Every step vLLM does not capture whole in a CUDA graph (prefill and mixed steps run attention between graph pieces;
everything with enforce_eager) pays the host time of one attention call per layer. This script measures it for one
Llama-3-8B attention layer (32 q / 8 kv heads, head size 128, bf16, block size 16) on paged decode and prefill
batches, all rows in one process on the same tensors:

  CUSTOM forward              TritonFAImpl.forward as vLLM calls it (metadata from the backend's builder)
  CUSTOM forward, checked     the same with the layer's argument check redone every call (the pre-#13 path)
  tritonfa API                tritonfa.flash_attn_varlen_func (every argument checked)
  tritonfa op                 torch.ops.tritonfa.varlen_fwd (the custom op the API ends in)
  tritonfa launcher           tritonfa.kernels.attention.attention_forward (plan + the prepared launch)
  tritonfa launcher, Triton   the same launches through Triton's JIT call (binding every argument: the A/B)
  FA3 varlen                  vLLM's flash_attn_varlen_func(fa_version=3) with the arguments FLASH_ATTN passes
  FLASH_ATTN forward          FlashAttentionImpl.forward (metadata from its builder, AOT scheduling included)
  TRITON_ATTN forward         TritonAttentionImpl.forward
  torch.add                   a one-kernel floor
  CUSTOM graph replay         the CUSTOM forward captured in a CUDA graph, replayed (wall time)

Timing: `--calls` calls back to back without synchronizing (after `--warmup` calls and a sync); host = the host
clock over the loop / calls (what the Python side costs while the GPU keeps up), wall = until the GPU finished /
calls, gpu = CUDA events around the loop / calls; the fastest of `--repeats` loops. Target (issue #13): CUSTOM
forward host <= FA3 varlen host + 20 us.

GPU machine, vLLM 0.24.0 (the scripts put kernel/src and integration/src on the path), ~1 min:

    python integration/scripts/hostcost.py --out DIR             # default cases; table, hostcost.json in DIR

`--stub-launcher` replaces the launcher (`attention_forward`, as tritonfa.interface calls it) with a no-op: the rows
then measure the Python above Triton's launch (the backend, the checks, the custom op), on any machine, CPU
included (`--stub-launcher --no-vllm-rows`). On a CPU without it, `--smoke` runs the tritonfa rows in Triton's
interpreter on tiny shapes to check the plumbing; those numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

import _harness as h

DEFAULT_CASES = ("b1x256", "b64x2048", "b1x2048q512")  # decode b1, decode b64 (the seed's), one prefill chunk
ROWS = (
    "CUSTOM forward", "CUSTOM forward, checked", "tritonfa API", "tritonfa op", "tritonfa launcher",
    "tritonfa launcher, Triton", "FA3 varlen", "FLASH_ATTN forward", "TRITON_ATTN forward", "torch.add",
    "CUSTOM graph replay",
)  # fmt: skip
TARGET_MARGIN_US = 20.0
LLAMA_3_8B = dict(num_heads=32, num_kv_heads=8, head_size=128)


def parse_case(case: str) -> tuple[int, int, int]:
    """'b64x2048' -> (batch 64, KV length 2048, 1 new query each); 'b1x2048q512' -> a 512-token chunk."""
    m = re.fullmatch(r"b(\d+)x(\d+)(?:q(\d+))?", case)
    if not m:
        raise ValueError(f"case {case!r} is not b<batch>x<kv length>[q<query length>]")
    batch, seq_len, query_len = int(m[1]), int(m[2]), int(m[3] or 1)
    if query_len > seq_len:
        raise ValueError(f"case {case!r}: query length > KV length")
    return batch, seq_len, query_len


def vllm_config(model_dir: Path, block_size: int, device: str):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig

    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=4096)
    return VllmConfig(
        model_config=model, cache_config=CacheConfig(block_size=block_size), device_config=DeviceConfig(device)
    )


def make_rows(case: str, args, device: str) -> dict:
    """name -> zero-argument callable making one attention call for `case` (rows that cannot run are left out,
    with the reason under name + ' (n/a)')."""
    import torch
    from vllm.config import set_current_vllm_config

    sys.path.insert(0, str(h.REPO / "tests" / "integration"))
    from vllm_batch import allocate_kv_cache, make_batch, make_builder, make_layer

    from tritonfa import flash_attn_varlen_func
    from tritonfa_vllm.backend import TritonFABackend, TritonFAImpl

    batch_size, seq_len, query_len = parse_case(case)
    hq, hk, d, bs = args.num_heads, args.num_kv_heads, args.head_size, args.block_size
    batch = make_batch([query_len] * batch_size, [seq_len - query_len] * batch_size, bs, device)
    md_common = batch.common
    dtype = torch.bfloat16
    layer = make_layer(device=device)
    scale = d**-0.5
    q = torch.randn(batch.num_query_tokens, hq, d, dtype=dtype, device=device)
    out = torch.empty_like(q)
    config = vllm_config(h.MODELS / "llama-3-8b", bs, device)
    rows: dict = {}

    with set_current_vllm_config(config):
        kv_cache = allocate_kv_cache(TritonFABackend, batch.num_blocks, bs, hk, d, "auto", dtype, device)
        kv_cache.normal_()
        impl = TritonFAImpl(hq, d, scale, hk, None, None, "auto")
        md = make_builder(TritonFABackend, device, block_size=bs, num_kv_heads=hk, head_size=d).build(0, md_common)
        key_cache, value_cache = impl._paged_kv(kv_cache)

        rows["CUSTOM forward"] = lambda: impl.forward(layer, q, None, None, kv_cache, md, out)

        def checked():
            impl._checked_call = None
            impl.forward(layer, q, None, None, kv_cache, md, out)

        rows["CUSTOM forward, checked"] = checked
        api_args = (q, key_cache, value_cache, md.max_query_len, md.query_start_loc, md.max_seq_len)
        api_kwargs = dict(seqused_k=md.seq_lens, block_table=md.block_table, softmax_scale=scale, causal=True, out=out)
        rows["tritonfa API"] = lambda: flash_attn_varlen_func(*api_args, **api_kwargs)
        op_args = (
            q, key_cache, value_cache, out, md.query_start_loc, None, md.seq_lens, md.block_table, None, None, None,
            None, None, None, None, md.max_query_len, md.max_seq_len, scale, -1, 0, 0.0, 0, False,
        )  # fmt: skip
        rows["tritonfa op"] = lambda: torch.ops.tritonfa.varlen_fwd(*op_args)
        from tritonfa.kernels.attention import attention_forward  # private: measured, not used by the backend

        launcher_args = op_args[:4] + (None,) + op_args[4:-1]  # lse = None; no return_lse flag
        rows["tritonfa launcher"] = lambda: attention_forward(*launcher_args)
        from tritonfa.kernels.attention import plan_attention

        def through_triton():
            for planned in plan_attention(*launcher_args):
                planned.fn[planned.grid](*planned.args, **planned.constexprs, **planned.options)

        rows["tritonfa launcher, Triton"] = through_triton
        rows["torch.add"] = lambda: torch.add(q, q, out=out)

        if args.vllm_rows and (hq, hk, d) == tuple(LLAMA_3_8B.values()):
            add_vllm_rows(rows, config, md_common, q, out, layer, scale, device)
        elif args.vllm_rows:
            rows["FLASH_ATTN forward (n/a)"] = "vLLM rows need the Llama-3-8B head layout (the builders read it)"
    return rows


def add_vllm_rows(rows: dict, config, md_common, q, out, layer, scale, device) -> None:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    sys.path.insert(0, str(h.REPO / "tests" / "integration"))
    from vllm_batch import allocate_kv_cache

    hq, hk, d = q.shape[1], LLAMA_3_8B["num_kv_heads"], q.shape[2]
    bs = config.cache_config.block_size
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=hk, head_size=d, dtype=q.dtype)
    num_blocks = int(md_common.block_table_tensor.max()) + 1
    for name, module, backend_cls in (
        ("FLASH_ATTN", "vllm.v1.attention.backends.flash_attn", "FlashAttentionBackend"),
        ("TRITON_ATTN", "vllm.v1.attention.backends.triton_attn", "TritonAttentionBackend"),
    ):
        try:
            import importlib

            backend = getattr(importlib.import_module(module), backend_cls)
            builder = backend.get_builder_cls()(spec, ["model.layers.0.self_attn.attn"], config, torch.device(device))
            md = builder.build(0, md_common)
            impl = backend.get_impl_cls()(hq, d, scale, hk, None, None, "auto")
            kv_cache = allocate_kv_cache(backend, num_blocks, bs, hk, d, "auto", q.dtype, device).normal_()
            rows[f"{name} forward"] = lambda impl=impl, kv_cache=kv_cache, md=md: impl.forward(
                layer, q, None, None, kv_cache, md, out
            )
        except Exception as e:  # a row that cannot run here is reported, not fatal
            rows[f"{name} forward (n/a)"] = f"{type(e).__name__}: {e}"
            continue
        if name != "FLASH_ATTN":
            continue
        try:
            from vllm.v1.attention.backends.fa_utils import flash_attn_varlen_func as fa_varlen

            key_cache, value_cache = kv_cache.unbind(1)
            descale_shape = (md.query_start_loc.shape[0] - 1, hk)
            fa_kwargs = dict(
                q=q, k=key_cache, v=value_cache, out=out, cu_seqlens_q=md.query_start_loc,
                max_seqlen_q=md.max_query_len, seqused_k=md.seq_lens, max_seqlen_k=md.max_seq_len,
                softmax_scale=scale, causal=True, alibi_slopes=None, window_size=[-1, -1],
                block_table=md.block_table, softcap=0.0, scheduler_metadata=md.scheduler_metadata,
                fa_version=impl.vllm_flash_attn_version, q_descale=None,
                k_descale=layer._k_scale.expand(descale_shape), v_descale=layer._v_scale.expand(descale_shape),
                num_splits=md.max_num_splits, s_aux=None,
            )  # fmt: skip
            rows["FA3 varlen"] = lambda fa_kwargs=fa_kwargs: fa_varlen(**fa_kwargs)
        except Exception as e:
            rows["FA3 varlen (n/a)"] = f"{type(e).__name__}: {e}"


def time_row(fn, calls: int, warmup: int, device: str, repeats: int = 1) -> dict:
    """Host and wall microseconds per call over `calls` back-to-back calls (and GPU time from CUDA events); with
    repeats > 1, the loop whose host time was lowest (the least disturbed by other work on the machine)."""
    import torch

    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        fn()
    best: dict = {}
    for _ in range(repeats):
        sync()
        start_event = end_event = None
        if cuda:
            start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_event.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        if cuda:
            end_event.record()
        sync()
        t2 = time.perf_counter()
        result = {"host_us": 1e6 * (t1 - t0) / calls, "wall_us": 1e6 * (t2 - t0) / calls}
        if cuda:
            result["gpu_us"] = 1e3 * start_event.elapsed_time(end_event) / calls
        if not best or result["host_us"] < best["host_us"]:
            best = result
    return best


def time_graph_replay(fn, calls: int) -> dict:
    import torch

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up outside the capture (compilation, allocations)
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        graph.replay()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return {"host_us": 1e6 * (t1 - t0) / calls, "wall_us": 1e6 * (t2 - t0) / calls}


def measure(cases, args, device: str) -> list[dict]:
    results = []
    for case in cases:
        rows = make_rows(case, args, device)
        for name in ROWS:
            if name == "CUSTOM graph replay":
                if device.startswith("cuda") and "CUSTOM forward" in rows and not args.stub_launcher:
                    timing = time_graph_replay(rows["CUSTOM forward"], args.calls)
                    results.append({"case": case, "row": name, **timing})
                continue
            if f"{name} (n/a)" in rows:
                results.append({"case": case, "row": name, "error": rows[f"{name} (n/a)"]})
            elif name in rows and not (args.stub_launcher and name.startswith(("tritonfa launcher", "torch.add"))):
                try:
                    timing = time_row(rows[name], args.calls, args.warmup, device, args.repeats)
                except Exception as exc:  # e.g. a peer backend that cannot run on this machine (FA3 on a CPU)
                    results.append({"case": case, "row": name, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                results.append({"case": case, "row": name, **timing})
    return results


def profile_rows(cases, args, device: str, path: Path) -> None:
    """Where the host time of a call goes: cProfile over `--calls` calls of each row that calls tritonfa."""
    import cProfile
    import io
    import pstats

    report = io.StringIO()
    for case in cases:
        rows = make_rows(case, args, device)
        for name in ("CUSTOM forward",) + (() if args.stub_launcher else ("tritonfa launcher",)):
            if name not in rows:
                continue
            for _ in range(args.warmup):
                rows[name]()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls):
                rows[name]()
            profiler.disable()
            report.write(f"\n===== {case}: {name}, {args.calls} calls =====\n")
            pstats.Stats(profiler, stream=report).sort_stats("tottime").print_stats(25)
    path.write_text(report.getvalue())
    print(f"written {path}")


def verdicts(results: list[dict]) -> dict:
    """Per case: CUSTOM forward host time against FA3 varlen host time + 20 us (None when FA3 did not run)."""
    out = {}
    for case in dict.fromkeys(r["case"] for r in results):
        by_row = {r["row"]: r for r in results if r["case"] == case and "host_us" in r}
        custom, fa3 = by_row.get("CUSTOM forward"), by_row.get("FA3 varlen")
        if custom is None or fa3 is None:
            out[case] = None
            continue
        limit = fa3["host_us"] + TARGET_MARGIN_US
        out[case] = {"custom_us": custom["host_us"], "limit_us": limit, "ok": custom["host_us"] <= limit}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cases", default=",".join(DEFAULT_CASES), help="b<batch>x<kv len>[q<query len>], comma-separated"
    )
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="timed loops per row; the fastest counts")
    parser.add_argument("--num-heads", type=int, default=LLAMA_3_8B["num_heads"])
    parser.add_argument("--num-kv-heads", type=int, default=LLAMA_3_8B["num_kv_heads"])
    parser.add_argument("--head-size", type=int, default=LLAMA_3_8B["head_size"])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--no-vllm-rows", dest="vllm_rows", action="store_false", help="tritonfa rows only")
    parser.add_argument("--smoke", action="store_true", help="CPU plumbing check: tiny shapes, 2 calls, no vLLM rows")
    parser.add_argument("--stub-launcher", action="store_true", help="no kernel launch: time the Python above it")
    parser.add_argument("--out", help="folder for hostcost.json (default ./hostcost-results)")
    parser.add_argument("--profile", action="store_true", help="cProfile of rows per case: hostcost_profile.txt")
    args = parser.parse_args(argv)
    h.setup_env()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        args.calls, args.warmup, args.repeats, args.vllm_rows = 2, 1, 1, False
        args.num_heads, args.num_kv_heads, args.head_size = 4, 2, 64
        if args.cases == ",".join(DEFAULT_CASES):
            args.cases = "b2x20,b1x24q8"
    elif device == "cpu" and not args.stub_launcher:
        raise SystemExit("hostcost.py measures GPU launches; on a CPU use --stub-launcher or --smoke")
    if args.stub_launcher:
        import tritonfa.interface

        tritonfa.interface.attention_forward = lambda *a, **k: None  # what the custom op's body calls
    info = {**h.gpu_info(query_device=True), "calls": args.calls, "warmup": args.warmup, "repeats": args.repeats}
    layout = f"{args.num_heads}q/{args.num_kv_heads}kv d{args.head_size} bf16 block {args.block_size}"
    if args.stub_launcher:
        layout += ", launcher stubbed out"
    print(f"hostcost: {layout}; {json.dumps(info)}", flush=True)

    results = measure(args.cases.split(","), args, device)
    checks = verdicts(results)
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["case"], r["row"], "-", "-", "-", r["error"][:80]])
        else:
            rows.append([r["case"], r["row"], round(r["host_us"], 1), round(r["wall_us"], 1),
                         round(r["gpu_us"], 1) if "gpu_us" in r else "-", ""])  # fmt: skip
    print(f"\nhost time per attention call, {args.calls} calls without sync ({layout}; {info.get('gpu', device)})")
    table = h.print_table(["case", "call", "host us", "wall us", "gpu us", "note"], rows)
    for case, v in checks.items():
        if v is None:
            print(f"{case}: no FA3 row, no verdict")
        else:
            print(f"{case}: CUSTOM forward {v['custom_us']:.1f} us host vs limit {v['limit_us']:.1f} us "
                  f"(FA3 varlen + {TARGET_MARGIN_US:.0f}): {'PASS' if v['ok'] else 'FAIL'}")  # fmt: skip
    if args.profile:
        profile_rows(args.cases.split(","), args, device, h.out_dir("hostcost", args.out) / "hostcost_profile.txt")
    path = h.out_dir("hostcost", args.out) / "hostcost.json"
    path.write_text(json.dumps({"info": info, "layout": layout, "results": results, "verdicts": checks,
                                "table": table}, indent=1))  # fmt: skip
    print(f"written {path}")
    finite = all(math.isfinite(r.get("host_us", 0.0)) for r in results)
    return 0 if finite and all(v is None or v["ok"] for v in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
