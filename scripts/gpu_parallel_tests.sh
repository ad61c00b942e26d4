#!/usr/bin/env bash
# ROLE: tool (tests/test_scripts_roles.py: scripts/ holds probes and tools only)
# GPU test files in parallel groups on one device (correctness only: no timings run while they share the GPU).
# Usage: scripts/gpu_parallel_tests.sh "LIMIT_S:file1 file2" "LIMIT_S:file3" ...
# Each group runs its files one after another under one time limit; groups run at the same time.
# The CUDA extension is built first when any group names a test_cuda_* or test_compare_cuda_* file.
# Logs: $OUT/tests_<n>.log; a summary table last.
set -u
OUT=${OUT:-$PWD/gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export CUDA_REF_BUILD_DIR=${CUDA_REF_BUILD_DIR:-$PWD/.cuda_build}
if [[ "$*" == *test_cuda_* || "$*" == *test_compare_cuda* ]]; then
  t0=$SECONDS; timeout 300 python3 scripts/build_cuda_ref.py > "$OUT/cuda_build.log" 2>&1
  echo "cuda build rc=$? $((SECONDS - t0))s"; tail -n 2 "$OUT/cuda_build.log"
fi
n=0; pids=()
for g in "$@"; do
  n=$((n + 1)); limit=${g%%:*}; files=${g#*:}
  ( t0=$SECONDS; timeout "$limit" python3 -m pytest -m gpu -q -rs -p no:cacheprovider --durations=5 $files \
      > "$OUT/tests_$n.log" 2>&1; rc=$?
    printf 'group %-2s rc=%-4s %4ss  %s | %s\n' "$n" "$rc" "$((SECONDS - t0))" "$files" \
      "$(grep -E '(passed|failed|error)' "$OUT/tests_$n.log" | tail -n 1)" > "$OUT/tests_$n.summary" ) &
  pids+=($!)
done
wait "${pids[@]}"
for i in $(seq 1 $n); do grep -E "^(FAILED|ERROR)" "$OUT/tests_$i.log" | head -n 8; done
echo "=== summary"; cat "$OUT"/tests_*.summary
