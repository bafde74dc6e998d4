"""Shared test setup: device choice, Triton's interpreter on CPU (with test-only fixes), seeds, NaN-poisoned memory.

- `--device cpu|cuda|auto` (default auto: cuda when available). On cpu, TRITON_INTERPRET=1 is set before anything
  imports triton, and three interpreter bugs are patched (`tritonfa.interpreter_fixes`); the patches are checked by
  tests/kernel/test_interpreter_patches.py.
- Seeds: one run-level seed (random unless `--seed N`, printed in the header and on failures) combined with each
  test's id, so every run draws fresh inputs and any failure reproduces with `--seed N`.
- Tests under tests/kernel/ see `torch.empty`-style allocations filled with NaN, so unwritten outputs show up.
- Content validation is on (TRITONFA_VALIDATE=1, `tritonfa.validation`) unless the environment sets it already:
  every call the suite makes has its cu_seqlens / seqused_k / block_table checked. `TRITONFA_VALIDATE=0 pytest ...`
  runs the suite on the production path; tests of the unvalidated path turn it off themselves.
- TRITONFA_FAIL_ON_SKIP=1 (set by sessions that install every dependency) turns any skip into a failure.
"""

import functools
import os
import random
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

KERNEL_TESTS = Path(__file__).parent / "kernel"
SEED_ENV = "TRITONFA_TEST_SEED"
DEVICE_ENV = "TRITONFA_TEST_DEVICE"
FAIL_ON_SKIP_ENV = "TRITONFA_FAIL_ON_SKIP"
VALIDATE_ENV = "TRITONFA_VALIDATE"  # tritonfa.validation.ENV_VAR (not imported: some suites run without tritonfa)

MARKERS = {
    "gpu": "needs a GPU (large sizes); skipped on the interpreter",
    "slow": "slower cases; still part of the default run",
}


def pytest_addoption(parser):
    group = parser.getgroup("tritonfa")
    group.addoption("--device", choices=["cpu", "cuda", "auto"], default="auto", help="where kernels run")
    group.addoption("--seed", type=int, default=None, help="run-level random seed (default: a fresh one)")


def _resolve_device(option: str) -> str:
    if option == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if option == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda given but torch sees no CUDA device")
    return option


def pytest_configure(config):
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")

    # xdist workers inherit the controller's environment, so seed and device are chosen once per run
    if SEED_ENV not in os.environ or config.getoption("seed") is not None:
        seed = config.getoption("seed")
        os.environ[SEED_ENV] = str(seed if seed is not None else random.SystemRandom().randrange(2**31))
    if DEVICE_ENV not in os.environ or config.getoption("device") != "auto":
        os.environ[DEVICE_ENV] = _resolve_device(config.getoption("device"))

    os.environ.setdefault(VALIDATE_ENV, "1")

    if "PYTEST_XDIST_WORKER" in os.environ:
        # workers share the cores already; torch's own threads would only oversubscribe them
        torch.set_num_threads(1)
    if os.environ[DEVICE_ENV] == "cpu":
        # must happen before any module decorates a kernel with @triton.jit
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            from tritonfa.interpreter_fixes import patch_triton_interpreter
        except ImportError:  # suites that need no kernel (tests/ci, tests/asv) may run without tritonfa installed
            return
        patch_triton_interpreter()


def pytest_collection_modifyitems(config, items):
    if current_device() == "cuda":
        return
    skip_gpu = pytest.mark.skip(reason="gpu test: too big for the interpreter (run with a GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def pytest_report_header(config):
    seed = os.environ[SEED_ENV]
    return (
        f"tritonfa: device={os.environ[DEVICE_ENV]} seed={seed} (reproduce with --seed {seed}) "
        f"{VALIDATE_ENV}={os.environ[VALIDATE_ENV]}"
    )


def run_seed() -> int:
    return int(os.environ[SEED_ENV])


def current_device() -> str:
    return os.environ[DEVICE_ENV]


@pytest.fixture(scope="session")
def device() -> str:
    """'cpu' (kernels run in Triton's interpreter) or 'cuda'."""
    return current_device()


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """Seed torch/random/numpy from the run seed and the test id: fresh per run, reproducible with --seed."""
    seed = (run_seed() ^ zlib.crc32(request.node.nodeid.encode())) % 2**31
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and os.environ.get(FAIL_ON_SKIP_ENV) == "1" and not hasattr(report, "wasxfail"):
        # a session that installs every dependency (nox -s accuracy): a skip would hide a missing check
        report.outcome = "failed"
        report.longrepr = f"skipped where skips are failures ({FAIL_ON_SKIP_ENV}=1): {report.longrepr}"
    if report.failed:
        report.sections.append(("tritonfa", f"reproduce with: --seed {run_seed()} --device {current_device()}"))
    if report.when == "call" and report.failed and cuda_context_lost():
        item.stash[CONTEXT_LOST] = True
        report.sections.append(("tritonfa", "the CUDA context is gone (sticky error): this process runs no more tests"))
    if report.when == "teardown" and item.stash.get(CONTEXT_LOST, False):
        stop_after_lost_context(item.session, item.nodeid)
    return report


CONTEXT_LOST = pytest.StashKey[bool]()


def cuda_context_lost() -> bool:
    """After a failed GPU test: whether this process's CUDA context is gone. An illegal address or a trap is
    sticky: every later test of the process would fail with it (session 29's suite: one fault, ~500 errors)."""
    if current_device() != "cuda":
        return False
    try:
        torch.ones(1, device="cuda").add_(1).cpu()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - any error here means the context cannot run the next test
        return True
    return False


def stop_after_lost_context(session, nodeid: str) -> None:
    """An xdist worker ends at once, inside the failed test's teardown, so xdist reports the crash against that
    test (its failure was sent already) and starts a fresh worker for the tests left; without xdist the run stops
    after this test with pytest's summary."""
    if hasattr(session.config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)
        return
    session.shouldstop = f"the CUDA context was lost in {nodeid}"


def pytest_runtest_logreport(report):
    """TRITONFA_FAILURES_LOG=FILE: each failure's id and traceback appended as it happens (under xdist, by the
    controller), so a GPU run cut off before pytest's summary still says why its tests failed."""
    path = os.environ.get("TRITONFA_FAILURES_LOG")
    if path and report.failed:
        with open(path, "a") as log:
            log.write(f"== {report.nodeid} ({report.when}; seed {run_seed()})\n{report.longreprtext}\n\n")


# ---------------------------------------------------------------------------------------------------------------
# NaN-poisoned allocations (fla style)


def _poison(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype.is_floating_point and tensor.numel():
        tensor.fill_(float("nan"))
    return tensor


@pytest.fixture(autouse=True)
def _fresh_plan_cache():
    """Each test plans its own calls: a test that patches the planner's module state must not get another test's
    cached plans (tests/kernel/test_plan_cache.py covers the cache itself)."""
    try:
        from tritonfa.kernels import plan_cache
    except ImportError:  # sessions without the kernel package
        yield
        return
    plan_cache.clear()
    yield


@pytest.fixture(autouse=True)
def _nan_poisoned_empty(request, monkeypatch):
    """Under tests/kernel/, torch.empty & co. return NaN-filled float memory so unwritten outputs show up (not in
    tests marked `real_allocators`: a torch.compile trace of the real functions)."""
    if not request.node.path.is_relative_to(KERNEL_TESTS) or request.node.get_closest_marker("real_allocators"):
        yield
        return
    for name in ("empty", "empty_like", "empty_strided"):
        original = getattr(torch, name)
        monkeypatch.setattr(torch, name, functools.wraps(original)(_poisoning(original)))
    monkeypatch.setattr(torch.Tensor, "new_empty", _poisoning(torch.Tensor.new_empty))
    yield


@pytest.fixture(scope="session", autouse=True)
def _torch_loaded_with_real_allocators():
    """torch imports parts of itself on first use (a meta tensor's randn_like loads its Python decompositions);
    loaded inside a test, they record the NaN-poisoning wrappers as torch.empty & co., and torch.compile then refuses
    the real torch.empty for the rest of the process (session 29: test_fast_paths' fullgraph compile after
    test_launch's meta planning). Loaded once here, before any test patches them."""
    torch.randn_like(torch.empty(1, device="meta"), dtype=torch.bfloat16)


def _poisoning(allocate):
    def allocate_poisoned(*args, **kwargs):
        tensor = allocate(*args, **kwargs)
        # `out=` variants return the caller's tensor, which must not be clobbered
        return tensor if "out" in kwargs else _poison(tensor)

    return allocate_poisoned
