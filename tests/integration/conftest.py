"""Setup for the vLLM backend tests: skip without vLLM; on the CPU, let vLLM's Triton ops run in the interpreter.

tests/conftest.py already sets TRITON_INTERPRET=1 (and patches the interpreter) when the device is the CPU. vLLM's
Triton reshape-and-cache op additionally asks the platform for a CUDA capability (to pick num_warps, and to allow
fp8 caches on SM89+); on a CPU-only torch those calls fail, so `cpu_vllm` answers them as an H100 would. Test-only:
nothing in tritonfa_vllm depends on it.
"""

import importlib.util
import os

import pytest

# Nothing here may import vllm or triton at module level: when pytest is pointed at this folder, this conftest loads
# before tests/conftest.py's pytest_configure sets TRITON_INTERPRET=1, and kernels decorated before that would not
# run in the interpreter.
if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]  # vLLM is not installed (nox -s vllm installs it)

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # model configs come from integration/scripts/models


@pytest.hookimpl(trylast=True)  # after tests/conftest.py chose the device
def pytest_configure(config):
    # vLLM disables its Triton ops unless a driver is active or CUDA_VISIBLE_DEVICES is empty
    if os.environ.get("TRITONFA_TEST_DEVICE") == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture(autouse=True)
def cpu_vllm(device, monkeypatch):
    """On the CPU, make vLLM's platform report an SM90 GPU to its Triton ops (see the module docstring)."""
    if device != "cpu":
        yield
        return
    import torch
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    sm90 = classmethod(lambda cls, device_id=0: DeviceCapability(major=9, minor=0))
    monkeypatch.setattr(type(current_platform), "get_device_capability", sm90)
    yield


@pytest.fixture(autouse=True)
def vllm_config_context():
    """Code paths that vLLM only reaches inside its engine (e.g. the KV-cache layout query) read the current config."""
    from vllm.config import set_current_vllm_config
    from vllm_batch import _vllm_config

    with set_current_vllm_config(_vllm_config(16, "auto")):
        yield
