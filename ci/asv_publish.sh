#!/usr/bin/env bash
# Build the asv site from every result recorded so far and ship it (Buildkite, main only):
#
#   ci/asv_publish.sh
#
# 1. The results store (TRITONFA_ASV_RESULTS_URI: s3://bucket/prefix through the aws CLI, or a folder on the
#    agent) is pulled and merged into the checkout's committed asv_bench/results (committed values win).
# 2. This build's results (the GPU steps' artifacts asv_bench/results/**) are merged on top (they win).
# 3. `nox -s asv_publish` builds asv_bench/html; only then is the merged folder pushed back to the store (adds and
#    updates, never deletes), so the history grows by every main build and a broken merge is never stored.
# 4. The site is uploaded as artifacts/asv-site.tar.gz and, with TRITONFA_ASV_SITE_URI (s3://...), synced there;
#    the site is rebuilt whole from the results every time, so its sync may delete stale pages.
# Without TRITONFA_ASV_RESULTS_URI the site shows the committed results plus this build's only. Commit links:
# TRITONFA_ASV_COMMIT_URL, else the web address of BUILDKITE_REPO (asv_bench/publish.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

store="${TRITONFA_ASV_RESULTS_URI:-}"
work="artifacts/asv-merge"
rm -rf "$work"
mkdir -p "$work" artifacts

if [[ -n "$store" ]]; then
  echo "--- pulling the results store $store"
  python3 asv_bench/results_store.py pull "$store" "$work/store"
  python3 asv_bench/results_store.py merge "$work/store" asv_bench/results --keep-existing
else
  echo "TRITONFA_ASV_RESULTS_URI is not set: no results store, the history is the committed results + this build"
fi

if [[ -n "${BUILDKITE:-}" ]]; then
  echo "--- this build's asv results"
  if buildkite-agent artifact download "asv_bench/results/**/*" "$work/build"; then
    python3 asv_bench/results_store.py merge "$work/build/asv_bench/results" asv_bench/results
  else
    echo "no asv results recorded in this build"
  fi
fi

echo "--- :nox: nox -s asv_publish"
ci/nox.sh --non-interactive -s asv_publish

if [[ -n "$store" ]]; then
  echo "--- pushing the merged results to $store"
  python3 asv_bench/results_store.py push asv_bench/results "$store"
fi

if [[ -d asv_bench/html ]]; then
  tar -C asv_bench -czf artifacts/asv-site.tar.gz html
  echo "site: artifacts/asv-site.tar.gz"
  if [[ -n "${TRITONFA_ASV_SITE_URI:-}" ]]; then
    echo "--- publishing the site to $TRITONFA_ASV_SITE_URI"
    aws s3 sync --delete asv_bench/html "$TRITONFA_ASV_SITE_URI"
  fi
else
  echo "no site built (asv_bench/asv.conf.json or results absent)"
fi
