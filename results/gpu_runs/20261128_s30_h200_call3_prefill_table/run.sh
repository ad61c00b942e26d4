# Session 30 call 3 (H200): the prefill entry again after the H200 table's fa_prefill rows were rebuilt from call 2
# (multi-tile configs at N 4096-8192), and the training steps at N 4096-8192 (their forward reads the same rows).
# bash .run/s30_run3.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 300 python3 -m compare run --config sweep --impl pallas:auto --impl 'pallas:fa_prefill:*' \
  --impl jax:cudnn --impl 'fa3:*' --only 'sweep_prefill_*' --jobs 6 --compile-workers 12 \
  --rounds 4 --max-run-s 280 --out /tmp/sweep > $OUT/sweep.log 2>&1
echo "sweep rc $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
timeout 230 python3 -m compare run --config sweep --impl pallas:auto --impl 'pallas:dropin:wide' --impl 'pallas:dropin:fused' \
  --impl jax:cudnn --impl 'fa3:*' --only 'sweep_train_*_n4096' --only 'sweep_train_*_n8192' --jobs 6 --compile-workers 12 \
  --rounds 4 --max-run-s 215 --out /tmp/train > $OUT/train.log 2>&1
echo "train rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/sweep/records.jsonl > $OUT/records.jsonl.gz
gzip -c /tmp/train/records.jsonl > $OUT/train.records.jsonl.gz
tail -1 $OUT/sweep.log; tail -1 $OUT/train.log
timeout 60 python3 -m compare report /tmp/sweep/records.jsonl /tmp/train/records.jsonl --out $OUT/sweep_report.md --no-plots > /dev/null 2>&1; echo "report rc $?"
grep -E '^\| (prefill|train) \|' $OUT/sweep_report.md | cut -c1-400
