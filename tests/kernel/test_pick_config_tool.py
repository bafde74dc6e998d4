"""kernel/scripts/pick_config.py: which A/B variants win (every round >= the gain on some workload, no workload
slower than the tolerance, outputs checked) and the config it writes for the rest of a GPU session's chain."""

import importlib.util
import json
import random
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "kernel" / "scripts"


def load_tool():
    spec = importlib.util.spec_from_file_location("pick_config", SCRIPTS / "pick_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = load_tool()
CONFIGS = {
    "faster": {"decode_gluon": True, "decode_gluon_v16_smem": True},
    "less-faster": {"decode_gluon": True, "decode_gluon_stages": 3},
    "faster-elsewhere": {"decode_gluon": True, "decode_gluon_split": True},
    "one-round-short": {"decode_gluon_fp8_q": True},
    "slower-on-one": {"decode_gluon_stages": 3},
    "wrong": {"decode_gluon_stages": 4},
}
# variant -> workload -> time / default's time per round
RATIOS = {
    "faster": {"a": [0.90, 0.91, 0.92], "b": [1.0, 0.995, 1.005]},
    "less-faster": {"a": [0.95, 0.96, 0.94], "b": [1.0, 1.0, 1.0]},
    "faster-elsewhere": {"a": [1.0, 1.0, 1.0], "b": [0.95, 0.96, 0.955]},
    "one-round-short": {"a": [0.95, 0.98, 0.95]},
    "slower-on-one": {"a": [0.80, 0.80, 0.80], "b": [1.02, 1.03, 1.02]},
    "wrong": {"a": [0.5, 0.5, 0.5]},
}


def records(seed=0):
    rng = random.Random(seed)
    rows = []
    for workload in ("a", "b"):
        for rnd in range(3):
            base = rng.uniform(0.05, 0.3)
            rows.append(dict(workload=workload, impl="tritonfa", variant="default", config=None, status="ok", ms=base,
                             round=rnd))  # fmt: skip
            rows.append(dict(workload=workload, impl="fa3", variant="peer", config=None, status="ok", ms=base / 9,
                             round=rnd))  # fmt: skip
            for variant, per_workload in RATIOS.items():
                if workload in per_workload:
                    status = "mismatch" if variant == "wrong" and rnd == 1 else "ok"
                    rows.append(dict(workload=workload, impl="tritonfa", variant=variant, config=CONFIGS[variant],
                                     status=status, ms=base * per_workload[workload][rnd], round=rnd))  # fmt: skip
    rng.shuffle(rows)
    return rows


def test_only_clean_wins_are_picked_and_merged():
    merged, lines = tool.pick(records(), gain=0.03)
    assert merged == {"decode_gluon": True, "decode_gluon_v16_smem": True, "decode_gluon_split": True}
    verdict = {line.split(":")[0]: line for line in lines}
    assert "wins" in verdict["faster"] and "wins" in verdict["faster-elsewhere"]
    # it won too, on the workload "faster" won by more: an alternative, not a complement (their union never ran)
    assert any(line.startswith("less-faster: not taken, faster won by more") for line in lines)
    assert "below the bar" in verdict["one-round-short"]  # 0.98 in one round: not >= 3% every round
    assert "loses on b" in verdict["slower-on-one"]  # a 20% win elsewhere does not excuse a 2-3% loss
    assert "not ok" in verdict["wrong"]  # an output that failed its check never wins


def test_writes_the_config_or_an_empty_file(tmp_path):
    jsonl = tmp_path / "variants-decode.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in records(1)) + "\n")
    out = tmp_path / "config.json"
    assert tool.main(["--out", str(out), str(jsonl), str(tmp_path / "missing.jsonl")]) == 0
    assert json.loads(out.read_text())["decode_gluon_v16_smem"] is True
    assert tool.main(["--out", str(out), "--gain", "0.5", str(jsonl)]) == 0
    assert out.read_text() == ""  # no winner at a 50% bar: the defaults
