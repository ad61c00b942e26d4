set -u
REPO=$(pwd)
mkdir -p /tmp/src && cd /tmp/src && tar xJf $REPO/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_fa_prefill_bwd_gpu.py tests/gpu/test_dropin_gpu.py -k "96" > $OUT/tests.log 2>&1; echo "tests rc $? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/tests.log
timeout 270 python3 -m compare run --config sweep --only 'sweep_prefill_phi-3-mini_n*' --only sweep_train_phi-3-mini_n1024 --only sweep_train_phi-3-mini_n4096 --only sweep_train_phi-3-mini_n16384 --impl pallas:auto --impl jax:cudnn --impl torch:cudnn --e2e-reps 3 --max-run-s 255 --out $OUT/phi > $OUT/phi.log 2>&1; echo "phi rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
t = collections.defaultdict(dict); ch = {}
for line in open(os.environ['OUT'] + '/phi/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    w = r['workload']['name'].replace('sweep_', ''); i = r['impl']['name']
    t[w][i] = r['metrics']['time_us_p50']
    if i == 'pallas:auto': ch[w] = r['impl'].get('plan', {}).get('chose')
cols = ['pallas:auto', 'jax:cudnn', 'torch:cudnn']
print('workload                 ' + ' '.join(f"{c:>12s}" for c in cols) + '  auto/peer  chose')
for w, v in t.items():
    a = v.get('pallas:auto'); pe = min([v[c] for c in cols[1:] if c in v] or [0])
    print(f"{w:24s} " + ' '.join(f"{v.get(c, 0):12.1f}" for c in cols) + f"  {a / pe if a and pe else 0:.3f}  {ch.get(w)}")
PY
