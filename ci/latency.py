#!/usr/bin/env python3
"""End-to-end vLLM latency: the seed's benchmark, for several attention backends in one go (GPU only).

Llama-3-8B architecture with dummy weights (no download), batch 64, input 2048, output 128, 2 warm-up and 5 timed
iterations, prefix caching off (or repeated iterations would hit the cache). Each (backend, KV-cache dtype) runs in
its own process so GPU memory is returned between runs. Prints a table and writes JSON.

    python ci/latency.py                                   # CUSTOM, FLASH_ATTN, TRITON_ATTN x auto, fp8 KV
    python ci/latency.py --backends CUSTOM --kv auto --batch 8 --input-len 512 --output-len 32
The vLLM plugin `tritonfa-vllm` must be installed (its entry point registers the CUSTOM backend).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

# meta-llama/Meta-Llama-3-8B's config.json (architecture only: weights are dummy, the tokenizer is skipped)
LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def run_one(args: argparse.Namespace) -> dict:
    """In a child process: build the engine for one backend and time generate()."""
    import numpy as np
    import torch
    from vllm import LLM, SamplingParams

    model_dir = args.model
    if model_dir is None:
        model_dir = tempfile.mkdtemp(prefix="llama3-8b-dummy-")
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(LLAMA3_8B, f)
    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        enable_prefix_caching=False,
        attention_backend=args.backend,
        kv_cache_dtype=args.kv,
        max_model_len=args.input_len + args.output_len,
        max_num_seqs=args.batch,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        seed=0,
    )
    rng = np.random.default_rng(0)
    prompts = [
        {"prompt_token_ids": rng.integers(0, 10000, size=args.input_len).tolist()} for _ in range(args.batch)
    ]  # fmt: skip
    params = SamplingParams(temperature=1.0, ignore_eos=True, max_tokens=args.output_len, detokenize=False)
    for _ in range(args.warmup):
        llm.generate(prompts, params, use_tqdm=False)
    times = []
    for _ in range(args.iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {
        "backend": args.backend,
        "kv_cache_dtype": args.kv,
        "latency_s": times,
        "avg_s": sum(times) / len(times),
        "p50_s": sorted(times)[len(times) // 2],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs="+", default=["CUSTOM", "FLASH_ATTN", "TRITON_ATTN"])
    p.add_argument("--kv", nargs="+", default=["auto", "fp8"], help="kv_cache_dtype values")
    p.add_argument("--model", help="model dir (default: Llama-3-8B config, dummy weights)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--input-len", type=int, default=2048)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--json", default="artifacts/latency.json")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:
        args.kv = args.kv[0]
        print("RESULT " + json.dumps(run_one(args)), flush=True)
        return 0

    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_USE_FLASHINFER_SAMPLER="0")
    env.pop("TRITON_INTERPRET", None)
    rows = []
    for kv in args.kv:
        for backend in args.backends:
            cmd = [sys.executable, __file__, "--child", "--backend", backend, "--kv", kv]
            for name in ("model", "batch", "input_len", "output_len", "warmup", "iters", "gpu_memory_utilization"):
                value = getattr(args, name)
                if value is not None:
                    cmd += ["--" + name.replace("_", "-"), str(value)]
            if args.enforce_eager:
                cmd.append("--enforce-eager")
            print(f"== {backend} kv={kv}", flush=True)
            proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
            result = next((json.loads(x[7:]) for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or result is None:
                print(proc.stdout[-4000:])
                result = {"backend": backend, "kv_cache_dtype": kv, "error": f"exit {proc.returncode}"}
            rows.append(result)

    import torch

    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    print(f"\nvLLM latency, {card}: batch {args.batch}, in {args.input_len}, out {args.output_len}, "
          f"{args.iters} iterations after {args.warmup} warm-up")  # fmt: skip
    print(f"{'backend':<14} {'kv cache':<8} {'avg s':>8} {'p50 s':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:<14} {r['kv_cache_dtype']:<8} {'FAILED (' + r['error'] + ')':>17}")
        else:
            print(f"{r['backend']:<14} {r['kv_cache_dtype']:<8} {r['avg_s']:>8.3f} {r['p50_s']:>8.3f}")
    import vllm

    meta = {"card": card, "vllm": vllm.__version__, "torch": torch.__version__, "host": platform.node(),
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "backend")}}  # fmt: skip
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": rows}, f, indent=1)
    print(f"wrote {args.json}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
