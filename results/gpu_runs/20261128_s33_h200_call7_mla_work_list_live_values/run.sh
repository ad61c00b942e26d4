# Session 33, call 7 (H200): the work list with the unit's share re-read per piece (not held live across the tile
# loops): GPU tests, the breakdown at equal B 8 S 8k and B 64 S 8k, ncu of the B 8 kernel (spills).
# bash .run/s33_run7.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
t0=$(date +%s)
timeout 120 python3 -m pytest -v -x -m gpu tests/gpu/test_mla_pallas_gpu.py -k "work_list" > $OUT/tests.log 2>&1
echo "tests rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 $OUT/tests.log)"
timeout 90 python3 scripts/mla_breakdown.py --configs kv64_mc,kv64_mc_wl --shapes b8_s8192,b64_s8192 \
  --out $OUT/breakdown.json > $OUT/breakdown.log 2>&1
echo "breakdown rc $?"; cut -c1-260 $OUT/breakdown.log | grep " us "
export NCU_LIMIT=90
bash scripts/ncu_profiles.sh mla_kv64_mc_wl "mla --config kv64_mc_wl --batch 8 --seq 8192" > /dev/null 2>&1
grep -E "Duration|Local Memory Spilling Requests  |Executed Instructions  " $OUT/mla_kv64_mc_wl.details.txt | head -8
