"""Record asv results for given commits on a GPU host that receives a copy of the working tree but not `.git`.

Three steps; only the first needs git:

  1. host:    python asv_bench/record.py stage [REV ...] [--range HEAD | A..B] [--like MACHINE] [--wheels]
     Writes asv_bench/.stage/ (git-ignored, ~100 KB per commit): each commit's `kernel/` (git archive),
     commits.json (full hash, author date in ms as asv's git backend reads it, subject; branch tips), and with
     --wheels the asv wheels for the GPU image's Python 3.12 (asv is not installed there).
  2. device:  python3 asv_bench/record.py run [--install-wheels] [--commits SHA,...|newest] [--peers-at ...]
     For each staged commit: `asv run -E existing:PY --set-commit-hash SHA --machine NAME` against a config whose
     "repository" is commits.json (asv_manifest_repo.py), with that commit's staged kernel/src first on
     PYTHONPATH (asv's existing environment passes PYTHONPATH through; nothing is pip-installed per commit).
     tritonfa alone at every commit, the reference lines (peers) too at --peers-at (default: the newest), in the
     same call. On a GPU a warm-up compiles every commit's kernels in parallel processes first (--warm-jobs), so
     the timed runs read Triton's cache instead of compiling one kernel after the other. After every commit,
     results/<machine>/ + results/benchmarks.json are packed into <--out>/asv-results-<machine>.tar.gz (one file
     to copy back to the host; a run cut off by a time limit keeps what it did), and
     --budget-s stops before a commit that would not fit. NAME defaults to the GPU's name as a slug (nvidia-h200,
     nvidia-h100-80gb-hbm3): one series per card. --cpu-smoke runs the same pipeline in Triton's interpreter
     under the machine name cpu-interpreter.
  3. host:    python asv_bench/record.py unpack asv-results-<machine>.tar.gz    then commit asv_bench/results.
     Merges value by value (asv_bench/results_store.py): a later call that measured other parameters of the same
     commit (the e2e benchmark with the other kv-cache dtype) adds to the results instead of replacing them.

`machine-name [--write]` prints the slug, and with --write adds it to ~/.asv-machine.json (`nox -s asv` uses it).
Exit status of `run`: 0 when every asv run succeeded, 1 when a commit could not be measured or recorded (or was
left for another call), 2 when some benchmark failed (its result is recorded as failed).

On the GPU host (copy asv_bench/.stage there with the tree; the README section "Performance history (asv)" has
the whole recipe, with the vLLM that the peers and the e2e benchmark need):
    python3 asv_bench/record.py run --install-wheels --budget-s 540 --out RESULTS_DIR
    python3 asv_bench/record.py run --install-wheels --commits newest --bench '^e2e' --e2e-kv auto --out RESULTS_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import results_store  # asv_bench/results_store.py, next to this script

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


def recorded_on(machine: str) -> list[str]:
    """Full hashes of the commits with results under asv_bench/results/<machine>/ that this history has."""
    found = []
    for path in sorted((RESULTS / machine).glob("*.json")):
        if path.name == "machine.json":
            continue
        sha = json.loads(path.read_text()).get("commit_hash")
        proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}"], cwd=REPO,
                              capture_output=True, text=True)  # fmt: skip
        if sha and proc.returncode == 0 and proc.stdout.strip() not in found:
            found.append(proc.stdout.strip())
    return found


def stage(args: argparse.Namespace) -> int:
    revs = list(args.revs)
    for machine in args.like or []:
        listed = recorded_on(machine)
        if not listed:
            log(f"no commit of this history has results under {(RESULTS / machine).relative_to(REPO)}")
            return 1
        revs += listed
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
        f"device: carry asv_bench/.stage and run `python3 asv_bench/record.py run --install-wheels --budget-s 540`")  # fmt: skip
    return 0


# ---------------------------------------------------------------------------------------------------------------
# run (device or CPU, no .git)


def probe_python(python: str, env: dict | None = None) -> dict:
    """GPU name ('' without one, or under the interpreter) and the torch / triton / vLLM versions of `python`."""
    code = ("import json, os, torch, triton; from importlib import metadata; gpu = torch.cuda.is_available() and "
            "os.environ.get('TRITON_INTERPRET') != '1'\ntry: vllm = metadata.version('vllm')\nexcept Exception: vllm = "
            "None\nprint(json.dumps({'gpu': torch.cuda.get_device_name(0) if gpu else '', 'torch': torch.__version__, "
            "'triton': triton.__version__, 'vllm': vllm}))")  # fmt: skip
    out = subprocess.run([python, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        log(f"{python}: torch/triton not importable: {out.stderr.strip()[-300:]}")
        return {"gpu": "", "torch": None, "triton": None, "vllm": None}
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
    vllm = f", vLLM {probe['vllm']}" if probe.get("vllm") else ""
    return f"{what} | torch {probe['torch']}, triton {probe['triton']}{vllm}"


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


def select_commits(shas: list[str], wanted: str | None, what: str) -> list[str] | None:
    """Of `shas` (oldest first): all (no `wanted`, or 'all'), none ('none'), the newest ('newest'), or those
    matching comma-separated prefixes; None when a prefix matches nothing."""
    if not wanted or wanted == "all":
        return list(shas)
    if wanted in ("none", "newest"):
        return shas[-1:] if wanted == "newest" else []
    prefixes = [c.strip() for c in wanted.split(",") if c.strip()]
    chosen = [sha for sha in shas if any(sha.startswith(p) for p in prefixes)]
    if len(chosen) != len(prefixes):
        log(f"{what} {wanted}: {len(chosen)} of {len(prefixes)} found among the staged commits")
        return None
    return chosen


def commit_env(env: dict, sha: str, impls: str | None) -> dict:
    """The environment that measures `sha`: its staged kernel/src first on the import path, the impls to measure.

    asv's benchmark runner drops PYTHONPATH's entries from sys.path unless ASV_PYTHONPATH names them (asv 0.6.6
    benchmark.py), so both are set: ASV_PYTHONPATH for the benchmarks, PYTHONPATH for what they start (vLLM's
    engine processes in e2e, the warm-up). The caller's PYTHONPATH (e.g. where vLLM is installed) follows.
    """
    out = dict(env)
    src = str(STAGE / "kernels" / sha / "kernel" / "src")
    path = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    out.update(PYTHONPATH=path, ASV_PYTHONPATH=path)
    if impls:
        out["TRITONFA_ASV_IMPLS"] = impls
    return out


def plan_commits(shas: list[str], peers_at: list[str], impls: str | None) -> list[tuple[str, str | None]]:
    """(commit, TRITONFA_ASV_IMPLS or None for all) in recording order: the commits with the reference lines
    first, then the newest first, so a call that runs out of time leaves the oldest commits for the next one."""
    plan = [(sha, impls or (None if sha in peers_at else "tritonfa")) for sha in shas]
    return sorted(plan, key=lambda item: (item[0] not in peers_at, -shas.index(item[0])))


def warm_up(python: str, plan: list[tuple[str, str | None]], env: dict, jobs: int, timeout_s: float) -> None:
    """Compile every kernel the runs will launch, many commits at once, before anything is timed.

    Cold, one commit's suite spends about a minute in Triton (and Inductor, for flex) compiles, one after the
    other; the timing itself takes seconds. Here one process per commit runs the suite once with short
    repetitions (`record.py warm`, results thrown away), `jobs` at a time, so the compiles run on all CPU cores
    and fill the caches the timed runs then read (Triton's under HOME, which asv's runs share; Inductor's in
    /tmp). Processes still running at `timeout_s` are stopped: what they compiled so far stays cached.
    """
    logs = STAGE / "warm-logs"
    logs.mkdir(parents=True, exist_ok=True)
    pending, running = list(plan), []
    deadline = time.monotonic() + timeout_s
    log(f"warm-up: {len(plan)} processes, {jobs} at a time, at most {timeout_s:.0f} s")
    while pending or running:
        while pending and len(running) < jobs:
            sha, impls = pending.pop(0)
            out = (logs / f"{sha[:12]}.log").open("w")
            wenv = dict(commit_env(env, sha, impls), TRITONFA_ASV_QUICK="1")
            proc = subprocess.Popen([python, str(Path(__file__).resolve()), "warm", "--label", sha[:12]], env=wenv,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            running.append((sha, proc, out, time.monotonic()))
        time.sleep(0.5)
        for item in list(running):
            sha, proc, out, began = item
            if proc.poll() is None and time.monotonic() < deadline:
                continue
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # its own session: the process and its compile workers
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            out.close()
            tail = (logs / f"{sha[:12]}.log").read_text().strip().splitlines()[-1:] or ["(no output)"]
            log(f"warm-up {sha[:12]}: exit {proc.returncode} after {time.monotonic() - began:.0f} s: {tail[0][:160]}")
            running.remove(item)


def warm(args: argparse.Namespace) -> int:
    """One warm-up process (see warm_up): this suite's measurement once, for its compiles only."""
    sys.path.insert(0, str(HERE))
    from benchmarks import _common  # standard library only at import

    started = time.perf_counter()
    cache = _common.measure_kernels()
    if "skip" in cache:
        print(f"warm {args.label}: skipped: {cache['skip']}", flush=True)
        return 1
    ok = sum(1 for row in cache["rows"].values() if row.get("status") == "ok")
    print(f"warm {args.label}: {ok} of {len(cache['rows'])} (workload, impl) ran in "
          f"{time.perf_counter() - started:.0f} s", flush=True)  # fmt: skip
    return 0


def run_commits(args: argparse.Namespace) -> int:
    started = time.monotonic()
    python = args.python
    manifest_path = STAGE / "commits.json"
    if not manifest_path.is_file():
        log(
            f"{manifest_path} is missing: run `python asv_bench/record.py stage ...` on the host, carry asv_bench/.stage"
        )
        return 1
    manifest = json.loads(manifest_path.read_text())
    shas = select_commits(manifest["record"], args.commits, "--commits")
    peers_at = select_commits(shas or [], args.peers_at, "--peers-at")
    if not shas or peers_at is None:
        return 1
    if args.install_wheels:
        wheels = sorted(str(p) for p in (STAGE / "wheels").glob("*.whl"))
        if not wheels:
            log("--install-wheels: asv_bench/.stage/wheels is empty (stage with --wheels)")
            return 1
        # PIP_BREAK_SYSTEM_PACKAGES: an image's system Python may be marked externally managed (older pips ignore it)
        run([python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile", *wheels],
            check=True, env=dict(os.environ, PIP_BREAK_SYSTEM_PACKAGES="1"))  # fmt: skip
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
    if args.quick:
        env["TRITONFA_ASV_QUICK"] = "1"
    if args.e2e_kv:
        env["TRITONFA_ASV_E2E_KV"] = args.e2e_kv
    plan = plan_commits(shas, peers_at, args.impls)
    conf = write_record_conf()
    write_machine_file(python, machine, describe(probe, args.cpu_smoke), env)
    kernels = re.search(args.bench, "kernel.KernelTime.track_ms") is not None
    if args.warm_jobs and kernels and not args.cpu_smoke and plan:
        left = args.budget_s - (time.monotonic() - started) if args.budget_s else float("inf")
        warm_up(python, plan, env, args.warm_jobs, min(args.warm_timeout, max(30.0, 0.5 * left)))
    out_dir = Path(args.out or os.environ.get("OUT") or STAGE / "out")
    status, durations, done = 0, [], []
    for sha, impls in plan:
        elapsed = time.monotonic() - started
        recent = max(durations[-3:], default=0.0)  # the first commit (with the peers) is the slow one
        if args.budget_s and durations and elapsed + recent > args.budget_s:
            log(f"budget: {elapsed:.0f} s used of {args.budget_s:.0f} s, a commit takes up to {recent:.0f} s")
            break
        commit = next(c for c in manifest["commits"] if c["sha"] == sha)
        cenv = commit_env(env, sha, impls)
        log(f"=== {sha[:12]} [{impls or 'all impls'}] {commit['subject'][:80]}")
        spec = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('tritonfa').origin)"],
                              env=cenv, capture_output=True, text=True).stdout.strip()  # fmt: skip
        if not spec.startswith(str(STAGE / "kernels" / sha)):
            log(f"{sha[:12]}: tritonfa resolves to {spec or 'nothing'}, not the staged kernel; skipped")
            status = 1
            continue
        began = time.monotonic()
        cmd = [python, "-m", "asv", "run", "--config", str(conf), "-E", f"existing:{python}",
               "--set-commit-hash", sha, "--machine", machine, "--show-stderr"]  # fmt: skip
        cmd += ["--bench", args.bench] if args.bench else []  # '' runs every benchmark
        rc = run(cmd, env=cenv).returncode
        durations.append(time.monotonic() - began)
        done.append(sha)
        log(f"{sha[:12]}: asv run exited {rc} after {durations[-1]:.0f} s")
        if rc not in (0, 2):
            status = 1
        elif rc == 2 and status == 0:
            status = 2
        if (RESULTS / machine).is_dir():  # after every commit: a call cut off by its time limit keeps what it did
            pack(machine, out_dir)
    left = [sha for sha, _ in plan if sha not in done]
    if left:
        log(f"not recorded ({len(left)}): record them in another call with --commits {','.join(s[:12] for s in left)}")
        status = status or 1
    if (RESULTS / machine).is_dir():
        log(f"results packed: {out_dir / f'asv-results-{machine}.tar.gz'} ({len(done)} commits this call)")
    return status


# ---------------------------------------------------------------------------------------------------------------
# unpack (host)


def unpack(args: argparse.Namespace) -> int:
    """Check the tarball's members, then merge it into asv_bench/results value by value (results_store.merge_tree):
    a later call that recorded only some parameters of a commit (e2e with one kv-cache dtype) adds to it."""
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
        with tempfile.TemporaryDirectory() as tmp:
            tar.extractall(tmp, members=members, filter="data")
            results_store.merge_tree(Path(tmp), RESULTS)
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
    p.add_argument("--like", action="append", metavar="MACHINE", help="also the commits recorded on MACHINE (e.g. "
                   "cpu-interpreter: the same series on a GPU)")  # fmt: skip
    p.add_argument("--wheels", action="store_true", help="also download the asv wheels for the GPU's Python 3.12")
    p.add_argument("--clean", action="store_true", help="forget previously staged commits")

    p = sub.add_parser("run", help="device/CPU: asv run for each staged commit, results packed for the host")
    p.add_argument("--python", default=sys.executable, help="the Python with torch, triton and asv (default: this)")
    p.add_argument("--machine", help="machine name (default: the GPU's name as a slug; cpu-interpreter with "
                                     "--cpu-smoke)")  # fmt: skip
    p.add_argument("--cpu-smoke", action="store_true", help="Triton interpreter, smoke-scaled shapes (no GPU)")
    p.add_argument("--commits", help="comma-separated prefixes of staged commits, or 'newest' (default: all staged)")
    p.add_argument("--bench", default="^kernel", help="asv --bench regex: '^kernel' (default) or '^e2e' (vLLM "
                   "latency, minutes per commit: record it with --commits newest)")  # fmt: skip
    p.add_argument("--impls", help="TRITONFA_ASV_IMPLS at every commit, e.g. tritonfa (overrides --peers-at)")
    p.add_argument("--peers-at", default="newest", help="commits (prefixes, 'newest' or 'all') where the reference "
                   "lines are measured too; elsewhere tritonfa only (default: newest)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="TRITONFA_ASV_QUICK: bench's shorter repetitions")
    p.add_argument("--e2e-kv", help="TRITONFA_ASV_E2E_KV: e.g. auto (end-to-end only with the bf16 KV cache)")
    p.add_argument("--install-wheels", action="store_true", help="pip install asv_bench/.stage/wheels first")
    p.add_argument("--out", help="folder for the results tarball (default: $OUT if set, else asv_bench/.stage/out)")
    p.add_argument("--warm-jobs", type=int, default=min(16, os.cpu_count() or 1),
                   help="GPU: compile in this many processes before timing (0: no warm-up; default: CPUs, <= 16)")  # fmt: skip
    p.add_argument("--warm-timeout", type=float, default=240.0, help="seconds the warm-up may take at most")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="stop before a commit that would end past this many seconds (0: no limit)")  # fmt: skip

    p = sub.add_parser("warm", help="internal (run's warm-up): measure the suite once, for its compiles")
    p.add_argument("--label", default="")

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
    if args.command == "warm":
        return warm(args)
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
