# Session 34, call 2 (H200): serving GPU tests (mixed batch, in-kernel pages); the mixed-batch probe, two mixes, on
# call 1's source (old, b6cba79) and this commit's (new), two processes, per-kernel breakdown.
# bash .run/s34_run2.sh <full git sha>   (archive HEAD to .run/src.tar.xz, b6cba79 to .run/src_old.tar.xz; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new /tmp/old && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) && (cd /tmp/old && tar xJf $REPO/.run/src_old.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
PYTHONPATH=/tmp/new PALLAS_ATTN_GIT_SHA=$1 timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_serving_gpu.py \
  -k "mixed or in_kernel" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s"; tail -2 $OUT/tests.log
for v in old new; do
  t0=$(date +%s)
  (cd /tmp/$v && PYTHONPATH=/tmp/$v PALLAS_ATTN_GIT_SHA=$( [ $v = old ] && echo b6cba7935508eb8c589ed969f8efefa715b86d20 || echo $1 ) \
    timeout 150 python3 scripts/serving_probe.py --parts mixed --kernels --out /tmp/probe_$v > $OUT/probe_$v.log 2>&1)
  echo "probe $v rc $? in $(( $(date +%s) - t0 )) s"
  gzip -c /tmp/probe_$v/records.jsonl > $OUT/probe_$v.records.jsonl.gz
done
for v in old new; do echo "== probe $v"; grep -v "^ " $OUT/probe_$v.log | tail -7; done
