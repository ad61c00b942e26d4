set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
echo "no tests (call 6 ran them)"
timeout 330 python3 -m compare run --config sweep --only sweep_decode_qwen2.5-7b_b32_s32768 --only sweep_spec_llama-3.1-8b_tq4 --only sweep_spec_llama-3.1-70b_tq8 --impl pallas:auto --impl pallas:fa_decode:default --impl pallas:fa_decode:waves --impl fa3:mha --impl jax:cudnn --e2e-reps 3 --max-run-s 320 --out $OUT/dec > $OUT/dec.log 2>&1; echo "dec rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
p = os.environ['OUT'] + '/dec/records.jsonl'
t = collections.defaultdict(dict); ch = {}
for line in open(p):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w = r['workload']['name'].replace('sweep_', ''); i = r['impl']['name'].replace('pallas:fa_decode:', '')
    t[w][i] = r['metrics']['time_us_p50']
    if i == 'pallas:auto': ch[w] = r['impl']['plan'].get('chose')
cols = ['pallas:auto', 'default', 'waves', 'fa3:mha', 'jax:cudnn']
print('workload                       ' + ' '.join(f"{c[:11]:>11s}" for c in cols) + '  auto/peer  chose')
for w, v in t.items():
    a = v.get('pallas:auto'); pe = min([v[c] for c in ('fa3:mha', 'jax:cudnn') if c in v] or [0])
    print(f"{w:30s} " + ' '.join(f"{v.get(c, 0):11.1f}" for c in cols) + f"  {a / pe if a and pe else 0:.3f}  {ch.get(w)}")
PY
