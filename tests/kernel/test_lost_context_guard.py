"""tests/conftest.py's guard for a lost CUDA context: a GPU test that leaves the context dead (an illegal address is
sticky) ends its xdist worker inside its own teardown, so xdist blames that test and starts a fresh worker; without
xdist the run stops after it. Exercised here with stand-in sessions (no GPU fault can be made on purpose)."""

from pathlib import Path
from types import SimpleNamespace

import pytest


@pytest.fixture
def root_conftest(request):
    path = Path(__file__).resolve().parents[1] / "conftest.py"
    (plugin,) = [p for p in request.config.pluginmanager.get_plugins() if getattr(p, "__file__", None) == str(path)]
    return plugin


def test_a_worker_exits_and_a_single_process_stops(root_conftest, monkeypatch):
    exits = []
    monkeypatch.setattr(root_conftest.os, "_exit", exits.append)
    worker = SimpleNamespace(config=SimpleNamespace(workerinput={"workerid": "gw4"}), shouldstop=False)
    root_conftest.stop_after_lost_context(worker, "t.py::case[239]")
    assert exits == [3] and worker.shouldstop is False
    single = SimpleNamespace(config=SimpleNamespace(), shouldstop=False)
    root_conftest.stop_after_lost_context(single, "t.py::case[239]")
    assert exits == [3] and single.shouldstop == "the CUDA context was lost in t.py::case[239]"


def test_the_context_check(root_conftest, device, monkeypatch):
    assert root_conftest.cuda_context_lost() is False, "a healthy process (or the CPU) keeps running tests"
    if device != "cuda":
        monkeypatch.setattr(root_conftest, "current_device", lambda: "cuda")
        # on a machine without a GPU a 'cuda' tensor fails like a dead context would
        assert root_conftest.cuda_context_lost() is True
