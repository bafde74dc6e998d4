"""The benchmark's CPU modes, its work accounting and its reuse by asv (no GPU needed).

`python -m tritonfa.bench` runs in a subprocess: on the CPU it re-executes itself with TRITON_INTERPRET=1, which
must be set before tritonfa's kernels are decorated, so it cannot share this process.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from attn_testing import ON_GPU

from tritonfa.bench import make_case
from tritonfa.bench.workloads import WORKLOADS, Workload, select, smoke_scaled, visible_pairs

REPO = Path(__file__).resolve().parents[2]
KERNEL_SRC = REPO / "kernel" / "src"
ROW_KEYS = {"workload", "impl", "status", "ms", "tflops", "gbps", "error", "ok", "ratio", "timer", "reason"}


def run_bench(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # let the bench switch the interpreter on itself, as it does for users
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(KERNEL_SRC), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "tritonfa.bench", "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(0, 5), (5, 0), (1, 1), (1, 9), (7, 7), (4, 11), (9, 4), (33, 64)])
def test_visible_pairs_counts_bottom_right_causal_mask(seqlen_q, seqlen_k, causal):
    brute_force = sum(
        1
        for i in range(seqlen_q)
        for j in range(seqlen_k)
        if not causal or j <= i + seqlen_k - seqlen_q  # query i sits on key i + Lk - Lq
    )
    assert visible_pairs(seqlen_q, seqlen_k, causal) == brute_force


def test_workload_flops_and_bytes():
    by_name = {w.name: w for w in WORKLOADS}
    prefill = by_name["prefill-b8x2048-causal"]
    assert prefill.flops == 4 * 128 * 32 * 8 * (2048 * 2049 // 2)
    decode = by_name["decode-b64x2048-paged"]
    kv_bytes = 64 * 2048 * 8 * 128 * 2 * 2  # K and V, bf16
    q_and_out_bytes = 2 * 64 * 32 * 128 * 2
    assert decode.bytes_moved == kv_bytes + q_and_out_bytes
    fp8_decode = by_name["fp8kv-decode-b64x2048-paged"]
    assert fp8_decode.bytes_moved == kv_bytes // 2 + q_and_out_bytes
    mixed = by_name["mixed-4x512+60-paged"]
    assert mixed.visible_pairs == 4 * sum(2048 + i + 1 for i in range(512)) + 60 * 2048
    assert {w.metric for w in WORKLOADS} == {"tflops", "gbps", "ms"}


def test_workload_names_are_unique_and_selectable():
    names = [w.name for w in WORKLOADS]
    assert len(set(names)) == len(names)
    assert [w.name for w in select(WORKLOADS, ["decode"])] == [n for n in names if "decode" in n]
    assert select(WORKLOADS, []) == list(WORKLOADS)


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_smoke_scaled_keeps_the_features(workload: Workload):
    tiny = smoke_scaled(workload)
    same = ("kind", "head_dim", "causal", "q_dtype", "kv_dtype", "paged", "block_size", "name")
    assert all(getattr(tiny, field) == getattr(workload, field) for field in same)
    assert (tiny.num_q_heads > tiny.num_kv_heads) == (workload.num_q_heads > workload.num_kv_heads)
    assert tiny.total_q <= 200 and tiny.max_seqlen_k <= 512
    if workload.kind == "mixed":
        assert 1 in tiny.seqlens_q and tiny.max_seqlen_q > 16  # decodes and prefill-shaped rows, as on the GPU


def test_cases_keep_the_workload_dtypes():
    """bf16 stays bf16 on the CPU too: the interpreter runs it correctly once tritonfa.interpreter_fixes is applied."""
    by_name = {w.name: w for w in WORKLOADS}
    case = make_case(smoke_scaled(by_name["prefill-b8x2048-causal"]), torch.device("cpu"))
    assert case.q.dtype == case.k_tokens.dtype == case.out_dtype == torch.bfloat16
    fp8 = make_case(smoke_scaled(by_name["fp8kv-decode-b64x2048-paged"]), torch.device("cpu"))
    assert fp8.q.dtype == torch.bfloat16 and fp8.k_cache.dtype == torch.float8_e4m3fn


def test_asv_loads_this_checkouts_bench_beside_the_installed_tritonfa():
    """asv_bench measures every commit with this checkout's bench package, loaded under a private name with the oracle
    it imports relatively; `tritonfa` (the commit under test) is left alone."""
    path = REPO / "asv_bench" / "benchmarks" / "_common.py"
    spec = importlib.util.spec_from_file_location("_asv_common_under_test", path)
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    bench = common.harness()
    assert bench.__name__ == f"{common.MEASURING}.bench"
    assert bench.WORKLOADS is common.WORKLOADS  # one workloads module: discovery and measuring agree
    assert bench.cases.attention_reference.__module__ == f"{common.MEASURING}.reference"
    assert bench.peers.prepare is bench.prepare and bench.QUICK_REPS.rep_ms < bench.FULL_REPS.rep_ms
    import tritonfa.reference

    assert tritonfa.reference.attention_reference is not bench.cases.attention_reference  # left alone, not swapped


# These exercise the CPU modes (smoke check, interpreter dry run), which a GPU host never takes by itself; there the
# benchmark proper runs instead (`python -m tritonfa.bench`, kernel/scripts/gpu_verify.sh, the CI bench steps).
cpu_mode_only = pytest.mark.skipif(ON_GPU, reason="tests the bench's CPU modes; run the suite on the CPU for them")


@cpu_mode_only
def test_cpu_smoke_check_passes():
    result = run_bench()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No GPU" in result.stderr
    assert "smoke check passed" in result.stdout
    assert result.stdout.count("rel. L2 error") == 2


@cpu_mode_only
@pytest.mark.slow
def test_cpu_dry_run_writes_table_json_and_png(tmp_path):
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    only = "prefill-b8x2048-causal,varlen,fp8kv-decode,mixed"  # the first also matches the fp8 / fp8-KV variants
    peers = "sdpa-math,flex,fa3"
    result = run_bench("--dry-run", "--quick", "--only", only, "--peers", peers, "--json", str(json_path),
                       "--png", str(png_path))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr

    document = json.loads(json_path.read_text())
    assert set(document) >= {"schema", "header", "ceilings", "workloads", "rows", "summary"}
    assert set(document["header"]) >= {"device", "mode", "date", "commit", "torch", "triton", "vllm", "timers"}
    assert set(document["ceilings"]) >= {"copy_gbps", "bf16_matmul_tflops", "fp8_scaled_mm_tflops"}
    workloads = [w["name"] for w in document["workloads"]]
    assert workloads == [w.name for w in select(WORKLOADS, only.split(","))] and len(workloads) >= 6
    assert all(w["flops"] > 0 and w["bytes_moved"] > 0 for w in document["workloads"])
    rows = {(r["workload"], r["impl"]): r for r in document["rows"]}
    assert set(rows) == {(w, impl) for w in workloads for impl in ("tritonfa", *peers.split(","))}
    assert all(set(r) >= ROW_KEYS for r in rows.values())

    for name in workloads:
        ours = rows[(name, "tritonfa")]
        assert ours["status"] == "ok" and ours["ok"], ours
        assert ours["ms"] > 0 and ours["tflops"] > 0 and ours["gbps"] > 0 and ours["error"] >= 0
        fa3 = rows[(name, "fa3")]
        assert fa3["status"] == "unsupported" and fa3["ms"] is None and fa3["reason"]
    dense = rows[("prefill-b8x2048-causal", "sdpa-math")]
    assert dense["ok"] and dense["ratio"] > 0
    assert rows[("prefill-varlen16-causal", "flex")]["ok"]  # packed sequences with a document mask
    assert rows[("mixed-4x512+60-paged", "sdpa-math")]["status"] == "unsupported"
    assert rows[("fp8-prefill-b8x2048-causal", "sdpa-math")]["status"] == "unsupported"
    assert rows[("prefill-b8x2048-causal", "tritonfa")]["best_peer"] in ("sdpa-math", "flex")

    assert "tritonfa bench" in result.stdout and f"[{len(workloads)}/{len(workloads)}]" in result.stderr
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no PNG" in result.stderr
    else:
        assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_triton_startup_is_one_launch_of_a_trivial_kernel(device):
    """The bench times Triton's one-time start-up apart from every workload's first call: one launch, its seconds."""
    from tritonfa.bench.timing import _add_one, triton_startup_s

    seconds = triton_startup_s(torch.device(device))
    assert isinstance(seconds, float) and 0.0 <= seconds < 120.0
    x = torch.full((1,), 41.0, device=device)
    _add_one[(1,)](x)
    assert x.item() == 42.0, "the start-up kernel ran"
