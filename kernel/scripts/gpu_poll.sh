#!/usr/bin/env bash
# One poll of a background GPU session (gpu_session.sh): a digest on stdout and the whole results folder as one
# tarball in DEST, so that a machine taken back before the next poll leaves what had finished (the device returns
# at most 8 files per call: one tarball instead of the folder's files).
#   bash kernel/scripts/gpu_poll.sh RESULTS_DIR "$OUT"
set -uo pipefail
results="${1:?usage: gpu_poll.sh RESULTS_DIR DEST}"
dest="${2:?usage: gpu_poll.sh RESULTS_DIR DEST}"
mkdir -p "$dest"
tar -czf "$dest/$(basename "$results").tgz" -C "$(dirname "$results")" "$(basename "$results")" 2>/dev/null
echo "== $(date -u +%T) $results: $(find "$results" -type f | wc -l) files"
tail -n 4 "$results/session.log" 2>/dev/null
if [ -s "$results/failures.log" ]; then
  echo "-- failed tests:"
  grep '^== ' "$results/failures.log" | sort -u
fi
grep -h -E '^=+ .*(passed|failed)' "$results"/gpu_tests.log 2>/dev/null | tail -n 2
for log in "$results"/latency_*.log; do
  [ -e "$log" ] && grep -E '^\| (CUSTOM|FLASH_ATTN|TRITON_ATTN) ' "$log"
done
sed -n '/^summary/,$p' "$results/variants.log" 2>/dev/null | tail -n 12
tail -n 3 "$results/vllm_session.log" 2>/dev/null
exit 0
