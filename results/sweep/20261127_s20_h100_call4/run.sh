R=/tmp/s20r4; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=b132d08554ccf5662237b47918b0c8f41fd25ae8 XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 540 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v2-lite_b32_s8192' --only 'sweep_mla_deepseek-v2-lite_b32_s32768' --only 'sweep_mla_deepseek-v2-lite_b64_*' --only 'sweep_mla_deepseek-v2-lite_b128_*' --only 'sweep_mla_deepseek-v3_ragged_*' --only 'sweep_mla_deepseek-v3_tq2_*' --impl pallas:auto --impl jax:xla_mla \
  --impl pallas:fa_mla:kv64_mc --impl pallas:fa_mla:kv64_ws_mc --out $R/mla --max-run-s 520 --e2e-reps 3 > $OUT/mla.log 2>&1
echo "sweep rc=$?"; cp $R/mla/records.jsonl $OUT/mla.records.jsonl
python3 - <<'PY'
import json, collections
recs=[json.loads(l) for l in open('/tmp/s20r4/mla/records.jsonl')]
res=[r for r in recs if r.get('type')=='result']
print(len(res), dict(collections.Counter(r['status'] for r in res)))
by=collections.defaultdict(dict)
for r in res:
    n=r['impl']['name'].split(':')[-1]
    m=r['metrics'] or {}
    by[r['workload']['name'].replace('sweep_mla_','')][n]=(f"{m['time_us_p50']:.1f}/{m.get('roofline_fraction',0):.2f}" if r['status']=='ok' else r['status'][:6])
for w,d in by.items(): print(w, ' '.join(f'{k}={v}' for k,v in d.items()))
PY
