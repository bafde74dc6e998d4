"""Where the end-to-end gap to FLASH_ATTN goes: one prefill-heavy step and one decode step of the latency workload,
profiled with torch.profiler inside the engine, CUSTOM next to FLASH_ATTN.

The workload is latency.py's (dummy Llama-3-8B, batch 64, prompts of 2048 tokens, prefix caching off, vLLM's
defaults otherwise: torch.compile + CUDA graphs), with async scheduling off so that one `LLMEngine.step()` is one
batch. After a warm-up generate, 64 prompts are added; the first step (the scheduler fills its token budget with
prefill chunks) is profiled, the engine steps on until every request has its first token, and one pure decode step
(64 sequences of ~2048 tokens) is profiled.

Per step and backend the summary holds:
- step wall time (host, synchronized) and the GPU's busy time (union of kernel intervals): the difference is time
  the GPU waited for the host;
- attention kernel time, total and per layer (kernels named like the backend's: tritonfa's attention_fwd_kernel /
  combine_splits_kernel, FA3's flash fwd kernels and their scheduler), and the KV-cache write;
- host time per attention call: the CPU time of vLLM's `unified_attention_with_output` op (everything the backend's
  forward does on the host, kernel launch included) and of `unified_kv_cache_update`, per call. In the decode step
  the whole forward is one CUDA graph replay, so no attention op appears on the host (that is the point);
- the top kernels by GPU time.

GPU machine, vLLM 0.24.0; two engines one after the other, ~4 min:

    python integration/scripts/step_profile.py                   # CUSTOM and FLASH_ATTN, vLLM defaults
    python integration/scripts/step_profile.py --eager           # without CUDA graphs / torch.compile
    python integration/scripts/step_profile.py --trace           # also the chrome traces (large)

Writes step_profile[_eager].json and .md (the tables) in --out (default ./step_profile-results).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import _harness as h

# Kernel-name fragments per role (lower case). Anything else is "other".
ATTENTION_KERNELS = {
    # the portable kernel, the split combine, Hopper's Gluon prefill and decode, the fp8 K/V widening copy
    "CUSTOM": (
        "attention_fwd_kernel",
        "combine_splits_kernel",
        "attention_fwd_hopper_kernel",
        "attention_decode_hopper_kernel",
        "widen_kv_kernel",
    ),
    "FLASH_ATTN": ("flash_fwd", "flashattnfwd", "flash::", "prepare_varlen", "flash_attn"),
    "TRITON_ATTN": ("kernel_unified_attention", "reduce_segments"),
}
KV_WRITE_KERNELS = ("reshape_and_cache",)
ATTENTION_OPS = ("unified_attention_with_output",)
KV_UPDATE_OPS = ("unified_kv_cache_update",)


def kernel_role(name: str, backend: str) -> str:
    low = name.lower()
    if any(k in low for k in KV_WRITE_KERNELS):
        return "kv_write"
    if any(k in low for k in ATTENTION_KERNELS.get(backend, ())):
        return "attention"
    return "other"


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (us)."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize(records: list[dict], backend: str, num_layers: int, wall_us: float) -> dict:
    """records: {"name", "device": "cuda"|"cpu", "start", "dur"} (us). Returns the step summary (see the docstring)."""
    kernels = [r for r in records if r["device"] == "cuda"]
    roles: dict = {"attention": [], "kv_write": [], "other": []}
    for k in kernels:
        roles[kernel_role(k["name"], backend)].append(k)
    by_name: dict = {}
    for k in kernels:
        entry = by_name.setdefault(k["name"], [0, 0.0])
        entry[0] += 1
        entry[1] += k["dur"]
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:12]

    def ops(names):
        calls = [r["dur"] for r in records if r["device"] == "cpu" and any(n in r["name"] for n in names)]
        return {"calls": len(calls), "mean_us": sum(calls) / len(calls) if calls else None,
                "max_us": max(calls) if calls else None}  # fmt: skip

    attention_us = sum(k["dur"] for k in roles["attention"])
    gpu_busy = busy_time([(k["start"], k["start"] + k["dur"]) for k in kernels])
    return {
        "wall_us": wall_us,
        "gpu_busy_us": gpu_busy,
        "gpu_idle_us": max(wall_us - gpu_busy, 0.0),
        "kernels": len(kernels),
        "kernel_us": sum(k["dur"] for k in kernels),
        "attention_kernels": len(roles["attention"]),
        "attention_us": attention_us,
        "attention_us_per_layer": attention_us / num_layers,
        "kv_write_us_per_layer": sum(k["dur"] for k in roles["kv_write"]) / num_layers,
        "attention_op_host": ops(ATTENTION_OPS),
        "kv_update_op_host": ops(KV_UPDATE_OPS),
        "top_kernels": [{"name": n[:90], "calls": c, "us": round(t, 1)} for n, (c, t) in top],
    }


def profiler_records(prof) -> list[dict]:
    """torch.profiler events as plain records: kernels (device 'cuda') and CPU ops (device 'cpu')."""
    from torch.autograd import DeviceType

    records = []
    for event in prof.events():
        device = (
            "cuda" if event.device_type == DeviceType.CUDA else "cpu" if event.device_type == DeviceType.CPU else None
        )
        if device is None:
            continue
        start, end = event.time_range.start, event.time_range.end
        records.append({"name": event.name, "device": device, "start": float(start), "dur": float(end - start)})
    return records


# ------------------------------------------------------------------------------------------------- worker


def worker(args) -> None:
    h.setup_env()
    import numpy as np
    import torch

    import tritonfa_vllm

    tritonfa_vllm.register()
    from vllm import LLM, SamplingParams

    model = h.resolve_model(args.model)
    num_layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    engine_kwargs = dict(
        model=str(model), load_format="dummy", skip_tokenizer_init=True, attention_backend=args.backend,
        kv_cache_dtype=args.kv_cache_dtype, enable_prefix_caching=False, enforce_eager=args.eager, seed=0,
        async_scheduling=False,
    )  # fmt: skip
    llm = LLM(**engine_kwargs)
    in_use = h.backends_in_use(llm)
    engine = llm.llm_engine
    rng = np.random.RandomState(0)
    warm = SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": rng.randint(10000, size=256).tolist()} for _ in range(8)], warm, use_tqdm=False)

    # long enough that no request finishes while the last prompts are still being prefilled
    params = SamplingParams(temperature=1.0, max_tokens=args.output_len, ignore_eos=True, detokenize=False)
    for i in range(args.batch_size):
        engine.add_request(f"p{i}", {"prompt_token_ids": rng.randint(10000, size=args.input_len).tolist()}, params)

    def profiled_step(label: str) -> dict:
        torch.cuda.synchronize()
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            t0 = time.perf_counter()
            outputs = engine.step()
            torch.cuda.synchronize()
            wall_us = 1e6 * (time.perf_counter() - t0)
        if args.trace:
            prof.export_chrome_trace(str(Path(args.trace_dir) / f"trace_{args.backend}_{label}.json"))
        summary = summarize(profiler_records(prof), args.backend, num_layers, wall_us)
        summary["outputs"] = len(outputs)
        return summary

    started: set = set()

    def note(outputs) -> None:
        for out in outputs:
            if out.outputs and out.outputs[0].token_ids:
                started.add(out.request_id)

    result = {"gpu": h.gpu_name(), "backend": args.backend, "backends_in_use": in_use, "num_layers": num_layers}
    result["prefill_step"] = profiled_step("prefill")
    steps = 1
    while len(started) < args.batch_size and steps < 10_000:  # run the remaining prefill chunks
        note(engine.step())
        steps += 1
    for _ in range(2):  # settle into decode-only batches
        engine.step()
    result["prefill_steps"] = steps
    result["decode_step"] = profiled_step("decode")
    while engine.has_unfinished_requests():
        engine.step()
    Path(args.result).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------------------- report


def report(results: list[dict]) -> tuple[str, list[list]]:
    rows = []
    for res in results:
        if "error" in res:
            rows.append([res["backend"], "-", res["error"], *["-"] * 8])
            continue
        for step in ("prefill_step", "decode_step"):
            s = res[step]
            op = s["attention_op_host"]
            rows.append([
                res["backend"], step.split("_")[0], round(s["wall_us"] / 1e3, 2), round(s["gpu_busy_us"] / 1e3, 2),
                round(s["gpu_idle_us"] / 1e3, 2), s["attention_kernels"], round(s["attention_us_per_layer"], 1),
                round(s["kv_write_us_per_layer"], 1), op["calls"],
                round(op["mean_us"], 1) if op["mean_us"] is not None else "-",
                round(s["kernel_us"] / 1e3, 2),
            ])  # fmt: skip
    header = ["backend", "step", "wall ms", "gpu busy ms", "gpu idle ms", "attn kernels", "attn us/layer",
              "kv write us/layer", "attn ops", "host us/attn op", "all kernels ms"]  # fmt: skip
    return h.print_table(header, rows), rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default="CUSTOM,FLASH_ATTN")
    parser.add_argument("--model", default="llama-3-8b")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=2048)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--eager", action="store_true", help="enforce_eager: no CUDA graphs, no torch.compile")
    parser.add_argument("--trace", action="store_true", help="export chrome traces of the two steps")
    parser.add_argument("--timeout", type=float, default=400, help="seconds per engine")
    parser.add_argument("--out", help="folder for the results (default ./step_profile-results)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--trace-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    h.setup_env()
    info = h.gpu_info()
    out = h.out_dir("step_profile", args.out)
    import tempfile

    logs = Path(tempfile.mkdtemp(prefix="step-profile-logs-"))
    shared = [f"--model={args.model}", f"--kv-cache-dtype={args.kv_cache_dtype}", f"--batch-size={args.batch_size}",
              f"--input-len={args.input_len}", f"--output-len={args.output_len}", f"--trace-dir={out}"]  # fmt: skip
    shared += ["--eager"] * args.eager + ["--trace"] * args.trace
    results = []
    for backend in args.backends.split(","):
        res = h.run_worker(
            Path(__file__), [*shared, "--backend", backend], logs / f"{backend}.json", args.timeout,
            logs / f"{backend}.log",
        )  # fmt: skip
        res.setdefault("backend", backend)
        print(f"  {backend}: {res.get('error', 'ok')} (wall {res['wall_s']} s)", flush=True)
        results.append(res)
    info["gpu"] = next((r["gpu"] for r in results if r.get("gpu")), None)
    mode = "eager" if args.eager else "vLLM defaults (torch.compile + CUDA graphs)"
    title = (f"one prefill-heavy and one decode step, {args.model} dummy, bs {args.batch_size}, in {args.input_len}, "
             f"kv {args.kv_cache_dtype}, {mode}; {info.get('gpu')}")  # fmt: skip
    print(f"\n{title}")
    table, _ = report(results)
    tops = []
    for res in results:
        for step in ("prefill_step", "decode_step"):
            if step in res:
                lines = [f"  {k['us']:>10.1f} us  {k['calls']:>5}x  {k['name']}" for k in res[step]["top_kernels"]]
                tops.append(f"{res['backend']} {step.split('_')[0]}: top kernels\n" + "\n".join(lines))
    print("\n\n".join(tops))
    suffix = "_eager" if args.eager else ""
    (out / f"step_profile{suffix}.json").write_text(
        json.dumps({"info": info, "args": vars(args), "results": results, "table": table}, indent=1)
    )
    (out / f"step_profile{suffix}.md").write_text(f"{title}\n\n{table}\n\n" + "\n\n".join(tops) + "\n")
    print(f"written {out / f'step_profile{suffix}.json'} and .md")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
