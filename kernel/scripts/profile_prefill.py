"""Hardware counters of one attention launch per (workload, config), through Nsight Compute: where the time goes
(issues 11 and 12 ask for the evidence behind each gap to FA3: tensor-pipe use, warp stall reasons). Prefill
workloads on Hopper profile the Gluon prefill, decode workloads the decode launch (the Gluon decode for Hopper's
fp8-KV paged calls, else the portable kernel).

For every workload x variant it starts one `ncu` process on this script's `--child` mode, which runs tritonfa on
the bench's case three times (compile, warm-up, the profiled call); ncu keeps the third launch of an attention
kernel (`attention_fwd*`; a mixed batch's calls launch two, so there it is the second call's prefill launch).
The clocks are left alone (`--clock-control none`, as the device notes ask). Then it exports each report's
details and raw pages as CSV and writes a table of the chosen metrics, and from the source page (SourceCounters'
sampled warp stalls per SASS instruction) the opcodes and instructions the warps wait on.

    python kernel/scripts/profile_prefill.py --out DIR                  # the default workloads and variants
    python kernel/scripts/profile_prefill.py --out DIR --only prefill-b4x4096-noncausal --variants default

Variants name `TRITONFA_CONFIG` overrides from kernel/scripts/variants.py (its prefill and decode variants); the
variant `fa3` profiles FA3's forward kernel on the same case instead (the bench's peer: vLLM's build on PYTHONPATH),
so its counters and stall samples sit beside ours in one table. Writes
DIR/profile-<workload>-<variant>.csv (ncu's details page), -raw.csv (raw page), -sass.csv.gz (source page, SASS)
and -sass-top.md (stall samples by opcode, the hottest instructions), and DIR/profile.md (the summary table).
Needs ncu (on the PATH, or under /opt/nvidia/nsight-compute/*/) and a GPU; exit status 2 when ncu is missing.
"""

from __future__ import annotations

import argparse
import csv
import glob
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

KERNEL = "^attention_(fwd|decode)"  # the Gluon prefill and decode, the portable kernel; not the split-KV combine
# the variant name that profiles FA3 (the bench's peer, from vLLM's build: PYTHONPATH must reach it) instead, through
# its forward kernel's demangled name (a CUTLASS device_kernel<...FlashAttnFwdSm90...>; not its scheduler's kernel)
PEER_VARIANT = "fa3"
PEER_KERNEL = "FlashAttnFwd"
WORKLOADS = ("prefill-b4x4096-noncausal", "prefill-b8x2048-causal", "fp8-prefill-b8x2048-causal-paged")
VARIANTS = ("default",)
# (label, ncu metric name): what the summary shows; the CSV keeps every metric of the sections
METRICS = (
    ("duration us", "Duration"),
    ("SM busy %", "Compute (SM) Throughput"),
    ("issue slots busy %", "Issue Slots Busy"),
    ("registers", "Registers Per Thread"),
    ("warp cycles / instr", "Warp Cycles Per Issued Instruction"),
    ("issued IPC", "Issued Ipc Active"),
    ("L2 hit %", "L2 Hit Rate"),
    ("DRAM %", "DRAM Throughput"),
)
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "SchedulerStats", "WarpStateStats", "LaunchStats", "Occupancy",
            "MemoryWorkloadAnalysis", "SourceCounters")  # fmt: skip
TOP_INSTRUCTIONS = 30  # SASS lines listed per profile, by warp stall samples


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"))
    return candidates[-1] if candidates else None


def child(workload_name: str, impl: str = "tritonfa") -> None:
    """Three calls of tritonfa (or the bench's peer `impl`) on the bench's case (the third is the one ncu keeps)."""
    import torch
    from variants import workloads_by_name  # the bench's workloads and variants.py's diagnostic shapes

    from tritonfa.bench import make_case
    from tritonfa.bench.peers import prepare

    workload = workloads_by_name()[workload_name]
    case = make_case(workload, torch.device("cuda"))
    run = prepare(impl, case).run
    for _ in range(3):
        run()
    torch.cuda.synchronize()


def export(ncu: str, report: Path, page: str) -> str:
    return subprocess.run([ncu, "--import", str(report), "--page", page, "--csv"], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def export_sass(ncu: str, report: Path) -> str:
    """The source page as SASS with its per-instruction counters (SourceCounters: warp stall samples), CSV; empty
    where this ncu cannot print it (the rest of the profile stands without it)."""
    done = subprocess.run([ncu, "--import", str(report), "--page", "source", "--csv", "--print-source", "sass"],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        print(f"ncu source page: exit {done.returncode}: {done.stderr[-400:]}", flush=True)
        return ""
    return done.stdout


def _number(cell: str) -> float | None:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return None


def sass_hotspots(text: str, top: int = TOP_INSTRUCTIONS) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Where the warps wait, per SASS instruction: ncu's source page (CSV: a header row with "Source" and a "Warp Stall
    Sampling (All Samples)" column, then a row per instruction) -> (stall samples summed per opcode, as shares of all
    samples, largest first; the `top` instructions by samples, as "address: source" with their share). The kernel's
    BAR.SYNCs, mbarrier polls (SYNCS) and wgmma waits (WARPGROUP.DEPBAR) are what the "barrier" and "wait" stall
    reasons of WarpStateStats sum over: this names which ones."""
    rows = list(csv.reader(io.StringIO(text)))
    at = next((i for i, row in enumerate(rows) if "Source" in row and any("Stall Sampling (All" in c for c in row)), -1)
    if at < 0:
        return [], []
    header = rows[at]
    source = header.index("Source")
    samples = next(i for i, cell in enumerate(header) if "Stall Sampling (All" in cell)
    address = header.index("Address") if "Address" in header else None
    lines = []
    for row in rows[at + 1 :]:
        if len(row) != len(header):
            continue
        count = _number(row[samples])
        if count is None:
            continue
        lines.append((row[address] if address is not None else "", row[source].strip(), count))
    total = sum(count for _, _, count in lines)
    if total <= 0:
        return [], []
    by_opcode: dict[str, float] = {}
    for _, text_line, count in lines:
        tokens = [t for t in text_line.split() if not t.startswith("@")]  # a predicate guard is not the opcode
        opcode = tokens[0].split(".")[0] if tokens else "?"
        by_opcode[opcode] = by_opcode.get(opcode, 0.0) + count
    opcodes = sorted(((op, count / total) for op, count in by_opcode.items()), key=lambda item: -item[1])
    hottest = sorted(lines, key=lambda line: -line[2])[:top]
    return opcodes, [
        (f"{addr}: {text_line}" if addr else text_line, count / total) for addr, text_line, count in hottest
    ]


def raw_metrics(text: str) -> dict[str, float]:
    """The raw page (a header row of metric names, a row of units, a row per kernel) as {name: value}."""
    rows = list(csv.reader(io.StringIO(text)))
    if len(rows) < 3:
        return {}
    values = {}
    for name, value in zip(rows[0], rows[2]):
        try:
            values[name] = float(value.replace(",", ""))
        except ValueError:
            pass
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".", help="folder for the reports, CSVs and profile.md")
    parser.add_argument("--only", default=",".join(WORKLOADS),
                        help="comma-separated: bench workloads, variants.py's diagnostic shapes")  # fmt: skip
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated variants.py prefill variants")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child-impl", default="tritonfa", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.child_impl)
        return 0

    from variants import DECODE_VARIANTS, PREFILL_VARIANTS  # kernel/scripts/variants.py

    known = {**DECODE_VARIANTS, **PREFILL_VARIANTS}

    ncu = find_ncu()
    if ncu is None:
        print("profile_prefill: ncu not found (PATH, /opt/nvidia/nsight-compute/*/ncu)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v != PEER_VARIANT and v not in known]
    if unknown:
        print(f"profile_prefill: unknown variants {unknown} (variants.py's, or {PEER_VARIANT!r})", file=sys.stderr)
        return 1
    # the caller's PYTHONPATH stays behind the kernel's source (FA3 comes from vLLM's build there)
    python_path = os.pathsep.join(p for p in (str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")) if p)
    for workload in [w for w in args.only.split(",") if w]:
        for variant in variants:
            peer = variant == PEER_VARIANT
            config = {} if peer else {k: v for k, v in known[variant].items() if k != "env"}
            env = {**os.environ, "TRITONFA_CONFIG": json.dumps(config), "PYTHONPATH": python_path}
            report = out / f"profile-{workload}-{variant}"
            command = [ncu, "--clock-control", "none", "--launch-skip", "2", "--launch-count", "1",
                       "--force-overwrite", "-o", str(report)]  # fmt: skip
            if peer:
                command += ["--kernel-name-base", "demangled", "--kernel-name", f"regex:{PEER_KERNEL}"]
            else:
                command += ["--kernel-name", f"regex:{KERNEL}"]
            command += [arg for section in SECTIONS for arg in ("--section", section)]
            command += [sys.executable, __file__, "--child", workload]
            command += ["--child-impl", "fa3"] if peer else []
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0 or not report.with_suffix(".ncu-rep").exists():
                print(f"{workload} {variant}: ncu failed ({done.returncode}): {done.stderr[-800:]}", flush=True)
                continue
            details_csv = export(ncu, report.with_suffix(".ncu-rep"), "details")
            raw_csv = export(ncu, report.with_suffix(".ncu-rep"), "raw")
            (out / f"profile-{workload}-{variant}.csv").write_text(details_csv)
            (out / f"profile-{workload}-{variant}-raw.csv").write_text(raw_csv)
            sass_csv = export_sass(ncu, report.with_suffix(".ncu-rep"))
            opcodes, hottest = sass_hotspots(sass_csv)
            if sass_csv:
                with gzip.open(out / f"profile-{workload}-{variant}-sass.csv.gz", "wt") as sink:
                    sink.write(sass_csv)
            with open(out / f"profile-{workload}-{variant}-sass-top.md", "w") as sink:
                sink.write(f"# {workload} / {variant}: warp stall samples by SASS opcode and instruction\n\n")
                sink.write("opcodes: " + ", ".join(f"{op} {share:.1%}" for op, share in opcodes[:12]) + "\n\n")
                sink.write("".join(f"- {share:.2%} `{line}`\n" for line, share in hottest) or "(no source page)\n")
            report.with_suffix(".ncu-rep").unlink()  # the CSVs hold what the table needs; reports are large
            metrics = list(csv.DictReader(io.StringIO(details_csv)))
            values = {
                m.get("Metric Name"): f"{m.get('Metric Value')} {m.get('Metric Unit', '')}".strip() for m in metrics
            }
            raw = raw_metrics(raw_csv)
            # stall reasons: warps stalled per issued instruction, by reason (WarpStateStats' raw metrics)
            prefix = "smsp__average_warps_issue_stalled_"
            stalls = sorted(((name[len(prefix):].split("_per_")[0], value) for name, value in raw.items()
                             if name.startswith(prefix) and name.endswith("_per_issue_active.ratio")),
                            key=lambda item: -item[1])[:5]  # fmt: skip
            pipes = {name: value for name, value in raw.items() if "pipe_tensor" in name and "pct_of_peak" in name}
            tensor = max(pipes.values()) if pipes else None
            rows.append((workload, variant, [values.get(name, "-") for _, name in METRICS], stalls, tensor, opcodes))
            print(workload, variant, rows[-1][2], flush=True)
    with open(out / "profile.md", "w") as sink:
        header = ["workload", "variant", *(label for label, _ in METRICS), "tensor pipe %", "top stalls (per instr)",
                  "stall samples by opcode"]  # fmt: skip
        sink.write("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|\n")
        for workload, variant, values, stalls, tensor, opcodes in rows:
            top = "; ".join(f"{name} {value:.2f}" for name, value in stalls) or "-"
            pipe = f"{tensor:.1f}" if tensor is not None else "-"
            where = "; ".join(f"{op} {share:.0%}" for op, share in opcodes[:5]) or "-"
            sink.write(f"| {workload} | {variant} | " + " | ".join(values) + f" | {pipe} | {top} | {where} |\n")
    print((out / "profile.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
