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
