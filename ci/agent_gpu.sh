#!/usr/bin/env bash
# Print the GPU(s) of the Buildkite agent that runs this job, for the docker wrappers:
#
#   ci/agent_gpu.sh nvidia|rocm        e.g. 3, or 0,1
#
# Hosts run one agent per GPU, so nothing may fall back to GPU 0: every agent would share it. The agent names its
# GPU with a tag (buildkite-agent start --tags "queue=amd_mi300_1,gpu=3"; Buildkite exports agent tags to jobs as
# BUILDKITE_AGENT_META_DATA_<TAG>), or with TRITONFA_GPU or the vendor's variable (NVIDIA_VISIBLE_DEVICES,
# HIP_VISIBLE_DEVICES) in its environment. A host with a single GPU needs none of them. Exit 2 otherwise: a
# misconfigured agent, not retried.
set -euo pipefail

vendor="${1:-}"
case "$vendor" in
  nvidia) own="${NVIDIA_VISIBLE_DEVICES:-}" ;;
  rocm) own="${HIP_VISIBLE_DEVICES:-}" ;;
  *)
    echo "usage: $0 nvidia|rocm" >&2
    exit 2
    ;;
esac
gpu="${BUILDKITE_AGENT_META_DATA_GPU:-${TRITONFA_GPU:-$own}}"
if [[ -z "$gpu" ]]; then
  if [[ "$vendor" == nvidia ]]; then
    count=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
  else
    count=$(find /dev/dri -maxdepth 1 -name 'renderD*' 2>/dev/null | wc -l)
  fi
  if [[ "$count" -ne 1 ]]; then
    echo "this agent names no GPU and the host has $count: start it with --tags gpu=N (or set TRITONFA_GPU)" >&2
    exit 2
  fi
  gpu=0
fi
echo "$gpu"
