set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
mkdir -p /tmp/src && cd /tmp/src && tar xJf $OLDPWD/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src:/tmp/site
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_fa_decode_gpu.py > $OUT/tests.log 2>&1; echo "tests rc $? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/tests.log
timeout 250 python3 -m compare run --config sweep --only 'sweep_spec_*' --impl pallas:auto --impl pallas:fa_decode:default --impl pallas:fa_decode:spec_split1 --impl pallas:fa_decode:tuned --impl fa3:mha --e2e-reps 3 --max-run-s 240 --out $OUT/spec > $OUT/spec.log 2>&1; echo "spec rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
p = os.environ['OUT'] + '/spec/records.jsonl'
t = collections.defaultdict(dict); ch = {}; l2 = {}
for line in open(p):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w = r['workload']['name'].replace('sweep_spec_', ''); i = r['impl']['name'].replace('pallas:fa_decode:', '')
    t[w][i] = r['metrics']['time_us_p50']
    if i == 'pallas:auto':
        ch[w] = r['impl']['plan'].get('chose'); l2[w] = ((r.get('prediction') or {}).get('layer2') or {}).get('time_us')
cols = ['pallas:auto', 'default', 'spec_split1', 'tuned', 'fa3:mha']
print('workload         ' + ' '.join(f"{c[:11]:>11s}" for c in cols) + '  auto/fa3  chose  l2')
for w, v in t.items():
    a, f = v.get('pallas:auto'), v.get('fa3:mha')
    print(f"{w:16s} " + ' '.join(f"{v.get(c, 0):11.1f}" for c in cols) + f"  {a / f if a and f else 0:.3f}  {ch.get(w)}  {l2.get(w)}")
PY
