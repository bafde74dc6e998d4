"""Kernel benchmarks: tritonfa and its reference lines (cuDNN SDPA, FlexAttention, FA3, vLLM unified_attention) on
`tritonfa.bench.workloads`.

One measurement per (workload, impl) and commit, shared by the three metric classes through one `setup_cache`
(asv runs a setup_cache once per source location): milliseconds for every workload, TFLOP/s where compute is the
headline (prefill, mixed), GB/s where memory is (decode, mixed), as in `python -m tritonfa.bench`'s table.
Parameters are the workload names of `tritonfa.bench.workloads.WORKLOADS` (no second copy of shapes) and the impl;
combinations that cannot run here (no GPU, a peer without fp8 or paging, ...) are skipped, not failed.
"""

from __future__ import annotations

from ._common import IMPLS, KIND, WORKLOAD_NAMES, kernel_row, measure_kernels

# Bump when what the numbers mean changes (shapes of a workload, timer, FLOP or byte accounting): asv then leaves
# results recorded under the old version off the site. Without an explicit version asv would hash the source, and
# any edit of this file would hide the whole history. A new workload in tritonfa.bench.workloads needs no bump.
VERSION = "1"


class _Kernel:
    params = [WORKLOAD_NAMES, list(IMPLS)]
    param_names = ["workload", "impl"]
    timeout = 600  # per track call: they only read the cache
    version = VERSION
    metric = ""

    def setup_cache(self):
        return measure_kernels()

    setup_cache.timeout = 3600  # the whole suite for one commit (GPU: FlexAttention compiles dominate)

    def setup(self, cache, workload, impl):
        self.row = kernel_row(cache, workload, impl, self.metric)


class KernelTime(_Kernel):
    """Median kernel time per call (GPU: CUDA events; cpu-smoke: wall clock of the interpreter)."""

    metric = "ms"
    unit = "ms"

    def track_ms(self, cache, workload, impl):
        return self.row["ms"]


class KernelTFLOPs(_Kernel):
    """TFLOP/s over the visible (query, key) pairs (causal counts half): prefill and mixed workloads."""

    params = [[name for name in WORKLOAD_NAMES if KIND[name] != "decode"], list(IMPLS)]
    metric = "tflops"
    unit = "TFLOP/s"

    def track_tflops(self, cache, workload, impl):
        return self.row["tflops"]


class KernelBandwidth(_Kernel):
    """GB/s of K/V read once per sequence plus q and the output: decode and mixed workloads."""

    params = [[name for name in WORKLOAD_NAMES if KIND[name] != "prefill"], list(IMPLS)]
    metric = "gbps"
    unit = "GB/s"

    def track_gbps(self, cache, workload, impl):
        return self.row["gbps"]
