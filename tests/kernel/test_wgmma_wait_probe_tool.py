"""kernel/scripts/wgmma_wait_probe.py: its summary of a kernel's SASS counts runs of wgmma issues, waits and
exponentials in order (the shape of a loop that PERF_NOTES compares with FA3's)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytest.importorskip("triton.experimental.gluon.language.nvidia.hopper", reason="this triton has no Gluon for Hopper")


def load_tool():
    path = REPO / "kernel" / "scripts" / "wgmma_wait_probe.py"
    spec = importlib.util.spec_from_file_location("wgmma_wait_probe", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SASS = """
        /*0940*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;   /* 0x0 */
        /*0a30*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;  /* 0x0 */
        /*0ab0*/                   HGMMA.64x128x16.F32.BF16 R88, R180, gdesc[UR4].tnspB, R88, gsb0 ;
        /*0b40*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0b50*/                   FMNMX R6, R84, R7, !PT ;
        /*0b60*/                   MUFU.EX2 R16, R41 ;
        /*0b70*/                   MUFU.EX2 R17, R42 ;
        /*0b80*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0b90*/                   MUFU.EX2 R18, R43 ;
        /*0ba0*/                   MUFU.RCP R19, R43 ;
"""


def test_sequence_counts_runs_in_order():
    tool = load_tool()
    assert tool.sequence(SASS) == "3xHGMMA 1xDEPBAR 2xEX2 1xDEPBAR 1xEX2"
    assert tool.sequence("") == ""
    assert {"base", "rescale-between", "rescale-first", "p-in-smem"} <= set(tool.SHAPES)


def test_exps_between_waits_counts_from_each_s_wait_to_the_next_wait():
    tool = load_tool()
    assert tool.exps_between_waits(SASS) == [2]
    late = SASS.replace("WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", "MUFU.EX2 R20, R44 ;") + "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"
    assert tool.exps_between_waits(late) == [4]
    assert tool.exps_between_waits(SASS + SASS) == [2, 2]
    assert tool.exps_between_waits("") == []


def run_without_interpreter(args: list[str]) -> subprocess.CompletedProcess:
    """Gluon compiles in a fresh process without TRITON_INTERPRET: in a test worker that has run interpreted kernels,
    the interpreter's patches of triton.language (e.g. its integer casts) leak into the compiler and break it."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_a_sync_that_needs_l_keeps_the_pv_wait_after_the_softmax():
    """sm_90 SASS of the probe loop (this triton's ptxas): with an mbarrier wait before the QK, as every step of the
    product has, ptxas waits for the P@V before most exponentials; a no-op warp sync guarded by a predicate on l
    keeps all 66 of them (64 of P, 2 of the rescale factor) between the S wait and the P@V wait."""
    tool_path = str(REPO / "kernel" / "scripts" / "wgmma_wait_probe.py")
    code = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('probe', {tool_path!r})\n"
        "tool = importlib.util.module_from_spec(spec); spec.loader.exec_module(tool)\n"
        "for shape in ('k-wait-sync-after-softmax', 'k-wait'):\n"
        "    print(shape, *tool.exps_between_waits(tool.cuda_sass(tool.compile_shape(shape))))\n"
    )
    counts = {
        line.split()[0]: [int(c) for c in line.split()[1:]]
        for line in run_without_interpreter(["-c", code]).stdout.splitlines()
    }
    assert counts["k-wait-sync-after-softmax"] == [66], counts
    assert counts["k-wait"][0] < 33, counts


def test_the_product_mode_reads_the_default_prefills_four_loops():
    """--product on the default 16-bit prefill shape (persistent, causal, D 128): one row with a count for each of its
    four KV loops (interior and masked, two consumer warpgroups). Today ptxas waits for the previous block's P@V
    before most of a block's exponentials there (PERF_NOTES, session 12): fewer than the block's 64 per thread
    between the two waits. Compiled in a process without the interpreter (the prefill calls @triton.jit helpers,
    which interpreter mode replaces)."""
    name = "hopper d128 CAUSAL=True RETURN_LSE=False PINGPONG=True PAGED=False PERSISTENT]"
    run = run_without_interpreter([str(REPO / "kernel" / "scripts" / "wgmma_wait_probe.py"), "--product", "-k", name])
    rows = [line.split() for line in run.stdout.splitlines() if name in line]
    assert len(rows) == 1, run.stdout
    counts = [int(word) for word in rows[0] if word.isdigit()]
    assert len(counts) == 4 and max(counts) < 64, rows[0]
