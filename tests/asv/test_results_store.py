"""asv_bench/results_store.py merges results value by value, record.py unpack merges instead of overwriting, and
ci/asv_publish.sh accumulates the history in a results store across builds (run here with a folder as the store,
a stand-in `buildkite-agent` and a stand-in nox). Standard library only: `pytest --noconftest tests/asv`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from test_gpu_series import load

ROOT = Path(__file__).resolve().parents[2]
ASV_BENCH = ROOT / "asv_bench"
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
           "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]  # fmt: skip
E2E = "e2e.VllmLatency.track_latency"
KERNEL = "kernel.KernelTime.track_ms"
NAN = float("nan")


store = load("results_store")


def document(sha: str, results: dict) -> dict:
    return {"commit_hash": sha, "env_name": "existing-py", "date": 1, "params": {"machine": "gpu"}, "python": "p",
            "requirements": {}, "env_vars": {}, "result_columns": COLUMNS, "results": results, "durations": {},
            "version": 2}  # fmt: skip


def e2e_row(auto: float, fp8: float) -> list:
    """A results row (result, params, version, started_at, duration) of CUSTOM x kv cache auto / fp8."""
    return [[auto, fp8], [["'CUSTOM'"], ["'auto'", "'fp8'"]], "1", 100, 5.0]


def values(doc: dict, name: str) -> list:
    return doc["results"][name][0]


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        (x == y) or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b)
    )


def test_partial_runs_add_up():
    """bf16 kv recorded in one call, fp8 in the next: both values stay, whichever side is preferred."""
    first = document("a" * 40, {E2E: e2e_row(4.2, NAN)})
    second = document("a" * 40, {E2E: e2e_row(NAN, 4.0)})
    assert same(values(store.merge_documents(second, first), E2E), [4.2, 4.0])
    assert same(values(store.merge_documents(first, second), E2E), [4.2, 4.0])


def test_preferred_side_wins_where_both_have_a_value():
    old = document("a" * 40, {E2E: e2e_row(4.2, 4.1)})
    new = document("a" * 40, {E2E: e2e_row(4.3, NAN)})
    assert same(values(store.merge_documents(new, old), E2E), [4.3, 4.1])
    assert same(values(store.merge_documents(old, new), E2E), [4.2, 4.1])


def test_a_new_parameter_value_extends_the_row():
    old = document("a" * 40, {KERNEL: [[1.0, 2.0], [["'w'"], ["'tritonfa'", "'flex'"]], "1", 100, 5.0]})
    new = document("a" * 40, {KERNEL: [[1.1, NAN, 3.0], [["'w'"], ["'tritonfa'", "'flex'", "'fa3'"]], "1", 200, 6.0]})
    merged = store.merge_documents(new, old)["results"][KERNEL]
    assert merged[1] == [["'w'"], ["'tritonfa'", "'flex'", "'fa3'"]]
    assert same(merged[0], [1.1, 2.0, 3.0])


def test_another_benchmark_version_is_not_mixed():
    old = document("a" * 40, {KERNEL: [[1.0], [["'w'"], ["'tritonfa'"]], "1", 100, 5.0]})
    new = document("a" * 40, {KERNEL: [[NAN], [["'w'"], ["'tritonfa'"]], "2", 200, 6.0]})
    assert store.merge_documents(new, old)["results"][KERNEL][2] == "2"
    assert same(values(store.merge_documents(new, old), KERNEL), [NAN])


def write_results(folder: Path, machine: str, docs: list[dict], benchmarks: dict | None = None) -> Path:
    (folder / machine).mkdir(parents=True, exist_ok=True)
    (folder / "benchmarks.json").write_text(json.dumps(benchmarks or {"version": 2}))
    (folder / machine / "machine.json").write_text(json.dumps({"machine": machine, "version": 1}))
    for doc in docs:
        (folder / machine / f"{doc['commit_hash'][:8]}-existing-py.json").write_text(json.dumps(doc))
    return folder


def commits_in(folder: Path, machine: str) -> set[str]:
    return {json.loads(p.read_text())["commit_hash"][:8] for p in (folder / machine).glob("*-existing-py.json")}


def test_merge_tree_and_keep_existing(tmp_path):
    dst = write_results(tmp_path / "dst", "gpu", [document("a" * 40, {E2E: e2e_row(4.2, NAN)})], {"version": 2, "x": 1})
    src = write_results(tmp_path / "src", "gpu", [document("a" * 40, {E2E: e2e_row(5.0, 4.0)}),
                                                  document("b" * 40, {E2E: e2e_row(4.4, NAN)})], {"version": 2, "x": 2})  # fmt: skip
    counts = store.merge_tree(src, dst, keep_existing=True)
    assert counts["added"] == 1
    merged = json.loads((dst / "gpu" / "aaaaaaaa-existing-py.json").read_text())
    assert same(values(merged, E2E), [4.2, 4.0]), "existing values win, missing ones are filled"
    assert json.loads((dst / "benchmarks.json").read_text())["x"] == 1
    store.merge_tree(src, dst)
    merged = json.loads((dst / "gpu" / "aaaaaaaa-existing-py.json").read_text())
    assert same(values(merged, E2E), [5.0, 4.0])
    assert json.loads((dst / "benchmarks.json").read_text())["x"] == 2
    assert commits_in(dst, "gpu") == {"aaaaaaaa", "bbbbbbbb"}


def test_unpack_merges_a_partial_recording(tmp_path, monkeypatch):
    record = load("record")
    results = write_results(tmp_path / "results", "gpu", [document("a" * 40, {E2E: e2e_row(4.2, NAN)})])
    monkeypatch.setattr(record, "RESULTS", results)
    monkeypatch.setattr(record, "REPO", tmp_path)
    incoming = write_results(tmp_path / "incoming", "gpu", [document("a" * 40, {E2E: e2e_row(NAN, 4.0)})])
    tarball = tmp_path / "asv-results-gpu.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(incoming / "benchmarks.json", arcname="benchmarks.json")
        tar.add(incoming / "gpu", arcname="gpu")
    assert record.main(["unpack", str(tarball)]) == 0
    merged = json.loads((results / "gpu" / "aaaaaaaa-existing-py.json").read_text())
    assert same(values(merged, E2E), [4.2, 4.0])


def test_unpack_refuses_paths_outside_the_results(tmp_path, monkeypatch):
    record = load("record")
    monkeypatch.setattr(record, "RESULTS", tmp_path / "results")
    evil = tmp_path / "evil.json"
    evil.write_text("{}")
    tarball = tmp_path / "bad.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(evil, arcname="../evil.json")
    assert record.main(["unpack", str(tarball)]) == 1


@pytest.fixture()
def ci_copy(tmp_path) -> Path:
    """The files ci/asv_publish.sh touches, with stand-ins for nox (writes a site) and buildkite-agent."""
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    (repo / "asv_bench").mkdir()
    shutil.copy2(ROOT / "ci" / "asv_publish.sh", repo / "ci" / "asv_publish.sh")
    shutil.copy2(ASV_BENCH / "results_store.py", repo / "asv_bench" / "results_store.py")
    nox = repo / "ci" / "nox.sh"
    nox.write_text("#!/usr/bin/env bash\nset -eu\nmkdir -p asv_bench/html\n"
                   "ls asv_bench/results/gpu > asv_bench/html/index.html\necho \"$@\" >> nox-calls.txt\n")  # fmt: skip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "buildkite-agent"
    # `buildkite-agent artifact download PATTERN DEST`: copies $FAKE_ARTIFACTS (this build's GPU results) to DEST
    agent.write_text("#!/usr/bin/env bash\nset -eu\n[ -d \"$FAKE_ARTIFACTS\" ] || exit 1\n"
                     "mkdir -p \"$4/asv_bench\"\ncp -R \"$FAKE_ARTIFACTS\" \"$4/asv_bench/results\"\n")  # fmt: skip
    for script in (nox, agent):
        script.chmod(0o755)
    return repo


def run_build(repo: Path, store_dir: Path, artifacts: Path, committed: list[dict]) -> subprocess.CompletedProcess:
    """One main build: a fresh checkout (committed results only) whose GPU steps recorded `artifacts`."""
    shutil.rmtree(repo / "asv_bench" / "results", ignore_errors=True)
    shutil.rmtree(repo / "artifacts", ignore_errors=True)
    write_results(repo / "asv_bench" / "results", "gpu", committed)
    env = dict(os.environ, BUILDKITE="true", TRITONFA_ASV_RESULTS_URI=str(store_dir), FAKE_ARTIFACTS=str(artifacts),
               PATH=f"{repo.parent / 'bin'}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    env.pop("TRITONFA_ASV_SITE_URI", None)
    return subprocess.run(["bash", "ci/asv_publish.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=120)


def test_ci_publish_accumulates_history_in_the_store(ci_copy, tmp_path):
    store_dir = tmp_path / "store"  # does not exist before the first build
    committed = [document("c" * 40, {E2E: e2e_row(4.0, NAN)})]
    builds = []
    for sha in ("1" * 40, "2" * 40):
        artifacts = write_results(tmp_path / f"artifacts-{sha[0]}", "gpu", [document(sha, {E2E: e2e_row(4.5, 4.4)})])
        proc = run_build(ci_copy, store_dir, artifacts, committed)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        builds.append((ci_copy / "asv_bench" / "html" / "index.html").read_text().split())
    assert commits_in(store_dir, "gpu") == {"cccccccc", "11111111", "22222222"}
    assert len(builds[1]) == 4, f"the second site sees the first build's results: {builds[1]}"  # + machine.json
    assert (ci_copy / "artifacts" / "asv-site.tar.gz").is_file()

    # a build without GPU results (the record steps failed) keeps and republishes the history
    proc = run_build(ci_copy, store_dir, tmp_path / "no-artifacts", committed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len((ci_copy / "asv_bench" / "html" / "index.html").read_text().split()) == 4
