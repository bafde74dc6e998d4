"""The seed's end-to-end latency benchmark for CUSTOM (tritonfa), FLASH_ATTN (FA3) and TRITON_ATTN in one go.

Same workload as the seed PR's `benchmark_latency.py` / `vllm bench latency`: dummy Llama-3-8B weights, batch 64,
input 2048 random token ids, output 128 (ignore_eos, temperature 1, no detokenization), 2 warm-up and 5 measured
iterations of `LLM.generate`, prefix caching off, CUDA graphs and torch.compile at vLLM's defaults. One engine per
(kv-cache dtype, backend), each in its own process, one after the other.

A GPU host with vLLM 0.24.0 (integration/README.md, "GPU scripts"); one engine takes ~1.5 min on an H200, so the
two kv-cache dtypes can run as two calls:

    python integration/scripts/latency.py --kv-cache-dtypes auto
    python integration/scripts/latency.py --kv-cache-dtypes fp8

Prints a table (average latency, ratio to FLASH_ATTN) and writes latency_<kv dtypes>.json into --out (default
./latency-results). Anchors on an H200 (vLLM 0.24.0): FLASH_ATTN 4.283 s, TRITON_ATTN 5.067 s; fp8 KV 4.151 s and
5.344 s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _harness as h

ANCHORS_H200 = {("FLASH_ATTN", "auto"): 4.283, ("TRITON_ATTN", "auto"): 5.067,
                ("FLASH_ATTN", "fp8"): 4.151, ("TRITON_ATTN", "fp8"): 5.344}  # fmt: skip


def worker(args) -> None:
    h.setup_env()
    import numpy as np

    import tritonfa_vllm

    tritonfa_vllm.register()
    from vllm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(
        model=str(h.resolve_model(args.model)),
        load_format="dummy",
        skip_tokenizer_init=True,
        attention_backend=args.backend,
        kv_cache_dtype=args.kv_cache_dtype,
        enable_prefix_caching=False,
        tensor_parallel_size=args.tensor_parallel_size,
        seed=0,
    )
    init_s = time.perf_counter() - start
    in_use = h.backends_in_use(llm)
    params = SamplingParams(
        n=1, temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=args.output_len, detokenize=False
    )
    token_ids = np.random.RandomState(0).randint(10000, size=(args.batch_size, args.input_len))
    prompts = [{"prompt_token_ids": row} for row in token_ids.tolist()]

    def once() -> float:
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, sampling_params=params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == args.output_len for o in outputs)
        return elapsed

    warmup = [once() for _ in range(args.warmup)]
    latencies = [once() for _ in range(args.iters)]
    result = {
        "gpu": h.gpu_name(),
        "backend": args.backend,
        "kv_cache_dtype": args.kv_cache_dtype,
        "backends_in_use": in_use,
        "init_s": round(init_s, 1),
        "warmup_s": [round(x, 4) for x in warmup],
        "latencies_s": [round(x, 4) for x in latencies],
        "avg_latency_s": float(np.mean(latencies)),
        "p50_s": float(np.percentile(latencies, 50)),
        "p90_s": float(np.percentile(latencies, 90)),
    }
    Path(args.result).write_text(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(h.BACKENDS), help="comma-separated (default: all three)")
    parser.add_argument("--kv-cache-dtypes", default="auto,fp8", help="comma-separated (default: auto,fp8)")
    parser.add_argument("--model", default="llama-3-8b", help="folder with config.json, or a name in models/")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=2048)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=400, help="seconds per engine")
    parser.add_argument("--out", help="folder for the JSON result (default ./latency-results)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--kv-cache-dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    h.setup_env()
    info = h.gpu_info()
    workload = {k: getattr(args, k) for k in ("model", "batch_size", "input_len", "output_len", "warmup", "iters",
                                              "tensor_parallel_size")}  # fmt: skip
    print(f"latency: {json.dumps(workload)}; {json.dumps(info)}", flush=True)
    logs = Path(tempfile.mkdtemp(prefix="latency-logs-"))
    shared = [f"--{k.replace('_', '-')}={v}" for k, v in workload.items() if k not in ("warmup", "iters")]
    shared += [f"--warmup={args.warmup}", f"--iters={args.iters}"]
    kv_dtypes = args.kv_cache_dtypes.split(",")
    results = []
    for kv in kv_dtypes:
        for backend in args.backends.split(","):
            tag = f"{backend}.{kv}"
            res = h.run_worker(
                Path(__file__), [*shared, "--backend", backend, "--kv-cache-dtype", kv],
                logs / f"{tag}.json", args.timeout, logs / f"{tag}.log",
            )  # fmt: skip
            res.setdefault("backend", backend)
            res.setdefault("kv_cache_dtype", kv)
            status = res.get("error") or f"{res['avg_latency_s']:.3f} s"
            print(f"  {tag}: {status} (engine {res.get('init_s', '-')} s, wall {res['wall_s']} s)", flush=True)
            results.append(res)

    info["gpu"] = next((r["gpu"] for r in results if r.get("gpu")), None)
    rows = []
    for res in results:
        kv = res["kv_cache_dtype"]
        fa = next((r for r in results if r["backend"] == "FLASH_ATTN" and r["kv_cache_dtype"] == kv
                   and "avg_latency_s" in r), None)  # fmt: skip
        avg = res.get("avg_latency_s")
        ratio = avg / fa["avg_latency_s"] if avg and fa else None
        res["vs_flash_attn"] = ratio
        rows.append([
            res["backend"], kv, avg, res.get("p50_s"), ratio, ANCHORS_H200.get((res["backend"], kv)),
            res.get("init_s"), ",".join(res.get("backends_in_use", [])) or res.get("error", ""),
        ])  # fmt: skip
    print(f"\nlatency, {info.get('gpu')}: Llama-3-8B dummy, bs {args.batch_size}, in {args.input_len}, "
          f"out {args.output_len}, {args.warmup} warm-up + {args.iters} iterations, prefix caching off")  # fmt: skip
    table = h.print_table(
        ["backend", "kv", "avg s", "p50 s", "/ FLASH_ATTN", "H200 anchor s", "engine init s", "in use"], rows
    )
    path = h.out_dir("latency", args.out) / f"latency_{'_'.join(kv_dtypes)}.json"
    path.write_text(json.dumps({"info": info, "workload": workload, "results": results, "table": table}, indent=1))
    # the engines' own logs (vLLM's warnings, e.g. a Triton JIT compile during inference) next to the result
    shutil.copytree(logs, path.with_suffix(".logs"), dirs_exist_ok=True)
    print(f"written {path}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
