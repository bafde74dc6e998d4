#!/usr/bin/env bash
# The vLLM part of a GPU session, in the background, after the kernel part (kernel/scripts/gpu_session.sh): the
# seed's latency benchmark (CUSTOM vs FLASH_ATTN, bf16 KV cache), ALiBi against float64 in the engine, the latency
# benchmark with an fp8 KV cache, host time per call. Each step writes into RESULTS_DIR as soon as it ends, so a
# session cut short keeps the steps that finished.
#   setsid nohup bash integration/scripts/gpu_session.sh RESULTS_DIR [READY_FILE] > /dev/null 2>&1 &
# READY_FILE (optional): wait until it exists (vLLM still being installed) before the first engine starts.
# VLLM_STEPS (default "auto alibi fp8 hostcost"): which steps, in that order: auto / fp8 (latency with that KV cache
# dtype), alibi (e2e_check.py --suite alibi), e2e:SUITE (e2e_check.py --suite SUITE, e.g. e2e:all), hostcost,
# stepprofile (step_profile.py: one prefill-heavy and one decode step per backend, torch profiler), encoder
# (encoder_check.py: a bidirectional Llama's embeddings, CUSTOM vs FLASH_ATTN).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
out="${1:?usage: gpu_session.sh RESULTS_DIR [READY_FILE]}"
ready="${2:-}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  if [ -n "$ready" ]; then
    for _ in $(seq 120); do [ -e "$ready" ] && break; sleep 5; done
  fi
  python3 -c "import vllm; print('vllm', vllm.__version__)" || { echo "no vLLM: stopping"; exit 1; }
  # the end-to-end number first: a session cut short still has it
  for step in ${VLLM_STEPS:-auto alibi fp8 hostcost}; do  # auto / fp8: the latency benchmark with that KV cache dtype
    case "$step" in
      encoder)
        echo "== encoder-only $(date -u +%T)"
        timeout 900 python3 integration/scripts/encoder_check.py --out "$out" 2>&1 | tail -n 20 ;;
      alibi)
        echo "== e2e alibi $(date -u +%T)"
        timeout 600 python3 integration/scripts/e2e_check.py --suite alibi --out "$out" 2>&1 | tail -n 40 ;;
      e2e:*)
        echo "== e2e ${step#e2e:} $(date -u +%T)"
        timeout "${E2E_TIMEOUT:-1500}" python3 integration/scripts/e2e_check.py --suite "${step#e2e:}" --out "$out" 2>&1 |
          tail -n 60 ;;
      stepprofile)
        echo "== step profile $(date -u +%T)"
        timeout 600 python3 integration/scripts/step_profile.py --out "$out" 2>&1 | tail -n 40 ;;
      hostcost)
        echo "== hostcost $(date -u +%T)"
        timeout 300 python3 integration/scripts/hostcost.py --profile --out "$out" 2>&1 | tail -n 30 ;;
      *)
        echo "== latency $step $(date -u +%T)"
        timeout 600 python3 integration/scripts/latency.py --backends CUSTOM,FLASH_ATTN --kv-cache-dtypes "$step" \
          --out "$out" 2>&1 | tee "$out/latency_$step.log" | tail -n 20
        echo "JIT compilations during inference (vLLM's warning) in the engines' logs:"
        grep -c "JIT compilation during inference" "$out/latency_$step.logs"/*.log ;;
    esac
  done
  echo "== done $(date -u +%T)"
} >> "$out/vllm_session.log" 2>&1  # appends: a session may run this more than once
touch "$out/VLLM_DONE"
