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
    kernel_candidates = [
        (mode, p) for mode in study.MODES for p in study.KERNEL_STRATEGIES if mode != "bf16" or p == "p16"
    ]
    rows, facts = study.measure_scenario(
        study.SCENARIOS[scenario],
        SIZES,
        FP8,
        DEVICE,
        seed=3,
        run_kernel=True,
        rows=list(dict.fromkeys([*kernel_candidates, ("fp8kv", "per_tile"), ("fp8kv", "pow2")])),
    )
    by_key = {(r.mode, r.strategy): r for r in rows}
    kernel_rows = [r for r in rows if r.kernel_implements]
    assert sorted(r.mode for r in kernel_rows) == sorted(study.MODES), "one P strategy per mode is the kernel's"
    assert facts["kernel_p"] == {r.mode: r.strategy for r in kernel_rows}
    for row in kernel_rows:
        assert row.kernel is not None, row
        # the emulation stands for the kernel: their gap is far below the error being measured
        floor = 1e-3 if row.mode == "bf16" else 0.0
        assert row.kernel_vs_emulation <= max(study.EMULATION_AGREEMENT * row.emulated.rel_l2, floor), row
        assert math.isclose(row.kernel.rel_l2, row.emulated.rel_l2, rel_tol=0.1, abs_tol=1e-4), row
    assert not study.emulation_gaps(rows)
    # a different P strategy is visibly different: the agreement above is not a tolerance that accepts anything
    pow2, per_tile = by_key[("fp8kv", "pow2")], by_key[("fp8kv", "per_tile")]
    [kernel_fp8kv] = [r for r in rows if r.mode == "fp8kv" and r.kernel_implements]
    assert per_tile.p_error > 0 and pow2.p_error > 0
    other = pow2 if kernel_fp8kv.strategy == "per_tile" else per_tile
    assert kernel_fp8kv.kernel_vs_emulation < 0.5 * other.p_error
    if not ON_GPU:  # the portable kernel: its own strategy's emulation, not the power of two's
        assert kernel_fp8kv.strategy == "per_tile"
        gap_to_pow2 = (pow2.p_error**2 + per_tile.p_error**2) ** 0.5  # a scale, not an exact distance
        assert kernel_fp8kv.kernel_vs_emulation < 0.25 * gap_to_pow2
    assert facts["block_n"]["fp8kv"] > 0


def test_kernel_numerics_follow_the_launcher(monkeypatch):
    """The P each mode gets, as planned: fp8 P scaled per tile in the portable kernel (this CPU's interpreter, or
    any device without the Gluon prefill); on Hopper (planned on meta tensors, as CI's cross-compile does) 16-bit P
    for causal prefill with fp8 V, which the Gluon prefill widens to fp16 (128-key blocks), or, for a bf16 q, in
    bf16 over K and V widened to bf16 before the prefill (ws_fp8_widen_copy; in the kernel, k16: fp16, 64 keys)."""
    batch = study.make_batch(study.SCENARIOS["gauss"], SIZES, 0, DEVICE)
    planned = {
        name: study.kernel_numerics(batch, study.mode_inputs(batch, mode, FP8), mode)
        for name, mode in study.MODES.items()
    }
    bf16, fp16 = torch.bfloat16, torch.float16
    if not ON_GPU:
        assert planned == {"bf16": ("p16", 64, bf16), "fp8kv": ("per_tile", 64, fp16),
                           "fp8qkv": ("per_tile", 64, fp16), "fp8kv_q8": ("per_tile", 64, fp16)}  # fmt: skip
    from tritonfa.kernels import attention_hopper

    if not attention_hopper.HAS_GLUON:
        pytest.skip("this triton has no Gluon for Hopper")
    monkeypatch.setenv("TRITONFA_ARCH", "hopper")
    meta = torch.device("meta")
    q = torch.empty(416, 4, 128, dtype=torch.bfloat16, device=meta)
    k = torch.empty(416, 2, 128, dtype=torch.bfloat16, device=meta)
    hopper = study.Batch(q, k, torch.empty_like(k), [256, 160], [256, 160])

    def on_hopper(widen_copy: bool) -> dict:
        planned = {}
        for name, mode in study.MODES.items():
            config = {"fp8_q_for_fp8_kv": mode.q_row_fp8, "ws_fp8_widen_copy": widen_copy}
            inputs = study.Inputs(
                q.to(FP8) if mode.q_fp8 else q, k.to(FP8) if mode.kv_fp8 else k, k.to(FP8) if mode.kv_fp8 else k,
                None, None, None, kernel_config=json.dumps(config),
            )  # fmt: skip
            planned[name] = study.kernel_numerics(hopper, inputs, mode)
        return planned

    assert on_hopper(True) == {"bf16": ("p16", 128, bf16), "fp8kv": ("p16", 128, bf16), "fp8qkv": ("p16", 128, fp16),
                               "fp8kv_q8": ("p16", 128, fp16)}  # fmt: skip
    assert on_hopper(False)["fp8kv"] == ("p16", 64, fp16), "K and V widened in the kernel (k16)"


def test_emulation_check_reports_a_mismatch():
    """A kernel row far from its emulation fails the check (and the script exits 1), named in the text."""
    good = study.Row("gauss", "fp8kv", "pow2", study.Error(0.05, 0.08), kernel=study.Error(0.05, 0.08),
                     kernel_implements=True, kernel_vs_emulation=0.001)  # fmt: skip
    bad = study.Row("long_heavy_sink", "fp8qkv", "pow2", study.Error(0.115, 0.2), kernel=study.Error(0.069, 0.19),
                    kernel_implements=True, kernel_vs_emulation=0.092)  # fmt: skip
    assert study.emulation_gaps([good]) == [] and study.emulation_gaps([good, bad]) == [bad]
    _, text = study.recommend([good, bad], study.summarize([good, bad]), 0.092)
    assert any("Emulation check FAILED" in line and "long_heavy_sink" in line for line in text)
    _, text = study.recommend([good], study.summarize([good]), 0.001)
    assert any(line.startswith("Emulation check: ") for line in text)


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
