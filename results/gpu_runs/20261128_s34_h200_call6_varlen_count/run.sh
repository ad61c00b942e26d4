# Session 34, call 6 (H200): GPU tests (the packed varlen batch, the serving mixed batches, the row-limited decode
# part); the mixed-batch probe (padded and packed, two mixes, per-kernel breakdown) on this commit.
# bash .run/s34_run6.sh <full git sha>   (archive HEAD to .run/src.tar.xz; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 OUT PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_serving_gpu.py -k "packed or mixed" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -2 $OUT/tests.log
t0=$(date +%s)
timeout 200 python3 scripts/serving_probe.py --parts mixed --kernels --out /tmp/probe > $OUT/probe.log 2>&1
echo "probe rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/probe/records.jsonl > $OUT/probe.records.jsonl.gz
grep -v "^ " $OUT/probe.log | tail -14
