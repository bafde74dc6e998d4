"""Record asv results for given commits on a machine that receives the working tree but not `.git` (the GPU box).

Three steps; only the first needs git:

  1. host:    python asv_bench/record.py stage [REV ...] [--range HEAD | A..B] [--wheels]
     Writes asv_bench/.stage/ (git-ignored, ~100 KB per commit): each commit's `kernel/` (git archive),
     commits.json (full hash, author date in ms as asv's git backend reads it, subject; branch tips), and with
     --wheels the asv wheels for the GPU image's Python 3.12 (asv is not installed there).
  2. device:  python3 asv_bench/record.py run [--install-wheels] [--commits SHA,...] [--impls ...] [--bench RE]
     For each staged commit, oldest first: `pip install -e` that commit's kernel/ into --python, then
     `asv run -E existing:PY --set-commit-hash SHA --machine NAME` against a config whose "repository" is
     commits.json (asv_manifest_repo.py), and at the end packs results/<machine>/ + results/benchmarks.json into
     $OUT/asv-results-<machine>.tar.gz (the device tool brings back at most 8 files, so one tarball). Results already
     in asv_bench/results (they travel with the tree) are merged by asv, so a long history can be recorded over
     several calls. NAME defaults to the GPU's name as a slug (nvidia-h200, nvidia-h100-80gb-hbm3): one series per
     card. --cpu-smoke runs the same pipeline in Triton's interpreter under the machine name cpu-interpreter.
  3. host:    python asv_bench/record.py unpack asv-results-<machine>.tar.gz    then commit asv_bench/results.

`machine-name [--write]` prints the slug, and with --write adds it to ~/.asv-machine.json (`nox -s asv` uses it).
Exit status of `run`: 0 when every asv run succeeded, 1 when a commit could not be installed or asv failed, 2 when
some benchmark failed (its result is recorded as failed).

The GPU (device tool, one call of at most 10 minutes; see README "Performance history (asv)"):
  carry ["asv_bench/.stage"]; command:
    python3 asv_bench/record.py run --install-wheels --commits SHA1,SHA2 --quick 2>&1 | tee $OUT/record.log

"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
STAGE = HERE / ".stage"
CONF = HERE / "asv.conf.json"
RECORD_CONF = HERE / "asv.record.conf.json"
RESULTS = HERE / "results"
ASV = "asv==0.6.6"
# asv's runtime imports on the GPU image (which has packaging, pyyaml, tabulate, zipp); virtualenv is optional
WHEELS = [ASV, "asv-runner==0.3.2", "json5==0.17.3", "importlib-metadata==8.7.0"]  # 8.7: needs only zipp
# with --range: commits that changed the kernel package, not only the measuring side (this checkout's bench/ and the
# reference.py and interpreter_fixes.py it imports measure every commit; bench.py and workloads.py: where bench/ was)
MEASURING_SIDE = ["bench", "bench.py", "workloads.py", "reference.py", "interpreter_fixes.py"]
DEFAULT_PATHS = ["kernel/src"] + [f":(exclude)kernel/src/tritonfa/{name}" for name in MEASURING_SIDE]
CPU_MACHINE = "cpu-interpreter"


def log(message: str) -> None:
    print(f"[record] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run(cmd, **kwargs)


def git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"[record] git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ---------------------------------------------------------------------------------------------------------------
# stage (host)


def stage(args: argparse.Namespace) -> int:
    revs = list(args.revs)
    if args.range:
        listed = git("rev-list", "--reverse", "--first-parent", args.range, "--", *args.paths).split()
        if not listed:
            log(f"no commit in {args.range} touches {' '.join(args.paths)}")
            return 1
        revs += listed
    if not revs:
        revs = ["HEAD"]
    shas: list[str] = []
    for rev in revs:
        sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
        if sha not in shas:
            shas.append(sha)
    if args.clean and STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "kernels").mkdir(parents=True, exist_ok=True)
    commits = []
    for sha in shas:
        date_s, subject = git("log", "-1", "--format=%at%x00%s", sha).split("\x00", 1)
        target = STAGE / "kernels" / sha
        if not (target / "kernel" / "pyproject.toml").is_file():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            archive = subprocess.run(["git", "archive", "--format=tar", sha, "kernel/pyproject.toml", "kernel/src"],
                                     cwd=REPO, check=True, capture_output=True).stdout  # fmt: skip
            run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        commits.append({"sha": sha, "date_ms": int(date_s) * 1000, "subject": subject})
        log(f"staged {sha[:12]} {subject[:70]}")
    manifest_path = STAGE / "commits.json"
    previous = json.loads(manifest_path.read_text())["commits"] if manifest_path.is_file() and not args.clean else []
    merged = {c["sha"]: c for c in previous + commits}
    branches = {}
    for branch in read_conf().get("branches", ["main"]):
        proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{branch}^{{commit}}"], cwd=REPO,
                              capture_output=True, text=True)  # fmt: skip
        if proc.returncode == 0:
            branches[branch] = proc.stdout.strip()
    manifest = {
        "branches": branches,
        "commits": sorted(merged.values(), key=lambda c: c["date_ms"]),
        "record": [c["sha"] for c in sorted(commits, key=lambda c: c["date_ms"])],
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    if args.wheels:
        wheels = STAGE / "wheels"
        wheels.mkdir(exist_ok=True)
        platforms = [f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                                   "manylinux2014_x86_64", "manylinux1_x86_64")]  # fmt: skip
        run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--python-version=3.12", "--implementation=cp", *platforms, "-d", str(wheels), *WHEELS],
            check=True)  # fmt: skip
    size = sum(p.stat().st_size for p in STAGE.rglob("*") if p.is_file())
    log(f"{STAGE.relative_to(REPO)}: {len(manifest['record'])} commits to record, {size / 1e6:.1f} MB; on the "
        f"device: carry asv_bench/.stage and run `python3 asv_bench/record.py run --install-wheels`")  # fmt: skip
    return 0


# ---------------------------------------------------------------------------------------------------------------
# run (device or CPU, no .git)


def probe_python(python: str, env: dict | None = None) -> dict:
    """GPU name ('' without one, or under the interpreter) and the torch / triton versions of `python`."""
    code = ("import json, os, torch, triton; gpu = torch.cuda.is_available() and os.environ.get('TRITON_INTERPRET') "
            "!= '1'; print(json.dumps({'gpu': torch.cuda.get_device_name(0) if gpu else '', 'torch': "
            "torch.__version__, 'triton': triton.__version__}))")  # fmt: skip
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        log(f"{python}: torch/triton not importable: {out.stderr.strip()[-300:]}")
        return {"gpu": "", "torch": None, "triton": None}
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine_name(probe: dict, cpu_smoke: bool) -> str | None:
    if cpu_smoke:
        return CPU_MACHINE
    return slug(probe["gpu"]) if probe["gpu"] else None


def write_machine_file(python: str, machine: str, accelerator: str, env: dict) -> None:
    """Add `machine` to ~/.asv-machine.json: asv's own defaults (os, cpu, ram, ...) plus the card in the cpu field.

    (`asv machine --yes --machine X` would store only the fields that differ from the defaults: no os, cpu, ram.)
    """
    probe = "import json; from asv.machine import Machine; print(json.dumps(Machine.get_defaults()))"
    info = json.loads(subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True,
                                     check=True).stdout)  # fmt: skip
    info["machine"] = machine
    info["cpu"] = f"{info.get('cpu') or 'unknown CPU'} | {accelerator}"
    path = Path(env.get("HOME") or Path.home()) / ".asv-machine.json"
    machines = json.loads(path.read_text()) if path.is_file() else {}
    machines.update({machine: info, "version": 1})
    path.write_text(json.dumps(machines, indent=4) + "\n")
    log(f"{path}: {json.dumps(info)}")


def describe(probe: dict, cpu_smoke: bool) -> str:
    what = "Triton interpreter on CPU: smoke shapes, not performance" if cpu_smoke else probe["gpu"]
    return f"{what} | torch {probe['torch']}, triton {probe['triton']}"


def read_conf() -> dict:
    text = "\n".join(line for line in CONF.read_text().splitlines() if not line.lstrip().startswith("//"))
    return json.loads(text)


def write_record_conf() -> Path:
    conf = read_conf()
    conf.update({"dvcs": "manifest", "repo": ".stage/commits.json", "plugins": [".asv_manifest_repo"]})
    RECORD_CONF.write_text("// written by asv_bench/record.py run: asv.conf.json with the manifest repository\n"
                           + json.dumps(conf, indent=1) + "\n")  # fmt: skip
    return RECORD_CONF


def pack(machine: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    tarball = out_dir / f"asv-results-{machine}.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(RESULTS / "benchmarks.json", arcname="benchmarks.json")
        tar.add(RESULTS / machine, arcname=machine)
    return tarball


def run_commits(args: argparse.Namespace) -> int:
    python = args.python
    manifest_path = STAGE / "commits.json"
    if not manifest_path.is_file():
        log(
            f"{manifest_path} is missing: run `python asv_bench/record.py stage ...` on the host, carry asv_bench/.stage"
        )
        return 1
    manifest = json.loads(manifest_path.read_text())
    shas = manifest["record"]
    if args.commits:
        wanted = [c.strip() for c in args.commits.split(",") if c.strip()]
        shas = [sha for sha in shas if any(sha.startswith(w) for w in wanted)]
        if len(shas) != len(wanted):
            log(f"--commits {args.commits}: {len(shas)} of {len(wanted)} found among the staged commits")
            return 1
    if args.install_wheels:
        wheels = sorted(str(p) for p in (STAGE / "wheels").glob("*.whl"))
        if not wheels:
            log("--install-wheels: asv_bench/.stage/wheels is empty (stage with --wheels)")
            return 1
        run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile", *wheels],
            check=True)  # fmt: skip
    if run([python, "-c", "import asv, asv_runner"]).returncode != 0:
        log(f"asv is not importable in {python}: pass --install-wheels (GPU) or --python with a venv that has {ASV}")
        return 1
    probe = probe_python(python)
    machine = args.machine or machine_name(probe, args.cpu_smoke)
    if not machine:
        log("no GPU visible: pass --cpu-smoke for the interpreter series, or --machine to name this one")
        return 1
    env = dict(os.environ)
    home = STAGE / "home"  # asv keeps its machine file in ~/.asv-machine.json: a private one, not the user's
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if args.cpu_smoke:
        env.update({"TRITONFA_ASV_MODE": "cpu-smoke", "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})
    else:
        env.pop("TRITON_INTERPRET", None)
    if args.impls:
        env["TRITONFA_ASV_IMPLS"] = args.impls
    if args.quick:
        env["TRITONFA_ASV_QUICK"] = "1"
    if args.e2e_kv:
        env["TRITONFA_ASV_E2E_KV"] = args.e2e_kv
    conf = write_record_conf()
    write_machine_file(python, machine, describe(probe, args.cpu_smoke), env)
    status = 0
    for sha in shas:
        commit = next(c for c in manifest["commits"] if c["sha"] == sha)
        kernel = STAGE / "kernels" / sha / "kernel"
        log(f"=== {sha[:12]} {commit['subject'][:80]}")
        install = run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e",
                       str(kernel)], env=env)  # fmt: skip
        where = subprocess.run([python, "-c", "import tritonfa; print(tritonfa.__file__)"], env=env,
                               capture_output=True, text=True).stdout.strip()  # fmt: skip
        if install.returncode != 0 or not where.startswith(str(kernel)):
            log(f"{sha[:12]}: could not install its kernel (tritonfa resolves to {where or 'nothing'}); skipped")
            status = 1
            continue
        cmd = [python, "-m", "asv", "run", "--config", str(conf), "-E", f"existing:{python}",
               "--set-commit-hash", sha, "--machine", machine, "--show-stderr"]  # fmt: skip
        if args.bench:
            cmd += ["--bench", args.bench]
        rc = run(cmd, env=env).returncode
        log(f"{sha[:12]}: asv run exited {rc}")
        if rc not in (0, 2):
            status = 1
        elif rc == 2 and status == 0:
            status = 2
    if args.restore and (REPO / "kernel" / "pyproject.toml").is_file():
        run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "-e",
             str(REPO / "kernel")], env=env)  # fmt: skip
    if (RESULTS / machine).is_dir():
        out_dir = Path(args.out or os.environ.get("OUT") or STAGE / "out")
        log(f"results packed: {pack(machine, out_dir)}")
    return status


# ---------------------------------------------------------------------------------------------------------------
# unpack (host)


def unpack(args: argparse.Namespace) -> int:
    with tarfile.open(args.tarball) as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts or not (member.isfile() or member.isdir()):
                log(f"refusing {member.name!r}")
                return 1
            if member.isfile() and not (member.name == "benchmarks.json" or len(parts) == 2):
                log(f"unexpected member {member.name!r} (want benchmarks.json and <machine>/<file>.json)")
                return 1
        tar.extractall(RESULTS, members=members, filter="data")
    machines = sorted({Path(m.name).parts[0] for m in members if m.isfile() and m.name != "benchmarks.json"})
    log(f"unpacked into {RESULTS.relative_to(REPO)}: machines {', '.join(machines)}; now `git add asv_bench/results`")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stage", help="host: stage commits (kernel/ trees, dates) into asv_bench/.stage")
    p.add_argument("revs", nargs="*", help="commits to stage (default HEAD unless --range)")
    p.add_argument(
        "--range",
        help="git revision range, e.g. HEAD (all history) or f984ecb..HEAD: its first-parent "
        "commits that touch --paths",
    )
    p.add_argument("--paths", nargs="+", default=DEFAULT_PATHS, help=f"with --range (default {DEFAULT_PATHS})")
    p.add_argument("--wheels", action="store_true", help="also download the asv wheels for the GPU's Python 3.12")
    p.add_argument("--clean", action="store_true", help="forget previously staged commits")

    p = sub.add_parser("run", help="device/CPU: asv run for each staged commit, results packed for the host")
    p.add_argument("--python", default=sys.executable, help="the Python with torch, triton and asv (default: this)")
    p.add_argument("--machine", help="machine name (default: the GPU's name as a slug; cpu-interpreter with "
                                     "--cpu-smoke)")  # fmt: skip
    p.add_argument("--cpu-smoke", action="store_true", help="Triton interpreter, smoke-scaled shapes (no GPU)")
    p.add_argument("--commits", help="comma-separated prefixes of staged commits (default: all staged)")
    p.add_argument("--bench", help="asv --bench regex, e.g. '^kernel' (default: all)")
    p.add_argument("--impls", help="TRITONFA_ASV_IMPLS: e.g. tritonfa (skip the reference lines)")
    p.add_argument("--quick", action="store_true", help="TRITONFA_ASV_QUICK: bench's shorter repetitions")
    p.add_argument("--e2e-kv", help="TRITONFA_ASV_E2E_KV: e.g. auto (end-to-end only with the bf16 KV cache)")
    p.add_argument("--install-wheels", action="store_true", help="pip install asv_bench/.stage/wheels first")
    p.add_argument("--out", help="folder for the results tarball (default $OUT, else asv_bench/.stage/out)")
    p.add_argument(
        "--no-restore",
        dest="restore",
        action="store_false",
        help="leave the last staged commit installed (default: reinstall this checkout's kernel/)",
    )

    p = sub.add_parser("unpack", help="host: merge a results tarball into asv_bench/results")
    p.add_argument("tarball", type=Path)

    p = sub.add_parser("machine-name", help="print the machine name for this GPU (cpu-interpreter with --cpu-smoke)")
    p.add_argument("--cpu-smoke", action="store_true")
    p.add_argument("--write", action="store_true", help="also add it to ~/.asv-machine.json (os, cpu, ram, card)")

    args = parser.parse_args(argv)
    if args.command == "stage":
        return stage(args)
    if args.command == "run":
        return run_commits(args)
    if args.command == "unpack":
        return unpack(args)
    probe = probe_python(sys.executable)
    name = machine_name(probe, args.cpu_smoke)
    if not name:
        log("no GPU visible (use --cpu-smoke for the interpreter series)")
        return 1
    if args.write:
        write_machine_file(sys.executable, name, describe(probe, args.cpu_smoke), dict(os.environ))
    print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
