# Prepared in session 30 (not yet run): --run-up-hold each vs one on the prefill + train entries (auto + peers, 6 lanes,
# 4 rounds), one after the other in one call, to size the lever for issue 27's 10-minute bound before making it the
# default. Prediction in .run/pred_s31_call1.md.
# bash .run/s31_run1.sh <full git sha>   (archive HEAD to .run/src.tar.xz first; carry [".run", ".whl"]; an H100)
set -u
REPO=$(pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/new && (cd /tmp/new && tar xJf $REPO/.run/src.tar.xz) || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PALLAS_ATTN_GIT_SHA=$1 PYTHONPATH=/tmp/new:/tmp/site OUT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /tmp/new
for mode in each one; do
  t0=$(date +%s)
  timeout 280 python3 -m compare run --config sweep --impl pallas:auto --impl jax:cudnn --impl 'fa3:*' \
    --only 'sweep_prefill_*' --only 'sweep_train_*' --jobs 6 --compile-workers 12 --rounds 4 --max-run-s 265 \
    --run-up-hold $mode --out /tmp/$mode > $OUT/$mode.log 2>&1
  echo "$mode rc $? in $(( $(date +%s) - t0 )) s"
  gzip -c /tmp/$mode/records.jsonl > $OUT/$mode.records.jsonl.gz
done
python3 - <<'PY' | tee $OUT/summary.txt
import json, collections
for mode in ('each', 'one'):
    st, tot, n = collections.Counter(), collections.Counter(), set()
    for line in open(f'/tmp/{mode}/records.jsonl'):
        r = json.loads(line)
        if r.get('type') != 'result': continue
        st[r['status']] += 1; m = r.get('metrics') or {}; ln = m.get('lane') or {}; w = r['workload']['name']
        if w in n or not ln: continue
        n.add(w); tot['wall'] += m.get('workload_wall_s') or 0
        for k in ('lock_wait_shared_s', 'lock_wait_exclusive_s', 'lock_holds_shared', 'lock_holds_exclusive'):
            tot[k] += ln.get(k, 0)
    print(mode, dict(st), len(n), 'workloads', {k: round(v, 1) for k, v in tot.items()})
    for line in open(f'/tmp/{mode}/records.jsonl'):
        r = json.loads(line)
        if r.get('type') != 'result' or r['impl']['name'] != 'pallas:auto': continue
        w = r['workload']['name']
        if w in ('sweep_prefill_packed_llama-3.1-8b_n4096', 'sweep_prefill_gpt-oss-20b:local_n2048', 'sweep_prefill_mistral-7b-v0.1_n8192'):
            m = r.get('metrics') or {}; pl = (r['impl'].get('plan') or {})
            print('  ', mode, w, r['status'], round(m.get('time_us_p50', 0), 1), pl.get('chose'), (pl.get('kernel_plan') or {}).get('tiles'))
PY
for mode in each one; do python3 $REPO/.run/bar.py $OUT/$mode.records.jsonl.gz | head -20; done
