"""How long the vLLM backend's warm-up compiles, for one layer configuration (Llama-3-8B: 32 q / 8 kv heads, head
size 128, bf16, pages of 16 tokens).

The backend (tritonfa_vllm.backend.TritonFAImpl._warm_up) makes one call per kernel-variant bucket: a decode with
the KV range split, 2 x SMs decodes, one prefill, a prefill beside a decode. `--mode calls`: the calls one after
the other, each compiling its own new kernels (side by side within the call: plan_cache's first call), as the
warm-up did before session 46; `--mode together` (what it does now): every variant of all the calls compiled side by
side first (tritonfa.interface.compile_varlen_fwd), then the calls. Each mode runs in a fresh process with an empty
Triton cache, after Triton's one-time start-up (as first_call.py).

    python kernel/scripts/warm_up_compile.py [--mode calls,together]                  # GPU
    python kernel/scripts/warm_up_compile.py --cross-compile [--mode calls,together]  # no GPU: sm_90, on this CPU

--cross-compile plans the calls for an H200 (132 SMs) on meta tensors and compiles their variants for sm_90 here
(ci/crosscompile.py), threads as above; without loading or running anything. One line per mode.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from first_call import run_worker, sm90_specs  # noqa: E402 - a script beside this one

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
H200_SMS = 132


def buckets(num_sms: int) -> list[list[int]]:
    """The query lengths of the warm-up's calls (backend._warm_up_calls; tests/integration checks they agree)."""
    from tritonfa.configs import DECODE_MAX_SEQLEN_Q

    return [[1], [1] * (2 * num_sms), [DECODE_MAX_SEQLEN_Q + 1], [DECODE_MAX_SEQLEN_Q + 1, 1]]


def warm_up_calls(device, num_sms: int) -> list[tuple]:
    """`varlen_fwd` arguments of the warm-up's calls for the layer: q a view of a fused qkv projection, K/V views of
    a [2, blocks, page, Hk, D] cache, every block id 0 (as the backend's synthetic calls)."""
    import torch

    cache = torch.zeros((2, 64, PAGE, NUM_KV_HEADS, HEAD_DIM), dtype=torch.bfloat16, device=device)
    width = (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    calls = []
    for query_lens in buckets(num_sms):
        tokens, max_len = sum(query_lens), max(query_lens)
        q = torch.zeros((tokens, width), dtype=torch.bfloat16, device=device)[:, : NUM_Q_HEADS * HEAD_DIM]
        q = q.view(tokens, NUM_Q_HEADS, HEAD_DIM)
        out = torch.empty((tokens, NUM_Q_HEADS, HEAD_DIM), dtype=torch.bfloat16, device=device)
        lens = torch.tensor(query_lens, dtype=torch.int32, device=device)
        cu_seqlens_q = torch.zeros(len(query_lens) + 1, dtype=torch.int32, device=device)
        if device != "meta":
            cu_seqlens_q[1:] = lens.cumsum(0)
        block_table = torch.zeros((len(query_lens), -(-max_len // PAGE)), dtype=torch.int32, device=device)
        max_seqlen_k = 1 << 30 if query_lens == [1] else max_len  # the split variant a long context would use
        calls.append((
            q, cache[0], cache[1], out, cu_seqlens_q, None, lens, block_table, None, None, None, None, None, None,
            None, max_len, max_seqlen_k, HEAD_DIM**-0.5, -1, 0, 0.0, 0, False,
        ))  # fmt: skip
    return calls


def measure(mode: str) -> dict:
    """In this (fresh) process, on the GPU: the warm-up's wall time in `mode`."""
    import torch

    from tritonfa.bench.timing import triton_startup_s
    from tritonfa.interface import compile_varlen_fwd, varlen_fwd_eager
    from tritonfa.kernels.attention import _multiprocessor_count

    device = torch.device("cuda")
    torch.zeros(1, device=device)
    triton_startup_s(device)
    calls = warm_up_calls(device, _multiprocessor_count(device))
    torch.cuda.synchronize()
    start = time.perf_counter()
    if mode == "together":
        compile_varlen_fwd(calls)
    compiled_s = time.perf_counter() - start
    for args in calls:
        varlen_fwd_eager(*args)
    torch.cuda.synchronize()
    return dict(mode=mode, device=torch.cuda.get_device_name(), wall_s=time.perf_counter() - start,
                compile_varlen_fwd_s=compiled_s if mode == "together" else None)  # fmt: skip


def cross_compile(mode: str) -> dict:
    """In this (fresh) process, no GPU: the warm-up's variants planned for an H200 and compiled for sm_90 here."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ci"))
    import crosscompile
    import tritonfa.kernels as kernels
    from tritonfa.kernels import attention

    attention._multiprocessor_count = lambda device: H200_SMS
    per_call: list[dict] = []  # per call: its variants no earlier call had (launch.py's key -> spec)
    seen: set = set()
    for args in warm_up_calls("meta", H200_SMS):
        specs = sm90_specs(kernels.plan_attention(*args[:4], None, *args[4:-1], arch="hopper"))
        per_call.append({key: spec for key, spec in specs.items() if key not in seen})
        seen |= specs.keys()
    groups = (
        [list(new.values()) for new in per_call] if mode == "calls" else [[s for n in per_call for s in n.values()]]
    )
    start = time.perf_counter()
    results = []
    for group in groups:
        with ThreadPoolExecutor(max_workers=max(1, len(group))) as pool:
            results += list(pool.map(lambda spec: crosscompile.compile_one("sm_90", spec), group))
    wall = time.perf_counter() - start
    failed = [f"{r.name}: {r.error}" for r in results if not r.ok]
    if failed:
        raise RuntimeError("did not compile for sm_90: " + "; ".join(failed))
    return dict(
        mode=mode, cross_compile="sm_90", wall_s=wall, variants=[(r.name, round(r.seconds, 2)) for r in results]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="calls,together", help="comma-separated: calls, together")
    parser.add_argument("--cross-compile", action="store_true", help="no GPU: compile the variants for sm_90 here")
    parser.add_argument("--out", default=".")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(cross_compile(args.worker) if args.cross_compile else measure(args.worker)))
        return 0
    modes = args.mode.split(",")
    if not set(modes) <= {"calls", "together"}:
        parser.error(f"--mode takes calls and/or together, got {args.mode!r}")
    rows = []
    for mode in modes:
        row = run_worker(__file__, [mode] + (["--cross-compile"] if args.cross_compile else []))
        if row is None:
            continue
        rows.append(row)
        where = "sm_90 cross-compile" if args.cross_compile else row["device"]
        detail = row["variants"] if args.cross_compile else f"compile_varlen_fwd {row['compile_varlen_fwd_s']}"
        print(f"warm-up {mode:<9} {row['wall_s']:.2f} s ({where}; {detail})", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "warm_up_compile.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if len(rows) == len(modes) else 1


if __name__ == "__main__":
    sys.exit(main())
