# Session 31 call 4 (H200): the train entry (60 workloads) with auto (APART's routed steps now fa_prefill's forward +
# jax.nn cuDNN's backward), cuDNN and FA3; 6 lanes, 4 rounds. Prediction in PREDICTION.md (.run/pred_s31_call4.md).
# bash .run/s31_run4.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; kind nvidia-h200)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 300 python3 -m compare run --config sweep --impl pallas:auto --impl jax:cudnn --impl 'fa3:*' --only 'sweep_train_*' \
  --jobs 6 --compile-workers 12 --rounds 4 --max-run-s 280 --out /tmp/train > $OUT/train.log 2>&1
echo "train rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/train/records.jsonl > $OUT/records.jsonl.gz
tail -2 $OUT/train.log
python3 $REPO/.run/geo.py $OUT/records.jsonl.gz
python3 $REPO/.run/bar.py $OUT/records.jsonl.gz | cut -c1-200
