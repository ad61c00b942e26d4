R=/tmp/s20r9; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=866ba01ba0c3292e010b9712358e854e690b2ee3 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$SECONDS
timeout 200 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests/gpu/test_fa_decode_gpu.py > $OUT/tests.log 2>&1; echo "tests rc=$? $(tail -n 1 $OUT/tests.log) $((SECONDS-t0))s"
O=""; for w in sweep_decode_llama-3.1-8b_b8_s1024 sweep_decode_llama-3.1-8b_b32_s1024 sweep_decode_llama-3.1-8b_b128_s1024 sweep_quant_llama-3.1-8b_nvfp4_b32_s8192; do O="$O --only $w"; done
timeout 90 python3 scripts/call_breakdown.py --config sweep $O --impl pallas:auto --impl jax:cudnn --reps 20 --out $OUT/calls.json 2>&1 | grep -v "^WARNING\|^I0000\|^W0000\|^E0000" > $OUT/calls.log; cut -c1-220 $OUT/calls.log
rem=$((560 - SECONDS)); echo "sweep budget $rem"
timeout $rem python3 -m compare run --config sweep --only 'sweep_decode_llama-3.1-8b_*' --impl pallas:auto --impl jax:cudnn --impl 'pallas:fa_decode:default' \
  --out $R/dec --max-run-s $((rem - 15)) --e2e-reps 3 > $OUT/decode.log 2>&1; echo "sweep rc=$?"; cp $R/dec/records.jsonl $OUT/decode.records.jsonl
python3 - <<'PY'
import json, collections
res=[json.loads(l) for l in open('/tmp/s20r9/dec/records.jsonl')]
res=[r for r in res if r.get('type')=='result']
by=collections.defaultdict(dict)
for r in res:
    m=r['metrics'] or {}
    by[r['workload']['name'].replace('sweep_decode_','')][r['impl']['name']]=(f"{m['time_us_p50']:.1f}" if r['status']=='ok' else r['status'][:6])
for w,d in by.items(): print(w, ' '.join(f'{k}={v}' for k,v in d.items()))
PY
