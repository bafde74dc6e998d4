"""asv_bench/record.py's planning for the GPU: which commits get the reference lines, in which order they run, how
the staged kernel reaches asv's benchmark processes, and that the parallel warm-up stops at its time limit.
Standard library only (the warm-up runs a stand-in for Python): `pytest --noconftest tests/asv`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASV_BENCH = ROOT / "asv_bench"


def load_record():
    sys.path.insert(0, str(ASV_BENCH))  # record.py imports results_store next to it
    try:
        spec = importlib.util.spec_from_file_location("_tritonfa_asv_record", ASV_BENCH / "record.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ASV_BENCH))
    return module


record = load_record()
SHAS = [f"{i}" * 40 for i in range(1, 6)]  # oldest first, as commits.json lists them


def test_select_commits():
    assert record.select_commits(SHAS, None, "--commits") == SHAS
    assert record.select_commits(SHAS, "newest", "--peers-at") == SHAS[-1:]
    assert record.select_commits(SHAS, "none", "--peers-at") == []
    assert record.select_commits(SHAS, "2222,4444", "--commits") == [SHAS[1], SHAS[3]]
    assert record.select_commits(SHAS, "2222,9999", "--commits") is None


def test_plan_puts_the_peers_first_then_the_newest():
    plan = record.plan_commits(SHAS, [SHAS[-1]], None)
    assert plan == [(SHAS[4], None)] + [(sha, "tritonfa") for sha in reversed(SHAS[:4])]
    assert all(impls == "flex" for _, impls in record.plan_commits(SHAS, [SHAS[-1]], "flex"))


def test_the_staged_kernel_comes_first_for_asv_and_its_children():
    env = record.commit_env({"PYTHONPATH": "/opt/site"}, SHAS[0], "tritonfa")
    staged = str(record.STAGE / "kernels" / SHAS[0] / "kernel" / "src")
    # asv 0.6.6's benchmark runner keeps only ASV_PYTHONPATH's entries; subprocesses read PYTHONPATH
    assert env["ASV_PYTHONPATH"] == env["PYTHONPATH"] == os.pathsep.join([staged, "/opt/site"])
    assert env["TRITONFA_ASV_IMPLS"] == "tritonfa"
    assert "TRITONFA_ASV_IMPLS" not in record.commit_env({}, SHAS[0], None)


def test_warm_up_runs_in_parallel_and_stops_at_its_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "STAGE", tmp_path)
    fake = tmp_path / "python"
    # stands in for `python record.py warm --label X`: commit 1 finishes, the others would take a minute
    fake.write_text('#!/usr/bin/env bash\ncase "$PYTHONPATH" in *1111111111*) echo "warm done"; exit 0;; esac\n'
                    'echo started; exec sleep 60\n')  # fmt: skip
    fake.chmod(0o755)
    plan = [(sha, "tritonfa") for sha in SHAS[:3]]
    began = time.monotonic()
    record.warm_up(str(fake), plan, dict(os.environ), jobs=3, timeout_s=3)
    took = time.monotonic() - began
    assert took < 30, f"the warm-up did not stop its processes at the limit ({took:.0f} s)"
    logs = {p.stem[:4]: p.read_text() for p in (tmp_path / "warm-logs").glob("*.log")}
    assert logs == {"1111": "warm done\n", "2222": "started\n", "3333": "started\n"}


def test_like_a_machine_stages_the_commits_recorded_there(tmp_path, monkeypatch):
    """stage --like MACHINE: the commits with results on MACHINE that this history has (a GPU series of the same
    commits as the interpreter's); a result of a commit the history lacks is left out."""
    import json
    import subprocess

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    head = head.stdout.strip()
    machine = tmp_path / "some-machine"
    machine.mkdir()
    (machine / "machine.json").write_text(json.dumps({"machine": "some-machine"}))
    for name, sha in (("a.json", head), ("b.json", "f" * 40), ("c.json", head)):
        (machine / name).write_text(json.dumps({"commit_hash": sha}))
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    assert record.recorded_on("some-machine") == [head]
    assert record.recorded_on("no-such-machine") == []
