# Session 30 call 4 (H200): multi-tile CTAs under Mistral's 4096-key window at N 8192 / 16384
# (configs/tune_fa_prefill_window_tiles.toml), then fa_prefill's multi-tile GPU tests (call 2's test step ran out of time).
# bash .run/s30_run4.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 150 python3 -m compare tune --config tune_fa_prefill_window_tiles --rounds 4 --compile-workers 8 --max-run-s 140 --out /tmp/wt > $OUT/wtiles.log 2>&1
echo "wtiles rc $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
gzip -c /tmp/wt/records.jsonl > $OUT/wtiles.records.jsonl.gz
timeout 170 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_fa_prefill_gpu.py -k "tiles" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -3 $OUT/tests.log
tail -4 $OUT/wtiles.log | cut -c1-600
