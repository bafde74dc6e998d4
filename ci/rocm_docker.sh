#!/usr/bin/env bash
# Run a command inside a ROCm image on an AMD agent, with the repository mounted at /workspace:
#
#   ci/rocm_docker.sh ci/gpu_session.sh tests
#
# The image (TRITONFA_ROCM_IMAGE, default vLLM 0.24.0's ROCm build, pinned like the CUDA one) has torch, triton and
# vLLM for ROCm; nox sessions use that interpreter (TRITONFA_NOX_EXISTING_ENV=1). The GPUs are passed through
# /dev/kfd + /dev/dri and the agent's own is picked with HIP_VISIBLE_DEVICES (ci/agent_gpu.sh: its `gpu` tag).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

image="${TRITONFA_ROCM_IMAGE:-vllm/vllm-openai-rocm:v0.24.0}"
name="tritonfa-rocm-${BUILDKITE_JOB_ID:-$$}"
gpus=$(ci/agent_gpu.sh rocm)

cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
  # files the container wrote (root-owned) must not break the agent's next checkout
  docker run --rm -v "$PWD:/workspace" --entrypoint "" "$image" \
    chown -R "$(id -u):$(id -g)" /workspace >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "--- :docker: $image (HIP_VISIBLE_DEVICES=$gpus)"
docker pull --quiet "$image"
docker run --rm --name "$name" \
  --device /dev/kfd --device /dev/dri --group-add video \
  --shm-size "${TRITONFA_SHM_SIZE:-16g}" \
  --security-opt seccomp=unconfined --cap-add SYS_PTRACE \
  -e HIP_VISIBLE_DEVICES="$gpus" \
  -e TRITONFA_NOX_EXISTING_ENV=1 -e TRITONFA_DEVICE=rocm -e TRITONFA_PLATFORM=rocm \
  -e BUILDKITE -e BUILDKITE_BRANCH -e BUILDKITE_COMMIT -e BUILDKITE_BUILD_NUMBER -e BUILDKITE_JOB_ID \
  -e TRITONFA_ASV_MACHINE -e HF_HUB_OFFLINE -e PYTHONUNBUFFERED=1 \
  -v "$PWD:/workspace" -w /workspace \
  --entrypoint "" \
  "$image" "$@"
