R=/tmp/s20r10; rm -rf $R; mkdir -p $R/src && tar xJf .run/src.tar.xz -C $R/src && cd $R/src
export PYTHONPATH=. PALLAS_ATTN_GIT_SHA=c703afbce3d79ada5ba2059fa388a3b810bd679a XLA_PYTHON_CLIENT_PREALLOCATE=false
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 python3 -m compare run --config sweep --only 'sweep_mla_deepseek-v3_*' --impl pallas:auto --impl jax:xla_mla \
  --out $R/mla --max-run-s 385 --e2e-reps 3 > $OUT/mla.log 2>&1; echo "sweep rc=$?"; cp $R/mla/records.jsonl $OUT/mla.records.jsonl
python3 - <<'PY'
import json, collections
res=[json.loads(l) for l in open('/tmp/s20r10/mla/records.jsonl')]
res=[r for r in res if r.get('type')=='result']
by=collections.defaultdict(dict)
for r in res:
    m=r['metrics'] or {}
    by[r['workload']['name'].replace('sweep_mla_','')][r['impl']['name'].split(':')[-1]]=(f"{m['time_us_p50']:.1f}/{m.get('roofline_fraction',0):.2f}" if r['status']=='ok' else r['status'][:6])
for w,d in by.items(): print(w, ' '.join(f'{k}={v}' for k,v in d.items()))
PY
