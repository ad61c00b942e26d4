# Session 30 call 2 (H200): the prefill entry (64 workloads) and the packed training steps with auto, every named
# fa_prefill config (tiles2/4/8 now snake, and timed at N 4096-8192), cuDNN and FA3; the records rebuild the H200
# table's fa_prefill rows. Then the GPU tests of the multi-tile and packed paths.
# bash .run/s30_run2.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 360 python3 -m compare run --config sweep --impl pallas:auto --impl 'pallas:fa_prefill:*' \
  --impl jax:cudnn --impl 'fa3:*' --only 'sweep_prefill_*' --only 'sweep_train_packed_*' --jobs 6 --compile-workers 12 \
  --rounds 4 --max-run-s 340 --out /tmp/sweep > $OUT/sweep.log 2>&1
echo "sweep rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/sweep/records.jsonl > $OUT/records.jsonl.gz
tail -2 $OUT/sweep.log
timeout 60 python3 -m compare report /tmp/sweep/records.jsonl --out $OUT/sweep_report.md --no-plots > /dev/null 2>&1; echo "report rc $?"
grep -E '^\| (prefill|train) \|' $OUT/sweep_report.md | cut -c1-400
t0=$(date +%s)
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_fa_prefill_gpu.py -k "tiles" tests/gpu/test_dropin_gpu.py -k "packed or tiles" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/tests.log
