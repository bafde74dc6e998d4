"""kernel/scripts/variants.py: a filter that selects nothing stops it with exit status 2 and says which entry, before
any GPU work (a regular expression given where it takes substrings once cost a GPU session its A/B step)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "kernel" / "scripts"


def load_tool():
    spec = importlib.util.spec_from_file_location("variants", SCRIPTS / "variants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["variants"] = module
    spec.loader.exec_module(module)
    return module


tool = load_tool()


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--plan", "decode", "--only", "^fp8(kv)?-decode-b64x2048-paged$"], "fp8(kv)?"),
        (["--plan", "decode", "--only", "b64x2048,no-such-workload"], "no-such-workload"),
        (["--plan", "decode", "--variants", "default,no-such-variant"], "no-such-variant"),
        (["--plan", "no-such-plan"], "no-such-plan"),
    ],
)
def test_a_filter_that_selects_nothing_is_an_error(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tool.main([*argv, "--out", "/nonexistent/never-written"])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_anchored_substrings_select_workloads():
    names = tool.PLANS["decode"][0]
    assert [n for n in names if tool.matches(n, "^fp8-decode-b8x32768-paged$")] == ["fp8-decode-b8x32768-paged"]
    assert {n for n in names if tool.matches(n, "fp8")} >= {"fp8kv-decode-b64x2048-paged", "fp8-decode-b64x2048-paged"}


def test_rotated_rounds_put_every_run_in_every_place():
    """--order rotate (the default): no run always first - session 33 saw two different kernels each +0.89% in every
    round they ran right after the default; fixed: the list's order every round."""
    runs = ["fa3", "default", "x", "y"]
    rotated = tool.round_schedule(runs, 8)
    assert len(rotated) == 32 and all(sorted(r for _, _, r in rotated[i : i + 4]) == sorted(runs) for i in (0, 4, 28))
    for run in runs:
        places = [position for _, position, r in rotated if r == run]
        assert sorted(places) == [0, 0, 1, 1, 2, 2, 3, 3], run
    assert [r for _, _, r in rotated[4:8]] == ["default", "x", "y", "fa3"] and rotated[4][:2] == (1, 0)
    fixed = tool.round_schedule(runs, 3, "fixed")
    assert [r for _, _, r in fixed] == runs * 3 and [p for _, p, _ in fixed] == [0, 1, 2, 3] * 3
    assert tool.round_schedule([], 3) == [] and len(tool.round_schedule(["default"], 0)) == 1


def test_every_planned_workload_is_defined():
    """A plan's workload with no definition would stop the run at its first round, on the GPU."""
    from tritonfa.bench.workloads import WORKLOADS

    known = {w.name for w in WORKLOADS} | set(tool.DIAGNOSTIC_WORKLOADS)
    missing = [name for names, _ in tool.PLANS.values() for name in names if name not in known]
    assert not missing
    assert not set(tool.DIAGNOSTIC_WORKLOADS) & {w.name for w in WORKLOADS}, "a diagnostic shape shadows the bench's"
