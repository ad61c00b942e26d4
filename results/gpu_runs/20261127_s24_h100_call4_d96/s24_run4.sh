set -u
REPO=$(pwd)
mkdir -p /tmp/src && cd /tmp/src && tar xJf $REPO/.run/src.tar.xz || exit 1
export PALLAS_ATTN_GIT_SHA=$1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=/tmp/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
MOSAIC_GPU_DUMP_PTXAS=1 timeout 90 python3 $REPO/.run/ptxas_prefill.py 96 default > $OUT/ptxas_d96.log 2>&1; echo "ptxas rc $?: $(grep -i -E 'registers|spill' $OUT/ptxas_d96.log | sort | uniq -c | head -3)"
timeout 200 python3 -m pytest -q -m gpu tests/gpu/test_fa_prefill_gpu.py -k "96" > $OUT/tests.log 2>&1; echo "tests rc $? at $(( $(date +%s) - t0 )) s"; tail -3 $OUT/tests.log
timeout 260 python3 -m compare run --config sweep --only 'sweep_prefill_phi-3-mini_n*' --impl pallas:fa_prefill:default --impl pallas:fa_prefill:tiles4 --impl pallas:fa_prefill:c3 --impl jax:cudnn --impl torch:cudnn --e2e-reps 3 --max-run-s 250 --out $OUT/pf > $OUT/pf.log 2>&1; echo "pf rc $? at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os, collections
t = collections.defaultdict(dict)
for line in open(os.environ['OUT'] + '/pf/records.jsonl'):
    r = json.loads(line)
    if r.get('type') != 'result' or r['status'] != 'ok': continue
    t[r['workload']['name'].replace('sweep_prefill_', '')][r['impl']['name'].replace('pallas:fa_prefill:', '')] = r['metrics']['time_us_p50']
cols = ['default', 'tiles4', 'c3', 'jax:cudnn', 'torch:cudnn']
print('workload            ' + ' '.join(f"{c:>11s}" for c in cols) + '  best/cudnn')
for w, v in t.items():
    ours = min([v[c] for c in cols[:3] if c in v] or [0]); peer = min([v[c] for c in cols[3:] if c in v] or [0])
    print(f"{w:19s} " + ' '.join(f"{v.get(c, 0):11.1f}" for c in cols) + f"  {ours / peer if ours and peer else 0:.3f}")
PY
