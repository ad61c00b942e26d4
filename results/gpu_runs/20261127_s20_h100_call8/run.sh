R=/tmp/s20r8; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=f95152140f0fd8c93fd4f4f184295a2377b61941 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$SECONDS; n=0
for k in "deepseek" "causal_multi or small_templates or fp8 or nvfp4" "bit_for_bit or ws_matches or nan_in or lazy or finish or oracle"; do
  n=$((n+1)); ( timeout 280 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/gpu/test_mla_pallas_gpu.py -k "($k) and not timing" > $R/tests_$n.log 2>&1; echo "group $n rc=$? $(tail -n 1 $R/tests_$n.log)" > $R/tests_$n.sum ) &
done
wait; cat $R/tests_*.sum > $OUT/tests.sum; cat $R/tests_*.log > $OUT/tests.log; cat $OUT/tests.sum; grep -h "^FAILED\|^ERROR" $R/tests_*.log | head; echo "tests $((SECONDS-t0))s"
timeout 100 python3 scripts/mla_breakdown.py --reps 20 --shapes b1_s2048,b1_s32768,b8_s8192,b64_s8192 --out $OUT/breakdown.json 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" > $OUT/breakdown.log
echo "breakdown rc=$?"; cut -c1-100 $OUT/breakdown.log
rem=$((575 - SECONDS)); echo "sweep budget $rem"
timeout $rem python3 -m compare run --config sweep --only 'sweep_mla_*_b1_*' --only 'sweep_mla_deepseek-v3_b8_*' --impl pallas:auto --impl jax:xla_mla \
  --impl pallas:fa_mla:kv64_mc --impl pallas:fa_mla:kv64_ws_mc --out $R/mla --max-run-s $((rem - 15)) --e2e-reps 3 > $OUT/mla.log 2>&1
echo "sweep rc=$?"; cp $R/mla/records.jsonl $OUT/mla.records.jsonl
python3 - <<'PY'
import json, collections
res=[json.loads(l) for l in open('/tmp/s20r8/mla/records.jsonl')]
res=[r for r in res if r.get('type')=='result']
by=collections.defaultdict(dict)
for r in res:
    m=r['metrics'] or {}
    by[r['workload']['name'].replace('sweep_mla_','')][r['impl']['name'].split(':')[-1]]=(f"{m['time_us_p50']:.1f}/{m.get('roofline_fraction',0):.2f}" if r['status']=='ok' else r['status'][:6])
for w,d in by.items(): print(w, ' '.join(f'{k}={v}' for k,v in d.items()))
PY
