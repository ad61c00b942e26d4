# Session 37, call 7 (H200): the MLA and quant entries over 6 lanes as the whole sweep runs them (auto + every peer,
# 4 rounds, reps 10), after lanes.HEAVY_FACTOR: the four workloads call 1's lanes ran out of memory on should be left
# to the second stage at once, and none of the others should run out of memory.
# bash .run/s37_run7.sh <full git sha>   (from the repository root; carry [".run", ".whl"])
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=$(pwd):/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t0=$(date +%s)
timeout 330 python3 -m compare run --config sweep --only 'sweep_mla_*' --only 'sweep_quant_*' --impl pallas:auto --impl 'jax:*' \
  --impl 'jax-pallas:*' --impl 'torch:cudnn' --impl 'torch:flash' --impl 'fa3:*' --impl 'flashinfer:*' --jobs 6 \
  --compile-workers 12 --rounds 4 --reps 10 --e2e-budget-s 0.25 --max-run-s 320 --out /tmp/heavy > $OUT/heavy.log 2>&1
echo "rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/heavy/records.jsonl > $OUT/heavy.records.jsonl.gz; gzip -f $OUT/heavy.log
zcat $OUT/heavy.log.gz | grep -E "left to a later pass|oom|lanes:|records in" | cut -c1-220 | tee $OUT/summary.txt
