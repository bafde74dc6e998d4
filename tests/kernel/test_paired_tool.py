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
        _row("a", "default", 1.0, round=1), _row("a", "x", 9.0, status="error", round=1),
        _row("a", "x", 1.1, round=2), _row("a", "default", 1.0, round=2),  # rotated: the baseline last
    ]  # fmt: skip
    ratios, left_out = tool.paired_ratios(rows)
    assert ratios[("a", "x")] == pytest.approx([0.1]) and left_out == 3
    path = tmp_path / "variants-prefill.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tool.main([str(path), str(path)])  # two files pool, each paired on its own
    out = capsys.readouterr().out
    assert "+10.00%" in out and " 2 " in out and "6 rows left out" in out


def test_rotated_rounds_pair_within_the_round_and_split_by_order(capsys, tmp_path):
    """variants.py --order rotate: the baseline anywhere in its round; an appended run repeats round 0 right after
    the first run's round 0 of the same workload (a new round, not one round with two baselines)."""
    tool = load_script("paired")

    def row(variant, ms, round, position):
        return dict(_row("a", variant, ms, round=round), position=position)

    rows = [
        row("default", 1.0, 0, 0), row("x", 1.1, 0, 1), row("y", 0.8, 0, 2),
        row("x", 2.2, 1, 0), row("y", 2.4, 1, 1), row("default", 2.0, 1, 2),
        row("default", 4.0, 0, 0), row("x", 3.0, 0, 1),  # the appended run's round 0
    ]  # fmt: skip
    ratios, left_out = tool.paired_ratios(rows)
    assert left_out == 0
    assert ratios[("a", "x")] == pytest.approx([0.1, 0.1, -0.25]) and ratios[("a", "y")] == pytest.approx([-0.2, 0.2])
    after, _ = tool.paired_ratios(rows, after=True)
    before, _ = tool.paired_ratios(rows, after=False)
    assert after[("a", "x")] == pytest.approx([0.1, -0.25]) and before[("a", "x")] == pytest.approx([0.1])
    path = tmp_path / "variants-prefill.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tool.main([str(path), "--split-order"])
    out = capsys.readouterr().out
    pooled, ran_after, ran_before = out.split("wins (time / default's - 1)")[1:]
    x_rows = [[line.split() for line in table.splitlines() if line.split()[1:2] == ["x"]] for table in (pooled, ran_after, ran_before)]  # fmt: skip
    assert [rows[0][2:4] for rows in x_rows] == [["3", "-1.67%"], ["2", "-7.50%"], ["1", "+10.00%"]]
