"""What do the kernel's memory-safety bounds cost (issue 14, target <= 1%)? The benchmark, with and without them.

The kernel never reads or writes outside its tensors, whatever cu_seqlens / seqused_k / block_table hold (block ids
clamped to the cache, keys to the block table's capacity / total_k, q rows to total_q, bias reads to its shape; see
kernel/SEMANTICS.md), in the portable kernel and in Hopper's Gluon prefill (which serves the prefill workloads there by
default). The library has no switch to turn that off, so this tool builds one: a copy of kernel/src in a
temporary folder with the bounds removed by exact textual replacements (REPLACEMENTS below). Every replacement keeps
the kernel correct for valid inputs; each pattern must occur exactly once, so a kernel edit that moves or rewrites a
bound stops the tool with the pattern's name instead of letting it time two identical kernels.

It then runs `python -m tritonfa.bench` (tritonfa alone, no peers; the bench's own reference check and timers) in
separate processes, alternating between the tree (PYTHONPATH=kernel/src) and the unbounded copy, ABBA order (even
rounds bounded first, odd rounds unbounded first) so drift of the card's clocks falls on both sides, and reports per
workload the median time of each side, their ratio bounded / unbounded and the spread over the rounds.

    python kernel/scripts/mask_cost.py --check                      # the replacements as a diff, nothing timed
    python kernel/scripts/mask_cost.py --out DIR                    # GPU: 5 rounds on the default workloads
    python kernel/scripts/mask_cost.py --rounds 9 --only decode-b64x2048-paged,decode-b8x32768-paged --out DIR
    python kernel/scripts/mask_cost.py --device cpu --quick --rounds 1 --only decode-b64x2048-paged   # plumbing

Writes DIR/mask_cost.json and DIR/mask_cost.md (rewritten after every round, so a run cut short leaves what it
measured) and each bench process's JSON and log under DIR/runs/. On the CPU the bench runs its tiny-shape dry run in
Triton's interpreter (`--dry-run`): the pipeline works, the times mean nothing. Exit status: 0 after a completed
measurement, whatever it found (the tool reports, it does not gate); 2 on setup errors (a pattern not found once, an
unknown workload, tritonfa imported from the wrong tree, the first bench process leaving no results); 1 when a later
bench process left no results (what the earlier rounds measured stays written).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KERNEL_SRC = Path(__file__).resolve().parents[1] / "src"
REPO = KERNEL_SRC.parents[1]
ATTENTION = "tritonfa/kernels/attention.py"
HOPPER = "tritonfa/kernels/attention_hopper.py"  # the Gluon prefill (Hopper's default prefill path)

# (file under kernel/src, what the bound does, exact old text, new text). Valid inputs (what `validate=True` accepts)
# never reach any of these bounds, so the copy computes the same output for them.
REPLACEMENTS: tuple[tuple[str, str, str, str], ...] = (
    (
        ATTENTION,
        "TMA paged: block id clamped into [0, num_blocks)",
        "i_page = tl.minimum(tl.maximum(i_page, 0), num_blocks - 1)",
        "i_page = i_page",
    ),
    (
        ATTENTION,
        "pointer paged: block id clamped into [0, num_blocks)",
        "i_block = tl.minimum(i_block.to(tl.uint32, bitcast=True), last_block).to(tl.int32, bitcast=True)",
        "i_block = i_block",
    ),
    (
        ATTENTION,
        "q length cut at total_q",
        "seq_q_len = tl.minimum(tl.load(cu_seqlens_q_ptr + seq + 1), total_q) - seq_q_start",
        "seq_q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - seq_q_start",
    ),
    (
        ATTENTION,
        "contiguous k start clamped into [0, total_k]",
        "seq_k_start = tl.minimum(tl.maximum(tl.load(cu_seqlens_k_ptr + seq), 0), total_k)",
        "seq_k_start = tl.load(cu_seqlens_k_ptr + seq)",
    ),
    (
        ATTENTION,
        "k length clamped into [0, block-table capacity / rest of k]",
        "seq_k_len = tl.minimum(tl.maximum(seq_k_len, 0), seq_k_cap)",
        "seq_k_len = seq_k_len",
    ),
    (
        ATTENTION,
        "q rows masked to [0, total_q)",
        "row_valid = (q_idx < seq_q_len) & (head_in_group < GROUP) & (i_q_tok >= 0) & (i_q_tok < total_q)",
        "row_valid = (q_idx < seq_q_len) & (head_in_group < GROUP)",
    ),
    (
        ATTENTION,
        "bias reads masked to its shape",
        "m_bias = (row_valid & (q_idx < bias_len_q))[:, None] & (m_k & (i_k < bias_len_k))[None, :]",
        "m_bias = row_valid[:, None] & m_k[None, :]",
    ),
    (
        HOPPER,
        "Gluon paged: block-table column clamped to the table",
        "block_id = gl.load(table_row + gl.minimum(page, max_blocks - 1))",
        "block_id = gl.load(table_row + page)",
    ),
    (
        HOPPER,
        "Gluon paged: block id clamped into [0, num_blocks)",
        "return gl.minimum(gl.maximum(block_id, 0), num_cache_blocks - 1).to(gl.int64)",
        "return block_id.to(gl.int64)",
    ),
    (
        HOPPER,
        "Gluon: q length cut at total_q",
        "seq_q_len = gl.minimum(gl.load(cu_seqlens_q_ptr + seq + 1), total_q) - seq_q_start",
        "seq_q_len = gl.load(cu_seqlens_q_ptr + seq + 1) - seq_q_start",
    ),
    (
        HOPPER,
        "Gluon: contiguous k start clamped into [0, total_k]",
        "seq_k_start = gl.minimum(gl.maximum(gl.load(cu_seqlens_k_ptr + seq), 0), total_k)",
        "seq_k_start = gl.load(cu_seqlens_k_ptr + seq)",
    ),
    (
        HOPPER,
        "Gluon: k length clamped into [0, block-table capacity / rest of k]",
        "seq_k_len = gl.minimum(gl.maximum(seq_k_len, 0), seq_k_cap)",
        "seq_k_len = seq_k_len",
    ),
    (
        ATTENTION,
        "split-KV lse buffer filled with -inf (rows no split writes), host side",
        "split_lse = plan_cache.scratch((num_splits, num_q_heads, total_q), torch.float32, q.device, "
        'fill=float("-inf"))',
        "split_lse = plan_cache.scratch((num_splits, num_q_heads, total_q), torch.float32, q.device)",
    ),
)

DEFAULT_WORKLOADS = (
    "decode-b64x2048-paged",
    "decode-b8x32768-paged",
    "mixed-4x512+60-paged",
    "prefill-b8x2048-causal",
    "prefill-b8x2048-causal-paged",
)
TARGET = 1.01  # issue 14: the bounds may cost at most 1%
SIDES = ("bounded", "unbounded")

# Runs the bench's own main() on exactly the named workloads (its --only matches substrings, and no substring selects
# prefill-b8x2048-causal alone), after checking that tritonfa comes from the tree this side is meant to time.
DRIVER = """
import sys
from pathlib import Path

root, names = Path(sys.argv[1]).resolve(), sys.argv[2].split(",")
import tritonfa
if root not in Path(tritonfa.__file__).resolve().parents:
    sys.exit(f"mask_cost: tritonfa was imported from {tritonfa.__file__}, not from {root}")
import tritonfa.bench.__main__ as bench
by_name = {w.name: w for w in bench.WORKLOADS}
missing = [n for n in names if n not in by_name]
if missing:
    sys.exit(f"mask_cost: unknown workloads {missing}; `python -m tritonfa.bench --list` names them")
bench.WORKLOADS = tuple(by_name[n] for n in names)
sys.exit(bench.main(["--only", ",".join(names), *sys.argv[3:]]))
"""


class SetupError(Exception):
    """The measurement cannot start or cannot mean anything (exit status 2)."""


def unbounded_text(path: str, text: str) -> str:
    """`text` (the file `path` under kernel/src) with its REPLACEMENTS applied; SetupError unless each old text
    occurs exactly once."""
    for file, what, old, new in REPLACEMENTS:
        if file != path:
            continue
        count = text.count(old)
        if count != 1:
            raise SetupError(
                f"{file}: the pattern for '{what}' occurs {count} times (expected once): {old!r}; "
                "update REPLACEMENTS in kernel/scripts/mask_cost.py to the kernel's current code"
            )
        text = text.replace(old, new)
    return text


def patched_files(src: Path | None = None) -> dict[str, tuple[str, str]]:
    """{path under `src` (default kernel/src): (original text, unbounded text)} for every file REPLACEMENTS touches."""
    src = src or KERNEL_SRC
    out = {}
    for path in dict.fromkeys(file for file, *_ in REPLACEMENTS):
        if not (src / path).is_file():
            raise SetupError(f"{src / path} not found: update REPLACEMENTS in kernel/scripts/mask_cost.py")
        original = (src / path).read_text()
        out[path] = (original, unbounded_text(path, original))
    return out


def build_unbounded_tree(dest: Path, src: Path | None = None) -> Path:
    """A copy of `src` (default kernel/src) under `dest` with the bounds removed; returns the copy's root (a
    PYTHONPATH entry)."""
    src = src or KERNEL_SRC
    files = patched_files(src)
    root = dest / "src"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"))
    for path, (_, text) in files.items():
        (root / path).write_text(text)
    return root


def unified_diff(src: Path | None = None) -> str:
    lines = []
    for path, (original, text) in patched_files(src).items():
        lines += difflib.unified_diff(
            original.splitlines(keepends=True), text.splitlines(keepends=True), f"a/{path}", f"b/{path} (unbounded)"
        )
    return "".join(lines)


def source_commit() -> str:
    """The tree's commit (git, else TRITONFA_COMMIT as the bench uses it in a copy without .git, else 'unknown')."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
        if result.returncode == 0 and result.stdout.strip():
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--", str(KERNEL_SRC)], cwd=REPO, capture_output=True, text=True
            ).stdout.strip()
            return result.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("TRITONFA_COMMIT", "unknown")


def kernel_hash(src: Path | None = None) -> str:
    """sha256 (12 hex digits) of the files REPLACEMENTS touches: names the kernel code in a copy without .git."""
    src = src or KERNEL_SRC
    digest = hashlib.sha256()
    for path in dict.fromkeys(file for file, *_ in REPLACEMENTS):
        digest.update((src / path).read_bytes())
    return digest.hexdigest()[:12]


def run_bench(side: str, root: Path, names: list[str], args, out_dir: Path, round_no: int, commit: str) -> dict:
    """One bench process on `root`'s tritonfa; returns its JSON document. SetupError when the driver refuses,
    RuntimeError when the process left no JSON."""
    stem = f"{side}-r{round_no}"
    json_path = out_dir / "runs" / f"{stem}.json"
    log_path = out_dir / "runs" / f"{stem}.log"
    json_path.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    env["PYTHONUNBUFFERED"] = "1"
    env["TRITONFA_COMMIT"] = commit if side == "bounded" else f"{commit}-unbounded"
    bench_args = ["--peers", "none", "--json", str(json_path), "--seed", str(args.seed), "--device", args.device]
    if args.device == "cpu":
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")  # the bench's own re-exec would drop the driver
        bench_args.append("--dry-run")
    else:
        env.pop("TRITON_INTERPRET", None)
    if args.quick:
        bench_args.append("--quick")
    command = [sys.executable, "-c", DRIVER, str(root), ",".join(names), *bench_args]
    with open(log_path, "w") as log:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=out_dir)
    tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
    if "mask_cost: " in tail and not json_path.exists():
        raise SetupError(tail.strip().splitlines()[-1].removeprefix("mask_cost: "))
    if not json_path.exists():
        raise RuntimeError(
            f"{stem}: the bench exited with {result.returncode} and wrote no JSON; log {log_path}:\n{tail}"
        )
    document = json.loads(json_path.read_text())
    got = [w["name"] for w in document["workloads"]]
    if got != names:
        raise SetupError(f"{stem}: the bench ran {got}, not {names} (has tritonfa.bench changed its selection?)")
    document["returncode"] = result.returncode
    return document


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(names: list[str], docs: dict[str, list[dict]]) -> list[dict]:
    """Per workload: each side's times over the rounds, medians, ratio bounded / unbounded, spreads."""
    rows = []
    for name in names:
        times: dict[str, list[float | None]] = {}
        failures: list[str] = []
        timer = None
        for side in SIDES:
            times[side] = []
            for round_no, doc in enumerate(docs[side]):
                row = next(r for r in doc["rows"] if r["workload"] == name and r["impl"] == "tritonfa")
                timer = timer or row.get("timer")
                ok = row.get("ok") and row.get("ms") is not None
                times[side].append(row["ms"] if ok else None)
                if not ok:
                    failures.append(f"{side} r{round_no}: {row.get('status')} {row.get('reason') or ''}".strip())
        good = {side: [t for t in times[side] if t is not None] for side in SIDES}
        medians = {side: _median(good[side]) for side in SIDES}
        paired = [b / u for b, u in zip(times["bounded"], times["unbounded"]) if b is not None and u is not None]
        ratio = medians["bounded"] / medians["unbounded"] if all(medians.values()) else None
        rows.append({
            "workload": name, "timer": timer, "rounds": len(docs["unbounded"]),
            "bounded_ms": times["bounded"], "unbounded_ms": times["unbounded"],
            "bounded_median_ms": medians["bounded"], "unbounded_median_ms": medians["unbounded"],
            "ratio": ratio, "cost_percent": None if ratio is None else 100 * (ratio - 1),
            "within_target": None if ratio is None else ratio <= TARGET,
            "bounded_range_ms": [min(good["bounded"]), max(good["bounded"])] if good["bounded"] else None,
            "unbounded_range_ms": [min(good["unbounded"]), max(good["unbounded"])] if good["unbounded"] else None,
            "paired_ratio_range": [min(paired), max(paired)] if paired else None,
            "failures": failures,
        })  # fmt: skip
    return rows


def _f(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _range(pair: list[float] | None, spec: str) -> str:
    return "—" if pair is None else f"{pair[0]:{spec}}-{pair[1]:{spec}}"


def markdown(report: dict) -> str:
    header = report["header"]
    lines = [
        f"# Cost of the kernel's bounds (issue 14, target <= {100 * (TARGET - 1):.0f}%)",
        "",
        f"{header['device']}; torch {header['torch']}, triton {header['triton']}; commit {report['commit']}, "
        f"kernel sha256 {report['kernel_sha256']}; {report['rounds_done']} of {report['rounds']} rounds "
        f"(ABBA order), bench {report['bench_mode']}; {report['date']}.",
        "",
        "ms: median over the rounds (bench timer per workload); ratio: bounded / unbounded medians (> 1: the bounds "
        "cost time); ranges: min-max over the rounds; paired: bounded / unbounded within each round.",
        "",
        "| workload | timer | bounded ms | unbounded ms | ratio | cost | <= 1% | bounded range | unbounded range "
        "| paired ratio range |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["results"]:
        verdict = {True: "yes", False: "no", None: "—"}[row["within_target"]]
        lines.append(
            f"| {row['workload']} | {row['timer']} | {_f(row['bounded_median_ms'], '.4f')} | "
            f"{_f(row['unbounded_median_ms'], '.4f')} | {_f(row['ratio'], '.4f')} | "
            f"{_f(row['cost_percent'], '+.2f')}% | {verdict} | {_range(row['bounded_range_ms'], '.4f')} | "
            f"{_range(row['unbounded_range_ms'], '.4f')} | {_range(row['paired_ratio_range'], '.4f')} |"
        )
    failures = [f"{row['workload']}: {f}" for row in report["results"] for f in row["failures"]]
    if failures:
        lines += ["", "Runs that failed the bench's reference check or were not timed (left out of the medians):"]
        lines += [f"- {f}" for f in failures]
    if header.get("interpreter"):
        lines += ["", "CPU dry run in Triton's interpreter (tiny shapes): the pipeline works; the times mean nothing."]
    lines += ["", "Bounds removed in the unbounded copy:"]
    lines += [f"- {what}" for what in report["replacements"]]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, report: dict) -> None:
    (out_dir / "mask_cost.json").write_text(json.dumps(report, indent=1) + "\n")
    (out_dir / "mask_cost.md").write_text(markdown(report))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="print the diff of the unbounded copy and exit")
    parser.add_argument("--rounds", type=int, default=5, help="bench processes per side (default 5)")
    parser.add_argument("--only", default=",".join(DEFAULT_WORKLOADS),
                        help="comma-separated exact workload names (default: %(default)s)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("mask-cost"), help="results folder (default ./mask-cost)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the bench's dry run in Triton's interpreter (tests the plumbing only)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="the bench's --quick (fewer repetitions, noisier)")
    parser.add_argument("--seed", type=int, default=0, help="the bench's input seed (the same on both sides)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.check:
            sys.stdout.write(unified_diff())
            return 0
        names = [n for n in args.only.split(",") if n]
        if not names or args.rounds < 1:
            raise SetupError("need at least one workload (--only) and one round (--rounds)")
        return measure(args, names)
    except SetupError as error:
        print(f"mask_cost: {error}", file=sys.stderr)
        return 2


def measure(args: argparse.Namespace, names: list[str]) -> int:
    out_dir = args.out.resolve()
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    commit = source_commit()
    mode = ("dry run (CPU interpreter)" if args.device == "cpu" else "full") + (", quick" if args.quick else "")
    report = {
        "tool": "kernel/scripts/mask_cost.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "kernel_sha256": kernel_hash(),
        "rounds": args.rounds,
        "rounds_done": 0,
        "bench_mode": mode,
        "workloads": names,
        "target_ratio": TARGET,
        "replacements": [what for _, what, _, _ in REPLACEMENTS],
        "header": {},
        "results": [],
    }  # fmt: skip
    docs: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="tritonfa-unbounded-") as tmp:
        roots = {"bounded": KERNEL_SRC, "unbounded": build_unbounded_tree(Path(tmp))}
        print(f"mask_cost: {len(names)} workloads x {args.rounds} rounds; unbounded copy in {roots['unbounded']}")
        for round_no in range(args.rounds):
            order = SIDES if round_no % 2 == 0 else SIDES[::-1]
            for side in order:
                try:
                    doc = run_bench(side, roots[side], names, args, out_dir, round_no, commit)
                except RuntimeError as error:
                    print(f"mask_cost: {error}", file=sys.stderr)
                    return 1 if docs["bounded"] or docs["unbounded"] else 2  # the first process: the bench cannot run
                docs[side].append(doc)
                times = ", ".join(
                    f"{r['workload']} {_f(r['ms'], '.4f')} ms{'' if r['ok'] else ' (FAILED check)'}"
                    for r in doc["rows"]
                    if r["impl"] == "tritonfa"
                )
                print(f"round {round_no} {side:9s} {times}", flush=True)
            keys = ("device", "torch", "triton", "cuda", "python", "interpreter", "timers")
            report["header"] = {key: docs["bounded"][0]["header"].get(key) for key in keys}
            report["rounds_done"] = round_no + 1
            report["results"] = summarize(names, docs)
            write_report(out_dir, report)
    print()
    print(markdown(report), end="")
    print(f"wrote {out_dir / 'mask_cost.md'} and {out_dir / 'mask_cost.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
