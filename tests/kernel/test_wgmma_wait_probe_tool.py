"""kernel/scripts/wgmma_wait_probe.py: its summary of a kernel's SASS counts runs of wgmma issues, waits and
exponentials in order (the shape of a loop that PERF_NOTES compares with FA3's)."""

import importlib.util
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
