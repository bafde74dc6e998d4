"""The site from fixture GPU results: regressions point the right way, the GPU series draws, publishing works on a
detached checkout, and the landing note and commit links are there.

A fake `nvidia-h200` machine gets results for main's kernel commits (the first-parent commits that changed
kernel/src, as `asv_bench/record.py stage --range` picks them), written in a temporary folder, never under
asv_bench/results: tritonfa at every commit, the reference lines at the first and the newest (as two recording
calls with `--peers-at newest` leave them), the end-to-end latency at the newest. Planted in tritonfa's times:

- a slowdown: decode-b64x2048-paged takes 40% longer from commit SLOW on (ms up, GB/s down);
- speed-ups: prefill-b8x2048-causal and decode-b8x32768-paged take 40% less from commit FAST on (ms down,
  TFLOP/s and GB/s up).

asv flags rises. The Regressions page must list the slowdown's time series and nothing else; the same fixture
published without asv.conf.json's `regressions_first_commits` lists the throughput speed-ups too, which shows
the setting is what keeps them out. Needs asv 0.6.6 (and Chromium for the browser test); run alone with
`pytest --noconftest tests/asv`.
"""

from __future__ import annotations

import html
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
import test_site
from test_site import PROBE, missing, run_chromium

ROOT = Path(__file__).resolve().parents[2]
ASV_BENCH = ROOT / "asv_bench"
chromium = test_site.chromium  # the browser fixture, shared (CI runs these tests with --noconftest)
BENCHMARKS_JSON = ASV_BENCH / "results" / "benchmarks.json"
MACHINE = "nvidia-h200"
CARD = "NVIDIA H200"
VERSIONS = "torch 2.11.0+cu130, triton 3.6.0, vLLM 0.24.0"
ENV_NAME = "existing-py_usr_bin_python3"
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
           "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]  # fmt: skip
SLOW_WORKLOAD = "decode-b64x2048-paged"
FAST_WORKLOADS = ("prefill-b8x2048-causal", "decode-b8x32768-paged")
MIN_KERNEL_COMMITS = 12  # issue 15: the H200 series covers every kernel commit since the first (>= 12)


def load(name: str):
    """asv_bench/<name>.py as a module (asv_bench on sys.path while it loads: record.py imports a sibling)."""
    sys.path.insert(0, str(ASV_BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"_tritonfa_asv_{name}", ASV_BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ASV_BENCH))
    return module


def load_publish():
    return load("publish")


def peers() -> list[str]:
    """The reference lines of the committed suite description (benchmarks.json), as asv's site will offer them."""
    impls = json.loads(BENCHMARKS_JSON.read_text())["kernel.KernelTime.track_ms"]["params"][1]
    return [impl.strip("'") for impl in impls if impl != "'tritonfa'"]


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def main_rev() -> str:
    """main's tip as asv reads it (local main, else origin/main, else this checkout: CI's detached HEAD)."""
    for rev in ("main", "origin/main", "HEAD"):
        if (
            subprocess.run(["git", "rev-parse", "--verify", "--quiet", rev], cwd=ROOT, capture_output=True).returncode
            == 0
        ):
            return rev
    pytest.skip("no git history")


def kernel_commits() -> list[str]:
    """main's commits that changed the kernel, oldest first: what `record.py stage --range` stages."""
    return git("rev-list", "--reverse", "--first-parent", main_rev(), "--", *load("record").DEFAULT_PATHS).split()


# ---------------------------------------------------------------------------------------------------------------
# fixture results


def tritonfa_ms(workload: str, index: int, slow_at: int, fast_at: int) -> float:
    base = 0.5 + (sum(map(ord, workload)) % 17) / 10
    noise = 1 + 0.004 * ((index * 7) % 5 - 2)  # under asv's 5% threshold
    factor = 1.4 if (workload == SLOW_WORKLOAD and index >= slow_at) else 1.0
    factor *= 0.6 if (workload in FAST_WORKLOADS and index >= fast_at) else 1.0
    return base * noise * factor


def write_fixture(results: Path, commits: list[str]) -> dict:
    """nvidia-h200 results for `commits` (oldest first) in asv's format 2; returns where the steps were planted."""
    benchmarks = json.loads(BENCHMARKS_JSON.read_text())
    results.mkdir(parents=True)
    shutil.copy2(BENCHMARKS_JSON, results / "benchmarks.json")
    info = {"arch": "x86_64", "cpu": f"Intel Xeon | {CARD} | {VERSIONS}", "machine": MACHINE, "num_cpu": "16",
            "os": "Linux", "ram": "137438953472"}  # fmt: skip
    (results / MACHINE).mkdir()
    (results / MACHINE / "machine.json").write_text(json.dumps(dict(info, version=1), indent=4))
    slow_at, fast_at = (2 * len(commits)) // 3, len(commits) // 3
    peers_at = {0, len(commits) - 1}
    for index, sha in enumerate(commits):
        date_ms = int(git("log", "-1", "--format=%at", sha)) * 1000
        rows = {}
        for name, bench in benchmarks.items():
            if name == "version":
                continue
            values = []
            for combo in itertools.product(*bench["params"]):
                names = dict(zip(bench["param_names"], (v.strip("'") for v in combo)))
                if name.startswith("e2e."):
                    newest = index == len(commits) - 1
                    base = 4.2 if names["backend"] == "FLASH_ATTN" else 4.6
                    values.append(base * (0.97 if names["kv_cache_dtype"] == "fp8" else 1) if newest else float("nan"))
                    continue
                impl, workload = names["impl"], names["workload"]
                if impl != "tritonfa" and index not in peers_at:
                    values.append(float("nan"))  # not measured at this commit
                    continue
                if impl == "tritonfa":
                    ms = tritonfa_ms(workload, index, slow_at, fast_at)
                else:  # the peers do not change with our commits
                    ms = 0.8 * tritonfa_ms(workload, index, len(commits), len(commits))
                metric = {"ms": ms, "TFLOP/s": 300 / ms, "GB/s": 3000 / ms}[bench["unit"]] if bench["unit"] in (
                    "ms", "TFLOP/s", "GB/s") else ms  # fmt: skip
                values.append(metric)
            rows[name] = [values, bench["params"], bench["version"], date_ms + 3_600_000, 10.0]
        document = {"commit_hash": sha, "env_name": ENV_NAME, "date": date_ms,
                    "params": dict(info, python="/usr/bin/python3"), "python": "/usr/bin/python3",
                    "requirements": {}, "env_vars": {}, "result_columns": COLUMNS, "results": rows,
                    "durations": {}, "version": 2}  # fmt: skip
        (results / MACHINE / f"{sha[:8]}-{ENV_NAME}.json").write_text(json.dumps(document))
    return {"slow": commits[slow_at], "fast": commits[fast_at], "peers": [commits[i] for i in sorted(peers_at)]}


def config_copy(folder: Path, repo: Path, **changes) -> Path:
    """asv.conf.json with `changes`, in `folder` next to a copy of the git plugin (asv imports it from there)."""
    conf = load_publish().read_conf(ASV_BENCH / "asv.conf.json")
    conf.update(repo=str(repo), **changes)
    for key in [k for k, v in changes.items() if v is None]:
        conf.pop(key)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(ASV_BENCH / "asv_git_repo.py", folder / "asv_git_repo.py")
    path = folder / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=1))
    return path


def publish(config: Path, results: Path, html_dir: Path, cwd: Path = ROOT, env: dict | None = None):
    cmd = [sys.executable, str(ASV_BENCH / "publish.py"), "--config", str(config), "--results-dir", str(results),
           "--html-dir", str(html_dir)]  # fmt: skip
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


@pytest.fixture(scope="module")
def commits() -> list[str]:
    try:
        import asv  # noqa: F401
    except ImportError:
        missing("asv is not installed (pip install asv==0.6.6)")
    found = kernel_commits()
    if len(found) < 6:
        pytest.skip(f"only {len(found)} kernel commits in this clone (shallow?)")
    return found


@pytest.fixture(scope="module")
def fixture(tmp_path_factory, commits) -> dict:
    root = tmp_path_factory.mktemp("gpu-fixture")
    planted = write_fixture(root / "results", commits)
    return dict(planted, root=root, results=root / "results")


@pytest.fixture(scope="module")
def site(fixture) -> Path:
    html_dir = fixture["root"] / "html"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRITONFA_ASV_COMMIT_URL", "BUILDKITE"))}
    proc = publish(config_copy(fixture["root"] / "conf", ROOT), fixture["results"], html_dir, env=env)
    assert proc.returncode == 0, f"publish.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    shutil.copy2(PROBE, html_dir / PROBE.name)
    return html_dir


def regressions(site: Path) -> list[tuple[str, dict]]:
    """(entry name, graph params) of each listed regression (asv's regressions.json)."""
    return [(entry[0], entry[2]) for entry in json.loads((site / "regressions.json").read_text())["regressions"]]


# ---------------------------------------------------------------------------------------------------------------
# tests


def test_regressions_list_the_slowdown_only(site):
    listed = regressions(site)
    assert listed, "the planted slowdown is not listed"
    names = {name for name, params in listed if params.get("machine", MACHINE) == MACHINE}
    assert names == {f"kernel.KernelTime.track_ms('{SLOW_WORKLOAD}', 'tritonfa')"}, listed


def test_without_the_setting_asv_lists_speedups(fixture, tmp_path):
    """The control: asv's default flags every rise, so the throughput speed-ups show up as 'regressions'."""
    config = config_copy(tmp_path / "conf", ROOT, regressions_first_commits=None)
    proc = publish(config, fixture["results"], tmp_path / "html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {name for name, _ in regressions(tmp_path / "html")}
    assert f"kernel.KernelTFLOPs.track_tflops('{FAST_WORKLOADS[0]}', 'tritonfa')" in names, names
    assert f"kernel.KernelBandwidth.track_gbps('{FAST_WORKLOADS[1]}', 'tritonfa')" in names, names


def test_every_non_time_series_is_out_of_regression_detection():
    """A new throughput benchmark must join regressions_first_commits, or its speed-ups read as regressions."""
    publish_py = load_publish()
    conf = publish_py.read_conf(ASV_BENCH / "asv.conf.json")
    for name, bench in json.loads(BENCHMARKS_JSON.read_text()).items():
        if name == "version":
            continue
        lower_is_better = bench["unit"] in publish_py.TIME_UNITS
        assert publish_py.checked_for_regressions(conf, name) == lower_is_better, (name, bench["unit"])


def test_landing_note_and_commit_links(site, fixture, commits):
    publish_py = load_publish()
    origin = subprocess.run(["git", "remote", "get-url", "origin"], cwd=ROOT, capture_output=True, text=True)
    web = publish_py.web_url(origin.stdout) if origin.returncode == 0 else None
    index = json.loads((site / "index.json").read_text())
    assert index["show_commit_url"] == (publish_py.commit_url_of(web) if web else "commits.html#")
    page = (site / "index.html").read_text()
    note = re.search(r'<div id="tritonfa-note".*?</div>', page, re.S)
    assert note, "no landing note on index.html"
    text = html.unescape(re.sub(r"<[^>]+>", " ", note.group(0)))
    for expected in (MACHINE, CARD, VERSIONS, "kernel.KernelTime.track_ms", "TFLOP/s", "Regressions"):
        assert expected in text, f"landing note lacks {expected!r}"
    assert f"<td>{len(commits)}</td>" in note.group(0), "the machine's number of recorded commits"
    listing = (site / "commits.html").read_text()
    for sha in commits:
        assert f'id="{sha[:8]}"' in listing, f"commits.html has no anchor for {sha[:8]}"


@pytest.mark.parametrize(
    "remote, url",
    [
        ("git@github.com:org/tritonfa.git", "https://github.com/org/tritonfa/commit/"),
        ("https://user:token@github.com/org/tritonfa.git", "https://github.com/org/tritonfa/commit/"),
        ("ssh://git@gitlab.example.com:2222/team/tritonfa.git", "https://gitlab.example.com/team/tritonfa/-/commit/"),
        ("https://bitbucket.org/team/tritonfa", "https://bitbucket.org/team/tritonfa/commits/"),
        ("/srv/git/tritonfa", None),
        ("file:///srv/git/tritonfa", None),
    ],
)
def test_commit_url_from_remote(remote, url):
    publish_py = load_publish()
    web = publish_py.web_url(remote)
    assert (publish_py.commit_url_of(web) if web else None) == url


def test_commit_url_setting_wins(monkeypatch):
    publish_py = load_publish()
    monkeypatch.setenv("BUILDKITE_REPO", "git@github.com:org/tritonfa.git")
    monkeypatch.delenv(publish_py.COMMIT_URL_ENV, raising=False)
    assert publish_py.commit_links({}, ROOT)[0] == "https://github.com/org/tritonfa/commit/"
    assert publish_py.commit_links({"show_commit_url": "https://x/c/"}, ROOT)[0] == "https://x/c/"
    monkeypatch.setenv(publish_py.COMMIT_URL_ENV, "https://mirror/commit/")
    assert publish_py.commit_links({"show_commit_url": "https://x/c/"}, ROOT)[0] == "https://mirror/commit/"


@pytest.fixture(scope="module")
def detached_clone(tmp_path_factory) -> Path:
    """A clone like Buildkite's checkout: HEAD detached at main's tip, no local branch at all."""
    clone = tmp_path_factory.mktemp("detached") / "repo"
    git("clone", "--quiet", "--no-checkout", str(ROOT), str(clone))
    tip = git("rev-parse", main_rev())
    git("checkout", "--quiet", "--detach", tip, cwd=clone)
    for branch in git("for-each-ref", "--format=%(refname:short)", "refs/heads", cwd=clone).split():
        git("branch", "--quiet", "-D", branch, cwd=clone)
    return clone


def test_publish_on_a_detached_checkout(detached_clone, fixture, tmp_path, commits):
    """Without a local main asv's own git reader fails; the plugin reads main from origin/main or from CI's commit."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BUILDKITE")}
    plain = config_copy(tmp_path / "plain", detached_clone, dvcs="git", plugins=[])
    proc = publish(plain, fixture["results"], tmp_path / "html-plain", env=clean)
    assert proc.returncode != 0, "asv's git read main on a checkout without it: the scenario is wrong"

    ours = config_copy(tmp_path / "ours", detached_clone)
    proc = publish(ours, fixture["results"], tmp_path / "html-origin", env=clean)  # falls back to origin/main
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    index = json.loads((tmp_path / "html-origin" / "index.json").read_text())
    assert {h[:8] for h in commits} <= {h[:8] for h in index["revision_to_hash"].values()}
    assert index["params"]["branch"] == ["main"], "the branch keeps its name on the site"

    git("remote", "remove", "origin", cwd=detached_clone)  # no origin/main either: only Buildkite's variables
    tip = git("rev-parse", "HEAD", cwd=detached_clone)
    buildkite = dict(clean, BUILDKITE="true", BUILDKITE_BRANCH="main", BUILDKITE_COMMIT=tip)
    proc = publish(ours, fixture["results"], tmp_path / "html-buildkite", env=buildkite)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    index = json.loads((tmp_path / "html-buildkite" / "index.json").read_text())
    assert {h[:8] for h in commits} <= {h[:8] for h in index["revision_to_hash"].values()}


def test_gpu_series_graphs_render(chromium, site, fixture, commits, tmp_path):
    """Headless Chromium draws the H200 graphs: one tritonfa point per recorded commit, peers where measured."""
    import http.server
    import threading
    from functools import partial

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        workload = FAST_WORKLOADS[0]
        pick = f"p-workload='{workload}'&" + "&".join(f"p-impl='{impl}'" for impl in ("tritonfa", *peers()))
        routes = ["", f"kernel.KernelTime.track_ms?machine={MACHINE}", f"kernel.KernelTFLOPs.track_tflops?machine={MACHINE}",
                  f"kernel.KernelTime.track_ms?machine={MACHINE}&{pick}", f"e2e.VllmLatency.track_latency?machine={MACHINE}"]  # fmt: skip
        url = f"http://127.0.0.1:{httpd.server_address[1]}/probe.html#{urllib.parse.quote(json.dumps(routes))}"
        proc = run_chromium(chromium, tmp_path, "--dump-dom", url)
    finally:
        httpd.shutdown()
        httpd.server_close()
    match = re.search(r"<pre id=\"result\">(.*?)</pre>", proc.stdout, re.S)
    assert match, f"no probe result in the DOM (chromium exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(html.unescape(match.group(1)))
    assert not report["errors"], report["errors"]

    thumbnails = {p["id"].removeprefix("summarygrid-"): p for p in report["pages"][""]["plots"]}
    for name in ("kernel.KernelTime.track_ms", "kernel.KernelTFLOPs.track_tflops", "kernel.KernelBandwidth.track_gbps"):
        assert thumbnails.get(name, {}).get("drawn"), f"summary grid: {name} not drawn"

    for route in routes[1:3]:
        (graph,) = report["pages"][route]["plots"]
        assert graph["drawn"], f"{route}: not drawn"
        ours = [s for s in graph["series"] if "impl-tritonfa" in s["label"] and s["points"]]
        assert ours, f"{route}: no tritonfa line: {graph['series']}"
        assert all(s["points"] == len(commits) for s in ours), (route, len(commits), ours)

    (graph,) = report["pages"][routes[3]]["plots"]
    by_impl = {re.search(r"impl-([\w-]+)", s["label"]).group(1): s["points"] for s in graph["series"]}
    assert by_impl.get("tritonfa") == len(commits), by_impl
    for peer in peers():
        assert by_impl.get(peer) == len(fixture["peers"]), (peer, by_impl)

    (graph,) = report["pages"][routes[4]]["plots"]
    assert graph["drawn"] and any(s["points"] == 1 for s in graph["series"]), graph


def test_committed_h200_series_covers_every_kernel_commit():
    """Once H200 results are committed: every kernel commit up to the newest recorded one has a value."""
    folder = ASV_BENCH / "results" / MACHINE
    if not folder.is_dir():
        pytest.skip(f"no {MACHINE} results committed yet (asv_bench/record.py on the GPU, README)")
    recorded = {}
    for path in folder.glob("*.json"):
        if path.name != "machine.json":
            document = json.loads(path.read_text())
            values = document["results"].get("kernel.KernelTime.track_ms", [None])[0] or []
            if any(isinstance(v, (int, float)) and v == v for v in values):
                recorded[document["commit_hash"]] = True
    kernel = kernel_commits()
    newest = max((kernel.index(sha) for sha in recorded if sha in kernel), default=-1)
    wanted = kernel[: newest + 1]
    assert len(wanted) >= MIN_KERNEL_COMMITS, f"{len(wanted)} kernel commits recorded, want >= {MIN_KERNEL_COMMITS}"
    assert not [sha[:8] for sha in wanted if sha not in recorded], "kernel commits without H200 results"


def test_git_plugin_reads_a_checkout_owned_by_another_user(tmp_path):
    """CI's docker steps run as root over the agent's checkout: git calls it dubious, asv's reads must still work."""
    pytest.importorskip("asv")
    if os.geteuid() != 0:
        pytest.skip("needs root (to own a repository by another user)")
    repo = tmp_path / "repo"
    git("init", "--quiet", "--initial-branch=main", str(repo))
    for message in ("one", "two"):
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "--quiet", "--allow-empty", "-m", message, cwd=repo)
    for path in [repo, *repo.rglob("*")]:
        os.chown(path, 65534, -1, follow_symlinks=False)  # nobody
    assert subprocess.run(["git", "rev-parse", "main"], cwd=repo, capture_output=True).returncode != 0, "not dubious"
    plugin = load("asv_git_repo")
    reader = plugin.CheckoutGit(str(repo), str(tmp_path / "mirror"))
    assert len(reader.get_branch_commits("main")) == 2
