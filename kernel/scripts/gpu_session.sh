#!/usr/bin/env bash
# A GPU session in the background: the paging probe, config variants (A/B), then the GPU test suite, memcheck and
# the benchmark (gpu_verify.sh; PEER_PYTHONPATH / PEER_READY pass through to it).
# Results go to a folder outside the checkout so that a later call can collect them:
#   setsid nohup bash kernel/scripts/gpu_session.sh RESULTS_DIR [variants plans] > /dev/null 2>&1 &
#   ... later: test -e RESULTS_DIR/DONE && cp RESULTS_DIR/* "$DEST"
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out="${1:?usage: gpu_session.sh RESULTS_DIR [plans]}"
plans="${2:-prefill,decode,mixed}"
mkdir -p "$out"
export PYTHONPATH="$PWD/kernel/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  echo "== paging probe $(date -u +%T)"
  python3 kernel/scripts/paging_probe.py 2>&1 | tee "$out/paging_probe.log"
  echo "== variants ($plans) $(date -u +%T)"
  python3 kernel/scripts/variants.py --plan "$plans" --out "$out" 2>&1 | tee "$out/variants.log"
  echo "== verify $(date -u +%T)"
  bash kernel/scripts/gpu_verify.sh "$out"
  echo "== done $(date -u +%T)"
} > "$out/session.log" 2>&1
touch "$out/DONE"
