R=/tmp/s20r5; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=b5e72bad43d786480199032ad8d47b618c76cc49 XLA_PYTHON_CLIENT_PREALLOCATE=false
O=""
for w in sweep_prefill_gpt-2_n512 sweep_prefill_gpt-2_n1024 sweep_prefill_llama-3.1-8b_n512 sweep_prefill_llama-3.1-8b_n1024 sweep_prefill_llama-3.1-8b_n4096   sweep_train_gpt-2_n1024 sweep_train_llama-3.1-8b_n1024 sweep_decode_llama-3.1-8b_b1_s1024 sweep_decode_llama-3.1-8b_b1_s8192 sweep_decode_llama-3.1-8b_b32_s1024   sweep_decode_gpt-2_b1_s1024 sweep_spec_llama-3.1-70b_tq8 sweep_spec_llama-3.1-8b_tq2 sweep_paged_llama-3.1-8b_p16_b1_s8192   sweep_quant_llama-3.1-8b_nvfp4_b1_s32768 sweep_quant_llama-3.1-8b_fp8_e4m3_b1_s8192 sweep_chunked_llama-3.1-8b_p16_c512_s8192; do O="$O --only $w"; done
timeout 560 python3 scripts/call_breakdown.py --config sweep $O --impl pallas:auto --impl jax:cudnn --impl 'jax:xla*' --reps 20 --out $OUT/calls.json 2>&1 | grep -v "^WARNING\|^I0000\|^W0000\|^E0000" > $OUT/calls.log
echo rc=$?; cut -c1-330 $OUT/calls.log
