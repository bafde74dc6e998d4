#!/usr/bin/env bash
# Run nox, pinned, from a private venv: ci/nox.sh -s tests lint   (all arguments go to nox)
#
# The venv lives in .nox/_ci_nox (git-ignored) and is reused while its nox matches NOX_VERSION. Sessions still
# create their own venvs, or use the current interpreter with TRITONFA_NOX_EXISTING_ENV=1 (docker images).
set -euo pipefail

NOX_VERSION="${NOX_VERSION:-2026.10.20}"
PYTHON="${PYTHON:-python3}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=.nox/_ci_nox
if [[ "$("$venv/bin/nox" --version 2>&1 || true)" != *"$NOX_VERSION"* ]]; then
  echo "--- installing nox==$NOX_VERSION into $venv"
  rm -rf "$venv"
  if ! "$PYTHON" -m venv "$venv" 2>/dev/null; then
    # images without ensurepip (python3-venv): fall back to virtualenv
    "$PYTHON" -m pip install --quiet virtualenv
    "$PYTHON" -m virtualenv --quiet "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "nox==$NOX_VERSION"
fi
exec "$venv/bin/nox" "$@"
