"""Build the asv site from asv_bench/results and make it self-contained: `nox -s asv_publish` runs this.

    python asv_bench/publish.py [--html-dir DIR] [--no-pull]      (the Python that runs it needs asv 0.6.6)

Runs `asv publish` (default output: asv.conf.json's html_dir, asv_bench/html, git-ignored), then rewrites the
site's pages so that the jQuery / Flot / Bootstrap files asv links from CDNs load from `vendor/` instead (copies of
asv_bench/site_vendor/): the site then renders offline, which CI's browser test and anyone opening the Buildkite
artifact need. Fails if a page links a CDN asset there is no local copy of (e.g. after an asv upgrade).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONF = HERE / "asv.conf.json"
VENDOR = HERE / "site_vendor"
VENDOR_DIR = "vendor"  # inside the built site

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


def html_dir_of(config: Path) -> Path:
    text = "\n".join(line for line in config.read_text().splitlines() if not line.lstrip().startswith("//"))
    return config.parent / json.loads(text).get("html_dir", "html")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--html-dir", type=Path, help="output folder (default: asv.conf.json's html_dir)")
    parser.add_argument("--config", type=Path, default=CONF)
    parser.add_argument("--no-pull", action="store_true", help="passed to asv publish")
    args = parser.parse_args(argv)
    html_dir = (args.html_dir or html_dir_of(args.config)).resolve()
    cmd = [sys.executable, "-m", "asv", "publish", "--config", str(args.config), "--html-dir", str(html_dir)]
    if args.no_pull:
        cmd.append("--no-pull")
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    replaced = localize(html_dir)
    print(f"site: {html_dir}/index.html ({len(set(replaced))} CDN assets served from {VENDOR_DIR}/)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
