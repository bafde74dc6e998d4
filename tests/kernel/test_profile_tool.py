"""kernel/scripts/profile_prefill.py: it reads ncu's raw CSV page, finds the stall reasons in it, sums the source
page's stall samples per SASS opcode, and stops with exit status 2 (not a traceback) where ncu is missing, as on this
CI machine."""

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "kernel" / "scripts"


def load_tool():
    sys.path.insert(0, str(SCRIPTS))  # the tool imports variants.py beside it
    spec = importlib.util.spec_from_file_location("profile_prefill", SCRIPTS / "profile_prefill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = load_tool()

# ncu's raw page: metric names, units, one row per profiled kernel (numbers may carry thousands separators)
RAW = (
    '"ID","Kernel Name","gpu__time_duration.sum","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_wait_per_issue_active.ratio","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"\n'
    '"","","usecond","ratio","ratio","%"\n'
    '"0","attention_fwd_hopper_kernel","1,234.5","0.75","2.5","61.2"\n'
)


def test_raw_page_values_and_stalls():
    values = tool.raw_metrics(RAW)
    assert values["gpu__time_duration.sum"] == 1234.5, "thousands separator"
    assert values["smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"] == 2.5
    assert "Kernel Name" not in values, "text columns are not metrics"
    assert tool.raw_metrics('"a"\n"u"\n') == {}, "no kernel row: nothing"


def test_missing_ncu_is_exit_status_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tool, "find_ncu", lambda: None)
    assert tool.main(["--out", str(tmp_path)]) == 2
    assert "ncu not found" in capsys.readouterr().err
    assert not list(tmp_path.iterdir()), "nothing written"


# ncu's source page printed as SASS: lines before the header, a header, a row per instruction (samples may carry
# thousands separators); a row of another width (a function label) is skipped
SASS = (
    '"Kernel Name","attention_fwd_hopper_kernel"\n'
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"\n'
    '"0x7f00","  BAR.SYNC.DEFER_BLOCKING 0x1, 0x80 ;","3,000","2900"\n'
    '"0x7f10","@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;","1000","990"\n'
    '"partition 1"\n'
    '"0x7f20","  MUFU.EX2 R4, R4 ;","500","100"\n'
    '"0x7f30","  BAR.SYNC.DEFER_BLOCKING 0x2, 0x80 ;","500","480"\n'
    '"0x7f40","  NOP ;","-",""\n'
)


def test_sass_hotspots_by_opcode_and_instruction():
    opcodes, hottest = tool.sass_hotspots(SASS, top=2)
    assert opcodes == [("BAR", 0.7), ("SYNCS", 0.2), ("MUFU", 0.1)], "predicates are not opcodes; shares of 5000"
    assert hottest == [("0x7f00: BAR.SYNC.DEFER_BLOCKING 0x1, 0x80 ;", 0.6),
                       ("0x7f10: @!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;", 0.2)]  # fmt: skip
    assert tool.sass_hotspots("") == ([], []), "an ncu that cannot print the page: nothing, no error"
    assert tool.sass_hotspots('"Address","Source"\n"0x0","NOP ;"\n') == ([], []), "no samples column"


def test_unknown_variant_is_exit_status_1(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(tool, "find_ncu", lambda: "/nonexistent/ncu")
    assert tool.main(["--out", str(tmp_path), "--variants", "default,no-such-variant"]) == 1
    assert "no-such-variant" in capsys.readouterr().err
    assert not list(tmp_path.glob("profile-*")), "nothing profiled"
