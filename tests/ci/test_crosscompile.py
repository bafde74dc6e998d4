"""ci/crosscompile.py against small kernels of our own (tests/ci/ci_test_kernels.py), for all three targets.

The real configurations are compiled by `nox -s crosscompile`; these tests check the script itself: success
reports shared memory and registers per target, and every kind of failure fails the run.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "crosscompile.py"
HERE = Path(__file__).resolve().parent


def run(*args: str, tmp_path: Path) -> tuple[int, str, dict | None]:
    out_json = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out_json), "--jobs", "1", *args],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    report = json.loads(out_json.read_text()) if out_json.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, report


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return run("--specs", "ci_test_kernels:cross_compile_specs", tmp_path=tmp_path_factory.mktemp("good"))


def test_compiles_every_config_for_every_target(good):
    rc, out, report = good
    assert rc == 0, out
    results = report["results"]
    assert {(r["arch"], r["name"]) for r in results} == {
        (arch, name)
        for arch in ("gfx942", "gfx950", "sm_90")
        for name in ("tile_attention_m64_n32_w4", "tile_attention_m128_n64_w8")
    }
    for r in results:
        assert r["ok"], r
        assert r["shared"] > 0 and r["shared"] <= r["shared_limit"]
        assert r["regs"] and r["regs"] > 0, f"no register count for {r['name']} on {r['arch']}"
    warps = {r["name"]: r["num_warps"] for r in results}
    assert warps == {"tile_attention_m64_n32_w4": 4, "tile_attention_m128_n64_w8": 8}, "options were not applied"
    assert "6/6 compiled for gfx942, gfx950, sm_90" in out
    assert "shared B" in out, "the report table is printed"


def test_compile_error_fails_the_run_and_names_the_config(tmp_path):
    rc, out, report = run("--arch", "sm_90", "gfx942", "--specs", "ci_test_kernels:broken_specs", tmp_path=tmp_path)
    assert rc == 1
    assert "FAIL broken on sm_90" in out and "FAIL broken on gfx942" in out
    assert "CompilationError" in out or "Error" in out
    ok = {(r["arch"], r["name"]) for r in report["results"] if r["ok"]}
    assert ok == {("sm_90", "tile_attention_m64_n32_w4"), ("gfx942", "tile_attention_m64_n32_w4")}, "others still ran"


def test_signature_mismatch_is_reported(tmp_path):
    rc, out, _ = run("--arch", "gfx950", "--specs", "ci_test_kernels:bad_signature_specs", tmp_path=tmp_path)
    assert rc == 1
    assert "missing ['sm_scale']" in out


def test_missing_provider_exits_2(tmp_path):
    rc, out, _ = run("--specs", "no_such_module_xyz:cross_compile_specs", tmp_path=tmp_path)
    assert rc == 2
    assert "cannot load the config provider" in out


def test_no_configs_is_a_failure(tmp_path):
    rc, out, _ = run("--specs", "ci_test_kernels:empty_specs", tmp_path=tmp_path)
    assert rc == 1
    assert "no configs" in out


def test_shared_memory_over_the_limit_fails(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    crosscompile = importlib.import_module("crosscompile")
    kernels = importlib.import_module("ci_test_kernels")
    backend, arch, warps, _, family = crosscompile.TARGETS["sm_90"]
    monkeypatch.setitem(crosscompile.TARGETS, "sm_90", (backend, arch, warps, 1024, family))
    result = crosscompile.compile_one("sm_90", kernels.cross_compile_specs("hopper")[0])
    assert not result.ok
    assert "shared memory" in result.error and result.shared > 1024


def test_spills_count_the_stack_frame(monkeypatch):
    """A kernel that moves registers between warp groups (setmaxnreg: the Gluon kernels) spills into its stack frame
    with LOCAL 0: cuobjdump lines as sm_90 printed them for the Gluon decode before and after such a spill."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    crosscompile = importlib.import_module("crosscompile")
    spilled = "Function k:REG:64 STACK:32 SHARED:1024 LOCAL:0 CONSTANT[0]:1136 TEXTURE:0 SURFACE:0 SAMPLER:0"
    assert crosscompile._parse_cuda_resources(spilled) == (64, 32)
    assert crosscompile._parse_cuda_resources(spilled.replace("STACK:32", "STACK:0")) == (64, 0)
    assert crosscompile._parse_cuda_resources("Function k:REG:255 STACK:0 SHARED:0 LOCAL:40") == (255, 40)
    assert crosscompile._parse_cuda_resources("") == (None, None)
