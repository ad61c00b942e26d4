# Session 35, call 7 (H200): the work list's plan in unit blocks and its finish reading whole pieces: the work-list GPU
# tests and the breakdown of kv64_mc_wl against kv64_mc at equal B 64 / 128 S 8k.
# bash .run/s35_run7.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
cd /tmp/new
t0=$(date +%s)
timeout 75 python3 -m pytest -v -m gpu tests/gpu/test_mla_pallas_gpu.py -k "work_list or (nan_in and wl)" \
  -p no:randomly > $OUT/tests_mla.log 2>&1
echo "mla tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests_mla.log)"
grep -hE "FAILED|Error:" $OUT/tests_mla.log | head -5
t0=$(date +%s)
timeout 70 python3 scripts/mla_breakdown.py --configs kv64_mc_wl,kv64_mc --shapes b64_s8192,b128_s8192 --reps 10 \
  --out $OUT/breakdown.json > $OUT/breakdown.log 2>&1
echo "breakdown rc $? in $(( $(date +%s) - t0 )) s"
cut -c1-230 $OUT/breakdown.log | grep -E " us |FAILED"
