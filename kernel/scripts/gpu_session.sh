#!/usr/bin/env bash
# A GPU session in the background: steps in order, each writing into RESULTS_DIR as soon as it ends.
#   setsid nohup bash kernel/scripts/gpu_session.sh RESULTS_DIR [STEPS] > /dev/null 2>&1 &
#   ... later: test -e RESULTS_DIR/DONE && cp RESULTS_DIR/* "$DEST"
# STEPS (comma-separated, default probe,variants,verify):
#   probe                  paging probe
#   variants               config variants (A/B) of VARIANT_PLANS (default prefill,decode,mixed)
#   variants:PLAN:ONLY:VARIANTS  one variants.py call (ONLY and VARIANTS comma lists with '+' for ','), killed after
#                          VARIANTS_TIMEOUT seconds (default 900); VARIANT_PEERS: its --peers; FA3 comes from
#                          PEER_PYTHONPATH once PEER_READY exists (waits up to PEER_WAIT_S seconds, default 120);
#                          VARIANT_ROUNDS: its --rounds (default 1)
#   ws-tests               the warp-specialized Gluon prefill's own tests (Hopper; its opt-in paths included), killed
#                          after WS_TESTS_TIMEOUT seconds (default 600) so a hung kernel cannot hold the session; a
#                          test that runs past WS_TEST_TIMEOUT_EACH seconds (default 180) fails alone (pytest-timeout);
#                          log ws_tests.log, exit status ws_tests_<step number>.rc (for gate:N)
#   ws-tests:EXPR          only the tests that pytest's -k EXPR selects ('+' for ' '), xfail-marked ones run too
#                          (--runxfail: e.g. a path marked as hanging, to check its fix), killed after
#                          WS_TESTS_TIMEOUT seconds; log ws_tests_<step number>.log, exit status ws_tests_<n>.rc
#   decode-tests           the Gluon fp8-KV decode's GPU tests (tests/kernel/test_hopper_decode.py and the fast-path
#                          tests of which decode calls it leaves to the portable kernel), with ws-tests' timeouts;
#                          log ws_tests_<step number>.log, exit status ws_tests_<n>.rc (for gate:N)
#   gate:N                 run the steps after it, up to gate-end, only if step N's tests passed (ws_tests_N.rc is 0)
#   gate-end               end of the gated steps
#   profile                Nsight Compute counters of one Gluon prefill launch per workload x variant
#                          (kernel/scripts/profile_prefill.py; killed after PROFILE_TIMEOUT seconds, default 300)
#   profile:ONLY:VARIANTS  the same for ONLY workloads and VARIANTS ('+' for ','); the variant fa3 profiles FA3 (from
#                          PEER_PYTHONPATH once PEER_READY exists)
#   timeline:ONLY:BEFORE:IMPLS  where a timed call's time goes (kernel/scripts/call_timeline.py: event vs kernel
#                          time, GPU idle, host time, allocations / syncs) for ONLY workloads after BEFORE workloads'
#                          calls ('+' for ','; IMPLS e.g. tritonfa+fa3); timeline_<step number>.{log,json}
#   launch-hostcost        host time per launcher call (kernel/scripts/launch_hostcost.py; first in a chain: it needs
#                          an idle host) into launch_hostcost.log
#   launch-hostcost:CASES  the same for CASES ('+' between case names, e.g. b1x512-qkv8+b4x4096-qkv8)
#   launch-profile:CASES   the same, then cProfile of each case's served calls (where their host time goes)
#   first-call             where a workload's first call goes, empty Triton cache, fresh process per workload
#   first-call:ONLY        the same for the workloads named in ONLY ('+' between names; ^/$-anchored patterns too)
#   warm-up-compile        the vLLM backend's warm-up compiles for a Llama layer, call after call vs all side by side
#                          (kernel/scripts/warm_up_compile.py, empty Triton cache per mode)
#   first-call-serial      the same with TRITONFA_COMPILE_AHEAD=0 (a call's new kernels one after the other), in serial/
#                          (kernel/scripts/first_call.py: compile stages vs the rest; issue 11 asks <= 5 s); early in a
#                          chain, while the host is idle; first_call.json into RESULTS_DIR
#   first-call-launcher:ONLY  TRITONFA_LAUNCHER_AHEAD on / off / on / off (the C launcher built beside the compile)
#   program-ends:ONLY[:VARIANT]  kernel/scripts/program_ends.py: when each SM's persistent prefill program ends
#                          (ONLY: workload patterns, '+' between; VARIANT: a variants.py prefill variant);
#                          program_ends_<n>.{log,json}
#   fault-probe            kernel/scripts/fault_probe.py: where the portable prefill's illegal address (paged, 2-key
#                          pages, session 29) comes from; RESULTS_DIR/fault_probe{,.log}
#   row-sum-probe          kernel/scripts/row_sum_probe.py: `ws_fp8_row_sum_mma`'s wgmma alone and the prefill's l
#                          (row_sum_probe.log)
#   long-context           kernel/scripts/fp8_long_context.py: fp8 non-causal over 4k-32k keys, the output's mean and
#                          error against float64 per variant (one- vs two-level P@V; LONG_CONTEXT_VARIANTS)
#   key-major-copy         fp8 V's key-major copy: tests/kernel/test_key_major.py, then kernel/scripts/key_major_copy.py
#                          (the Triton transpose against torch's copies; key_major_copy.log / .json)
#   fp8-study              the fp8 error study on the GPU (accuracy/fp8_error_study.py --device cuda): its log and
#                          fp8_error_table.{md,json} into RESULTS_DIR (exit status in fp8_study.rc)
#   mask-cost              bounds on vs off (kernel/scripts/mask_cost.py, MASK_COST_ROUNDS rounds, default 3;
#                          MASK_COST_CONFIG: TRITONFA_CONFIG for it)
#   lm-eval                issue 16's accuracy run: trains the suite's small model (accuracy/train_tiny_llama.py,
#                          seed 0, if accuracy/models/tiny-llama-s0 is missing; its train_info.json into RESULTS_DIR),
#                          before it waits for vLLM, then accuracy/run_lm_eval.py (CUSTOM / FLASH_ATTN /
#                          TRITON_ATTN x bf16 / fp8kv / fp8qkv; lm-eval if it imports, else --engine native) into
#                          RESULTS_DIR/lm_eval; vLLM from PEER_PYTHONPATH once PEER_READY exists; killed after
#                          LM_EVAL_TIMEOUT seconds (default 1200)
#   train                  only the lm-eval step's training (a step that needs no vLLM: run it while vLLM is sent)
#   lm-eval:ARGS           the same with ARGS ('+' for ' ') passed to run_lm_eval.py, e.g. lm-eval:--backends+CUSTOM
#                          (LM_EVAL_MODEL: the model's folder instead, e.g. one trained beside an earlier step)
#   verify                 GPU test suite, memcheck, benchmark (gpu_verify.sh; PEER_PYTHONPATH / PEER_READY;
#                          VERIFY_PARTS picks and orders them, default "suite memcheck bench")
#   verify:PARTS           the same with PARTS ('+'-separated, e.g. verify:bench or verify:suite+memcheck)
#   pick-config            write CONFIG_FILE (default RESULTS_DIR/config.json) from the variants that won the A/B
#                          steps so far (kernel/scripts/pick_config.py; none: an empty file), unless it exists or
#                          a gate failed
#   await-config           wait up to AWAIT_CONFIG_S seconds (default 300) for the file CONFIG_FILE (default
#                          RESULTS_DIR/config.json), then run the later steps with TRITONFA_CONFIG set to its contents
#                          (a config chosen from the variants while the machine stays warm; empty file: defaults)
#   vllm                   the vLLM part (integration/scripts/gpu_session.sh RESULTS_DIR PEER_READY; VLLM_STEPS;
#                          vLLM from PEER_PYTHONPATH)
#   vllm:STEPS             the same with VLLM_STEPS=STEPS ('+'-separated, e.g. vllm:auto or vllm:fp8+hostcost)
#   asv                    the asv kernel series of the commits staged in asv_bench/.stage (carry it with `start` or
#                          a bundle part: ASV_STAGE, default /root/asv_stage, holds a later one; README
#                          "Performance history"): asv_bench/record.py run --install-wheels --budget-s ASV_BUDGET_S
#                          (default 540), peers from PEER_PYTHONPATH once PEER_READY exists; tarball in RESULTS_DIR/asv
#   asv:ARGS               the same with ARGS ('+' for ' ') instead of --budget-s, e.g.
#                          asv:--commits+newest+--bench+^e2e+--e2e-kv+auto (end to end, vLLM engines)
#   bg:STEP                STEP in the background (output in bg_<step number>.log): the chain goes on at once. Only
#                          for steps that time nothing, beside steps that time nothing (correctness tests, training,
#                          vLLM agreement and accuracy runs with their GPU memory capped: two engines fit one card)
#   wait-bg                wait until the background steps started so far have ended (before anything timed)
set -uo pipefail
out="$(realpath -m "${1:?usage: gpu_session.sh RESULTS_DIR [STEPS]}")"
steps="${2:-probe,variants,verify}"
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
# The device re-syncs the repository copy at every call, and files rewritten under a running pytest fail its
# collection (session 26): the chain runs from a snapshot of the tree taken when it starts
if [ -z "${GPU_SESSION_SNAPSHOT:-}" ]; then
  snapshot="$(mktemp -d /tmp/gpu_session_tree.XXXXXX)" || exit
  tar --exclude=./.devbundle --exclude=./.nox -cf - . | tar -xf - -C "$snapshot" || exit
  GPU_SESSION_SNAPSHOT="$snapshot" exec bash "$snapshot/kernel/scripts/gpu_session.sh" "$out" "$steps"
fi
mkdir -p "$out"
export PYTHONPATH="$PWD/kernel/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
await_peers() {  # with PEER_PYTHONPATH: wait up to PEER_WAIT_S seconds (default 120) for PEER_READY (vLLM installed)
  [ -n "${PEER_PYTHONPATH:-}" ] || return 0
  for _ in $(seq "${PEER_WAIT_S:-120}"); do [ -z "${PEER_READY:-}" ] || [ -e "$PEER_READY" ] && break; sleep 1; done
}
model="${LM_EVAL_MODEL:-accuracy/models/tiny-llama-s0}"  # issue 16's model (a folder outside the tree survives)
train_model() {  # the model into its folder unless it is there; its train_info.json into RESULTS_DIR
  if [ ! -e "$model/model.safetensors" ]; then
    python3 accuracy/train_tiny_llama.py --out "$model" --seed 0 2>&1 | tee "$out/train_tiny_llama.log" | tail -n 5
  fi
  cp "$model/train_info.json" "$out/" 2>/dev/null
}
run_step() {  # one step of the chain; $2: its number (file names, gates)
  local step="$1" n="$2"
  case "$step" in
    probe) python3 kernel/scripts/paging_probe.py 2>&1 | tee "$out/paging_probe.log" ;;
    variants) python3 kernel/scripts/variants.py --plan "${VARIANT_PLANS:-prefill,decode,mixed}" --out "$out" 2>&1 |
      tee -a "$out/variants.log" ;;
    variants:*)
      IFS=':' read -r _ plan only variants <<< "$step"
      # only FA3 comes with vLLM: torch's peers need no wait (session 39 lost 400 s waiting with sdpa-cudnn only)
      case ",${VARIANT_PEERS:-fa3,sdpa-cudnn,flex}," in *,fa3,*) await_peers ;; esac
      PYTHONPATH="${PEER_PYTHONPATH:+$PEER_PYTHONPATH:}$PYTHONPATH" timeout -s KILL "${VARIANTS_TIMEOUT:-900}" python3 kernel/scripts/variants.py \
        --plan "$plan" --only "${only//+/,}" --variants "${variants//+/,}" \
        --peers "${VARIANT_PEERS:-fa3,sdpa-cudnn,flex}" --rounds "${VARIANT_ROUNDS:-1}" --out "$out" 2>&1 |
        tee -a "$out/variants.log" ;;
    ws-tests* | decode-tests)
      # a hung kernel fails its own test (the thread method ends the worker, which xdist reports and replaces)
      each=(--timeout "${WS_TEST_TIMEOUT_EACH:-180}" --timeout-method thread)
      export TRITONFA_FAILURES_LOG="$out/failures_$n.log" ;;&  # each failure's traceback at once
    ws-tests)
      timeout -s KILL "${WS_TESTS_TIMEOUT:-600}" python3 -m pytest tests/kernel/test_hopper_warp_specialized.py \
        --device cuda -n 8 -v --tb=short -p no:cacheprovider -rfEs "${each[@]}" 2>&1 | tee "$out/ws_tests.log" | tail -n 30
      echo "${PIPESTATUS[0]}" > "$out/ws_tests_$n.rc" ;;  # for gate:N too
    ws-tests:*)
      expr="${step#ws-tests:}"
      timeout -s KILL "${WS_TESTS_TIMEOUT:-600}" python3 -m pytest tests/kernel/test_hopper_warp_specialized.py \
        --device cuda -n 8 -v --tb=short -p no:cacheprovider -rfEs "${each[@]}" --runxfail -k "${expr//+/ }" 2>&1 |
        tee "$out/ws_tests_$n.log" | tail -n 30
      echo "${PIPESTATUS[0]}" > "$out/ws_tests_$n.rc" ;;
    decode-tests)
      # --maxfail: a kernel that hangs or is wrong everywhere costs two tests' time, not every test's
      # with the fast-path tests that pin which decode calls stay off the Gluon kernel
      timeout -s KILL "${WS_TESTS_TIMEOUT:-600}" python3 -m pytest tests/kernel/test_hopper_decode.py \
        tests/kernel/test_fast_paths.py::test_hopper_decode_tiles_keep_p_in_fp16_with_fp8_v \
        tests/kernel/test_fast_paths.py::test_keys_as_rows_tile_setting --device cuda -n 4 -v --tb=short \
        -p no:cacheprovider -rfEs --maxfail=2 "${each[@]}" 2>&1 | tee "$out/ws_tests_$n.log" | tail -n 30
      echo "${PIPESTATUS[0]}" > "$out/ws_tests_$n.rc" ;;
    gate:*)
      rc_file="$out/ws_tests_${step#gate:}.rc"
      if [ "$(cat "$rc_file" 2>/dev/null)" != 0 ]; then skipping=1; gate_failed=1; fi
      echo "gate on $rc_file: $(cat "$rc_file" 2>/dev/null || echo missing), skipping=$skipping" ;;
    profile) timeout -s KILL "${PROFILE_TIMEOUT:-300}" python3 kernel/scripts/profile_prefill.py \
      --out "$out/profile" 2>&1 | tail -n 20 ;;
    profile:*)
      IFS=':' read -r _ only variants <<< "$step"
      await_peers  # the variant fa3 profiles FA3, from PEER_PYTHONPATH
      PYTHONPATH="${PEER_PYTHONPATH:+$PEER_PYTHONPATH:}$PYTHONPATH" timeout -s KILL "${PROFILE_TIMEOUT:-300}" python3 \
        kernel/scripts/profile_prefill.py --out "$out/profile" --only "${only//+/,}" --variants "${variants//+/,}" \
        2>&1 | tail -n 20 ;;
    launch-hostcost) timeout -s KILL 300 python3 kernel/scripts/launch_hostcost.py 2>&1 |
      tee "$out/launch_hostcost.log" ;;
    launch-hostcost:*)  # launch-hostcost:CASES ('+' between launch_hostcost.py's case names)
      cases="${step#launch-hostcost:}"
      timeout -s KILL 300 python3 kernel/scripts/launch_hostcost.py --cases "${cases//+/,}" 2>&1 |
        tee "$out/launch_hostcost_$n.log" ;;
    launch-profile:*)  # launch-profile:CASES: launch-hostcost:CASES, then cProfile of the served calls
      cases="${step#launch-profile:}"
      timeout -s KILL 300 python3 kernel/scripts/launch_hostcost.py --profile --cases "${cases//+/,}" 2>&1 |
        tee "$out/launch_profile_$n.log" ;;
    timeline:*)  # timeline:ONLY:BEFORE:IMPLS ('+' for ','), kernel/scripts/call_timeline.py, peers from PEER_PYTHONPATH
      IFS=':' read -r _ only before impls <<< "$step"
      if [ -n "${impls//tritonfa/}" ]; then await_peers; fi  # a peer (fa3) comes with vLLM
      PYTHONPATH="${PEER_PYTHONPATH:+$PEER_PYTHONPATH:}$PYTHONPATH" timeout -s KILL 300 python3 \
        kernel/scripts/call_timeline.py --only "${only//+/,}" --before "${before//+/,}" \
        --impls "${impls:+${impls//+/,}}" --out "$out/timeline_$n.json" 2>&1 | tee "$out/timeline_$n.log" | tail -n 12 ;;
    first-call) timeout -s KILL 300 python3 kernel/scripts/first_call.py --out "$out" 2>&1 | tail -n 12 ;;
    first-call:*)  # first-call:ONLY ('+' between workload names or ^/$-anchored patterns, e.g. ^mixed)
      only="${step#first-call:}"
      timeout -s KILL 300 python3 kernel/scripts/first_call.py --only "${only//+/,}" --out "$out" 2>&1 |
        tail -n 12 ;;
    warm-up-compile)  # the vLLM warm-up's compiles for a Llama layer: call after call, then all side by side
      timeout -s KILL 300 python3 kernel/scripts/warm_up_compile.py --out "$out" 2>&1 | tail -n 4 ;;
    first-call-launcher:*)  # first-call-launcher:ONLY: the C launcher built beside the compile, on / off / on / off
      only="${step#first-call-launcher:}"
      for run in on1 off1 on2 off2; do
        case "$run" in on*) ahead=1 ;; *) ahead=0 ;; esac
        echo "launcher ahead $run"
        TRITONFA_LAUNCHER_AHEAD="$ahead" timeout -s KILL 300 python3 kernel/scripts/first_call.py \
          --only "${only//+/,}" --out "$out/first_call_launcher_$run" 2>&1 | tail -n 6
      done ;;
    first-call-serial)
      TRITONFA_COMPILE_AHEAD=0 timeout -s KILL 300 python3 kernel/scripts/first_call.py --out "$out/serial" 2>&1 |
        tail -n 12 ;;
    program-ends:*)  # program-ends:ONLY[:VARIANT] ('+' between workload patterns): kernel/scripts/program_ends.py
      IFS=':' read -r _ only variant <<< "$step"
      timeout -s KILL 300 python3 kernel/scripts/program_ends.py --only "${only//+/,}" \
        --variant "${variant:-default}" --out "$out/program_ends_$n.json" 2>&1 | tee "$out/program_ends_$n.log" |
        tail -n 12 ;;
    fault-probe)  # the illegal-address case of session 29, one launch setting changed at a time (fault_probe.py)
      timeout -s KILL 900 python3 kernel/scripts/fault_probe.py --out "$out/fault_probe" 2>&1 |
        tee "$out/fault_probe.log" | tail -n 20 ;;
    row-sum-probe)  # ws_fp8_row_sum_mma: its wgmma alone (N 8 / 16) and the prefill's l (row_sum_probe.py)
      timeout -s KILL 300 python3 kernel/scripts/row_sum_probe.py 2>&1 | tee "$out/row_sum_probe.log" | tail -n 20 ;;
    long-context)  # LONG_CONTEXT_VARIANTS: variants.py names (default: the script's)
      timeout -s KILL 600 python3 kernel/scripts/fp8_long_context.py --out "$out" \
        ${LONG_CONTEXT_VARIANTS:+--variants "$LONG_CONTEXT_VARIANTS"} 2>&1 | tee "$out/fp8_long_context.log" | tail -n 12 ;;
    key-major-copy)
      timeout -s KILL 300 python3 -m pytest tests/kernel/test_key_major.py -q -p no:cacheprovider 2>&1 |
        tee "$out/key_major_tests.log" | tail -n 3
      timeout -s KILL 300 python3 kernel/scripts/key_major_copy.py --out "$out" 2>&1 | tee "$out/key_major_copy.log" ;;
    fp8-study)
      timeout -s KILL 600 python3 accuracy/fp8_error_study.py --device cuda --out-dir "$out" 2>&1 |
        tee "$out/fp8_study.log" | tail -n 12
      echo "${PIPESTATUS[0]}" > "$out/fp8_study.rc" ;;
    mask-cost)  # MASK_COST_CONFIG: the TRITONFA_CONFIG of both sides (its patches cover the portable kernel)
      TRITONFA_CONFIG="${MASK_COST_CONFIG:-${TRITONFA_CONFIG:-}}" python3 kernel/scripts/mask_cost.py \
        --rounds "${MASK_COST_ROUNDS:-3}" --out "$out/mask_cost" 2>&1 | tail -n 30 ;;
    verify) bash kernel/scripts/gpu_verify.sh "$out" ;;
    verify:*)
      parts="${step#verify:}"
      VERIFY_PARTS="${parts//+/ }" bash kernel/scripts/gpu_verify.sh "$out" ;;
    pick-config)
      # the variants that won the A/B steps so far (kernel/scripts/pick_config.py) into CONFIG_FILE for
      # await-config; a config file already there (written by hand) is kept
      config_file="${CONFIG_FILE:-$out/config.json}"
      if [ -e "$config_file" ]; then
        echo "kept $config_file: $(cat "$config_file")"
      elif [ "$gate_failed" = 1 ]; then
        echo "a gate failed: no config picked (await-config waits for one written by hand)"
      else
        python3 kernel/scripts/pick_config.py --out "$config_file.tmp" "$out"/variants-*.jsonl 2>&1 |
          tee "$out/pick_config.log" && mv "$config_file.tmp" "$config_file"
      fi ;;
    await-config)
      config_file="${CONFIG_FILE:-$out/config.json}"
      for _ in $(seq "${AWAIT_CONFIG_S:-300}"); do [ -e "$config_file" ] && break; sleep 1; done
      if [ -s "$config_file" ]; then
        TRITONFA_CONFIG="$(cat "$config_file")"
        export TRITONFA_CONFIG
      fi
      echo "TRITONFA_CONFIG=${TRITONFA_CONFIG:-}" ;;
    vllm) PYTHONPATH="${PEER_PYTHONPATH:+$PEER_PYTHONPATH:}$PYTHONPATH" \
      bash integration/scripts/gpu_session.sh "$out" "${PEER_READY:-}" ;;
    vllm:*)
      parts="${step#vllm:}"
      VLLM_STEPS="${parts//+/ }" PYTHONPATH="${PEER_PYTHONPATH:+$PEER_PYTHONPATH:}$PYTHONPATH" \
      bash integration/scripts/gpu_session.sh "$out" "${PEER_READY:-}" ;;
    train) train_model ;;
    lm-eval | lm-eval:*)
      args=""
      [ "$step" = lm-eval ] || args="${step#lm-eval:}"
      (
        train_model  # needs torch only: it runs while vLLM is still being sent
        await_peers
        export PYTHONPATH="${PEER_PYTHONPATH:+$PEER_PYTHONPATH:}$PYTHONPATH"
        engine=lm-eval
        python3 -c "import lm_eval" 2>/dev/null || engine=native
        # shellcheck disable=SC2086  # ARGS are words
        timeout -s KILL "${LM_EVAL_TIMEOUT:-1200}" python3 accuracy/run_lm_eval.py --model "$model" \
          --engine "$engine" --out "$out/lm_eval" ${args//+/ } 2>&1 | tee "$out/lm_eval.log" | tail -n 30
      ) ;;
    asv | asv:*)
      args="--budget-s ${ASV_BUDGET_S:-540}"
      [ "$step" = asv ] || args="${step#asv:}"
      await_peers
      # asv_bench/.stage carried with a bundle part came after the snapshot: device_session.sh kept it in ASV_STAGE
      if [ ! -e asv_bench/.stage/commits.json ] && [ -e "${ASV_STAGE:-/root/asv_stage}/commits.json" ]; then
        rm -rf asv_bench/.stage && cp -r "${ASV_STAGE:-/root/asv_stage}" asv_bench/.stage
      fi
      # record.py puts each staged commit's kernel first on the import path: not this checkout's
      # shellcheck disable=SC2086  # ARGS are words
      PYTHONPATH="${PEER_PYTHONPATH:-}" python3 asv_bench/record.py run --install-wheels ${args//+/ } \
        --out "$out/asv" 2>&1 | tail -n 30 ;;
    *) echo "unknown step $step" ;;
  esac
}
{
  IFS=',' read -r -a step_list <<< "$steps"
  n=0
  skipping=0
  gate_failed=0
  background=()
  for step in "${step_list[@]}"; do
    n=$((n + 1))
    if [ "$step" = gate-end ]; then skipping=0; continue; fi
    if [ "$skipping" = 1 ]; then echo "== $step skipped (gate)"; continue; fi
    echo "== $step $(date -u +%T) TRITONFA_CONFIG=${TRITONFA_CONFIG:-}"
    case "$step" in
      bg:*)  # the step after "bg:" in the background, output in bg_N.log; the chain goes on at once (steps that
        # do not time anything beside one another, e.g. vLLM checks of accuracy: two engines fit an H200)
        run_step "${step#bg:}" "$n" > "$out/bg_$n.log" 2>&1 &
        background+=("$!") ;;
      wait-bg) wait "${background[@]}"; background=() ;;  # the background steps so far have ended
      *) run_step "$step" "$n" ;;
    esac
  done
  wait  # background steps
  echo "== done $(date -u +%T)"
} > "$out/session.log" 2>&1
touch "$out/DONE"
