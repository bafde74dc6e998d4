"""Decode latency-bound or bandwidth-bound? Time paged decode at fixed KV split counts (same inputs, CUDA graphs).

    python kernel/scripts/split_probe.py [workload names...]

If more splits (more programs, more loads in flight) speed up a batch that already fills the GPU with programs, the
loop is latency-bound, not bandwidth-bound.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

import tritonfa  # noqa: E402
from tritonfa.bench import FULL_REPS, make_case, reference_check, time_cuda_graph  # noqa: E402
from tritonfa.bench.workloads import WORKLOADS  # noqa: E402

names = sys.argv[1:] or ["decode-b64x2048-paged", "fp8kv-decode-b64x2048-paged", "decode-b256x1024-paged"]
for name in names:
    w = next(x for x in WORKLOADS if x.name == name)
    case = make_case(w, torch.device("cuda"))
    check = reference_check(case)
    for splits in (1, 2, 4, 8):

        def run(splits=splits):
            return tritonfa.flash_attn_varlen_func(
                case.q, case.k_cache, case.v_cache, w.max_seqlen_q, case.cu_seqlens_q, w.max_seqlen_k,
                seqused_k=case.seqused_k, block_table=case.block_table, causal=True, num_splits=splits,
                q_descale=case.q_descale, k_descale=case.k_descale, v_descale=case.v_descale,
            )  # fmt: skip

        error = check.error(run())
        ms = time_cuda_graph(run, FULL_REPS)
        print(
            f"{name:30s} splits {splits}: {ms:.4f} ms {w.bytes_moved / ms / 1e6:6.0f} GB/s err {error:.1e}", flush=True
        )
