"""Pick the config variants that won an A/B (variants.py's JSONL) and write their TRITONFA_CONFIG.

A variant wins when, on some workload, every round it took at most (1 - gain) of `default`'s time in the same round,
on no workload any round took more than (1 + tolerance) of it (a setting that changes nothing there costs nothing),
and its output was checked ("ok") every time. Winners on the same workload are alternatives: the one with the
larger win is taken. The configs taken (as variants.py set them) are merged into one JSON object and written to
--out; no winner writes an empty file (the defaults). A GPU session's chain runs this between its A/B steps and
`await-config`, so the engines, the suite and the bench run the winners without a hand in the loop
(kernel/scripts/gpu_session.sh, step `pick-config`).

    python kernel/scripts/pick_config.py --out results/config.json results/variants-decode.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def pick(records: list[dict], gain: float, tolerance: float = 0.01) -> tuple[dict, list[str]]:
    """(merged config of the winners, one line per variant saying why it won or lost)."""
    # (workload, round) -> default's ms; (variant) -> [(workload, round, ms, status)]
    default_ms: dict[tuple[str, int], float] = {}
    runs: dict[str, list[tuple[str, int, float | None, str]]] = defaultdict(list)
    configs: dict[str, dict] = {}
    for r in records:
        if r.get("impl") != "tritonfa":
            continue
        key = (r["workload"], r.get("round", 0))
        if r["variant"] == "default":
            if r["status"] == "ok" and r["ms"]:
                default_ms[key] = r["ms"]
            continue
        runs[r["variant"]].append((r["workload"], r.get("round", 0), r["ms"], r["status"]))
        configs[r["variant"]] = r.get("config") or {}
    lines = []
    winners = []  # (mean ratio on the workloads it won, variant, those workloads)
    for variant, rows in sorted(runs.items()):
        ratios = []
        failed = [f"{w} r{rnd}: {status}" for w, rnd, _, status in rows if status != "ok"]
        for w, rnd, ms, status in rows:
            if status == "ok" and (w, rnd) in default_ms:
                ratios.append((w, rnd, ms / default_ms[(w, rnd)]))
        if failed:
            lines.append(f"{variant}: loses (not ok: {', '.join(failed)})")
            continue
        if not ratios:
            lines.append(f"{variant}: no round beside default")
            continue
        by_workload: dict[str, list[float]] = defaultdict(list)
        for w, _, ratio in ratios:
            by_workload[w].append(ratio)
        won = sorted(w for w, rs in by_workload.items() if max(rs) <= 1.0 - gain)
        lost = sorted(w for w, rs in by_workload.items() if max(rs) > 1.0 + tolerance)
        summary = ", ".join(f"{w} r{rnd} {ratio:.3f}" for w, rnd, ratio in ratios)
        if won and not lost:
            lines.append(f"{variant}: wins every round by >= {gain:.0%} on {', '.join(won)} ({summary})")
            mean = sum(r for w in won for r in by_workload[w]) / sum(len(by_workload[w]) for w in won)
            winners.append((mean, variant, set(won)))
        elif lost:
            lines.append(f"{variant}: loses on {', '.join(lost)} ({summary})")
        else:  # faster or level, but not by the margin in every round of a workload
            lines.append(f"{variant}: below the bar, no workload >= {gain:.0%} faster every round ({summary})")
    # winners on the same workload are alternatives (their union was not measured): the larger win is taken; winners
    # on different workloads (a decode step and a split form, say) are merged
    merged: dict = {}
    taken: dict[str, str] = {}  # workload -> the winner taken for it
    for _, variant, won in sorted(winners, key=lambda t: (t[0], t[1])):
        rivals = sorted({taken[w] for w in won if w in taken})
        if rivals:
            lines.append(f"{variant}: not taken, {', '.join(rivals)} won by more on the same workload")
            continue
        conflicts = [k for k, v in configs[variant].items() if k in merged and merged[k] != v]
        if conflicts:
            lines.append(f"{variant}: not taken, {', '.join(conflicts)} set otherwise by a larger winner")
            continue
        merged.update(configs[variant])
        taken.update({w: variant for w in won})
    return merged, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jsonl", nargs="+", type=Path, help="variants.py result files")
    parser.add_argument("--out", type=Path, required=True, help="the config file to write (empty: defaults)")
    parser.add_argument("--gain", type=float, default=0.03, help="the least win in every round (default 0.03)")
    parser.add_argument(
        "--tolerance", type=float, default=0.01, help="the most any other workload may lose in a round (default 0.01)"
    )
    args = parser.parse_args(argv)
    records = []
    for path in args.jsonl:
        if path.exists():
            records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    merged, lines = pick(records, args.gain, args.tolerance)
    for line in lines:
        print(line)
    args.out.write_text(json.dumps(merged) if merged else "")
    print(f"{args.out}: {json.dumps(merged) if merged else '(empty: defaults)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
