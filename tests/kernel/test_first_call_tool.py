"""kernel/scripts/first_call.py: the Triton functions it splits a first call into exist under those names in the
installed triton (a rename would silently report 0 s for a stage)."""

import importlib.util
import inspect
from pathlib import Path

import triton

REPO = Path(__file__).resolve().parents[2]


def load_tool():
    spec = importlib.util.spec_from_file_location("first_call", REPO / "kernel" / "scripts" / "first_call.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stage_names_a_function_of_this_triton():
    root = Path(triton.__file__).parent
    for stage, (suffix, function) in load_tool().STAGES.items():
        source = (root / suffix).read_text()
        assert f"def {function}(" in source, (stage, suffix, function)


def test_the_compile_entry_point_is_tritons():
    import triton.compiler.compiler as compiler

    assert Path(inspect.getsourcefile(compiler.compile)).as_posix().endswith(load_tool().STAGES["triton.compile"][0])
