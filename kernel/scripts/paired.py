"""Paired A/B summary of `variants.py` runs: each variant's time over the baseline's (the `default` row) of the same
round and workload, pooled over the files given. On a GPU whose clocks move 3-8% between rounds, only such paired
ratios separate a 1% change from noise.

    python kernel/scripts/paired.py RESULTS/variants-prefill.jsonl [MORE.jsonl ...] [--baseline default]

variants.py writes, per workload and round, the baseline first and then each variant; a variant's row is paired
with the last baseline row of its workload and round before it in the same file (a file appended to by two runs
repeats the round numbers). Rows that are not `ok` (a wrong output or a failed launch) pair with nothing and are
counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path


def paired_ratios(rows: list[dict], baseline: str = "default") -> tuple[dict[tuple[str, str], list[float]], int]:
    """{(workload, variant): [variant ms / baseline ms - 1, ...]} over tritonfa rows in file order, and how many
    rows were left out (not ok, or no baseline before them)."""
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    last: dict[tuple[str, int], float] = {}  # (workload, round) -> the baseline's ms
    left_out = 0
    for row in rows:
        if row.get("impl") != "tritonfa":
            continue
        workload, variant, key = row["workload"], row["variant"], (row["workload"], row.get("round", 0))
        if row.get("status") != "ok":
            left_out += 1
            if variant == baseline:
                last.pop(key, None)  # nothing to pair the next variants with
            continue
        if variant == baseline:
            last[key] = row["ms"]
        elif key in last:
            ratios[(workload, variant)].append(row["ms"] / last[key] - 1)
        else:
            left_out += 1
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
    args = parser.parse_args(argv)
    pooled: dict[tuple[str, str], list[float]] = defaultdict(list)
    left_out = 0
    for path in args.files:  # pairs never cross files: each file's rounds are its own
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        ratios, skipped = paired_ratios(rows, args.baseline)
        left_out += skipped
        for key, values in ratios.items():
            pooled[key].extend(values)
    print(f"{'workload':36} {'variant':24} pairs   mean  median  wins (time / {args.baseline}'s - 1)")
    for s in summarize(pooled):
        mean, median = 100 * s["mean"], 100 * s["median"]
        wins = f"{s['wins']}/{s['pairs']}"
        print(f"{s['workload']:36} {s['variant']:24} {s['pairs']:5d} {mean:+6.2f}% {median:+6.2f}%  {wins}")
    if left_out:
        print(f"{left_out} rows left out (not ok, or no {args.baseline} row before them)")


if __name__ == "__main__":
    main()
