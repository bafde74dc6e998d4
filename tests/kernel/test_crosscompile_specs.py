"""tritonfa.kernels.cross_compile_specs keeps up with the kernels (ci/crosscompile.py compiles what it lists).

Lives with the kernel tests because it needs torch and tritonfa (the ci_checks session has neither).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "ci" / "crosscompile.py"


_SPEC_CHECK = """
import sys
from triton.runtime.jit import JITFunction
import crosscompile
import tritonfa.kernels as kernels
from tritonfa.kernels import attention, attention_hopper, attention_hopper_decode

arch = crosscompile.TARGETS[sys.argv[1]][4]
specs = kernels.cross_compile_specs(arch)
for spec in specs:
    if "bound_args" in spec:  # compiled from the launch's own arguments (Gluon): the binder checks them
        assert {"fn", "constexprs", "options"} <= set(spec), spec["name"]
    else:
        crosscompile._normalize(spec)  # raises on a missing argument or constexpr value
launched = {id(spec["fn"]) for spec in specs}
gluon = [attention_hopper, attention_hopper_decode] if arch == "hopper" and attention_hopper.HAS_GLUON else []
modules = [attention] + gluon
jit = [(m, n) for m in modules for n, obj in vars(m).items() if isinstance(obj, JITFunction) and n.endswith("_kernel")]
assert jit, "no kernels found"
missing = [n for m, n in jit if id(getattr(m, n)) not in launched]
assert not missing, f"kernels without a cross-compile spec: {missing}"
assert arch != "hopper" or not attention_hopper.HAS_GLUON or any(n == "attention_fwd_hopper_kernel" for _, n in jit)
assert len({spec["name"] for spec in specs}) == len(specs), "spec names must be unique"
print(len(specs), "specs ok")
"""


@pytest.mark.parametrize("arch", ["gfx942", "gfx950", "sm_90"])
def test_real_specs_match_the_kernels(arch):
    """The provider keeps up with the kernels: every jit kernel in tritonfa.kernels.attention has a spec, and each
    spec names every argument with a value for every constexpr. Checked without compiling (nox -s crosscompile
    compiles them), in a process without TRITON_INTERPRET so the kernels are real JIT functions."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPT.parent), str(ROOT / "kernel" / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", _SPEC_CHECK, arch], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "specs ok" in proc.stdout
