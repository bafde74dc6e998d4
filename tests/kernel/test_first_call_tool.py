"""kernel/scripts/first_call.py: its timers see a real compile's parts in the installed triton (a renamed hook or
entry point would silently report 0 s, as cProfile did for `triton.compile` on the H200 host in session 18)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# An sm_90 compile of a small kernel with the tool's timers on (no GPU needed: Triton ships ptxas). In a fresh
# process without TRITON_INTERPRET: under the interpreter @triton.jit makes no compilable function.
CODE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("first_call", sys.argv[1])
tool = importlib.util.module_from_spec(spec); spec.loader.exec_module(tool)
compiles = []
seconds = tool.instrument(compiles)
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(x_ptr + o, tl.load(x_ptr + o, mask=o < n) + 1, mask=o < n)

src = triton.compiler.ASTSource(fn=add_one, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                constexprs={"BLOCK": 128})
triton.compiler.compile(src, target=GPUTarget("cuda", 90, 32))
print(json.dumps(dict(seconds=dict(seconds), kernels=tool.kernel_timeline(compiles, compiles[0]["start"] - 1.0))))
"""


def test_the_timers_see_every_stage_of_a_compile(tmp_path):
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    script = tmp_path / "compile_with_timers.py"  # @triton.jit needs its source in a file
    script.write_text(CODE)
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")  # empty: every stage runs
    run = subprocess.run(
        [sys.executable, str(script), str(REPO / "kernel" / "scripts" / "first_call.py")],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    timed = json.loads(run.stdout.strip().splitlines()[-1])
    seconds = timed["seconds"]
    stages = ("TTIR", "TTGIR", "LLVM IR", "PTX", "ptxas")
    for stage in (*stages, "triton.compile"):
        assert seconds.get(stage, 0.0) > 0.0, (stage, seconds)
    assert sum(seconds[stage] for stage in stages) <= seconds["triton.compile"], seconds
    # the per-kernel timeline: this compile's name, its place after the (1 s earlier) call start, its own stages
    [kernel] = timed["kernels"]
    assert kernel["kernel"] == "add_one", kernel
    assert abs(kernel["start_s"] - 1.0) < 1e-6 and kernel["seconds"] > 0.0
    assert abs(kernel["end_s"] - kernel["start_s"] - kernel["seconds"]) < 1e-6, kernel
    for stage in stages:
        assert kernel["stages_s"][stage] == seconds[stage], (stage, kernel, seconds)
    assert abs(sum(kernel["stages_s"].values()) - kernel["seconds"]) < 1e-6, kernel


def test_cross_compile_mode_compiles_a_first_calls_kernels_for_sm_90(tmp_path):
    """--cross-compile (no GPU): the decode workload's first call on an H200 plans one portable-kernel launch; it is
    compiled for sm_90 here with every backend stage timed, and written to first_call.json."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, str(REPO / "kernel" / "scripts" / "first_call.py"), "--cross-compile",
         "--only", "decode-b64x2048-paged", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    [row] = json.loads((tmp_path / "first_call.json").read_text())
    assert row["workload"] == "decode-b64x2048-paged" and row["cross_compile"] == "sm_90"
    assert [kernel["kernel"] for kernel in row["kernels"]] == ["attention_fwd_kernel"]
    assert row["kernels"][0]["regs"] > 0 and row["compile_s"] > 0.0
    for stage in ("LLVM IR", "PTX", "ptxas"):
        assert row["stages_s"][stage] > 0.0, row["stages_s"]
    assert "decode-b64x2048-paged" in run.stdout and "sm_90 compile" in run.stdout


def test_kernel_timeline_orders_side_by_side_compiles_by_start():
    """Two kernels compiled side by side: listed in the order they started, offsets from the call's start, each
    one's front end the part of its compile outside its timed stages."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_call", REPO / "kernel" / "scripts" / "first_call.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    compiles = [
        dict(kernel="late", start=10.5, end=12.0, stages_s={"LLVM IR": 1.0}),
        dict(kernel="early", start=10.2, end=14.2, stages_s={"LLVM IR": 1.5, "ptxas": 2.0}),
    ]
    early, late = tool.kernel_timeline(compiles, call_start=10.0)
    assert (early["kernel"], late["kernel"]) == ("early", "late")
    assert (
        abs(early["start_s"] - 0.2) < 1e-9 and abs(early["end_s"] - 4.2) < 1e-9 and abs(early["seconds"] - 4.0) < 1e-9
    )
    assert abs(early["stages_s"]["front end"] - 0.5) < 1e-9 and abs(late["stages_s"]["front end"] - 0.5) < 1e-9
    assert list(early["stages_s"]) == ["front end", "LLVM IR", "ptxas"]


def test_unknown_workload_names_are_refused_up_front(capsys):
    import importlib.util

    import pytest

    spec = importlib.util.spec_from_file_location("first_call", REPO / "kernel" / "scripts" / "first_call.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with pytest.raises(SystemExit) as exit_info:
        tool.main(["--only", "prefill-b8x2048-causal,^prefill-nothing$", "--cross-compile"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--only" in err and "'^prefill-nothing$'" in err and "'prefill-b8x2048-causal'" not in err, err


def test_anchored_entries_select_workloads_by_pattern():
    """gpu_session.sh passes '+' between --only entries, so a name with a '+' in it is reached by a pattern."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("first_call", REPO / "kernel" / "scripts" / "first_call.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    known = ["prefill-b8x2048-causal", "prefill-b8x2048-causal-paged", "fp8-prefill-b8x2048-causal-paged",
             "mixed-4x512+60-paged"]  # fmt: skip
    assert tool.select_workloads("^mixed", known) == (["mixed-4x512+60-paged"], [])
    assert tool.select_workloads("prefill-b8x2048-causal", known) == (["prefill-b8x2048-causal"], []), "exact"
    assert tool.select_workloads("causal-paged$,^prefill-b8x2048-causal$", known) == (
        ["prefill-b8x2048-causal-paged", "fp8-prefill-b8x2048-causal-paged", "prefill-b8x2048-causal"],
        [],
    )
    assert tool.select_workloads("mixed,^x", known) == ([], ["mixed", "^x"]), "a bare part of a name is no name"
