"""kernel/scripts/program_ends.py: how it turns probe stamps into per-SM end times and how it sums calls up
(synthetic stamps; the stamping itself is the tool's job on the GPU)."""

from attn_testing import load_script


def load_tool():
    return load_script("program_ends")


def test_each_sm_ends_at_its_first_probe():
    tool = load_tool()
    start = 1_000_000
    # start stamp, then (time, smid) per probe program: SM 3 frees at +50 us, SM 7 at +20 us; later probes on them
    stamps = [start, 0, start + 50_000, 3, start + 20_000, 7, start + 650_000, 7, start + 52_000, 3]
    assert tool.sm_end_times(stamps) == {3: 50.0, 7: 20.0}


def test_summary_spread_and_rank_correlation():
    tool = load_tool()
    same_order = [{0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0}, {0: 11.0, 1: 19.0, 2: 33.0, 3: 45.0}]
    summary = tool.summarize(same_order)
    assert summary["calls"][0] == dict(sms=4, first_us=10.0, median_us=25.0, last_us=40.0, spread_us=30.0)
    assert summary["rank_correlation"] == 1.0 and summary["latest_sms"][0] == 3 and summary["common_sms"] == 4
    reversed_order = [same_order[0], {0: 40.0, 1: 30.0, 2: 20.0, 3: 10.0}]
    assert tool.summarize(reversed_order)["rank_correlation"] == -1.0
    # an SM one call did not see is left out of the comparison
    partial = [same_order[0], {0: 11.0, 1: 19.0, 2: 33.0}]
    assert tool.summarize(partial)["common_sms"] == 3


def test_spearman_of_one_sm():
    assert load_tool().spearman([5.0], [7.0]) == 0.0, "one SM: no order to compare"


def test_a_variant_becomes_the_process_config(monkeypatch):
    import json
    import os

    import pytest
    import torch

    tool = load_tool()
    monkeypatch.delenv("TRITONFA_CONFIG", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="stamps GPU programs"):
        tool.main(["--only", "^prefill-varlen16-causal$", "--variant", "ws-dynamic"])
    assert json.loads(os.environ["TRITONFA_CONFIG"]) == {"ws_dynamic": True, "ws_dynamic_tail": 0}
    monkeypatch.delenv("TRITONFA_CONFIG")
    with pytest.raises(SystemExit):
        tool.main(["--only", "^prefill-varlen16-causal$"])
    assert "TRITONFA_CONFIG" not in os.environ, "the default variant sets nothing"
