# Session 37, call 5 (H200): scripts/alloc_variance_probe.py, one program on six fresh allocations of the same
# inputs, interleaved rounds: spec_st4 (auto's table choice) and the default at Llama-3.1-8B's Tq 8 spec shape.
# bash .run/s37_run5.sh <full git sha>   (from the repository root; carry [".run"])
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd) OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for c in spec_st4 default; do
  timeout 120 python3 scripts/alloc_variance_probe.py --config $c --copies 6 --rounds 4 --reps 10 2>&1 | grep -v Warning | tee $OUT/probe_$c.txt
done
