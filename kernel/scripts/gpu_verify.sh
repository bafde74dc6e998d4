#!/usr/bin/env bash
# GPU verification in one command, for a GPU host with torch/triton but without nox: the kernel suite on the GPU,
# a compute-sanitizer memcheck over a representative subset, and the side-by-side benchmark.
#   [PEER_PYTHONPATH=DIR [PEER_READY=FILE]] [VERIFY_PARTS="suite memcheck bench"] bash kernel/scripts/gpu_verify.sh \
#     OUTDIR [bench args...]
# VERIFY_PARTS: which parts, in that order (the bench first when the numbers matter more than a complete suite).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
out="${1:?usage: gpu_verify.sh OUTDIR [bench args...]}"
shift
mkdir -p "$out"
export PYTHONPATH="$PWD/kernel/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/card.txt"

for part in ${VERIFY_PARTS:-suite memcheck bench}; do
  case "$part" in
  suite)
    echo "== kernel tests on the GPU"
    # -v names each failure as it happens and failures.log keeps its traceback at once, so a run cut off by a time
    # limit still says what failed and why; a test past SUITE_TEST_TIMEOUT seconds (default 240: a hung kernel)
    # fails alone, and the whole suite is killed after SUITE_TIMEOUT seconds (default 1200); SUITE_K: only the tests
    # pytest's -k SUITE_K selects (a part of the suite when device time is short, e.g. "fp8 or paged"); SUITE_FILES:
    # the test files or folders to run instead of tests/kernel, SUITE_IGNORE: files left out (pytest --ignore) - the
    # suite in parts over several leases
    # workers: one per ~9 GiB of GPU memory, at most 16 (SUITE_WORKERS overrides; session 22: 16 workers on an 80 GB
    # H100 ran out of memory in 119 tests that passed when rerun with 6)
    mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)
    workers=${SUITE_WORKERS:-$(( mem_mib / 9216 < 16 ? mem_mib / 9216 : 16 ))}
    [ "$workers" -ge 1 ] || workers=1
    echo "pytest workers: $workers (GPU memory ${mem_mib} MiB)"
    # tests marked large_memory (several GiB each) run after the parallel pass, alone: beside the other workers'
    # cached memory one ran out on an 80 GB H100 (session 30); each pass's summary line is in gpu_tests.log
    read -ra suite_files <<< "${SUITE_FILES:-tests/kernel}"
    for path in ${SUITE_IGNORE:-}; do suite_files+=("--ignore=$path"); done
    : > "$out/gpu_tests.log"
    for pass in parallel large_memory; do
      if [ "$pass" = parallel ]; then marks="not large_memory" procs=(-n "$workers"); else marks="large_memory" procs=(-p no:xdist); fi
      TRITONFA_FAILURES_LOG="$out/failures.log" timeout -s KILL "${SUITE_TIMEOUT:-1200}" python3 -m pytest "${suite_files[@]}" \
        ${SUITE_K:+-k "$SUITE_K"} -m "$marks" \
        --device cuda "${procs[@]}" -v --tb=short -p no:cacheprovider -rfE --timeout "${SUITE_TEST_TIMEOUT:-240}" \
        --timeout-method thread 2>&1 | tee -a "$out/gpu_tests.log" | grep -E "FAILED|ERROR|passed|failed" | tail -n 40
    done
    ;;
  memcheck)
    echo "== compute-sanitizer memcheck (paged, split-KV decode, fp8, masks, varlen, bad index contents, Hopper Gluon prefill)"
    timeout -s KILL "${MEMCHECK_TIMEOUT:-900}" \
      compute-sanitizer --tool memcheck --error-exitcode 99 python3 -m pytest -p no:cacheprovider -p no:xdist -q \
      "tests/kernel/test_paged.py::test_mixed_prefill_context_and_decode_in_one_call" \
      "tests/kernel/test_paged.py::test_decode_and_speculative_lengths" \
      "tests/kernel/test_fp8.py::test_fp8_kv_cache_decode" \
      "tests/kernel/test_masks_and_biases.py::test_rows_that_see_no_key_are_zero" \
      "tests/kernel/test_attention.py::test_varlen_batch" \
      "tests/kernel/test_attention.py::test_v_head_size_differs" \
      "tests/kernel/test_bad_inputs.py" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_prefill_matches_reference[True-num_heads0-True-128]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_prefill_matches_reference[False-num_heads1-False-256]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_paged_prefill_matches_reference[gather-128-16-paged_kv_interleaved]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_paged_prefill_matches_reference[gather-64-256-paged_heads_major]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_paged_prefill_matches_reference[tma-128-16-paged_kv_interleaved]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_paged_prefill_matches_reference[tma-64-256-paged_heads_major]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_fp8_prefill_matches_reference[True-per_head-True-False-128]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_persistent_matches_reference[contiguous-True-128]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_persistent_matches_reference[paged-tma-True-64]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_padded_head_size_matches_reference[True-contiguous-96]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_padded_head_size_matches_reference[False-paged_kv_interleaved-80]" \
      "tests/kernel/test_hopper_warp_specialized.py::test_warp_specialized_paged_fp8_prefill_matches_reference[128-16-paged_kv_interleaved]" \
      2>&1 | tee "$out/memcheck.log" | tail -n 8
    echo "memcheck exit: ${PIPESTATUS[0]}" | tee -a "$out/memcheck.log"
    ;;
  bench)
    echo "== benchmark"
    (  # a subshell: the peers' path stays out of the later parts
    if [ -n "${PEER_PYTHONPATH:-}" ]; then
      # FA3 and vLLM's unified attention as peers, from a vLLM install outside the checkout (perhaps still being
      # installed by another call: PEER_READY names a file that exists once it is done)
      for _ in $(seq 60); do [ -z "${PEER_READY:-}" ] || [ -e "$PEER_READY" ] && break; sleep 5; done
      export PYTHONPATH="$PEER_PYTHONPATH:$PYTHONPATH"
    fi
    python3 -m tritonfa.bench --json "$out/bench.json" --png "$out/bench.png" "$@" 2>&1 | tee "$out/bench.log" | tail -n 45
    )
    ;;
  *) echo "unknown part $part" ;;
  esac
done
