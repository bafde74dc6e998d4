"""The CI wiring holds together: every script and nox session the Buildkite pipeline, the ci/ scripts and .ci/run
name exists, GPU steps run in the right docker wrappers, and no step hides logic in YAML.

Run by `nox -s ci_checks` (with --noconftest: needs pyyaml and nox, not torch).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / ".buildkite" / "pipeline.yml"
CI_SCRIPTS = sorted((ROOT / "ci").glob("*.sh"))
NOX_WRAPPERS = {"nox", "ci/nox.sh"}
DOCKER_WRAPPERS = {"ci/rocm_docker.sh": "amd_", "ci/cuda_docker.sh": "nvidia_"}


def load_pipeline() -> dict:
    return yaml.safe_load(PIPELINE.read_text())


def all_steps(steps: list) -> list[dict]:
    out = []
    for step in steps:
        if isinstance(step, dict) and "group" in step:
            out += [dict(s, _group=step) for s in all_steps(step["steps"])]
        elif isinstance(step, dict):
            out.append(step)
    return out


def commands(step: dict) -> list[str]:
    cmd = step.get("command", step.get("commands", []))
    return [cmd] if isinstance(cmd, str) else list(cmd)


@pytest.fixture(scope="module")
def sessions() -> dict[str, dict]:
    """Every nox session (`nox -l --json` lists only the default ones unless a keyword selects all)."""
    pytest.importorskip("nox")
    env = {k: v for k, v in os.environ.items() if k != "TRITONFA_NOX_EXISTING_ENV"}
    out = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json", "-k", "not __no_such_session__"],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    listed = json.loads(out)
    by_name: dict[str, dict] = {}
    for entry in listed:
        by_name.setdefault(entry["name"], entry)  # parametrized sessions share a name
        by_name[entry["session"]] = entry
    return by_name


def nox_sessions_in(argv: list[str]) -> list[str]:
    """Session names after -s/--session(s) in a nox command line (up to the next option or `--`)."""
    names, taking = [], False
    for arg in argv:
        if arg == "--":
            break
        if arg in ("-s", "--session", "--sessions", "-e"):
            taking = True
        elif arg.startswith("-"):
            taking = False
        elif taking:
            names.append(arg)
    return names


def referenced_sessions() -> list[tuple[str, str]]:
    """(where, session) for every nox session named by the pipeline, ci/*.sh and .ci/run."""
    found = []
    for step in all_steps(load_pipeline()["steps"]):
        for cmd in commands(step):
            argv = shlex.split(cmd)
            while argv and argv[0] in DOCKER_WRAPPERS:
                argv = argv[1:]
            if argv and argv[0] in NOX_WRAPPERS:
                found += [(f"pipeline step {step.get('key')}", s) for s in nox_sessions_in(argv[1:])]
            elif argv and argv[0] == "ci/gpu_session.sh":
                found.append((f"pipeline step {step.get('key')}", argv[1]))
    for script in [*CI_SCRIPTS, ROOT / ".ci" / "run"]:
        text = script.read_text()
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            m = re.search(r"(?:ci/nox\.sh|\bnox)\s+(.*)", line)
            if m:
                argv = [a.strip("\"'") for a in m.group(1).split()]
                found += [(str(script.relative_to(ROOT)), s) for s in nox_sessions_in(argv) if "$" not in s]
        m = re.search(r"^SESSIONS=\((.*)\)", text, re.M)
        if m:
            found += [(str(script.relative_to(ROOT)), s) for s in m.group(1).split()]
    return found


def test_pipeline_parses_and_has_steps():
    steps = all_steps(load_pipeline()["steps"])
    assert len(steps) >= 10
    keys = [s["key"] for s in steps if "key" in s]
    assert len(keys) == len(set(keys)), "duplicate step keys"
    assert all("key" in s for s in steps), "every step has a key (depends_on and retries refer to them)"


def test_depends_on_refers_to_existing_keys():
    pipeline = load_pipeline()
    keys = {s["key"] for s in all_steps(pipeline["steps"])} | {g["key"] for g in pipeline["steps"] if "group" in g}
    for step in all_steps(pipeline["steps"]) + [g for g in pipeline["steps"] if "group" in g]:
        deps = step.get("depends_on") or []
        deps = [deps] if isinstance(deps, str) else deps
        for dep in deps:
            name = dep["step"] if isinstance(dep, dict) else dep
            assert name in keys, f"{step.get('key')} depends on unknown step {name}"


def test_every_command_is_a_script_or_nox_without_inline_logic():
    for step in all_steps(load_pipeline()["steps"]):
        cmds = commands(step)
        assert len(cmds) == 1, f"{step['key']}: one command per step, the logic lives in ci/"
        cmd = cmds[0]
        assert not re.search(r"&&|\|\||[;|`\n]|\$\(", cmd), f"{step['key']}: shell logic inline: {cmd!r}"
        argv = shlex.split(cmd)
        for arg in argv:
            if arg.startswith(("ci/", ".ci/")):
                path = ROOT / arg
                assert path.is_file(), f"{step['key']}: {arg} does not exist"
                assert os.access(path, os.X_OK), f"{step['key']}: {arg} is not executable"
        assert argv[0] in NOX_WRAPPERS | set(DOCKER_WRAPPERS) | {"ci/asv_publish.sh", ".ci/run"} or argv[0].startswith(
            "ci/"
        ), f"{step['key']}: steps call ci/*.sh or nox, not {argv[0]}"


def test_every_named_nox_session_exists(sessions):
    refs = referenced_sessions()
    assert refs, "found no nox sessions in the pipeline and scripts"
    missing = [(where, s) for where, s in refs if s not in sessions]
    assert not missing, f"nox sessions named but not defined in noxfile.py: {missing}"
    # the sessions .ci/run promises
    assert {s for w, s in refs if w == ".ci/run"} >= {"tests", "lint", "crosscompile", "ci_checks", "vllm"}


def test_every_session_has_a_description(sessions):
    for name, entry in sessions.items():
        assert entry.get("description"), f"nox session {name} has no docstring (nox -l shows it)"


def test_required_sessions_exist(sessions):
    required = {"tests", "lint", "vllm", "bench", "latency", "lm_eval", "asv", "asv_publish", "crosscompile"}
    assert required <= set(sessions), f"missing: {required - set(sessions)}"


def test_gpu_steps_run_in_docker_on_their_queue():
    gpu_steps = [s for s in all_steps(load_pipeline()["steps"]) if "agents" in s]
    assert {s["agents"]["queue"] for s in gpu_steps} >= {"amd_mi300_1"}
    rocm = [s for s in gpu_steps if s["agents"]["queue"].startswith("amd_")]
    nvidia = [s for s in gpu_steps if s["agents"]["queue"].startswith("nvidia_")]
    assert rocm and nvidia
    for step in gpu_steps:
        wrapper = shlex.split(commands(step)[0])[0]
        assert wrapper in DOCKER_WRAPPERS, f"{step['key']}: GPU steps run inside a docker wrapper"
        assert step["agents"]["queue"].startswith(DOCKER_WRAPPERS[wrapper]), f"{step['key']}: wrapper/queue mismatch"
    for what in ("tests", "bench", "latency", "lm_eval", "asv"):
        for group in (rocm, nvidia):
            assert any(shlex.split(commands(s)[0])[-1] == what for s in group), f"no GPU step runs {what}"


def test_rocm_docker_passes_the_devices():
    text = (ROOT / "ci" / "rocm_docker.sh").read_text()
    for flag in ("--device /dev/kfd", "--device /dev/dri", "--group-add video", "--shm-size", "HIP_VISIBLE_DEVICES"):
        assert flag in text, f"ci/rocm_docker.sh lacks {flag}"
    assert "TRITONFA_NOX_EXISTING_ENV=1" in text


def test_artifacts_and_retries():
    steps = {s["key"]: s for s in all_steps(load_pipeline()["steps"])}
    for key in ("rocm-bench", "nvidia-bench", "rocm-asv", "nvidia-asv", "asv-publish", "crosscompile"):
        assert steps[key].get("artifact_paths"), f"{key} uploads nothing"
    for key, step in steps.items():
        auto = step.get("retry", {}).get("automatic")
        assert auto, f"{key} has no automatic retry for infrastructure exit codes"
        codes = {r["exit_status"] for r in auto}
        assert -1 in codes, f"{key}: agent-lost (-1) is not retried"
        assert 1 not in codes, f"{key}: exit 1 is a real failure, never retried"
    gate = "build.branch == pipeline.default_branch"
    assert steps["asv-publish"].get("if") == gate, "the asv site is published from main only"


def test_ci_scripts_are_strict_executable_bash():
    assert CI_SCRIPTS
    for script in [*CI_SCRIPTS, ROOT / ".ci" / "run"]:
        text = script.read_text()
        assert text.startswith("#!/usr/bin/env bash\n"), f"{script}: shebang"
        assert os.access(script, os.X_OK), f"{script} is not executable"
        assert re.search(r"^set -[eu]*o pipefail|^set -uo pipefail", text, re.M), f"{script}: set -euo pipefail"


def test_scripts_reference_existing_paths():
    pattern = re.compile(r"(?<![\w/.])((?:\.ci|ci|tests|kernel|integration)/[\w./-]+\.(?:sh|py|txt))")
    for script in [*CI_SCRIPTS, ROOT / ".ci" / "run", ROOT / "noxfile.py"]:
        for path in pattern.findall(script.read_text()):
            if "*" in path:
                continue
            assert (ROOT / path).exists(), f"{script.relative_to(ROOT)} names {path}, which does not exist"


def test_pinned_versions_agree():
    noxfile = (ROOT / "noxfile.py").read_text()
    nox_pin = re.search(r'NOX_VERSION="\$\{NOX_VERSION:-([\d.]+)\}"', (ROOT / "ci" / "nox.sh").read_text()).group(1)
    assert f'"nox=={nox_pin}"' in noxfile, "ci/nox.sh and noxfile.py's CI_TOOLS pin different nox versions"
    assert 'TRITON_GPU = "3.6.0"' in noxfile, "crosscompile must also run with the GPU images' triton"


def test_images_are_pinned():
    """A moving tag (`latest`, none) changes torch/triton/vLLM under the same commit."""
    images = {key: value for key, value in load_pipeline()["env"].items() if key.endswith("_IMAGE")}
    assert set(images) == {"TRITONFA_ROCM_IMAGE", "TRITONFA_CUDA_IMAGE"}
    for wrapper in DOCKER_WRAPPERS:
        default = re.search(r'image="\$\{TRITONFA_\w+_IMAGE:-([^}]+)\}"', (ROOT / wrapper).read_text()).group(1)
        assert default in images.values(), f"{wrapper}'s default image {default} differs from the pipeline's"
    for image in images.values():
        name, _, tag = image.rpartition(":")
        assert name and re.fullmatch(r"v\d+\.\d+\.\d+", tag), f"{image}: pin a release tag"


def run_agent_gpu(vendor: str, **env: str) -> subprocess.CompletedProcess:
    kept = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
    return subprocess.run([str(ROOT / "ci" / "agent_gpu.sh"), vendor], env={**kept, **env}, capture_output=True,
                          text=True)  # fmt: skip


@pytest.mark.parametrize("vendor, own", [("nvidia", "NVIDIA_VISIBLE_DEVICES"), ("rocm", "HIP_VISIBLE_DEVICES")])
def test_gpu_steps_use_the_agents_own_gpu(vendor, own):
    """Agents sharing a host must not all fall back to GPU 0: the agent's tag, else its own variable, else fail."""
    assert run_agent_gpu(vendor, BUILDKITE_AGENT_META_DATA_GPU="3", **{own: "1"}).stdout.strip() == "3"
    assert run_agent_gpu(vendor, **{own: "1"}).stdout.strip() == "1"
    assert run_agent_gpu(vendor, TRITONFA_GPU="2").stdout.strip() == "2"
    for wrapper in DOCKER_WRAPPERS:
        text = (ROOT / wrapper).read_text()
        assert f"ci/agent_gpu.sh {'rocm' if 'rocm' in wrapper else 'nvidia'}" in text
        assert not re.search(r"VISIBLE_DEVICES:-\d", text), f"{wrapper} falls back to a fixed GPU"


def test_agent_without_a_gpu_fails_unless_the_host_has_one():
    """This CPU machine has no GPU (or several): an agent naming none is a configuration error, exit 2."""
    if shutil.which("nvidia-smi"):
        pytest.skip("a host with nvidia-smi: the GPU count decides")
    result = run_agent_gpu("nvidia")
    assert result.returncode == 2 and "--tags gpu=N" in result.stderr


def test_ci_tag_is_what_ci_run_runs(sessions):
    """`nox -t ci` (README: the CPU CI set) and .ci/run name the same sessions."""
    tagged = {entry["name"] for entry in sessions.values() if "ci" in entry.get("tags", [])}
    assert tagged == {s for w, s in referenced_sessions() if w == ".ci/run"}
