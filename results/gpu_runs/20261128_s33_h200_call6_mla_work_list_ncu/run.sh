# Session 33, call 6 (H200): ncu of fa_mla at DeepSeek-V3 B 8 S 8192 (equal lengths), kv64_mc against kv64_mc_wl:
# where the work list's ~5 us of kernel time at one piece a unit goes (docs/mla.md "The work list").
# bash .run/s33_run6.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run"])
set -u
REPO=$(pwd)
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
export NCU_LIMIT=150
for c in kv64_mc kv64_mc_wl; do
  bash scripts/ncu_profiles.sh mla_$c "mla --config $c --batch 8 --seq 8192" > /dev/null 2>&1
  echo "== $c"; grep -E "^  [a-zA-Z_].*\(|Duration|Registers Per|Issue Slots Busy" $OUT/mla_$c.details.txt | head -20
done
