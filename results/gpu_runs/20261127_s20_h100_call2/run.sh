R=/tmp/s20r2; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=b132d08554ccf5662237b47918b0c8f41fd25ae8 XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$SECONDS
for k in "deepseek" "causal_multi or small_templates or fp8 or nvfp4" "bit_for_bit or ws_matches or nan_in or lazy or finish or oracle"; do
  n=$((n+1)); ( timeout 300 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/gpu/test_mla_pallas_gpu.py -k "($k) and not timing" > $OUT/tests_$n.log 2>&1; echo "group $n rc=$? $(tail -n 1 $OUT/tests_$n.log)" > $OUT/tests_$n.sum ) &
done
wait; cat $OUT/tests_*.sum; grep -h "^FAILED\|^ERROR" $OUT/tests_*.log | head; echo "tests $((SECONDS-t0))s"
timeout 200 python3 scripts/mla_breakdown.py --reps 20 --shapes b1_s2048,b1_s32768,b8_s8192,b32_s2048,b64_s8192,b128_s2048 --out $OUT/breakdown.json 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" > $OUT/breakdown.log
echo "breakdown rc=$?"; cut -c1-100 $OUT/breakdown.log
