set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout 300 python3 -m compare tune --config tune_fa_decode_fill --e2e-reps 3 --max-run-s 290 --out $OUT/fill > $OUT/fill.log 2>&1; echo "fill rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
p = os.environ['OUT'] + '/fill/records.jsonl'
t = collections.defaultdict(dict)
for line in open(p):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    i = r['impl']['name'].replace('pallas:fa_decode:', '')
    ov = r['impl'].get('overrides')
    if ov: i = 'pt' + json.dumps(ov, separators=(',', ':'))[:60]
    pl = (r['impl'].get('plan') or {})
    pl = pl.get('kernel_plan') if isinstance(pl.get('kernel_plan'), dict) else pl
    t[r['workload']['name']][i] = (r['metrics']['time_us_p50'], pl.get('splits'), pl.get('block_k'))
for w, v in t.items():
    print(w)
    for i, (x, s, bk) in sorted(v.items(), key=lambda kv: kv[1][0]):
        print(f"   {i:70s} {x:9.1f}  splits={s} bk={bk}")
PY
