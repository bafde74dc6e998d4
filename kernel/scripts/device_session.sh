#!/usr/bin/env bash
# A device session's calls in one line each (PERF_NOTES "Next session: run first"), run from the tree's root on the
# GPU machine; the vLLM bundle's parts come from .devbundle (kernel/scripts/split_bundle.sh).
#   bash kernel/scripts/device_session.sh start RESULTS_DIR   # first call: carry .devbundle/q0 and .devbundle/run
#   bash kernel/scripts/device_session.sh part I RESULTS_DIR [last]  # later calls: carry .devbundle/qI; "last"
#                                                            # (the bundle's last part) installs vLLM too
#   bash kernel/scripts/device_session.sh poll RESULTS_DIR
# `start` stages part 0 and starts gpu_session.sh in the background with the card's chain: H200_STEPS on an H200
# (the issues are decided there), OTHER_STEPS elsewhere (defaults below; override through the environment), with
# OTHER_SUITE_IGNORE / OTHER_SUITE_FILES as SUITE_IGNORE / SUITE_FILES there. Each call ends with one poll
# (gpu_poll.sh: a digest, and the results folder as a tarball in $OUT).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
stage=/root/stage
site=/root/site
asv_stage=/root/asv_stage
H200_STEPS="${H200_STEPS:-train,verify:bench,vllm:auto+fp8,asv,lm-eval,verify:suite}"
OTHER_STEPS="${OTHER_STEPS:-train,lm-eval,verify:suite}"
action="${1:?usage: device_session.sh start|part|poll ...}"
case "$action" in
  start)
    results="${2:?usage: device_session.sh start RESULTS_DIR}"
    mkdir -p "$stage" "$(dirname "$results")"
    # The tree plus part 0 can pass the 64 MiB a call carries: then part 0 (and run/) come with a later `part 0`.
    if [ -d .devbundle/q0 ]; then cp -r .devbundle/q0/* "$stage/"; fi
    if [ -d .devbundle/run ]; then cp -r .devbundle/run "$stage/"; fi
    card="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    echo "$card"
    # OTHER_SUITE_IGNORE / OTHER_SUITE_FILES: the suite's files left out / run on another card only (the H200 runs
    # the suite whole)
    case "$card" in
      *H200*) steps="$H200_STEPS" ;;
      *)
        steps="$OTHER_STEPS"
        if [ -n "${OTHER_SUITE_IGNORE:-}" ]; then export SUITE_IGNORE="$OTHER_SUITE_IGNORE"; fi
        if [ -n "${OTHER_SUITE_FILES:-}" ]; then export SUITE_FILES="$OTHER_SUITE_FILES"; fi ;;
    esac
    echo "steps: $steps"
    (LM_EVAL_MODEL="${LM_EVAL_MODEL:-/root/tiny-llama-s0}" LM_EVAL_TIMEOUT="${LM_EVAL_TIMEOUT:-900}" \
      PEER_PYTHONPATH="$site" PEER_READY="$site/READY" PEER_WAIT_S="${PEER_WAIT_S:-400}" \
      setsid nohup bash kernel/scripts/gpu_session.sh "$results" "$steps" > /dev/null 2>&1 &)
    sleep 15 ;;
  part)
    part="${2:?usage: device_session.sh part I RESULTS_DIR}"
    results="${3:?usage: device_session.sh part I RESULTS_DIR}"
    cp .devbundle/"q$part"/* "$stage/"
    if [ -d .devbundle/run ]; then cp -r .devbundle/run "$stage/"; fi
    # the chain runs from a snapshot of the tree taken at `start`: a stage carried later waits here for its asv step
    if [ -e asv_bench/.stage/commits.json ]; then rm -rf "$asv_stage" && cp -r asv_bench/.stage "$asv_stage"; fi
    if [ "${4:-}" = last ]; then
      bash "$stage/run/install.sh" > /root/install.log 2>&1 && touch "$site/READY"
      tail -n 1 /root/install.log
    fi ;;
  poll) results="${2:?usage: device_session.sh poll RESULTS_DIR}" ;;
  *) echo "unknown action $action" >&2; exit 2 ;;
esac
bash kernel/scripts/gpu_poll.sh "$results" "${OUT:-/tmp/out}" | tail -n 20
