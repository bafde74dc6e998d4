#!/usr/bin/env bash
# Run a command inside a CUDA image on an NVIDIA agent, with the repository mounted at /workspace:
#
#   ci/cuda_docker.sh ci/gpu_session.sh tests
#
# The default image is vLLM 0.24.0's (torch 2.11, triton 3.6); nox sessions use its interpreter
# (TRITONFA_NOX_EXISTING_ENV=1). The GPU is the agent's own (ci/agent_gpu.sh: its `gpu` tag).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

image="${TRITONFA_CUDA_IMAGE:-vllm/vllm-openai:v0.24.0}"
name="tritonfa-cuda-${BUILDKITE_JOB_ID:-$$}"
gpus=$(ci/agent_gpu.sh nvidia)

cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
  # files the container wrote (root-owned) must not break the agent's next checkout
  docker run --rm -v "$PWD:/workspace" --entrypoint "" "$image" \
    chown -R "$(id -u):$(id -g)" /workspace >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "--- :docker: $image (GPUs $gpus)"
docker pull --quiet "$image"
docker run --rm --name "$name" \
  --gpus "\"device=$gpus\"" \
  --shm-size "${TRITONFA_SHM_SIZE:-16g}" \
  -e TRITONFA_NOX_EXISTING_ENV=1 -e TRITONFA_DEVICE=cuda -e TRITONFA_PLATFORM=cuda \
  -e BUILDKITE -e BUILDKITE_BRANCH -e BUILDKITE_COMMIT -e BUILDKITE_BUILD_NUMBER -e BUILDKITE_JOB_ID \
  -e TRITONFA_ASV_MACHINE -e HF_HUB_OFFLINE -e PYTHONUNBUFFERED=1 \
  -e VLLM_USE_FLASHINFER_SAMPLER=0 \
  -v "$PWD:/workspace" -w /workspace \
  --entrypoint "" \
  "$image" "$@"
