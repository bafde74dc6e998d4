"""Build the asv site from asv_bench/results and make it readable and self-contained: `nox -s asv_publish` runs this.

    python asv_bench/publish.py [--html-dir DIR] [--results-dir DIR] [--no-pull]   (needs asv 0.6.6)

1. Runs `asv publish` (default output: asv.conf.json's html_dir, asv_bench/html, git-ignored) with a copy of
   asv.conf.json that has the commit links filled in (`show_commit_url`, `project_url`; see commit_links()).
2. Rewrites the site's pages so that the jQuery / Flot / Bootstrap files asv links from CDNs load from `vendor/`
   instead (copies of asv_bench/site_vendor/): the site then renders offline, which CI's browser test and anyone
   opening the Buildkite artifact need. Fails if a page links a CDN asset there is no local copy of.
3. Puts a note on the landing page (the benchmark grid): what each machine is (card, torch / triton / vLLM as
   recorded), how many commits it covers, what each series measures, which way is better and whether asv checks
   it for regressions; and writes commits.html, the recorded commits with subject, date and message.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONF = HERE / "asv.conf.json"
VENDOR = HERE / "site_vendor"
VENDOR_DIR = "vendor"  # inside the built site
COMMITS_PAGE = "commits.html"
CPU_MACHINE = "cpu-interpreter"  # asv_bench/record.py --cpu-smoke
COMMIT_URL_ENV = "TRITONFA_ASV_COMMIT_URL"

# asv 0.6.6's CDN links (www/index.html) -> the local copy (site_vendor/README.md says where each comes from)
ASSETS = {
    "https://code.jquery.com/jquery-3.3.1.min.js": "jquery-3.3.1.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": "jquery.flot-0.8.3.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": "jquery.flot.time-0.8.3.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": "jquery.flot.selection-0.8.3.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": "jquery.flot.categories-0.8.3.js",
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": "jquery.flot.orderBars-1.0.0.js",
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": "stupidtable-1.1.3.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": "md5-2.19.0.min.js",
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": "bootstrap-3.1.1.min.js",
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": "bootstrap-3.1.1.min.css",
}
TAG = re.compile(r"<(script|link)\b[^>]*?\b(?:src|href)=\"(https?://[^\"]+)\"[^>]*>")
# subresource-integrity hashes name the CDN's bytes (cdnjs minifies Flot itself): dropped with the CDN
DROP_ATTRIBUTES = re.compile(r"\s+(?:integrity|crossorigin|referrerpolicy)=\"[^\"]*\"")

# The landing note's words for the suite's series; a benchmark not listed here shows its unit only.
SERIES = {
    "kernel.KernelTime.track_ms": "median kernel time per call, every workload",
    "kernel.KernelTFLOPs.track_tflops": "prefill and mixed workloads: FLOP of the visible (query, key) pairs "
    "(causal counts half) per second",
    "kernel.KernelBandwidth.track_gbps": "decode and mixed workloads: bytes of K/V read once per sequence, plus q "
    "and the output, per second",
    "e2e.VllmLatency.track_latency": "vLLM end to end: dummy Llama-3-8B, batch 64, 2048 in, 128 out, average "
    "LLM.generate latency; backend CUSTOM (tritonfa) vs FLASH_ATTN (FA3), kv cache auto (bf16) and fp8",
}
IMPLS = {
    "tritonfa": "this project's kernel as of the commit",
    "sdpa-cudnn": "torch SDPA, cuDNN backend",
    "flex": "FlexAttention (torch.compile)",
    "fa3": "FlashAttention-3 (vLLM's build)",
    "vllm-unified": "vLLM's Triton unified_attention",
}
TIME_UNITS = {"ns", "us", "ms", "s", "seconds"}
NOTE_ID = "tritonfa-note"


def read_conf(path: Path) -> dict:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("//"))
    return json.loads(text)


def html_dir_of(config: Path) -> Path:
    return config.parent / read_conf(config).get("html_dir", "html")


# ---------------------------------------------------------------------------------------------------------------
# commit links


def git(repo: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def web_url(remote: str) -> str | None:
    """https://host/owner/repo for a git remote (https, ssh:// or scp-like git@host:owner/repo.git); else None."""
    remote = remote.strip()
    if re.match(r"^https?://", remote):
        parts = urllib.parse.urlsplit(remote)
        host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")  # no user:token@ in links
        scheme, path = parts.scheme, parts.path
    elif match := re.match(r"^ssh://(?:[^@/]+@)?([^/:]+)(?::\d+)?/(.+)$", remote):
        scheme, host, path = "https", match[1], match[2]
    elif match := re.match(r"^(?:[^@/]+@)?([^/:]+):(?!/)(.+)$", remote):
        scheme, host, path = "https", match[1], match[2]
    else:
        return None  # a local path or file:// clone has no web page
    path = path.strip("/").removesuffix(".git")
    if not host or "/" not in path:
        return None
    return f"{scheme}://{host}/{path}"


def commit_url_of(web: str) -> str:
    host = urllib.parse.urlsplit(web).hostname or ""
    if "gitlab" in host:
        return f"{web}/-/commit/"
    if host == "bitbucket.org":
        return f"{web}/commits/"
    return f"{web}/commit/"  # GitHub, Gitea, Forgejo, ...


def commit_links(conf: dict, repo: Path) -> tuple[str, str, str]:
    """(show_commit_url, project_url, where it came from). asv appends the short hash to show_commit_url.

    In order: $TRITONFA_ASV_COMMIT_URL; asv.conf.json's show_commit_url; the web address of the repository
    ($BUILDKITE_REPO on Buildkite, else the `origin` remote); else this site's commits.html (never a dead link).
    """
    project_url = conf.get("project_url") if conf.get("project_url", "#") != "#" else None
    if os.environ.get(COMMIT_URL_ENV):
        return os.environ[COMMIT_URL_ENV], project_url or COMMITS_PAGE, COMMIT_URL_ENV
    if conf.get("show_commit_url", "#") != "#":
        return conf["show_commit_url"], project_url or COMMITS_PAGE, "asv.conf.json"
    remote = os.environ.get("BUILDKITE_REPO") or (git(repo, "remote", "get-url", "origin") or "")
    web = web_url(remote) if remote else None
    if web:
        return commit_url_of(web), project_url or web, "the origin remote"
    return f"{COMMITS_PAGE}#", project_url or COMMITS_PAGE, f"no web address known: {COMMITS_PAGE}"


def publish_conf(config: Path, results_dir: Path | None, commit_url: str, project_url: str) -> Path:
    """asv.conf.json with the links filled in, next to it (asv imports the config's plugins from its folder)."""
    conf = read_conf(config)
    conf.update({"show_commit_url": commit_url, "project_url": project_url})
    if results_dir is not None:
        conf["results_dir"] = str(results_dir.resolve())
    path = config.parent / f".publish-{os.getpid()}.conf.json"
    path.write_text(json.dumps(conf, indent=1) + "\n")
    return path


# ---------------------------------------------------------------------------------------------------------------
# self-contained pages


def localize(html_dir: Path) -> list[str]:
    """Point every page's CDN <script>/<link> at vendor/ copies; returns the URLs replaced."""
    (html_dir / VENDOR_DIR).mkdir(exist_ok=True)
    replaced, missing = [], []

    def swap(match: re.Match, page: str) -> str:
        tag, url = match.group(0), match.group(2)
        if url not in ASSETS:
            missing.append(f"{page}: {url}")
            return tag
        shutil.copy2(VENDOR / ASSETS[url], html_dir / VENDOR_DIR / ASSETS[url])
        replaced.append(url)
        return DROP_ATTRIBUTES.sub("", tag.replace(url, f"{VENDOR_DIR}/{ASSETS[url]}"))

    for page in sorted(html_dir.glob("*.html")):
        page.write_text(TAG.sub(lambda match, name=page.name: swap(match, name), page.read_text()))
    if missing:
        raise SystemExit("publish.py: no local copy of these CDN assets (see asv_bench/site_vendor/README.md):\n  "
                         + "\n  ".join(missing))  # fmt: skip
    return replaced


# ---------------------------------------------------------------------------------------------------------------
# landing note and commits page


def recorded(results_dir: Path) -> dict:
    """{machine: {"info": machine.json, "commits": {hash: number of finite values}}} from the results folder."""
    machines: dict = {}
    for machine_json in sorted(results_dir.glob("*/machine.json")):
        commits: dict = {}
        for path in sorted(machine_json.parent.glob("*.json")):
            if path.name == "machine.json":
                continue
            document = json.loads(path.read_text())
            columns = document.get("result_columns", [])
            finite = 0
            for row in document.get("results", {}).values():
                values = dict(zip(columns, row)).get("result") or []
                values = values if isinstance(values, list) else [values]
                finite += sum(1 for v in values if isinstance(v, (int, float)) and math.isfinite(v))
            commits[document["commit_hash"]] = commits.get(document["commit_hash"], 0) + finite
        machines[machine_json.parent.name] = {"info": json.loads(machine_json.read_text()), "commits": commits}
    return machines


def commit_info(repo: Path, hashes: list[str]) -> dict:
    """{hash: {"date", "subject", "body"}} from git (one call); hashes git does not know are left out."""
    if not hashes:
        return {}
    out = git(repo, "show", "-s", "--no-notes", "--format=%H%x1f%aI%x1f%s%x1f%b%x1e", *hashes)
    if out is None:  # one hash this clone lacks fails the whole call: ask one by one
        return {k: v for sha in hashes for k, v in commit_info(repo, [sha]).items()} if len(hashes) > 1 else {}
    info = {}
    for record in out.split("\x1e"):
        fields = record.strip("\n").split("\x1f")
        if len(fields) == 4:
            info[fields[0]] = {"date": fields[1], "subject": fields[2], "body": fields[3].strip()}
    return info


def checked_for_regressions(conf: dict, benchmark: str) -> bool:
    """False where asv.conf.json's regressions_first_commits maps a matching pattern to null (asv: never)."""
    return not any(
        start is None and re.match(pattern, benchmark)
        for pattern, start in conf.get("regressions_first_commits", {}).items()
    )


def describe_machine(name: str, info: dict) -> tuple[str, str, str]:
    """(kind, card, versions) from machine.json, whose cpu field record.py writes as 'CPU | card | versions'."""
    parts = [p.strip() for p in str(info.get("cpu", "")).split(" | ")]
    card = parts[1] if len(parts) >= 3 else "(not recorded)"
    versions = ", ".join(parts[2:]) if len(parts) >= 3 else "(not recorded)"
    host = f"host: {parts[0] or '?'}, {info.get('num_cpu', '?')} CPUs, {info.get('os', '?')}"
    if name == CPU_MACHINE:
        kind = ("Triton's interpreter on CPU, shapes shrunk by smoke_scaled, wall clock of one call: proves the "
                "recording and publishing pipeline; <b>not performance</b>")  # fmt: skip
    else:
        kind = ("one GPU; kernel times are CUDA-event medians (prefill: do_bench, decode and mixed: CUDA-graph "
                "replays), each output checked against tritonfa.reference first")  # fmt: skip
    return f"{kind}<br><small>{html.escape(host)}</small>", html.escape(card), html.escape(versions)


def landing_note(conf: dict, machines: dict, benchmarks: dict, commits: dict, link_source: str) -> str:
    e = html.escape
    rows = []
    for name, data in sorted(machines.items(), key=lambda item: (item[0] == CPU_MACHINE, item[0])):
        with_values = [h for h, n in data["commits"].items() if n]
        newest = max(with_values, key=lambda h: commits.get(h, {}).get("date", ""), default=None)
        kind, card, versions = describe_machine(name, data["info"])
        newest_text = (
            f"<code>{e(newest[:8])}</code> {e(commits.get(newest, {}).get('subject', '')[:60])}" if newest else "—"
        )
        rows.append(f"<tr><td><code>{e(name)}</code></td><td>{card}</td><td>{versions}</td><td>{kind}</td>"
                    f"<td>{len(with_values)}</td><td>{newest_text}</td></tr>")  # fmt: skip
    series = []
    for name in sorted(b for b in benchmarks if b != "version"):
        unit = str(benchmarks[name].get("unit", ""))
        lower = unit in TIME_UNITS
        checked = checked_for_regressions(conf, name)
        series.append(f"<tr><td><code>{e(name)}</code></td><td>{e(unit)}</td><td>{e(SERIES.get(name, ''))}</td>"
                      f"<td>{'lower' if lower else 'higher'}</td><td>{'yes' if checked else 'no'}</td></tr>")  # fmt: skip
    impls = ", ".join(f"<code>{e(k)}</code> {e(v)}" for k, v in IMPLS.items())
    table = 'class="table table-condensed table-bordered" style="width: auto; font-size: 90%"'
    return f"""
      <div id="{NOTE_ID}" style="margin: 10px 20px 0 20px; max-width: 1400px">
        <h2 style="margin-top: 0">tritonfa performance history</h2>
        <p>One point per commit of <code>main</code> on each machine. Click a graph below; its left panel picks the
        <b>machine</b> (compare numbers only within one machine) and the parameters: <b>workload</b>
        (<code>tritonfa.bench.workloads</code>) and <b>impl</b>: {impls}. The peers are reference lines, measured in the
        same recording runs on the same inputs (where a peer cannot run a workload it has no point). A gap in
        tritonfa's line is a commit whose output failed the reference check or could not run.</p>
        <table {table}>
          <tr><th>machine</th><th>card</th><th>versions</th><th>what it is</th><th>commits</th><th>newest</th></tr>
          {"".join(rows)}
        </table>
        <table {table}>
          <tr><th>series</th><th>unit</th><th>what</th><th>better</th><th>in Regressions</th></tr>
          {"".join(series)}
        </table>
        <p><b>Regressions</b> lists rises of the lower-is-better series (times) by more than
        {e(str(int(100 * float(conf.get("regressions_thresholds", {}).get(".*", 0.05)))))}%; throughput series
        rise when the kernel gets faster, so they are drawn but not checked. Clicking a point opens its commit
        ({e(link_source)}); <a href="{COMMITS_PAGE}">all recorded commits</a>.</p>
      </div>"""


def commits_page(machines: dict, commits: dict, commit_url: str, hash_length: int) -> str:
    e = html.escape
    by_commit: dict = {}
    for name, data in machines.items():
        for sha, finite in data["commits"].items():
            by_commit.setdefault(sha, []).append(name if finite else f"{name} (no values)")
    order = sorted(by_commit, key=lambda h: commits.get(h, {}).get("date", ""), reverse=True)
    external = not commit_url.startswith(COMMITS_PAGE)
    rows = []
    for sha in order:
        info = commits.get(sha, {})
        short = e(sha[:hash_length])
        link = f'<a href="{e(commit_url + sha[:hash_length])}">{short}</a>' if external else short
        body = f"<details><summary>message</summary><pre>{e(info['body'])}</pre></details>" if info.get("body") else ""
        rows.append(f'<tr id="{short}"><td><code>{link}</code><br><small><code>{e(sha)}</code></small></td>'
                    f"<td style=\"white-space: nowrap\">{e(info.get('date', '?')[:16].replace('T', ' '))}</td><td>{e(info.get('subject', '(not in this clone)'))}{body}</td>"
                    f"<td>{e(', '.join(sorted(by_commit[sha])))}</td></tr>")  # fmt: skip
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>tritonfa: recorded commits</title>
<link rel="stylesheet" href="{VENDOR_DIR}/{ASSETS["https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css"]}">
<style>tr:target {{ background: #fff3c4; }} pre {{ white-space: pre-wrap; }}</style></head>
<body style="margin: 20px">
<h2>Recorded commits</h2>
<p><a href="index.html">back to the graphs</a> &middot; newest first; machines with results for each commit.</p>
<table class="table table-condensed table-bordered">
<tr><th>commit</th><th>date</th><th>subject</th><th>machines</th></tr>
{chr(10).join(rows)}
</table></body></html>
"""


def add_pages(html_dir: Path, conf: dict, results_dir: Path, repo: Path, commit_url: str, link_source: str) -> None:
    machines = recorded(results_dir)
    benchmarks = json.loads((results_dir / "benchmarks.json").read_text())
    hashes = sorted({sha for data in machines.values() for sha in data["commits"]})
    commits = commit_info(repo, hashes)
    index = html_dir / "index.html"
    page = index.read_text()
    anchor = '<div id="summarygrid-display"'
    start = page.index(anchor)
    end = page.index(">", start) + 1
    note = landing_note(conf, machines, benchmarks, commits, link_source)
    index.write_text(page[:end] + note + page[end:])  # summarygrid.js appends the grid after it
    (html_dir / COMMITS_PAGE).write_text(commits_page(machines, commits, commit_url, int(conf.get("hash_length", 8))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--html-dir", type=Path, help="output folder (default: asv.conf.json's html_dir)")
    parser.add_argument("--results-dir", type=Path, help="results to publish (default: asv.conf.json's results_dir)")
    parser.add_argument("--config", type=Path, default=CONF)
    parser.add_argument("--no-pull", action="store_true", help="passed to asv publish")
    args = parser.parse_args(argv)
    config = args.config.resolve()
    conf = read_conf(config)
    html_dir = (args.html_dir or html_dir_of(config)).resolve()
    results_dir = (args.results_dir or config.parent / conf.get("results_dir", "results")).resolve()
    repo = (config.parent / conf.get("repo", "..")).resolve()
    commit_url, project_url, link_source = commit_links(conf, repo)
    derived = publish_conf(config, args.results_dir, commit_url, project_url)
    try:
        cmd = [sys.executable, "-m", "asv", "publish", "--config", str(derived), "--html-dir", str(html_dir)]
        if args.no_pull:
            cmd.append("--no-pull")
        print("$ " + " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    finally:
        derived.unlink(missing_ok=True)
    replaced = localize(html_dir)
    add_pages(html_dir, conf, results_dir, repo, commit_url, link_source)
    print(f"site: {html_dir}/index.html ({len(set(replaced))} CDN assets served from {VENDOR_DIR}/; commit links: "
          f"{commit_url} from {link_source})", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
