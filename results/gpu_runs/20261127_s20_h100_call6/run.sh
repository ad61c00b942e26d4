R=/tmp/s20r6; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=64090f2f96d85af73bc7a041b3a6cf0e63907384 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$SECONDS; n=0
for g in "tests/gpu/test_fa_decode_quant_gpu.py -k nvfp4" "tests/gpu/test_fa_decode_quant_gpu.py -k 'not nvfp4'" "tests/gpu/test_fa_decode_gpu.py tests/gpu/test_paged_gqa_gpu.py"; do
  n=$((n+1)); ( eval timeout 280 python3 -m pytest -m gpu -q -rs -p no:cacheprovider $g > $OUT/tests_$n.log 2>&1; echo "group $n rc=$? $g | $(tail -n 1 $OUT/tests_$n.log)" > $OUT/tests_$n.sum ) &
done
wait; cat $OUT/tests_*.sum; grep -h "^FAILED\|^ERROR" $OUT/tests_*.log | head; echo "tests $((SECONDS-t0))s"
O=""; for w in sweep_decode_llama-3.1-8b_b1_s8192 sweep_paged_llama-3.1-8b_p16_b1_s8192 sweep_quant_llama-3.1-8b_nvfp4_b1_s32768 sweep_quant_llama-3.1-8b_fp8_e4m3_b1_s8192 sweep_quant_llama-3.1-8b_nvfp4_b32_s8192; do O="$O --only $w"; done
timeout 120 python3 scripts/call_breakdown.py --config sweep $O --impl pallas:auto --reps 20 --out $OUT/calls.json 2>&1 | grep -v "^WARNING\|^I0000\|^W0000\|^E0000" > $OUT/calls.log; cut -c1-250 $OUT/calls.log
rem=$((570 - SECONDS)); echo "quant sweep budget $rem s"
timeout $rem python3 -m compare run --config sweep --only 'sweep_quant_*' --impl pallas:auto --impl jax:cudnn --impl pallas:fa_decode:default --impl pallas:fa_decode:nvfp4_cast \
  --out $R/quant --max-run-s $((rem - 20)) --e2e-reps 3 > $OUT/quant.log 2>&1; echo "quant rc=$?"; cp $R/quant/records.jsonl $OUT/quant.records.jsonl
python3 .run/quant_table.py $R/quant/records.jsonl 2>&1 | tail -30
