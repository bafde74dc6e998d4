#!/usr/bin/env bash
# Build the asv site from the committed results plus the ones this build recorded, and ship it (main only):
#
#   ci/asv_publish.sh
#
# On Buildkite the asv record steps upload asv_bench/results/**; they are downloaded here, `nox -s asv_publish`
# builds asv_bench/html, and the site is uploaded as artifacts/asv-site.tar.gz. With TRITONFA_ASV_SITE_URI set
# (e.g. s3://bucket/tritonfa-asv) the site is also synced there.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -n "${BUILDKITE:-}" ]]; then
  echo "--- downloading this build's asv results"
  buildkite-agent artifact download "asv_bench/results/**/*" . || echo "no asv results recorded in this build"
fi

echo "--- :nox: nox -s asv_publish"
ci/nox.sh --non-interactive -s asv_publish

mkdir -p artifacts
if [[ -d asv_bench/html ]]; then
  tar -C asv_bench -czf artifacts/asv-site.tar.gz html
  echo "site: artifacts/asv-site.tar.gz"
  if [[ -n "${TRITONFA_ASV_SITE_URI:-}" ]]; then
    echo "--- publishing to $TRITONFA_ASV_SITE_URI"
    aws s3 sync --delete asv_bench/html "$TRITONFA_ASV_SITE_URI"
  fi
else
  echo "no site built (asv_bench/asv.conf.json or results absent)"
fi
