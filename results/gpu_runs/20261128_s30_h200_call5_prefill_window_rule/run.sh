# Session 30 call 5 (H200): the prefill entry with the wide-window rule (Mistral N 8192 on tiles8), auto + every named
# fa_prefill config + cuDNN + FA3; then the drop-in's Mistral-window GPU tests.
# bash .run/s30_run5.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
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
gzip -c /tmp/sweep/records.jsonl > $OUT/records.jsonl.gz
tail -1 $OUT/sweep.log
timeout 60 python3 -m compare report /tmp/sweep/records.jsonl --out $OUT/sweep_report.md --no-plots > /dev/null 2>&1; echo "report rc $?"
grep -E '^\| prefill \|' $OUT/sweep_report.md | cut -c1-400
timeout 80 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_dropin_gpu.py -k "mistral" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -2 $OUT/tests.log
