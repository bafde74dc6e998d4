#!/usr/bin/env bash
# Re-split the vLLM bundle of the GPU environment's gpu-vllm/make-bundle.sh (.devbundle/part0..N, 58 MB chunks) into
# .devbundle/q0..qN of 43 MB: a `run` call carries the working tree (~16 MB) and one part within its 64 MiB.
#   (make-bundle.sh from the project root) && bash kernel/scripts/split_bundle.sh
# Then (PERF_NOTES "Next session: run first"): the first call carries .devbundle/q0 and .devbundle/run, each later
# call one part (cp .devbundle/qI/* /root/stage/), the last one runs /root/stage/run/install.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bundle=.devbundle
compgen -G "$bundle/part*/vllm.tgz.*" > /dev/null || { echo "no $bundle/part*/vllm.tgz.*: run make-bundle.sh" >&2; exit 1; }
whole="$(mktemp)"
trap 'rm -f "$whole"' EXIT
cat "$bundle"/part*/vllm.tgz.* > "$whole"
rm -rf "$bundle"/part* "$bundle"/q*
split -b 43000000 -d -a 1 "$whole" "$bundle/vllm.tgz."
for chunk in "$bundle"/vllm.tgz.*; do
  i="${chunk##*.}"
  mkdir -p "$bundle/q$i"
  mv "$chunk" "$bundle/q$i/"
done
du -sh "$bundle"/q* "$bundle/run"
