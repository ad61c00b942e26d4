#!/usr/bin/env bash
# ROLE: tool (tests/test_scripts_roles.py: scripts/ holds probes and tools only)
# One device call: build, GPU tests and measurements, stage by stage, each under its own time limit.
# Usage (on the GPU machine, from the checkout): scripts/gpu_session.sh STAGE [STAGE ...]
#   stages: pallas-tests cuda-build cuda-tests cuda-sanitize cuda-time pallas-time fa-tests fa-tune fa-tune-splits
#           serving-tests dropin-tests ring-tests quant-tests serving-probe ring-probe make-compare
#           compare:<config>[:<only-glob>]
#   (ring-tests / ring-probe want 2+ GPUs: a 2-GPU machine)
# Timings and sweeps are compare's (one clock, one record schema): cuda-time / pallas-time run
# configs/time_generations.toml, fa-tune / fa-tune-splits the grids of configs/tune_fa_decode*.toml.
# Logs go to $OUT (or ./gpu_out); a summary table is printed last.
set -u
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export CUDA_REF_BUILD_DIR=${CUDA_REF_BUILD_DIR:-$PWD/.cuda_build}
declare -a SUMMARY
stage() {  # stage NAME LIMIT_S CMD...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== [$name] $* (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  SUMMARY+=("$(printf '%-22s rc=%-4s %5ss' "$name" "$rc" "$((SECONDS - t0))")")
}
for s in "$@"; do
  case "$s" in
    pallas-tests)  stage pallas-tests ${PALLAS_TESTS_LIMIT:-240} python3 -m pytest -m gpu -q -rs tests/gpu/test_pallas_gpu.py ;;
    cuda-build)    stage cuda-build 300 python3 scripts/build_cuda_ref.py ;;
    cuda-tests)    stage cuda-tests ${CUDA_TESTS_LIMIT:-200} python3 -m pytest -m gpu -q -rs tests/gpu/test_cuda_ref_gpu.py ;;
    cuda-sanitize) stage cuda-sanitize 300 compute-sanitizer --tool memcheck --error-exitcode 1 python3 scripts/cuda_sanitize.py ;;
    cuda-time)     stage cuda-time 200 python3 -m compare run --config time_generations --impl 'cuda:*' \
                     --out "$OUT/cuda-time" ;;
    pallas-time)   stage pallas-time 200 python3 -m compare run --config time_generations --impl 'pallas:*' \
                     --out "$OUT/pallas-time" ;;
    fa-tests)      stage fa-tests ${FA_TESTS_LIMIT:-200} python3 -m pytest -m gpu -q -rs tests/gpu/test_fa_decode_gpu.py ;;
    fa-tune)       stage fa-tune 300 python3 -m compare tune --config tune_fa_decode --max-run-s 270 \
                     --out "$OUT/fa-tune" ;;
    fa-tune-splits) stage fa-tune-splits 300 python3 -m compare tune --config tune_fa_decode_paged_splits \
                     --max-run-s 270 --out "$OUT/fa-tune-splits" ;;
    serving-tests) stage serving-tests ${SERVING_TESTS_LIMIT:-330} python3 -m pytest -m gpu -q -rs \
                     tests/gpu/test_serving_gpu.py ;;
    dropin-tests)  stage dropin-tests ${DROPIN_TESTS_LIMIT:-300} python3 -m pytest -m gpu -q -rs tests/gpu/test_dropin_gpu.py ;;
    ring-tests)    stage ring-tests ${RING_TESTS_LIMIT:-200} python3 -m pytest -m gpu -q -rs tests/gpu/test_ring_gpu.py ;;
    quant-tests)   stage quant-tests ${QUANT_TESTS_LIMIT:-200} python3 -m pytest -m gpu -q -rs \
                     tests/gpu/test_fa_decode_quant_gpu.py ;;
    make-compare)  stage make-compare 540 make compare NO_VENV=1 PYTHON=python3 ARGS="--out $OUT/make-compare" ;;
    serving-probe) stage serving-probe 200 python3 scripts/serving_probe.py --out "$OUT/serving-probe" ;;
    ring-probe)    stage ring-probe 150 python3 scripts/ring_probe.py --out "$OUT/ring-probe" ;;
    compare:*)     IFS=: read -r _ cfg only <<< "$s"
                   stage "compare-$cfg" 540 python3 -m compare run --config "$cfg" ${only:+--only "$only"} --out "$OUT/compare-$cfg" ;;
    *) echo "unknown stage $s"; exit 2 ;;
  esac
done
echo; echo "=== summary"; printf '%s\n' "${SUMMARY[@]}"
