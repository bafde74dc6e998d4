"""What a run leaves behind: the header (device, versions, commit), the table, the JSON document and the chart."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
import subprocess
from pathlib import Path

import torch

from .cases import TOLERANCE_16BIT, TOLERANCE_FP8
from .errors import one_line
from .peers import IMPLS
from .runner import Row
from .timing import TIMER_DESCRIPTIONS
from .workloads import Workload


def git_commit() -> str:
    """TRITONFA_COMMIT when set (a copy of the tree without its own `.git`), else this checkout's commit."""
    if os.environ.get("TRITONFA_COMMIT"):
        return os.environ["TRITONFA_COMMIT"]
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if result.returncode == 0 and result.stdout.strip():
            return result.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("TRITONFA_COMMIT", "unknown")


def vllm_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def collect_header(device: torch.device, mode: str) -> dict:
    import triton

    on_gpu = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if on_gpu else f"CPU ({platform.processor() or platform.machine()})"
    return {
        "device": name,
        "mode": mode,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "vllm": vllm_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if on_gpu else None,
        "python": platform.python_version(),
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
        "timers": TIMER_DESCRIPTIONS,
        "ratio": "tritonfa's speed / the peer's (>1: tritonfa faster); on tritonfa's row, / the fastest correct peer",
        "tolerance": {"16bit": TOLERANCE_16BIT, "fp8": TOLERANCE_FP8},
        "first_call": "a workload's first call in this process: its new kernels' compiles, C launchers and planning "
        "(Triton's one-time start-up, before the first workload: triton_startup_s)",
    }


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _ceiling_share(workload: Workload, row: Row, ceilings: dict) -> str:
    if row.ms is None:
        return ""
    if workload.metric == "gbps" and ceilings.get("copy_gbps"):
        return f"{100 * row.gbps / ceilings['copy_gbps']:.0f}% copy"
    if workload.metric == "tflops":
        key = "fp8_scaled_mm_tflops" if workload.fp8_q else "bf16_matmul_tflops"
        if ceilings.get(key):
            return f"{100 * row.tflops / ceilings[key]:.0f}% {'fp8 mm' if workload.fp8_q else 'mm'}"
    return ""


def table_lines(header: dict, ceilings: dict, workloads: list[Workload], rows: list[Row]) -> tuple[str, list, list]:
    """(title, column names, rows of cells) shared by the rich and the plain table."""
    title = (
        f"tritonfa bench — {header['device']} — {header['mode']} — {header['date']} — commit {header['commit']}\n"
        f"torch {header['torch']}, triton {header['triton']}, vLLM {header['vllm'] or 'not installed'}"
        f"{', interpreter' if header['interpreter'] else ''}\n"
        f"ceilings: copy {_fmt(ceilings.get('copy_gbps'), '.0f')} GB/s, "
        f"bf16 matmul {_fmt(ceilings.get('bf16_matmul_tflops'), '.0f')} TFLOP/s, "
        f"fp8 _scaled_mm {_fmt(ceilings.get('fp8_scaled_mm_tflops'), '.0f')} TFLOP/s"
    )
    columns = ["workload", "impl", "ms", "TFLOP/s", "GB/s", "of ceiling", "ratio", "rel. err", "note"]
    by_name = {w.name: w for w in workloads}
    cells = []
    for row in rows:
        workload = by_name[row.workload]
        if row.ms is None:
            cells.append(
                [row.workload, row.impl, "—", "—", "—", "", "", "—", one_line(f"{row.status}: {row.reason}", 70)]
            )
            continue
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        if row.impl == "tritonfa" and row.best_peer:
            ratio += f" vs {row.best_peer}"
        note = ("WRONG (failed the reference check); " if not row.ok else "") + row.note
        if row.timer and row.timer not in ("events", "cuda-graph", "cpu-wall"):
            note += f" [{row.timer}]"
        cells.append([
            row.workload, row.impl, f"{row.ms:.4f}",
            _fmt(row.tflops, ".1f") if workload.kind != "decode" else "",
            _fmt(row.gbps, ".0f") if workload.kind != "prefill" else "",
            _ceiling_share(workload, row, ceilings), ratio, _fmt(row.error, ".1e"), note,
        ])  # fmt: skip
    return title, columns, cells


def print_table(header: dict, ceilings: dict, workloads: list[Workload], rows: list[Row]) -> None:
    title, columns, cells = table_lines(header, ceilings, workloads, rows)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(c)) for c in col) for col in zip(columns, *cells)]
        widths[-1] = min(widths[-1], 80)
        print(title)
        print("  ".join(name.ljust(width) for name, width in zip(columns, widths)))
        previous = None
        for line in cells:
            if previous is not None and line[0] != previous:
                print()
            previous = line[0]
            shown = [line[0] if line[1] == "tritonfa" else "", *line[1:]]
            print("  ".join(str(c)[:w].ljust(w) for c, w in zip(shown, widths)).rstrip())
        return
    table = Table(title=title, show_lines=False)
    for name in columns:
        table.add_column(name, justify="left" if name in ("workload", "impl", "note") else "right", overflow="fold")
    previous = None
    for line in cells:
        if previous is not None and line[0] != previous:
            table.add_section()
        previous = line[0]
        table.add_row(*[line[0] if line[1] == "tritonfa" else "", *line[1:]])
    Console(width=max(160, Console().width)).print(table)


def summary(workloads: list[Workload], rows: list[Row]) -> list[dict]:
    out = []
    for workload in workloads:
        ours = next((r for r in rows if r.workload == workload.name and r.impl == "tritonfa"), None)
        if ours is None:
            continue
        best = next((r for r in rows if r.workload == workload.name and r.impl == ours.best_peer), None)
        out.append({
            "workload": workload.name, "metric": workload.metric, "tritonfa_ms": ours.ms, "tritonfa_ok": ours.ok,
            "best_peer": ours.best_peer, "best_peer_ms": best.ms if best else None, "ratio": ours.ratio,
        })  # fmt: skip
    return out


def print_summary(workloads: list[Workload], rows: list[Row]) -> None:
    for item in summary(workloads, rows):
        ratio = "—" if item["ratio"] is None else f"{item['ratio']:.2f}x vs {item['best_peer']}"
        print(f"{item['workload']:<32} tritonfa {_fmt(item['tritonfa_ms'], '.4f')} ms  {ratio}")


def write_json(path: Path, header: dict, ceilings: dict, workloads: list[Workload], rows: list[Row]) -> None:
    document = {
        "schema": 1,
        "header": header,
        "ceilings": ceilings,
        "workloads": [
            dict(
                dataclasses.asdict(w),
                metric=w.metric,
                visible_pairs=w.visible_pairs,
                flops=w.flops,
                bytes_moved=w.bytes_moved,
                description=w.describe(),
            )
            for w in workloads
        ],
        "rows": [dataclasses.asdict(r) for r in rows],
        "summary": summary(workloads, rows),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_json_safe(document), indent=1, allow_nan=False, default=str) + "\n")


def _json_safe(value):
    """NaN / inf (a broken kernel's error) become strings: strict JSON has no literal for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(item) for item in value]
    return value


def write_png(path: Path, header: dict, ceilings: dict, workloads: list[Workload], rows: list[Row]) -> bool:
    """Grouped bars per workload and impl: TFLOP/s (prefill), GB/s (decode), ms (mixed). False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [
        ("prefill", "tflops", "TFLOP/s (higher is better)", ceilings.get("bf16_matmul_tflops"), "bf16 matmul"),
        ("decode", "gbps", "GB/s (higher is better)", ceilings.get("copy_gbps"), "copy"),
        ("mixed", "ms", "ms (lower is better)", None, None),
    ]
    panels = [p for p in panels if any(w.kind == p[0] for w in workloads)]
    impls = [i for i in IMPLS if any(r.impl == i and r.ms is not None for r in rows)]
    colors = dict(zip(IMPLS, ("#d62728", "#1f77b4", "#2ca02c", "#98df8a", "#9467bd", "#ff7f0e", "#7f7f7f")))
    weights = [max(1, sum(w.kind == p[0] for w in workloads)) for p in panels]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4 + 1.3 * sum(weights), 5.5), gridspec_kw={"width_ratios": weights}, squeeze=False
    )
    width = 0.8 / max(1, len(impls))
    for ax, (kind, field, label, ceiling, ceiling_name) in zip(axes[0], panels):
        names = [w.name for w in workloads if w.kind == kind]
        for j, impl in enumerate(impls):
            values = []
            for name in names:
                row = next((r for r in rows if r.workload == name and r.impl == impl), None)
                values.append(getattr(row, field) if row is not None and row.ms is not None else 0.0)
            positions = [i + (j - (len(impls) - 1) / 2) * width for i in range(len(names))]
            ax.bar(positions, values, width, label=impl, color=colors[impl])
        if ceiling:
            ax.axhline(ceiling, color="black", linestyle="--", linewidth=1)
            ax.text(len(names) - 0.5, ceiling, f" {ceiling_name} {ceiling:.0f}", va="bottom", ha="right", fontsize=8)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"tritonfa vs peers — {header['device']} — {header['mode']} — {header['date']} — {header['commit']}\n"
        f"torch {header['torch']}, triton {header['triton']}, vLLM {header['vllm'] or '—'}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
