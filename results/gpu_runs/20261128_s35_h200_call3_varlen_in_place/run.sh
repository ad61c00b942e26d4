# Session 35, call 3 (H200): packed queries read in place by fa_prefill (issue 32): GPU tests of the serving paths and
# the MLA direct epilogue, the mixed probe with kernels, the MLA breakdown with the one-reduction flag.
# bash .run/s35_run3.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 200 python3 -m pytest -v -m gpu tests/gpu/test_serving_gpu.py -k "packed or mixed" -p no:randomly \
  > $OUT/tests.log 2>&1
echo "serving tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests.log)"
t0=$(date +%s)
timeout 120 python3 -m pytest -v -m gpu tests/gpu/test_mla_pallas_gpu.py -k "direct" -p no:randomly \
  > $OUT/tests_mla.log 2>&1
echo "mla tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests_mla.log)"
grep -hE "FAILED|Error:" $OUT/tests.log $OUT/tests_mla.log | head -10
t0=$(date +%s)
timeout 220 python3 scripts/serving_probe.py --parts mixed --kernels --out /tmp/probe > $OUT/probe.log 2>&1
echo "probe rc $? in $(( $(date +%s) - t0 )) s"
gzip -c /tmp/probe/records.jsonl > $OUT/probe.records.jsonl.gz
t0=$(date +%s)
timeout 90 python3 scripts/mla_breakdown.py --configs kv64_mc --shapes b64_s2048,b128_s2048,b256_s1024 \
  --out $OUT/breakdown.json > $OUT/breakdown.log 2>&1
echo "breakdown rc $? in $(( $(date +%s) - t0 )) s"
cut -c1-220 $OUT/breakdown.log | grep -E " us |FAILED"
grep -v "^ " $OUT/probe.log | tail -16
