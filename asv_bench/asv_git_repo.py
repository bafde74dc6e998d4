"""asv plugin: asv's git repository, made to work on CI checkouts (asv.conf.json: `"dvcs": "tritonfa-git"`).

asv 0.6.6 reads the history of each configured branch by name (`git rev-list --first-parent main` for the site,
`git rev-parse main` in `asv run`). Two kinds of checkout break that:

- a detached HEAD without a local `main`, which is what Buildkite checks out: asv exits with "Unknown branch" or
  `git rev-list` exits 128. Here a branch that has no local ref is read from the build's commit when CI says the
  build is of that branch (BUILDKITE_BRANCH / BUILDKITE_COMMIT), else from `origin/<branch>` (any clone has it).
  Its name stays `main` on the site (graph paths, the branch parameter), only the commits come from elsewhere.
- a checkout owned by another user (CI's GPU steps run as root in docker over the agent's checkout): git refuses
  it ("dubious ownership"). asv's read-only git calls mark this one repository safe: `safe.directory` counts only
  in global (or system) config on the git versions CI images carry, so they get a global config of their own
  (GIT_CONFIG_GLOBAL) that includes the user's and adds this repository.

A local branch that exists is used as it is, so a developer's clone behaves exactly like plain asv.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from asv.plugins.git import Git
from asv.repo import NoSuchNameError


class CheckoutGit(Git):
    dvcs = "tritonfa-git"

    @classmethod
    def url_match(cls, url):
        return False  # only when asv.conf.json says "dvcs": "tritonfa-git"

    def _global_config(self) -> str:
        """A global git config: the user's (included) plus this repository as a safe directory."""
        path = getattr(self, "_safe_config", None)
        if path is None:
            folder = tempfile.mkdtemp(prefix="tritonfa-asv-git-")
            atexit.register(shutil.rmtree, folder, True)
            home = os.path.expanduser("~")
            xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
            user = [
                os.environ.get("GIT_CONFIG_GLOBAL"),
                os.path.join(xdg, "git", "config"),
                os.path.join(home, ".gitconfig"),
            ]
            lines = [f"[include]\n\tpath = {p}\n" for p in user if p and os.path.isfile(p)]
            lines.append(f"[safe]\n\tdirectory = {os.path.abspath(self._path)}\n")
            path = os.path.join(folder, "gitconfig")
            with open(path, "w") as f:
                f.write("".join(lines))
            self._safe_config = path
        return path

    def _run_git(self, args, cwd=True, **kwargs):
        env = dict(kwargs.pop("env", None) or os.environ)
        env["GIT_CONFIG_GLOBAL"] = self._global_config()
        return super()._run_git(args, cwd=cwd, env=env, **kwargs)

    def _resolves(self, rev: str) -> bool:
        out = self._run_git(
            ["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
            valid_return_codes=(0, 1, 128),
            display_error=False,
            dots=False,
        )
        return bool(out.strip())

    def branch_rev(self, branch=None) -> str:
        """The revision to read `branch`'s history from: the branch itself when it resolves, else a fallback."""
        name = self.get_branch_name(branch)
        if self._resolves(name):
            return name
        commit = os.environ.get("BUILDKITE_COMMIT", "")
        if os.environ.get("BUILDKITE_BRANCH") == name and commit and self._resolves(commit):
            return commit  # Buildkite checked out this build of `name` detached
        if self._resolves(f"origin/{name}"):
            return f"origin/{name}"
        return name  # let git report the missing branch as asv would

    def get_branch_commits(self, branch):
        return self.get_hashes_from_range(self.branch_rev(branch))

    def get_new_range_spec(self, latest_result, branch=None):
        return f"{latest_result}..{self.branch_rev(branch)}"

    def get_hash_from_name(self, name):
        name = self.get_branch_name(name)
        try:
            return super().get_hash_from_name(name)
        except NoSuchNameError:
            fallback = self.branch_rev(name)
            if fallback == name:
                raise
            return super().get_hash_from_name(fallback)
