"""Paired A/B summary of `variants.py` runs: each variant's time over the baseline's (the `default` row) of the same
round and workload, pooled over the files given. On a GPU whose clocks move 3-8% between rounds, only such paired
ratios separate a 1% change from noise.

    python kernel/scripts/paired.py RESULTS/variants-prefill.jsonl [MORE.jsonl ...] [--baseline default]

variants.py writes each workload's rounds one after the other, every run of a round together (the baseline first,
or, with its default `--order rotate`, anywhere in the round); a variant's row is paired with the baseline row of
its round: the run of consecutive rows of one workload and round number in which no variant repeats (a file
appended to by two runs repeats the round numbers). Rows that are not `ok` (a wrong output or a failed launch)
pair with nothing and are counted. `--split-order` also splits each variant's pairs by whether it ran after the baseline
or before it in its round (rows with a `position`): the order's own effect, where the rounds rotate.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def paired_ratios(
    rows: list[dict], baseline: str = "default", after: bool | None = None
) -> tuple[dict[tuple[str, str], list[float]], int]:
    """{(workload, variant): [variant ms / baseline ms - 1, ...]} over tritonfa rows in file order, and how many
    rows were left out (not ok, or no ok baseline in their round). after True / False: only the pairs whose variant
    ran after / before the baseline (rows without a `position` count as after: variants.py's fixed order)."""
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    left_out = 0
    rounds: list[list[dict]] = []  # runs of consecutive tritonfa rows of one (workload, round)
    for row in rows:
        if row.get("impl") != "tritonfa":
            continue
        key = (row["workload"], row.get("round", 0))
        current = rounds[-1] if rounds else []
        # a new round: another workload or round number, or a variant the round already has (an appended run)
        if (
            not current
            or (current[0]["workload"], current[0].get("round", 0)) != key
            or any(r["variant"] == row["variant"] for r in current)
        ):
            rounds.append([])
        rounds[-1].append(row)
    for members in rounds:
        base = next((r for r in members if r["variant"] == baseline), None)  # a round runs each variant once
        if base is not None and base.get("status") != "ok":
            left_out += 1
            base = None
        for row in members:
            if row is base or row["variant"] == baseline:
                continue
            if row.get("status") != "ok" or base is None:
                left_out += 1
                continue
            ran_after = row.get("position", 1) > base.get("position", 0)
            if after is None or after == ran_after:
                ratios[(row["workload"], row["variant"])].append(row["ms"] / base["ms"] - 1)
    return ratios, left_out


def summarize(ratios: dict[tuple[str, str], list[float]]) -> list[dict]:
    return [
        dict(workload=w, variant=v, pairs=len(d), mean=statistics.mean(d), median=statistics.median(d),
             wins=sum(x < 0 for x in d))
        for (w, v), d in sorted(ratios.items())
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="variants-<plan>.jsonl files (pooled)")
    parser.add_argument("--baseline", default="default", help="the variant the others are paired with")
    parser.add_argument("--split-order", action="store_true", help="also the pairs run after / before the baseline")
    args = parser.parse_args(argv)
    tables = [("", None)] + ([(" (ran after it)", True), (" (ran before it)", False)] if args.split_order else [])
    for title, after in tables:
        pooled: dict[tuple[str, str], list[float]] = defaultdict(list)
        left_out = 0
        for path in args.files:  # pairs never cross files: each file's rounds are its own
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            ratios, skipped = paired_ratios(rows, args.baseline, after)
            left_out += skipped
            for key, values in ratios.items():
                pooled[key].extend(values)
        print(f"{'workload':36} {'variant':24} pairs   mean  median  wins (time / {args.baseline}'s - 1){title}")
        for s in summarize(pooled):
            mean, median = 100 * s["mean"], 100 * s["median"]
            wins = f"{s['wins']}/{s['pairs']}"
            print(f"{s['workload']:36} {s['variant']:24} {s['pairs']:5d} {mean:+6.2f}% {median:+6.2f}%  {wins}")
        if left_out and after is None:
            print(f"{left_out} rows left out (not ok, or no ok {args.baseline} row in their round)")


if __name__ == "__main__":
    main()
