set -x
R=/tmp/s20r1; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=561cbb61b90d60b794db762f69c4697f407906eb XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
timeout 520 python3 scripts/mla_breakdown.py --reps 20 --shapes b1_s2048,b1_s32768,b8_s8192,b32_s2048,b64_s8192,b128_s2048 --out $OUT/breakdown.json 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" | tee $OUT/breakdown.log
echo rc=$?
