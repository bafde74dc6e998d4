"""Merge asv result folders, and move them to and from a results store, so the history accumulates.

    python asv_bench/results_store.py merge SRC DST [--keep-existing]   SRC's results into DST (a results folder)
    python asv_bench/results_store.py pull URI DIR                       the store's results into DIR
    python asv_bench/results_store.py push DIR URI                       DIR's results into the store (adds, never
                                                                         deletes)

A results folder is asv's: benchmarks.json, and <machine>/machine.json plus one <commit>-<env>.json per commit
(format version 2). Merging works per value: for each benchmark and each parameter combination, a finite value
from the preferred side wins (SRC's, or with --keep-existing DST's), else the other side's. So a second recording
of one commit that measured only some parameters (e.g. the fp8 kv cache after the bf16 one, or the peers after
tritonfa) adds to the first instead of replacing it, and nothing recorded is lost to a later partial run. A
benchmark whose `version` differs takes the preferred side whole (asv hides the other version anyway).
benchmarks.json and machine.json are taken from the preferred side.

URI: `s3://bucket/prefix` (the `aws` CLI, credentials from the agent's environment) or a folder (a path or
file://...), e.g. a volume mounted on the CI agents. ci/asv_publish.sh uses pull / merge / push on Buildkite.
asv_bench/record.py unpack uses merge. Standard library only (the CI agent's python3).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# the columns of a results row that hold one entry per parameter combination (asv 0.6 results format 2)
PER_PARAM = ("result", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25", "stats_q_75", "stats_number",
             "stats_repeat", "samples")  # fmt: skip
SCALAR = ("version", "started_at", "duration", "profile")
SHARED_FILES = ("benchmarks.json", "machine.json")


def log(message: str) -> None:
    print(f"[results_store] {message}", file=sys.stderr, flush=True)


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------------------------------------------------
# merging


def _columns(document: dict, name: str) -> dict:
    row = document["results"][name]
    return {column: row[i] if i < len(row) else None for i, column in enumerate(document["result_columns"])}


def _by_params(row: dict) -> dict:
    """{param combination: {per-param column: value}}; a benchmark without parameters has one combination ()."""
    axes = row.get("params") or []
    combos = list(itertools.product(*axes)) if axes else [()]
    out = {}
    for i, combo in enumerate(combos):
        entry = {}
        for column in PER_PARAM:
            values = row.get(column)
            if column == "result" and values is not None and not isinstance(values, list):
                values = [values]
            entry[column] = values[i] if isinstance(values, list) and i < len(values) else None
        out[combo] = entry
    return out


def merge_row(preferred: dict, other: dict) -> dict:
    """One benchmark's row (column -> value) merged value by value; `preferred` wins where both are finite."""
    if preferred.get("version") != other.get("version"):
        return preferred
    axes_p, axes_o = preferred.get("params") or [], other.get("params") or []
    if len(axes_p) != len(axes_o):
        return preferred
    axes = [list(a) + [v for v in b if v not in a] for a, b in zip(axes_p, axes_o)]
    entries_p, entries_o = _by_params(preferred), _by_params(other)
    combos = list(itertools.product(*axes)) if axes else [()]
    merged = {column: [] for column in PER_PARAM}
    used_preferred = False
    for combo in combos:
        mine, theirs = entries_p.get(combo), entries_o.get(combo)
        if mine is not None and (finite(mine["result"]) or theirs is None or not finite(theirs["result"])):
            chosen, used_preferred = mine, True
        else:
            chosen = theirs or {column: None for column in PER_PARAM}
        for column in PER_PARAM:
            merged[column].append(chosen[column])
    row = dict(preferred if used_preferred else other)
    row["params"] = axes
    for column, values in merged.items():
        row[column] = None if all(v is None for v in values) else values
    return row


def merge_documents(preferred: dict, other: dict) -> dict:
    """Two result files of one machine, commit and environment, merged per benchmark and parameter combination."""
    if preferred.get("result_columns") != other.get("result_columns") or preferred.get("version") != other.get(
        "version"
    ):
        return preferred
    columns = preferred["result_columns"]
    merged = copy.deepcopy(preferred)
    for name in other["results"]:
        if name not in preferred["results"]:
            merged["results"][name] = copy.deepcopy(other["results"][name])
            continue
        row = merge_row(_columns(preferred, name), _columns(other, name))
        values = [row.get(column) for column in columns]
        while values and values[-1] is None:
            values.pop()
        merged["results"][name] = values
    merged["durations"] = {**other.get("durations", {}), **preferred.get("durations", {})}
    return merged


def results_files(folder: Path) -> list[Path]:
    """benchmarks.json and <machine>/*.json under `folder`, relative to it (anything else is ignored)."""
    files = []
    for path in sorted(folder.rglob("*.json")):
        rel = path.relative_to(folder)
        if path.is_symlink() or not path.is_file():
            continue
        if rel.parts == ("benchmarks.json",) or len(rel.parts) == 2:
            files.append(rel)
        else:
            log(f"ignored {rel} (not an asv results file)")
    return files


def merge_tree(src: Path, dst: Path, keep_existing: bool = False) -> dict:
    """Merge results folder `src` into `dst`; returns counts of files added, merged and left as they were."""
    counts = {"added": 0, "merged": 0, "kept": 0}
    for rel in results_files(src):
        incoming = json.loads((src / rel).read_text())  # also validates the file before anything is written
        target = dst / rel
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, target)
            counts["added"] += 1
            continue
        if rel.name in SHARED_FILES:
            if not keep_existing:
                shutil.copy2(src / rel, target)
            counts["merged" if not keep_existing else "kept"] += 1
            continue
        existing = json.loads(target.read_text())
        merged = merge_documents(existing, incoming) if keep_existing else merge_documents(incoming, existing)
        if merged == existing:
            counts["kept"] += 1
            continue
        target.write_text(json.dumps(merged, separators=(", ", ": ")))
        counts["merged"] += 1
    log(f"{src} -> {dst}: {counts['added']} added, {counts['merged']} merged, {counts['kept']} unchanged")
    return counts


# ---------------------------------------------------------------------------------------------------------------
# the store


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def local(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def aws(*args: str) -> None:
    if not shutil.which("aws"):
        raise SystemExit("[results_store] the aws CLI is not on PATH (needed for s3:// stores)")
    cmd = ["aws", "s3", "sync", "--no-progress", "--only-show-errors", *args]
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True)


def pull(uri: str, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if is_s3(uri):
        aws(uri, str(folder))
    elif local(uri).is_dir():
        shutil.copytree(local(uri), folder, dirs_exist_ok=True)
    else:
        log(f"{uri} does not exist yet: an empty store")
    log(f"pulled {len(results_files(folder))} files from {uri}")


def push(folder: Path, uri: str) -> None:
    files = results_files(folder)
    if is_s3(uri):
        with tempfile.TemporaryDirectory() as tmp:  # only results files, whatever else lies in the folder
            for rel in files:
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(folder / rel, Path(tmp) / rel)
            aws(tmp, uri)
    else:
        for rel in files:
            (local(uri) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(folder / rel, local(uri) / rel)
    log(f"pushed {len(files)} files to {uri}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("merge", help="merge results folder SRC into DST")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--keep-existing", action="store_true", help="DST's values win where both sides have one")
    p = sub.add_parser("pull", help="copy the store's results into DIR")
    p.add_argument("uri")
    p.add_argument("folder", type=Path)
    p = sub.add_parser("push", help="copy DIR's results into the store (nothing there is deleted)")
    p.add_argument("folder", type=Path)
    p.add_argument("uri")
    args = parser.parse_args(argv)
    if args.command == "merge":
        if not args.src.is_dir():
            log(f"{args.src}: no such folder, nothing to merge")
            return 0
        merge_tree(args.src, args.dst, keep_existing=args.keep_existing)
    elif args.command == "pull":
        pull(args.uri, args.folder)
    else:
        push(args.folder, args.uri)
    return 0


if __name__ == "__main__":
    sys.exit(main())
