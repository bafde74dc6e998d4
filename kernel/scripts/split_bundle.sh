#!/usr/bin/env bash
# Re-split the vLLM bundle of the GPU environment's gpu-vllm/make-bundle.sh (.devbundle/part0..N, 58 MB chunks; or an
# earlier split's q0..qN) into .devbundle/q0..qN of PART_BYTES (default 34 MB): a `run` call carries the working tree
# (~24 MB in session 41, and growing with kernel/results) and one part within its 64 MiB.
#   (make-bundle.sh from the project root) && bash kernel/scripts/split_bundle.sh
# Then (PERF_NOTES "Next session: run first"): the first call carries .devbundle/q0 and .devbundle/run, each later
# call one part (cp .devbundle/qI/* /root/stage/), the last one runs /root/stage/run/install.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bundle=.devbundle
if compgen -G "$bundle/part*/vllm.tgz.*" > /dev/null; then
  pieces=("$bundle"/part*/vllm.tgz.*)
elif compgen -G "$bundle/q*/vllm.tgz.*" > /dev/null; then
  mapfile -t pieces < <(printf '%s\n' "$bundle"/q*/vllm.tgz.* | sort -t/ -k2.2n)  # q0 .. q10 in number order
else
  echo "no $bundle/part*/vllm.tgz.* or $bundle/q*/vllm.tgz.*: run make-bundle.sh" >&2; exit 1
fi
whole="$(mktemp)"
trap 'rm -f "$whole"' EXIT
cat "${pieces[@]}" > "$whole"
rm -rf "$bundle"/part* "$bundle"/q*
split -b "${PART_BYTES:-34000000}" -d -a 1 "$whole" "$bundle/vllm.tgz."
for chunk in "$bundle"/vllm.tgz.*; do
  i="${chunk##*.}"
  mkdir -p "$bundle/q$i"
  mv "$chunk" "$bundle/q$i/"
done
du -sh "$bundle"/q* "$bundle/run"
