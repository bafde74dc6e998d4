"""The asv site builds from the committed results and its graphs render with data points in headless Chromium.

Builds the site with asv_bench/publish.py (`asv publish` + local copies of the JS/CSS asv links from CDNs) into a
temporary folder, serves it on 127.0.0.1 (http.server in a thread) and opens it in Debian's Chromium, headless, with
the flags that work on these machines (no sandbox as root, no background networking on a closed network):

- `--dump-dom` of tests/asv/probe.html, which loads the site in an iframe, visits the summary grid and one graph
  page per benchmark, and reports what Flot drew (series and finite data points per plot);
- `--screenshot` of the summary grid and of one graph page, kept under artifacts/asv/ (git-ignored) for CI to
  upload.

Needs asv 0.6.6 and /usr/bin/chromium (`apt-get install -y chromium`). Without them the tests skip, unless
TRITONFA_REQUIRE_BROWSER=1 (set by `nox -s ci_checks`), where a missing browser is a failure. Run alone with
`pytest --noconftest tests/asv` (this needs no torch).
"""

from __future__ import annotations

import functools
import html
import http.server
import itertools
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASV_BENCH = ROOT / "asv_bench"
RESULTS = ASV_BENCH / "results"
ARTIFACTS = ROOT / "artifacts" / "asv"
PROBE = Path(__file__).with_name("probe.html")
REQUIRE = os.environ.get("TRITONFA_REQUIRE_BROWSER", "") not in ("", "0")
MIN_COMMITS = 5  # issue 5: the committed results cover at least 5 commits on one machine
CPU_MACHINE = "cpu-interpreter"  # Triton's interpreter (asv_bench/record.py --cpu-smoke); any other name is a GPU
# flags that let Chromium run headless as root on a machine without network access
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def missing(what: str) -> None:
    if REQUIRE:
        pytest.fail(f"{what} (TRITONFA_REQUIRE_BROWSER=1)")
    pytest.skip(what)


def committed_results() -> dict:
    """{machine: {benchmark: {commit: number of finite values}}} from asv_bench/results/<machine>/*.json."""
    out: dict = {}
    for machine_json in sorted(RESULTS.glob("*/machine.json")):
        machine = machine_json.parent.name
        per_benchmark: dict = {}
        for path in sorted(machine_json.parent.glob("*.json")):
            if path.name == "machine.json":
                continue
            document = json.loads(path.read_text())
            columns = document["result_columns"]
            for name, row in document["results"].items():
                values = dict(zip(columns, row))["result"] or []
                values = values if isinstance(values, list) else [values]
                finite = sum(1 for v in values if isinstance(v, (int, float)) and math.isfinite(v))
                per_benchmark.setdefault(name, {})[document["commit_hash"]] = finite
        out[machine] = per_benchmark
    return out


def finite_points(machine: str, benchmark: str, impl: str) -> dict:
    """{workload: commits with a finite value} of `impl` in `benchmark` on `machine` (committed results)."""
    counts: dict = {}
    for path in sorted((RESULTS / machine).glob("*.json")):
        if path.name == "machine.json":
            continue
        row = json.loads(path.read_text())["results"].get(benchmark)
        if not row or not row[0]:
            continue
        for (workload, which), value in zip(itertools.product(*row[1]), row[0]):
            if which.strip("'") == impl:
                finite = isinstance(value, (int, float)) and math.isfinite(value)
                counts[workload.strip("'")] = counts.get(workload.strip("'"), 0) + finite
    return counts


@pytest.fixture(scope="module")
def results() -> dict:
    found = _COMMITTED  # read once, at import (HISTORIES below parametrizes the browser test with it)
    if not found:
        pytest.fail(f"no committed asv results under {RESULTS.relative_to(ROOT)}")
    return found


def recorded_commits(results: dict, machine: str) -> int:
    return len({c for per in results[machine].values() for c in per})


@pytest.fixture(scope="module")
def main_machine(results) -> str:
    """The machine whose history the screenshots show: a GPU's (not the interpreter's) once one has MIN_COMMITS
    commits, else the machine with the most recorded commits."""
    gpus = [m for m in results if m != CPU_MACHINE and recorded_commits(results, m) >= MIN_COMMITS]
    return max(gpus or results, key=lambda m: recorded_commits(results, m))


# every machine with a history: each one's graphs are drawn and checked point by point in the browser
_COMMITTED = committed_results()
HISTORIES = [m for m in _COMMITTED if recorded_commits(_COMMITTED, m) >= MIN_COMMITS]


@pytest.fixture(scope="module")
def chromium() -> str:
    path = os.environ.get("TRITONFA_CHROMIUM") or next(
        filter(None, (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome"))), None
    )
    if not path:
        missing("no chromium on PATH (apt-get install -y chromium)")
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    try:
        import asv  # noqa: F401
    except ImportError:
        missing("asv is not installed (pip install asv==0.6.6)")
    html_dir = tmp_path_factory.mktemp("asv-site") / "html"
    proc = subprocess.run([sys.executable, str(ASV_BENCH / "publish.py"), "--html-dir", str(html_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, f"publish.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    shutil.copy2(PROBE, html_dir / PROBE.name)
    return html_dir


@pytest.fixture(scope="module")
def server(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def run_chromium(chromium: str, tmp_path: Path, *args: str, budget_ms: int = 60000) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def test_site_builds_from_committed_results(site, results, main_machine):
    index = json.loads((site / "index.json").read_text())
    benchmarks = json.loads((RESULTS / "benchmarks.json").read_text())
    assert set(index["benchmarks"]) == {k for k in benchmarks if k != "version"}
    assert set(results) <= set(index["params"]["machine"])
    commits = {c for per in results[main_machine].values() for c in per}
    assert len(commits) >= MIN_COMMITS, f"{main_machine}: {len(commits)} commits recorded, want >= {MIN_COMMITS}"
    assert {h[:8] for h in commits} <= {h[:8] for h in index["revision_to_hash"].values()}
    page = (site / "index.html").read_text()
    assert not re.search(r"<(?:script|link)\b[^>]*(?:src|href)=\"https?://", page), "a CDN script or stylesheet is left"
    for local in re.findall(r"(?:src|href)=\"(vendor/[^\"]+)\"", page):
        assert (site / local).is_file(), local


def kernel_benchmarks(results, machine) -> list[str]:
    return sorted(b for b, per in results[machine].items() if b.startswith("kernel.") and any(per.values()))


@pytest.mark.parametrize("machine", HISTORIES or [None])
def test_graphs_render_with_data_points(chromium, server, results, main_machine, machine, tmp_path):
    machine = machine or main_machine  # no machine with a history yet: checked on the main one (and failing)
    with_data = kernel_benchmarks(results, machine)
    assert with_data, f"no kernel benchmark has a value on {machine}"
    routes = [""] + [f"{name}?machine={machine}" for name in with_data]
    url = f"{server}/probe.html#{urllib.parse.quote(json.dumps(routes))}"
    proc = run_chromium(chromium, tmp_path, "--dump-dom", url)
    match = re.search(r"<pre id=\"result\">(.*?)</pre>", proc.stdout, re.S)
    assert match, f"no probe result in the DOM (chromium exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(html.unescape(match.group(1)))
    assert not report["errors"], report["errors"]

    summary = report["pages"][""]
    assert summary["path"].endswith("index.html") and summary["title"] == "All benchmarks", summary
    thumbnails = {p["id"].removeprefix("summarygrid-"): p for p in summary["plots"]}
    for name in with_data:
        commits = sum(1 for n in results[machine][name].values() if n)
        plot = thumbnails.get(name)
        assert plot and plot["drawn"], f"summary grid: no plot drawn for {name}"
        points = max(s["points"] for s in plot["series"])
        assert points >= min(commits, MIN_COMMITS), f"summary grid {name}: {points} points, {commits} commits"

    for name in with_data:
        page = report["pages"][f"{name}?machine={machine}"]
        assert page["title"] == name, page
        (graph,) = page["plots"]
        assert graph["drawn"], f"{name}: the graph was not drawn"
        series = [s for s in graph["series"] if s["points"]]
        assert series, f"{name}: no series with data points: {graph['series']}"
        # tritonfa's lines (the default selection) have one point per commit recorded with a value for that
        # workload: the whole history (a commit whose output failed the check is a gap, not a point)
        ours = [s for s in graph["series"] if "impl-tritonfa" in s["label"]]
        assert ours, f"{name}: no tritonfa line among {[s['label'] for s in graph['series']]}"
        drawn: dict = {}
        for s in ours:  # a line split by an environment parameter (e.g. a new torch) adds up to one
            workload = re.search(r"workload-([^;]+)", s["label"]).group(1).strip()
            drawn[workload] = drawn.get(workload, 0) + s["points"]
        expected = finite_points(machine, name, "tritonfa")
        assert all(n == expected.get(w) for w, n in drawn.items()), (name, drawn, expected)  # asv draws <= 8 lines


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize(
    "label, route",
    [
        ("summary", ""),
        (
            "graph",
            "kernel.KernelTime.track_ms?p-workload='prefill-b8x2048-causal'&p-workload='decode-b64x2048-paged'"
            "&p-workload='mixed-4x512+60-paged'&p-impl='tritonfa'&p-impl='flex'",
        ),  # fmt: skip
        (
            "tflops",
            "kernel.KernelTFLOPs.track_tflops?p-workload='prefill-b8x2048-causal'"
            "&p-workload='fp8-prefill-b8x2048-causal'&p-impl='tritonfa'&p-impl='sdpa-cudnn'&p-impl='fa3'",
        ),  # fmt: skip
        (
            "gbps",
            "kernel.KernelBandwidth.track_gbps?p-workload='decode-b64x2048-paged'"
            "&p-workload='fp8kv-decode-b64x2048-paged'&p-impl='tritonfa'&p-impl='fa3'&p-impl='vllm-unified'",
        ),  # fmt: skip
        ("e2e", "e2e.VllmLatency.track_latency"),
    ],
)
def test_screenshot(chromium, server, results, main_machine, tmp_path, label, route):
    """Screenshots for people (and CI's artifacts): the landing page and the main graphs of the main machine."""
    benchmark = route.split("?")[0]
    if benchmark and not any(results[main_machine].get(benchmark, {}).values()):
        pytest.skip(f"{main_machine} has no {benchmark} values to show")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"asv-{label}.png"
    shot.unlink(missing_ok=True)
    if route:
        route += f"{'&' if '?' in route else '?'}machine={main_machine}"
    quoted = urllib.parse.quote(route, safe="?&=.'-_")  # '+' must be %2B: asv reads a plain '+' as a space
    proc = run_chromium(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1400,900",
                        f"{server}/index.html#{quoted}", budget_ms=20000)  # fmt: skip
    assert shot.is_file(), f"no screenshot (chromium exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    assert png_size(shot) == (1400, 900)
    assert shot.stat().st_size > 20_000, "the screenshot looks empty"
