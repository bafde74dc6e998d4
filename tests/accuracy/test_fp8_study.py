"""The fp8 error study (accuracy/fp8_error_study.py): its emulation of the kernel's blocked online softmax matches
the real kernel on the combinations the kernel implements, and the table covers every mode x P strategy."""

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "accuracy"))  # the study is a script of the accuracy suite, not part of tritonfa
import fp8_error_study as study  # noqa: E402

DEVICE = torch.device(os.environ.get("TRITONFA_TEST_DEVICE", "cpu"))
ON_GPU = DEVICE.type == "cuda"
SIZES = study.SIZES["tiny"]
FP8 = torch.float8_e4m3fn
# GPU: tensor-core accumulation order and Hopper's fp8 accumulators are not modelled by the emulation
AGREEMENT = 0.25 if ON_GPU else 0.02  # |kernel - emulation| as a share of the emulation's own error


@pytest.mark.parametrize("scenario", ["gauss", "sink", "long_heavy_sink"])
def test_emulation_matches_kernel(scenario):
    rows, facts = study.measure_scenario(
        study.SCENARIOS[scenario],
        SIZES,
        FP8,
        DEVICE,
        seed=3,
        run_kernel=True,
        rows=[*study.KERNEL_ROWS, ("fp8kv", "per_tile"), ("fp8kv", "p16")],
    )
    by_key = {(r.mode, r.strategy): r for r in rows}
    for key in study.KERNEL_ROWS:
        row = by_key[key]
        assert row.kernel is not None, key
        # the emulation stands for the kernel: their gap is far below the error being measured
        floor = 1e-3 if key[0] == "bf16" else 0.0
        assert row.kernel_vs_emulation <= max(AGREEMENT * row.emulated.rel_l2, floor), (key, row)
        assert math.isclose(row.kernel.rel_l2, row.emulated.rel_l2, rel_tol=0.1, abs_tol=1e-4), (key, row)
    # a different P strategy is visibly different: the agreement above is not a tolerance that accepts anything
    pow2, per_tile = by_key[("fp8kv", "pow2")], by_key[("fp8kv", "per_tile")]
    assert per_tile.p_error > 0
    assert pow2.kernel_vs_emulation < 0.5 * max(pow2.p_error, per_tile.p_error)
    assert facts["block_n"]["fp8kv"] > 0


def test_pow2_emulation_is_the_kernels_scale():
    """Strategy (c) uses tritonfa.fp8.p_scale: 256 for e4m3fn, 128 for e4m3fnuz, a power of two."""
    from tritonfa.fp8 import p_scale

    for dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        scale = p_scale(dtype)
        assert scale == 2 ** math.floor(math.log2(torch.finfo(dtype).max))


def test_table_has_every_mode_and_strategy(tmp_path):
    scenarios = ["gauss", "long"]
    doc = study.run_study(SIZES, FP8, DEVICE, scenarios=scenarios, run_kernel=False, log=lambda _: None)
    got = {(r["scenario"], r["mode"], r["strategy"]) for r in doc["rows"]}
    want = {(s, m, p) for s in scenarios for m, p in study.table_rows()}
    assert got == want
    assert {m for _, m, _ in got} == set(study.MODES)
    assert {p for _, _, p in got} == set(study.STRATEGIES)
    for row in doc["rows"]:
        assert math.isfinite(row["emulated"]["rel_l2"]) and row["emulated"]["rel_l2"] > 0
    assert doc["recommendation"]["strategy"] in study.FP8_P_STRATEGIES
    paths = study.write_outputs(doc, [tmp_path])
    text = (tmp_path / "fp8_error_table.md").read_text()
    for mode, strategy in study.table_rows():
        assert f"| {study.MODES[mode].label} | {study.STRATEGY_LABELS[strategy]}" in text
    assert "Recommendation" in text
    assert "TINY / Triton-interpreter scale" in text, "a reduced-size table says so, on any device"
    json.loads((tmp_path / "fp8_error_table.json").read_text())
    assert len(paths) == 2


def test_committed_table_is_complete():
    """accuracy/fp8_error_table.json (committed) has every scenario x mode x strategy, kernel rows included."""
    doc = json.loads((REPO / "accuracy" / "fp8_error_table.json").read_text())
    got = {(r["scenario"], r["mode"], r["strategy"]) for r in doc["rows"]}
    scenarios = set(doc["scenarios"])
    assert scenarios == set(study.SCENARIOS)
    assert got == {(s, m, p) for s in scenarios for m, p in study.table_rows()}
    kernel_rows = [r for r in doc["rows"] if r["kernel_implements"]]
    assert kernel_rows and all(r["kernel"] is not None for r in kernel_rows)
    assert (REPO / "accuracy" / "fp8_error_table.md").read_text().count("| ") > 50
