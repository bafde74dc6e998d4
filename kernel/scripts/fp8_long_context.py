"""fp8 q/k/v non-causal prefill over long key ranges: how far the output drifts from the float64 reference, per
config variant.

Hopper's fp8 MMA keeps 13 mantissa bits of the accumulator it adds into, so an output chained through every key block's
fp8 P@V (one-level, as ws-three-consumers-p-smem-one-level runs it) can shrink block by block; the default and
`ws_fp8_three_consumers` add each block's product in fp32 (two-level). V of mean 1 makes a shrink show in the output's
mean. Per (keys, variant): the output's mean over the reference's, the max-norm error, and the same error of the PyTorch
low-precision reference (bf16 emulation, fp8 P per key block) for scale. The interpreter's model of the accumulator
predicts the one-level mean at 0.9965 / 0.9938 / 0.9769 of the reference's at 4k / 8k / 32k keys (kernel/PERF_NOTES.md,
session 38); the H100 measured 0.928 / 0.855 / 0.602 (session 39).

    python kernel/scripts/fp8_long_context.py [--keys 4096,8192,32768] [--variants default,ws-fp8-three-consumers]
        [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from variants import PREFILL_VARIANTS  # noqa: E402

from tritonfa import flash_attn_varlen_func  # noqa: E402
from tritonfa.reference import attention_reference  # noqa: E402

FP8 = torch.float8_e4m3fn


def make_case(num_keys: int, num_queries: int, num_heads: tuple[int, int], head_size: int, device: str, seed: int):
    """One sequence of num_queries queries over num_keys keys: q and K random, V = 1 + 0.1 N(0, 1), all e4m3."""
    gen = torch.Generator(device=device).manual_seed(seed)
    hq, hk = num_heads
    q = torch.randn(num_queries, hq, head_size, device=device, generator=gen).to(FP8)
    k = torch.randn(num_keys, hk, head_size, device=device, generator=gen).to(FP8)
    v = (1.0 + 0.1 * torch.randn(num_keys, hk, head_size, device=device, generator=gen)).to(FP8)
    cu_q = torch.tensor([0, num_queries], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, num_keys], dtype=torch.int32, device=device)
    return (q, k, v, num_queries, cu_q, num_keys, cu_k)


def max_norm_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def run_variant(case: tuple, variant: str) -> torch.Tensor:
    """The non-causal call under the variant's TRITONFA_CONFIG override (as variants.py applies it)."""
    config = PREFILL_VARIANTS[variant]
    if config:
        os.environ["TRITONFA_CONFIG"] = json.dumps(config)
    try:
        return flash_attn_varlen_func(*case, causal=False)
    finally:
        os.environ.pop("TRITONFA_CONFIG", None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", default="4096,8192,32768", help="key counts, comma-separated")
    parser.add_argument("--variants", default="default,ws-fp8-three-consumers,ws-three-consumers-p-smem-one-level",
                        help="variants.py PREFILL_VARIANTS names, comma-separated")  # fmt: skip
    parser.add_argument("--queries", type=int, default=192)
    parser.add_argument("--heads", default="8,2", help="q heads, kv heads")
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="folder for fp8_long_context.json")
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":  # a CPU run: the interpreter's fp8 casts need the fixes
        from tritonfa.interpreter_fixes import patch_triton_interpreter

        patch_triton_interpreter()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in PREFILL_VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(PREFILL_VARIANTS)}")
    num_heads = tuple(int(h) for h in args.heads.split(","))
    rows = []
    print(f"{'keys':>6} {'variant':36} {'mean / ref':>10} {'max-norm err':>12} {'low-prec ref err':>16}")
    for num_keys in (int(n) for n in args.keys.split(",")):
        case = make_case(num_keys, args.queries, num_heads, args.head_size, args.device, args.seed)
        ref = attention_reference(*case, causal=False)
        low = attention_reference(*case, causal=False, emulate_dtype=torch.bfloat16, fp8_p_round_trip=FP8,
                                  fp8_p_to_max=True)  # fmt: skip
        low_error = max_norm_error(low, ref)
        for variant in variants:
            out = run_variant(case, variant)
            if not torch.isfinite(out).all():
                raise SystemExit(f"{variant} at {num_keys} keys: non-finite output")
            row = dict(keys=num_keys, variant=variant, mean_ratio=(out.double().mean() / ref.mean()).item(),
                       error=max_norm_error(out, ref), low_precision_error=low_error)  # fmt: skip
            rows.append(row)
            print(f"{num_keys:>6} {variant:36} {row['mean_ratio']:>10.5f} {row['error']:>12.3e} {low_error:>16.3e}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
        (args.out / "fp8_long_context.json").write_text(json.dumps(dict(device=device, rows=rows), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
