"""kernel/scripts/mask_cost.py (issue 14): its unbounded copy of kernel/src computes what the library computes for
valid inputs, a kernel that no longer holds a pattern stops it, and its pipeline runs end to end (CPU dry run).

The copy is a second `tritonfa` package, so it runs in a subprocess (PYTHONPATH=copy) on the inputs this process
hands it; this process computes the same calls with the tree's tritonfa.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from attn_testing import ON_GPU, make_inputs, random_bias, run_kernel

REPO = Path(__file__).resolve().parents[2]
TOOL_PATH = REPO / "kernel" / "scripts" / "mask_cost.py"


def load_tool():
    spec = importlib.util.spec_from_file_location("mask_cost", TOOL_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = load_tool()

# NaN-poisoned torch.empty as in tests/conftest.py, so a row the copy leaves unwritten shows up
CHILD = """
import sys
from pathlib import Path

import torch

root, device, calls_path, out_path = sys.argv[1:]
import tritonfa
assert Path(root).resolve() in Path(tritonfa.__file__).resolve().parents, tritonfa.__file__
if device == "cpu":
    from tritonfa.interpreter_fixes import patch_triton_interpreter

    patch_triton_interpreter()
empty = torch.empty


def poisoned_empty(*args, **kwargs):
    tensor = empty(*args, **kwargs)
    return tensor.fill_(float("nan")) if tensor.dtype.is_floating_point and "out" not in kwargs else tensor


torch.empty = poisoned_empty
calls = torch.load(calls_path, map_location=device)
torch.save([tritonfa.flash_attn_varlen_func(*args, **kwargs) for args, kwargs in calls], out_path)
"""


def test_unbounded_copy_matches_the_library(tmp_path, device):
    root = tool.build_unbounded_tree(tmp_path)
    for path, what, old, new in tool.REPLACEMENTS:
        text = (root / path).read_text()
        assert old not in text and new in text, what
    assert (root / "tritonfa" / "bench" / "__main__.py").is_file()

    paged = make_inputs([37, 1], [83, 50], kv_layout="paged", block_size=16)
    decode = make_inputs([1, 1, 1], [70, 33, 0], kv_layout="paged", block_size=16)
    contiguous = make_inputs([37, 20], [37, 83])
    calls = [
        (paged, dict(causal=True, return_softmax_lse=True)),
        (decode, dict(causal=True, num_splits=4)),  # split-KV: the lse buffer the copy leaves uninitialized
        (contiguous, dict(causal=True, bias=random_bias(contiguous, False, True))),  # bias reads, k/q clamps
    ]
    expected = [run_kernel(inputs, **kwargs) for inputs, kwargs in calls]
    portable = [(inputs.args(), dict(kwargs, block_table=inputs.block_table)) for inputs, kwargs in calls]
    torch.save(portable, tmp_path / "calls.pt")

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), device, str(tmp_path / "calls.pt"), str(tmp_path / "out.pt")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    actual = torch.load(tmp_path / "out.pt", map_location=device)
    # the same arithmetic in the same order: bit for bit in the interpreter; a GPU may schedule differently
    tolerance = {} if device == "cuda" else dict(atol=0, rtol=0)
    for (_, kwargs), want, got in zip(calls, expected, actual):
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        for w, g in zip(want, got):
            torch.testing.assert_close(g, w, equal_nan=False, **tolerance, msg=f"call with {sorted(kwargs)}")


def test_check_prints_every_replacement(capsys):
    assert tool.main(["--check"]) == 0
    diff = capsys.readouterr().out
    for _, what, old, new in tool.REPLACEMENTS:
        assert any(line.startswith("-") and old in line for line in diff.splitlines()), what
        assert any(line.startswith("+") and new in line for line in diff.splitlines()), what


def test_a_pattern_not_found_once_stops_the_tool(tmp_path, monkeypatch, capsys):
    original = (tool.KERNEL_SRC / tool.ATTENTION).read_text()
    _, first_what, first_old, _ = tool.REPLACEMENTS[0]
    with pytest.raises(tool.SetupError, match="occurs 0 times"):
        tool.unbounded_text(tool.ATTENTION, original.replace(first_old, "i_page = i_page"))
    _, what, old, _ = tool.REPLACEMENTS[-1]
    with pytest.raises(tool.SetupError, match="occurs 2 times") as raised:
        tool.unbounded_text(tool.ATTENTION, original + old)
    assert what in str(raised.value)

    # the command line says which pattern and exits with 2, for --check and before any measurement
    src = tmp_path / "src"
    (src / tool.ATTENTION).parent.mkdir(parents=True)
    (src / tool.ATTENTION).write_text(original.replace(first_old, "i_page = i_page"))
    (src / tool.HOPPER).write_text((tool.KERNEL_SRC / tool.HOPPER).read_text())
    monkeypatch.setattr(tool, "KERNEL_SRC", src)
    assert tool.main(["--check"]) == 2
    assert first_what in capsys.readouterr().err
    assert tool.main(["--device", "cpu", "--rounds", "1", "--out", str(tmp_path / "out")]) == 2
    assert first_what in capsys.readouterr().err
    assert not (tmp_path / "out" / "mask_cost.json").exists()


@pytest.mark.skipif(ON_GPU, reason="runs the bench's CPU mode (the interpreter); the CPU suite runs it")
def test_cpu_dry_run_end_to_end(tmp_path):
    """Two bench processes (one round, one tiny workload) in the interpreter; the report has both sides."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, str(TOOL_PATH), "--device", "cpu", "--quick", "--rounds", "1",
         "--only", "decode-b64x2048-paged", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "mask_cost.json").read_text())
    assert report["rounds_done"] == 1 and report["header"]["interpreter"] is True
    (row,) = report["results"]
    assert row["workload"] == "decode-b64x2048-paged" and not row["failures"]
    assert row["bounded_median_ms"] > 0 and row["unbounded_median_ms"] > 0 and row["ratio"] > 0
    assert "| decode-b64x2048-paged |" in (tmp_path / "mask_cost.md").read_text()
    unbounded = json.loads((tmp_path / "runs" / "unbounded-r0.json").read_text())
    assert unbounded["header"]["commit"].endswith("-unbounded")
