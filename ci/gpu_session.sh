#!/usr/bin/env bash
# Run one nox session on a GPU, inside the ROCm/CUDA image (see ci/rocm_docker.sh, ci/cuda_docker.sh):
#
#   ci/gpu_session.sh SESSION [ARGS...]     e.g. ci/gpu_session.sh bench
#
# Uses the image's torch/triton/vLLM (TRITONFA_NOX_EXISTING_ENV=1). Fails with exit 75 (EX_TEMPFAIL, retried by the
# pipeline) when torch sees no GPU, so a broken agent never passes a GPU step by skipping it. bench, latency and
# lm_eval write their results (JSON; bench also a PNG, lm_eval a markdown table) to artifacts/, which the pipeline
# uploads.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $# -lt 1 ]]; then
  echo "usage: $0 SESSION [ARGS...]" >&2
  exit 2
fi
session="$1"
shift
platform="${TRITONFA_PLATFORM:-gpu}"
export TRITONFA_NOX_EXISTING_ENV=1
mkdir -p artifacts

echo "--- :gpu: devices"
if command -v rocm-smi >/dev/null; then rocm-smi --showproductname || true; fi
if command -v nvidia-smi >/dev/null; then nvidia-smi -L || true; fi
if ! python3 -c "import torch, triton, sys; ok = torch.cuda.is_available(); \
print('torch', torch.__version__, '| triton', triton.__version__, '| hip', torch.version.hip, '| cuda', \
torch.version.cuda, '| device', torch.cuda.get_device_name(0) if ok else None); sys.exit(0 if ok else 1)"; then
  echo "torch sees no GPU on a GPU agent: infrastructure problem (exit 75, retried)" >&2
  exit 75
fi

case "$session" in
  bench) set -- --json "artifacts/bench-$platform.json" --png "artifacts/bench-$platform.png" "$@" ;;
  latency) set -- --out artifacts "$@" ;;      # integration/scripts/latency.py: latency_<kv>.json
  lm_eval) set -- --out artifacts/lm_eval "$@" ;; # accuracy/run_lm_eval.py: lm_eval_results.json, lm_eval_table.md
esac

echo "--- :nox: nox -s $session -- $*"
exec ci/nox.sh --non-interactive -s "$session" -- "$@"
