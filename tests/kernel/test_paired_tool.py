"""kernel/scripts/paired.py: which rows pair with which (synthetic variants.py rows)."""

import json

import pytest
from attn_testing import load_script


def _row(workload, variant, ms, status="ok", impl="tritonfa", round=0):
    return dict(workload=workload, variant=variant, ms=ms, status=status, impl=impl, round=round)


def test_each_variant_pairs_with_its_rounds_baseline():
    tool = load_script("paired")
    rows = [
        _row("a", "default", 1.0), _row("a", "x", 0.9), _row("a", "y", 1.2),
        _row("a", "default", 2.0, round=1), _row("a", "x", 2.2, round=1), _row("a", "y", 2.0, round=1),
        _row("b", "default", 4.0), _row("b", "x", 3.0), _row("fa3", "fa3", 0.1, impl="fa3"),
        _row("b", "x", 5.0, round=1),  # round 1 of b has no baseline: left out
    ]  # fmt: skip
    ratios, left_out = tool.paired_ratios(rows)
    assert left_out == 1
    assert ratios[("a", "x")] == pytest.approx([-0.1, 0.1]) and ratios[("a", "y")] == pytest.approx([0.2, 0.0])
    assert ratios[("b", "x")] == pytest.approx([-0.25])
    (a_x,) = [s for s in tool.summarize(ratios) if (s["workload"], s["variant"]) == ("a", "x")]
    assert a_x["pairs"] == 2 and a_x["wins"] == 1 and a_x["mean"] == pytest.approx(0.0)


def test_rows_that_are_not_ok_pair_with_nothing(tmp_path, capsys):
    tool = load_script("paired")
    rows = [
        _row("a", "default", 1.0, status="wrong"), _row("a", "x", 0.5),  # no ok baseline: left out
        _row("a", "default", 1.0), _row("a", "x", 9.0, status="error"), _row("a", "x", 1.1),
    ]  # fmt: skip
    ratios, left_out = tool.paired_ratios(rows)
    assert ratios[("a", "x")] == pytest.approx([0.1]) and left_out == 3
    path = tmp_path / "variants-prefill.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tool.main([str(path), str(path)])  # two files pool, each paired on its own
    out = capsys.readouterr().out
    assert "+10.00%" in out and " 2 " in out and "6 rows left out" in out
