R=/tmp/s20r7; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=b93914b813250ae62819b781a3cf507cf54410ab XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$SECONDS; n=0
for g in "tests/gpu/test_dropin_gpu.py" "tests/gpu/test_fa_prefill_bwd_gpu.py" "tests/gpu/test_fa_prefill_gpu.py"; do
  n=$((n+1)); ( timeout 330 python3 -m pytest -m gpu -q -rs -p no:cacheprovider $g > $OUT/tests_$n.log 2>&1; echo "group $n rc=$? $g | $(tail -n 1 $OUT/tests_$n.log)" > $OUT/tests_$n.sum ) &
done
wait; cat $OUT/tests_*.sum > $OUT/tests.sum; cat $OUT/tests.sum; grep -h "^FAILED\|^ERROR" $OUT/tests_*.log | head; echo "tests $((SECONDS-t0))s"
O=""; for w in sweep_prefill_gpt-2_n512 sweep_prefill_llama-3.1-8b_n1024 sweep_train_gpt-2_n1024 sweep_decode_llama-3.1-8b_b32_s1024 sweep_quant_llama-3.1-8b_nvfp4_b32_s8192 sweep_mla_deepseek-v3_b8_s2048; do O="$O --only $w"; done
timeout 150 python3 scripts/call_breakdown.py --config sweep $O --impl pallas:auto --reps 20 --out $OUT/calls.json 2>&1 | grep -v "^WARNING\|^I0000\|^W0000\|^E0000" > $OUT/calls.log; cut -c1-250 $OUT/calls.log
rm -f $OUT/tests_*.sum
