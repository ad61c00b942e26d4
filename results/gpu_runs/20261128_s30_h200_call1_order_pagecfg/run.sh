# Session 30 call 1 (H200): (1) GPU tests of the snake order (multi-tile ragged grid) and the serving probe's smoke;
# (2) configs/tune_fa_prefill_order.toml (tiles 2/4/8 strided and snake at D 128, N 2048-8192, FA3 and cuDNN beside);
# (3) scripts/serving_probe.py --parts pagecfg (page 16 vs the dense cache under four fa_prefill configs).
# bash .run/s30_run1.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fa_prefill_gpu.py -k "multi_tile_ragged_grid" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -2 $OUT/tests.log; t0=$(date +%s)
timeout 300 python3 -m compare tune --config tune_fa_prefill_order --rounds 4 --compile-workers 8 --max-run-s 290 --out /tmp/order > $OUT/order.log 2>&1
echo "order rc $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
timeout 170 python3 scripts/serving_probe.py --parts pagecfg --out /tmp/pagecfg > $OUT/pagecfg.log 2>&1
echo "pagecfg rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/order/records.jsonl > $OUT/order.records.jsonl.gz
gzip -c /tmp/pagecfg/records.jsonl > $OUT/pagecfg.records.jsonl.gz
tail -8 $OUT/order.log
tail -20 $OUT/pagecfg.log
