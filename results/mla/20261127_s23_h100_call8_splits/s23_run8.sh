set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout 400 python3 -m compare tune --config tune_fa_mla_splits --e2e-reps 3 --max-run-s 390 --out $OUT/msplit > $OUT/msplit.log 2>&1; echo "msplit rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
p = os.environ['OUT'] + '/msplit/records.jsonl'
t = collections.defaultdict(dict)
for line in open(p):
    r = json.loads(line)
    if r.get('type') != 'result': continue
    i = r['impl']['name'].replace('pallas:fa_mla:', '')
    if r['status'] != 'ok':
        t[r['workload']['name']][i] = (0.0, r['status'] + ' ' + (r.get('reason') or '')[:60]); continue
    pl = r['impl'].get('plan') or {}
    pl = pl.get('kernel_plan') if isinstance(pl.get('kernel_plan'), dict) else pl
    t[r['workload']['name']][i] = (r['metrics']['time_us_p50'], f"splits={pl.get('splits')}")
for w, v in t.items():
    print(w)
    for i, (x, s) in sorted(v.items(), key=lambda kv: kv[1][0]):
        print(f"   {i:40s} {x:9.1f}  {s}")
PY
