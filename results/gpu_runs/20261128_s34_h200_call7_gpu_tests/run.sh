# Session 34, call 7 (H200): the GPU test files the session's changes touch, whole: fa_prefill (q_lens programs),
# serving (chunked, mixed, packed), fa_decode and paged GQA (fa_decode's packing gained a query-major option).
# bash .run/s34_run7.sh <full git sha>   (archive HEAD to .run/src.tar.xz; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 OUT PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 400 python3 -m pytest -q -m gpu tests/gpu/test_fa_prefill_gpu.py tests/gpu/test_serving_gpu.py \
  tests/gpu/test_fa_decode_gpu.py tests/gpu/test_paged_gqa_gpu.py -x -p no:randomly > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -4 $OUT/tests.log
