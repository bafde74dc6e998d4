"""What does paging cost? The same prefill and decode shapes contiguous and paged at several block sizes.

    python kernel/scripts/paging_probe.py

Each row: tritonfa's time (do_bench for prefill, CUDA graphs for decode) and its error against tritonfa.reference.
"""

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from tritonfa.bench import FULL_REPS, make_case, reference_check, run_impl  # noqa: E402
from tritonfa.bench.workloads import WORKLOADS  # noqa: E402

by_name = {w.name: w for w in WORKLOADS}
shapes = [by_name["prefill-b8x2048-causal"], by_name["decode-b64x2048-paged"], by_name["fp8kv-decode-b64x2048-paged"]]
for base in shapes:
    layouts = [("contiguous", dataclasses.replace(base, paged=False, name=base.name + "-contiguous"))]
    layouts += [(f"paged bs{bs}", dataclasses.replace(base, paged=True, block_size=bs)) for bs in (16, 64, 256)]
    for label, w in layouts:
        case = make_case(w, torch.device("cuda"))
        row = run_impl("tritonfa", case, reference_check(case), FULL_REPS)
        metric = f"{row.tflops or 0:6.1f} TFLOP/s" if w.kind == "prefill" else f"{row.gbps or 0:6.0f} GB/s"
        print(f"{base.name:30s} {label:12s} {row.status:6s} {row.ms or 0:.4f} ms {metric} err {row.error}", flush=True)
        del case
        torch.cuda.empty_cache()
