"""Side-by-side attention benchmark, a tool beside the library: `python -m tritonfa.bench [--only SUBSTR] [--quick]
[--json P] [--png P]` (`--help` lists the rest).

On a GPU, in one process and on the same inputs, it times tritonfa against the peers that are importable (torch
SDPA, FlexAttention, FlashAttention-3 from the vLLM bundle, vLLM's Triton `unified_attention`). Every result is
first checked against `tritonfa.reference` (fp32 on the GPU; big shapes on a subset of sequences and heads); a peer
that cannot run a workload shows "—" and the reason. TFLOP/s count only the visible (query, key) pairs; GB/s count
the K/V bytes each sequence reads plus q and the output. The copy bandwidth and matmul throughput measured in the
same run are printed as ceilings.

Without a GPU it says so and runs a tiny smoke check of the kernel in Triton's interpreter against the reference
(exit status 1 if they disagree). `--dry-run` instead runs every workload at a tiny scale through the whole
pipeline (checks, table, JSON, PNG); on the CPU its timings are wall clock of the interpreter, not performance.

Modules, one job each: `workloads` (the shapes, as plain data), `cases` (their input tensors and the reference
check), `peers` (tritonfa and each peer behind `prepare(impl, case)`), `timing` (timers and ceilings), `runner`
(the loop over workloads and impls), `report` (header, table, JSON, chart), `__main__` (the command line).

Reuse (asv_bench): shapes are `WORKLOADS`; `make_case(workload, device)` builds the inputs, `prepare(impl,
case).run` is the call to time, `reference_check(case).error(out)` the check, `run_workloads` all of it. The
measuring side imports the library's oracle and interpreter fixes relatively (`..reference`) and the kernel under
test absolutely (`import tritonfa`), so asv can load this package from the checkout next to the installed
`tritonfa` of an older commit and measure every commit alike.
"""

from .cases import FP8_DESCALE, TOLERANCE_16BIT, TOLERANCE_FP8, Case, ReferenceCheck, make_case, reference_check
from .errors import Unsupported
from .peers import DEFAULT_GPU_PEERS, IMPLS, PEERS, Prepared, prepare
from .runner import Row, run_impl, run_workloads
from .timing import FULL_REPS, QUICK_REPS, Reps, measure, measure_ceilings, time_cpu, time_cuda_graph, time_events
from .workloads import WORKLOADS, Workload, select, smoke_scaled

__all__ = [
    "DEFAULT_GPU_PEERS",
    "FP8_DESCALE",
    "FULL_REPS",
    "IMPLS",
    "PEERS",
    "QUICK_REPS",
    "TOLERANCE_16BIT",
    "TOLERANCE_FP8",
    "WORKLOADS",
    "Case",
    "Prepared",
    "ReferenceCheck",
    "Reps",
    "Row",
    "Unsupported",
    "Workload",
    "make_case",
    "measure",
    "measure_ceilings",
    "prepare",
    "reference_check",
    "run_impl",
    "run_workloads",
    "select",
    "smoke_scaled",
    "time_cpu",
    "time_cuda_graph",
    "time_events",
]
