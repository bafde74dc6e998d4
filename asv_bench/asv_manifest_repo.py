"""asv plugin: a "repository" read from a JSON manifest of commits, for machines that get the tree without `.git`.

`asv run --set-commit-hash SHA` asks the project's repository for three things (asv 0.6.6, commands/run.py and
benchmarks.py): the full hash of SHA and of each configured branch (`get_hash_from_name`), and SHA's date
(`get_date`, milliseconds; the x axis of the site). Nothing is checked out for an `existing` environment. The
recording recipe (asv_bench/record.py) writes that answer on the host, where git is, into
`.stage/commits.json`:

    {"branches": {"main": "<sha>"}, "commits": [{"sha": "<40 hex>", "date_ms": 1764720000000, "subject": "..."}]}

and a config that selects this plugin: `"dvcs": "manifest"`, `"repo": ".stage/commits.json"`,
`"plugins": [".asv_manifest_repo"]` (asv imports a leading-dot plugin from the config's folder). The site is built
on the host from the real git repository (asv.conf.json), so only recording uses this.
"""

from __future__ import annotations

import json
import os

from asv import util
from asv.repo import NoSuchNameError, Repo


class ManifestRepo(Repo):
    dvcs = "manifest"

    def __init__(self, url, mirror_path):
        self._path = os.path.abspath(url)
        try:
            with open(self._path) as f:
                manifest = json.load(f)
        except (OSError, ValueError) as error:
            raise util.UserError(f"manifest repository {self._path}: {error}") from None
        self._commits = {c["sha"]: c for c in manifest["commits"]}
        self._order = [c["sha"] for c in sorted(manifest["commits"], key=lambda c: c["date_ms"], reverse=True)]
        self._branches = dict(manifest.get("branches", {}))
        self._default_branch = next(iter(self._branches), "main")
        self._pulled = True

    @classmethod
    def url_match(cls, url):
        return False  # only when asv.conf says "dvcs": "manifest"

    def pull(self):
        pass

    def checkout(self, path, commit_hash):
        raise util.UserError("the manifest repository holds no files: use an existing environment")

    def get_date(self, hash):
        return int(self._commits[self.get_hash_from_name(hash)]["date_ms"])

    def get_date_from_name(self, name):
        return self.get_date(name)

    def get_hash_from_name(self, name):
        if name is None:
            name = self.get_branch_name()
        if name in self._branches:
            return self._branches[name]
        matches = [sha for sha in self._commits if len(name) >= 4 and sha.startswith(name.lower())]
        if len(matches) == 1:
            return matches[0]
        raise NoSuchNameError(name)

    def get_hash_from_parent(self, name):
        sha = self.get_hash_from_name(name)
        index = self._order.index(sha)
        if index + 1 >= len(self._order):
            raise NoSuchNameError(name + "^")
        return self._order[index + 1]

    def get_name_from_hash(self, commit):
        return None

    def get_tags(self):
        return {}

    def get_branch_commits(self, branch):
        return list(self._order)

    def get_hashes_from_range(self, range_spec):
        raise util.UserError("the manifest repository records given commits only: use --set-commit-hash")

    def get_range_spec(self, commit_a, commit_b):
        return f"{commit_a}..{commit_b}"

    def get_new_range_spec(self, latest_result, branch=None):
        return self.get_range_spec(latest_result, self.get_branch_name(branch))

    def get_revisions(self, commits):
        return {sha: len(self._order) - i for i, sha in enumerate(self._order) if sha in commits}
